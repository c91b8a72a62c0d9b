"""A tenant's members page, for its tenant admins and platform admins: members with what
their runs hold, adding, inviting, changing roles and removing.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from core.http import or_404
from jobs.selectors.capacity import member_usage_list, quota_usage_list, tenant_get_members_viewable
from tenants import invitations as tenant_invitations
from tenants.access import (
    is_platform_admin,
    membership_can_manage,
    roles_forget,
)
from tenants.forms import MemberAddForm
from tenants.invitations import invitation_sent_message, member_add_or_invite
from tenants.models import Invitation, Membership, Tenant
from tenants.selectors import (
    invitation_get_pending,
    invitation_list_pending,
    membership_get,
    quota_list_for_tenant,
)
from tenants.services.memberships import membership_remove, membership_role_change


@login_required
@require_GET
def tenant_members(request: HttpRequest, slug: str) -> HttpResponse:
    """A tenant's members with what their runs hold now, beside the tenant's quota use, and
    the forms that add members, change their roles and remove them (for its tenant admins
    and platform admins, the only ones who see the page)."""
    tenant = or_404(tenant_get_members_viewable, user=request.user, slug=slug)
    return _members_page(request, tenant)


def _members_page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    add_form: MemberAddForm | None = None,
    error: str = "",
) -> HttpResponse:
    """The members page; 400 when it shows a refused change (``add_form`` errors, ``error``)."""
    add_form = add_form or MemberAddForm()
    return render(
        request,
        "jobs/tenant_members.html",
        {
            "tenant": tenant,
            "members": member_usage_list(tenant=tenant),
            "usages": quota_usage_list(
                quotas=list(quota_list_for_tenant(tenant=tenant)), tenant=tenant
            ),
            "add_form": add_form,
            "adds_directly": is_platform_admin(request.user),
            "invitations": invitation_list_pending(tenant=tenant, now=timezone.now()),
            "roles": Membership.Role.choices,
            "error": error,
        },
        status=400 if error or add_form.errors else 200,
    )


def _after_member_change(request: HttpRequest, tenant: Tenant, message: str) -> HttpResponse:
    """Back to the members page, or to the tenant's quotas when the change took the user's
    own right to manage members (a tenant admin who stepped down or left)."""
    messages.success(request, message)
    roles_forget(request.user)
    if membership_can_manage(user=request.user, tenant=tenant):
        return redirect("jobs:tenant_members", slug=tenant.slug)
    return redirect(f"{reverse('jobs:quota_list')}?tenant={tenant.slug}")


@login_required
@require_POST
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = or_404(tenant_get_members_viewable, user=request.user, slug=slug)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            added = member_add_or_invite(
                tenant=tenant,
                identifier=form.cleaned_data["user"],
                role=form.cleaned_data["role"],
                actor=request.user,
                now=timezone.now(),
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            if isinstance(added, Invitation):
                messages.success(request, invitation_sent_message(added))
            else:
                messages.success(
                    request,
                    f"Added {added.user.get_username()} to {tenant.slug} as "
                    f"{added.get_role_display().lower()}.",
                )
            return redirect("jobs:tenant_members", slug=tenant.slug)
    return _members_page(request, tenant, add_form=form)


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, slug: str, invitation_id: int) -> HttpResponse:
    tenant = or_404(tenant_get_members_viewable, user=request.user, slug=slug)
    invitation = or_404(invitation_get_pending, tenant=tenant, invitation_id=invitation_id)
    or_404(
        tenant_invitations.invitation_revoke,
        invitation=invitation,
        actor=request.user,
        now=timezone.now(),
    )
    messages.success(request, f"Withdrew the invitation of {invitation.identifier}.")
    return redirect("jobs:tenant_members", slug=tenant.slug)


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    tenant = or_404(tenant_get_members_viewable, user=request.user, slug=slug)
    membership = or_404(membership_get, tenant=tenant, user_id=user_id)
    try:
        changed = or_404(
            membership_role_change,
            membership=membership,
            role=request.POST.get("role", ""),
            actor=request.user,
        )
    except ValidationError as exc:
        return _members_page(request, tenant, error=" ".join(exc.messages))
    return _after_member_change(
        request,
        tenant,
        f"{changed.user.get_username()} is now {changed.get_role_display().lower()} of "
        f"{tenant.slug}.",
    )


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    tenant = or_404(tenant_get_members_viewable, user=request.user, slug=slug)
    membership = or_404(membership_get, tenant=tenant, user_id=user_id)
    try:
        or_404(membership_remove, membership=membership, actor=request.user)
    except ValidationError as exc:
        return _members_page(request, tenant, error=" ".join(exc.messages))
    return _after_member_change(
        request,
        tenant,
        f"Removed {membership.user.get_username()} from {tenant.slug}. Their runs stay; they "
        f"can no longer submit to {tenant.slug}.",
    )
