from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from jobs.live import live_page, live_page_poll
from portal.home import home_for
from portal.readiness import database_unready_reason
from tenants.access import tenant_roles
from tenants.models import Membership, Tenant


@never_cache
@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """What each of the user's roles needs first: their runs, their tenants, the platform,
    the money (``portal.home``)."""
    home = home_for(user=request.user, now=timezone.now())
    part = live_page(request, part_id="home-live", template="home.html", context={"home": home})
    return live_page_poll(request, part) or render(
        request, "home_page.html", {"home": home, "live_page": part}
    )


@login_required
@require_GET
def members(request: HttpRequest) -> HttpResponse:
    """The navigation's Members: the members page of the tenant the user administers, or
    the list of them when they administer several; 404 for everyone else."""
    administered = [
        tenant_id
        for tenant_id, role in tenant_roles(request.user).items()
        if role == Membership.Role.TENANT_ADMIN
    ]
    tenants = list(Tenant.objects.filter(pk__in=administered, active=True).order_by("slug"))
    if not tenants:
        raise Http404("No such page")
    if len(tenants) == 1:
        return redirect("jobs:tenant_members", slug=tenants[0].slug)
    return render(request, "tenants/member_tenants.html", {"tenants": tenants})


@require_GET
def healthz(request):
    """The process is up."""
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request):
    """The process can serve: its database answers and has every migration applied
    (``portal.readiness``); 503 with the reason otherwise, never a 500."""
    reason = database_unready_reason()
    if reason is not None:
        return JsonResponse({"status": "unavailable", "reason": reason}, status=503)
    return JsonResponse({"status": "ok"})
