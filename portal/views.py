from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET


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
