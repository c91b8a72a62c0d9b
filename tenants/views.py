"""Pages of the tenants app: GPU flavors, the audit log and each tenant's idle-GPU policy.

Every page starts from a selector that returns 404 to users who may not see it, so the
pages' existence is no more visible than another tenant's objects.
"""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from core.http import form_page, or_404
from tenants.access import idle_policy_can_edit, require_platform_admin
from tenants.forms import FlavorForm, IdlePolicyForm, WorkspacePolicyForm
from tenants.selectors import (
    audit_list_viewable,
    audit_tenant_choices,
    flavor_get_manageable,
    flavor_list_manageable,
    tenant_get_viewable,
)
from tenants.services import quotas
from tenants.services.idle_policy import IDLE_POLICY_FIELDS, tenant_idle_policy_update
from tenants.services.workspace_policy import (
    WORKSPACE_POLICY_FIELDS,
    tenant_workspace_policy_update,
)

FLAVORS_PER_PAGE = 50
AUDIT_EVENTS_PER_PAGE = 50
ABSENT = "—"


@login_required
@require_GET
def flavor_list(request: HttpRequest) -> HttpResponse:
    flavors = or_404(flavor_list_manageable, user=request.user)
    page = Paginator(flavors, FLAVORS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request, "tenants/flavor_list.html", {"page_obj": page, "flavors": page.object_list}
    )


@login_required
@require_http_methods(["GET", "POST"])
def flavor_create(request: HttpRequest) -> HttpResponse:
    or_404(require_platform_admin, request.user)

    def done(flavor) -> HttpResponse:
        messages.success(request, f"Created the GPU flavor {flavor.slug}.")
        return redirect("tenants:flavor_list")

    return form_page(
        request,
        FlavorForm(request.POST)
        if request.method == "POST"
        else FlavorForm(initial={"gpu_fraction": 1}),
        save=lambda data: quotas.flavor_create(actor=request.user, **data),
        done=done,
        template="tenants/flavor_form.html",
        context={"flavor": None},
    )


@login_required
@require_http_methods(["GET", "POST"])
def flavor_edit(request: HttpRequest, slug: str) -> HttpResponse:
    flavor = or_404(flavor_get_manageable, user=request.user, slug=slug)

    def done(saved) -> HttpResponse:
        messages.success(request, f"Saved the GPU flavor {saved.slug}.")
        return redirect("tenants:flavor_list")

    initial = {name: getattr(flavor, name) for name in quotas.FLAVOR_FIELDS}
    return form_page(
        request,
        FlavorForm(request.POST, editing=True)
        if request.method == "POST"
        else FlavorForm(editing=True, initial=initial),
        save=lambda data: quotas.flavor_update(flavor=flavor, actor=request.user, **data),
        done=done,
        template="tenants/flavor_form.html",
        context={"flavor": flavor},
    )


@login_required
@require_http_methods(["GET", "POST"])
def idle_policy(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's idle-GPU policy: read by whoever reads the tenant's runs, changed by its
    tenant admins and platform admins."""
    return _policy_page(
        request,
        slug,
        form_class=IdlePolicyForm,
        fields=IDLE_POLICY_FIELDS,
        update=tenant_idle_policy_update,
        name="idle-GPU policy",
        view="tenants:idle_policy",
        template="tenants/idle_policy.html",
    )


@login_required
@require_http_methods(["GET", "POST"])
def workspace_policy(request: HttpRequest, slug: str) -> HttpResponse:
    """The tenant's workspace policy: read by whoever reads the tenant's runs, changed by
    its tenant admins and platform admins."""
    return _policy_page(
        request,
        slug,
        form_class=WorkspacePolicyForm,
        fields=WORKSPACE_POLICY_FIELDS,
        update=tenant_workspace_policy_update,
        name="workspace policy",
        view="tenants:workspace_policy",
        template="tenants/workspace_policy.html",
    )


def _policy_page(
    request: HttpRequest,
    slug: str,
    *,
    form_class,
    fields,
    update,
    name: str,
    view: str,
    template: str,
) -> HttpResponse:
    """A tenant policy's page: shown to whoever sees the tenant, saved through ``update``
    by its tenant admins and platform admins (a member's POST is 403)."""
    tenant = or_404(tenant_get_viewable, user=request.user, slug=slug)
    can_edit = idle_policy_can_edit(user=request.user, tenant=tenant)
    form = None
    if request.method == "POST":
        if not can_edit:  # a member: the tenant is no secret to them, so 403 leaks nothing
            raise PermissionDenied("Only tenant admins and platform admins change this policy.")
        form = form_class(request.POST)
        if form.is_valid():
            try:
                update(tenant=tenant, actor=request.user, **form.cleaned_data)
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(request, f"Saved the {name} of {tenant.slug}.")
                return redirect(view, slug=tenant.slug)
    elif can_edit:
        form = form_class(initial={field: getattr(tenant, field) for field in fields})
    return render(
        request,
        template,
        {"tenant": tenant, "form": form},
        status=400 if form is not None and form.errors else 200,
    )


@login_required
@require_GET
def audit_list(request: HttpRequest) -> HttpResponse:
    """Who changed what: all of it for platform admins, their tenants' for tenant admins."""
    events = or_404(audit_list_viewable, user=request.user)
    actions = list(events.order_by("action").values_list("action", flat=True).distinct())
    action = request.GET.get("action", "")
    tenant = request.GET.get("tenant", "")
    if action:
        events = events.filter(action=action)
    if tenant:
        events = events.filter(tenant__slug=tenant)
    page = Paginator(events, AUDIT_EVENTS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "tenants/audit_list.html",
        {
            "page_obj": page,
            "rows": [(event, audit_changes(event.before, event.after)) for event in page],
            "actions": actions,
            "action": action,
            "tenants": audit_tenant_choices(user=request.user),
            "tenant": tenant,
            "filtered": bool(action or tenant),
        },
    )


def audit_changes(before, after) -> list[tuple[str, str, str]]:
    """(key, old, new) for each key whose value differs, keys in alphabetical order.

    A key that was or is absent shows as a dash: creations have no "before".
    """
    if not isinstance(before, dict | None) or not isinstance(after, dict | None):
        return [("value", _shown(before), _shown(after))] if before != after else []
    before, after = before or {}, after or {}
    return [
        (
            key,
            _shown(before[key]) if key in before else ABSENT,
            _shown(after[key]) if key in after else ABSENT,
        )
        for key in sorted(before.keys() | after.keys())
        if key not in before or key not in after or before[key] != after[key]
    ]


def _shown(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)
