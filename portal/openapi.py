"""The OpenAPI schema (drf-spectacular): its hooks and the view that serves it."""

import logging
import threading
import time
from typing import ClassVar

from django.http import HttpResponse
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.settings import api_settings

logger = logging.getLogger(__name__)

BAD_REQUEST = {
    "description": (
        "The request is malformed, for example it names a host (Host header) this deployment "
        "does not serve: Django refuses it before any endpoint sees it."
    )
}


def every_operation_may_answer_400(result, generator, request, public):
    """Every operation documents 400: a request with a bad Host header is refused with it
    by Django's middleware, whatever the endpoint (found by the API fuzzing test)."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            if isinstance(operation, dict) and "responses" in operation:
                operation["responses"].setdefault("400", BAD_REQUEST)
    return result


class SchemaView(SpectacularAPIView):
    """The OpenAPI schema, generated once per process and served from memory.

    Generating it walks every endpoint and serializer (about 3 s of CPU), and
    drf-spectacular's generator is not thread-safe: generated per request, 22 of 200
    concurrent requests answered 500 on threaded gunicorn workers (3 of 120 in the probe),
    and on sync workers every request cost those 3 s. The schema is public and the same for
    every caller, so each process renders it once per version and format, under a lock, and
    keeps the bytes. The key is bounded whatever clients send: a version only when it is an
    allowed one, the renderer's class and media type, not the Accept header's text."""

    _rendered: ClassVar[dict[tuple[str | None, type], bytes]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def _get_schema_response(self, request):
        version = self.api_version or request.version
        if version is None and request.GET.get("version") in (api_settings.ALLOWED_VERSIONS or ()):
            version = request.GET["version"]
        renderer = request.accepted_renderer
        media_type = renderer.media_type
        key = (version, type(renderer))
        content = self._rendered.get(key)
        if content is None:
            with self._lock:
                content = self._rendered.get(key)
                if content is None:
                    content = self._render(
                        version=version, renderer=renderer, media_type=media_type
                    )
                    self._rendered[key] = content
        content_type = (
            media_type if renderer.charset is None else f"{media_type}; charset={renderer.charset}"
        )
        response = HttpResponse(content, content_type=content_type)
        response["Content-Disposition"] = (
            f'inline; filename="{self._get_filename(request, version)}"'
        )
        return response

    def _render(self, *, version: str | None, renderer, media_type: str) -> bytes:
        # Without the request: nothing in the schema may depend on who asked first.
        generator = self.generator_class(
            urlconf=self.urlconf, api_version=version, patterns=self.patterns
        )
        started = time.monotonic()
        schema = generator.get_schema(request=None, public=self.serve_public)
        content = renderer.render(schema, media_type, {})
        logger.info(
            "OpenAPI schema generated for this process in %.1f s (%s, %d bytes)",
            time.monotonic() - started,
            media_type,
            len(content),
        )
        return content


class DocsView(SpectacularSwaggerSplitView):
    """Swagger UI's page. OPTIONS answers what Django's own views answer (200, the methods
    in ``Allow``): DRF's answer is a description of the endpoint's fields, which this HTML
    view's template renderer cannot draw (every OPTIONS was a 500)."""

    def options(self, request, *args, **kwargs):
        response = HttpResponse()
        response["Allow"] = ", ".join(self.allowed_methods)
        response["Content-Length"] = "0"
        return response
