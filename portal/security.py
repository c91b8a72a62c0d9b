"""Security headers Django does not set by itself: Content-Security-Policy, Permissions-Policy.

The policy (``CONTENT_SECURITY_POLICY`` in the settings) allows scripts from Gantry's own
origin only: no inline scripts, no event-handler attributes, no ``eval``. Pages keep their
data in ``<script type="application/json">`` blocks (json_script), which are data, not code,
and the vendored Plotly draws the SVG charts Gantry uses without ``eval`` (only its WebGL
traces would need it). Swagger UI (``/api/docs/``) is served by drf-spectacular's split view,
whose start-up script is a file of its own; it only needs data: images, which ``csp_update``
allows on its responses alone.
"""

from collections.abc import Callable, Mapping, Sequence
from functools import wraps

from django.conf import settings
from django.http import HttpRequest, HttpResponse

CSP_HEADER = "Content-Security-Policy"


def render_policy(policy: Mapping[str, Sequence[str]]) -> str:
    return "; ".join(
        f"{directive} {' '.join(sources)}".strip() for directive, sources in policy.items()
    )


def csp_update(**additions: Sequence[str]) -> Callable:
    """Adds sources to directives of the policy, for the responses of one view only.

    Directive names are written with underscores: ``csp_update(img_src=["data:"])``.
    """
    extra = {name.replace("_", "-"): list(sources) for name, sources in additions.items()}

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            response = view(request, *args, **kwargs)
            policy = {
                name: list(sources) for name, sources in settings.CONTENT_SECURITY_POLICY.items()
            }
            for name, sources in extra.items():
                known = policy.setdefault(name, [])
                known += [source for source in sources if source not in known]
            response.headers[CSP_HEADER] = render_policy(policy)
            return response

        return wrapped

    return decorator


class SecurityHeadersMiddleware:
    """Sets Content-Security-Policy (unless a view set its own) and Permissions-Policy on
    every response."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.policy = render_policy(settings.CONTENT_SECURITY_POLICY)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault(CSP_HEADER, self.policy)
        response.headers.setdefault("Permissions-Policy", settings.PERMISSIONS_POLICY)
        return response
