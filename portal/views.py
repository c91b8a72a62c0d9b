from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from portal.home import home_for


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """What each of the user's roles needs first: their runs, their tenants, the platform,
    the money (``portal.home``)."""
    return render(request, "home.html", {"home": home_for(user=request.user, now=timezone.now())})


@require_GET
def healthz(request):
    """The process is up."""
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request):
    """The process can serve: its database answers."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any database failure means not ready
        return JsonResponse({"status": "unavailable", "database": str(exc)[:200]}, status=503)
    return JsonResponse({"status": "ok"})
