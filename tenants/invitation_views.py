"""The signed-in user's invitations to tenants: the list, accept and decline.

Every look-up starts from the signed-in user (tenants.selectors.invitation_list_for_user),
so an invitation meant for someone else answers 404, like one that does not exist.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from tenants.invitations import invitation_accept, invitation_decline
from tenants.models import Invitation
from tenants.selectors import invitation_list_for_user


@login_required
@require_GET
def invitation_list(request: HttpRequest) -> HttpResponse:
    invitations = invitation_list_for_user(user=request.user, now=timezone.now())
    return render(request, "tenants/invitations.html", {"invitations": invitations})


@login_required
@require_POST
def invitation_accept_own(request: HttpRequest, invitation_id: int) -> HttpResponse:
    try:
        membership = invitation_accept(
            invitation_id=invitation_id, user=request.user, now=timezone.now()
        )
    except Invitation.DoesNotExist:
        raise Http404("No such invitation") from None
    messages.success(
        request,
        f"You joined {membership.tenant.slug} as {membership.get_role_display().lower()}.",
    )
    return redirect("home")


@login_required
@require_POST
def invitation_decline_own(request: HttpRequest, invitation_id: int) -> HttpResponse:
    try:
        invitation = invitation_decline(
            invitation_id=invitation_id, user=request.user, now=timezone.now()
        )
    except Invitation.DoesNotExist:
        raise Http404("No such invitation") from None
    messages.success(request, f"Declined the invitation to {invitation.tenant.slug}.")
    return redirect("invitations:list")
