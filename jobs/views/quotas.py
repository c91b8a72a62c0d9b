"""The quota pages: every quota the user may read with its use, and editing one (platform
admins).
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from core.http import or_404
from jobs.selectors.capacity import flavor_overcommits, quota_usage_list
from jobs.services.capacity import quota_update_checked
from tenants.access import (
    is_platform_admin,
    is_tenant_admin,
    tenant_list_viewable,
)
from tenants.forms import QuotaForm, quota_initial
from tenants.selectors import (
    flavor_list_manageable,
    quota_get_manageable,
    quota_list_viewable,
)

QUOTAS_PER_PAGE = 50


class _FirstPageCountingPaginator(Paginator):
    """A Paginator that reads the first page with one row more than it shows and counts only
    if that row is there: a first page with room to spare holds every item, so its count is
    its length (most tenants have fewer quotas than a page). Other pages as Paginator."""

    def get_page(self, number) -> Page:
        if number not in (None, "", "1") or self.orphans:
            return super().get_page(number)
        rows = list(self.object_list[: self.per_page + 1])
        if len(rows) <= self.per_page:
            self.__dict__["count"] = len(rows)  # Paginator.count is a cached_property
        return Page(rows[: self.per_page], 1, self)


@login_required
@require_GET
def quota_list(request: HttpRequest) -> HttpResponse:
    """Quotas, use and budget burn of every tenant the user may read."""
    tenants = list(tenant_list_viewable(user=request.user))
    quotas = quota_list_viewable(user=request.user)
    slug = request.GET.get("tenant", "")
    tenant = next((t for t in tenants if t.slug == slug), None)
    if slug:
        quotas = quotas.filter(tenant__slug=slug)
    page = _FirstPageCountingPaginator(quotas, QUOTAS_PER_PAGE).get_page(request.GET.get("page"))
    can_manage = is_platform_admin(request.user)
    return render(
        request,
        "jobs/quota_list.html",
        {
            "page_obj": page,
            "usages": quota_usage_list(quotas=list(page.object_list), tenant=tenant),
            "tenants": tenants,
            "tenant": slug,
            "can_manage": can_manage,
            "flavors": or_404(flavor_list_manageable, user=request.user) if can_manage else (),
            "member_tenants": [
                t for t in tenants if can_manage or is_tenant_admin(request.user, t.pk)
            ],
            "overcommits": flavor_overcommits(),
            "show_overcommit_figures": can_manage,
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def quota_edit(request: HttpRequest) -> HttpResponse:
    """Create or change the quota of ``?tenant=`` for ``?flavor=`` (platform admins)."""
    tenant, flavor, quota = or_404(
        quota_get_manageable,
        user=request.user,
        tenant_slug=request.GET.get("tenant", ""),
        flavor_slug=request.GET.get("flavor", ""),
    )
    if request.method == "POST":
        form = QuotaForm(request.POST)
        if form.is_valid():
            try:
                change = quota_update_checked(
                    tenant=tenant, flavor=flavor, actor=request.user, **form.cleaned_data
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(request, f"Saved the {flavor.slug} quota of {tenant.slug}.")
                if change.overcommit is not None:
                    messages.warning(request, change.overcommit.message)
                if change.beyond_guarantee:
                    messages.warning(
                        request,
                        f"{tenant.slug} now uses {change.in_use} of "
                        f"{change.quota.guaranteed_gpus} guaranteed {flavor.slug} GPUs: "
                        f"{change.beyond_guarantee} beyond the guarantee. Running runs keep "
                        "their GPUs; new runs can only borrow until use drops below it.",
                    )
                return redirect(f"{reverse('jobs:quota_list')}?tenant={tenant.slug}")
    else:
        form = QuotaForm(initial=quota_initial(quota))
    usage = quota_usage_list(quotas=[quota], tenant=tenant)[0] if quota else None
    return render(
        request,
        "jobs/quota_edit.html",
        {"form": form, "tenant": tenant, "flavor": flavor, "quota": quota, "usage": usage},
        status=400 if form.errors else 200,
    )
