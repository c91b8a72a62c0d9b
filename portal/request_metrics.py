"""Every request's time, per view, method and status class, into Gantry's own metrics
(``gantry_http_request_duration_seconds``, core/metrics.py): the web's saturation seen on
/metrics, where it shows first (docs/operations.md, *Scale*).

First in the middleware, so the time includes what every other middleware does (sessions,
CSRF, WhiteNoise's static files)."""

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

from core import metrics


class RequestMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        response = self.get_response(request)
        match = request.resolver_match
        metrics.http_request_observed(
            view=match.view_name if match is not None else metrics.UNROUTED,
            method=request.method or "",
            status=response.status_code,
            seconds=time.perf_counter() - started,
        )
        return response
