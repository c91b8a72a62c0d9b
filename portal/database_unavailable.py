"""A request the database could not serve is answered 503 with ``Retry-After``, not 500.

While PostgreSQL restarts or fails over, a request meets Django's ``OperationalError`` or
``InterfaceError`` (connection refused, "the database system is starting up", a connection
terminated). Its client is told that the failure is passing and to send the request again.
What the request wrote is all there or not at all (every service writes in one
transaction); a submit sent again with the same ``Idempotency-Key`` answers with the run it
may already have recorded (the chaos test, tests/portal/test_chaos.py, found 500s here).
"""

import logging
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
API_DETAIL = (
    "The database is not answering (restarting or failing over). Send the request again in a "
    "few seconds; a submit sent again with the same Idempotency-Key answers with the run it "
    "may already have recorded."
)


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        logger.warning(
            "database unavailable, answered 503: %s %s: %s", request.method, request.path, exception
        )
        response: HttpResponse
        if request.path.startswith("/api/"):
            response = JsonResponse({"detail": API_DETAIL}, status=503)
        else:
            # No request context: it would read the session and the user from the database.
            response = HttpResponse(render_to_string("503.html"), status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
