"""``GET /api/v1/``: an index of the API's resources, so the API's root answers what it
holds instead of a 404. Derived from the API's URL configuration, so a new endpoint is
listed without anyone remembering to add it here."""

from django.urls import NoReverseMatch, URLPattern, URLResolver, get_resolver, reverse
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import UNAUTHENTICATED

API_NAMESPACE = "api"
API_URLCONF = "portal.api_urls"


def _names(patterns) -> set[str]:
    names: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            names |= _names(pattern.url_patterns)
        elif isinstance(pattern, URLPattern) and pattern.name:
            names.add(pattern.name)
    return names


def api_resources() -> dict[str, str]:
    """name -> path of every API route a client can call without an id, by path."""
    paths = {}
    for name in _names(get_resolver(API_URLCONF).url_patterns) - {"index"}:
        try:
            paths[name] = reverse(f"{API_NAMESPACE}:{name}")
        except NoReverseMatch:  # needs an id: reached from a listed resource
            continue
    return dict(sorted(paths.items(), key=lambda item: item[1]))


class ApiIndex(APIView):
    """The API's resources and where its schema and docs are, for a signed-in client (a
    token, or the browser's session) like every other endpoint of the API."""

    @extend_schema(
        tags=["index"],
        responses={
            200: inline_serializer(
                "ApiIndex",
                {
                    "resources": serializers.DictField(child=serializers.URLField()),
                    "schema": serializers.URLField(),
                    "docs": serializers.URLField(),
                    "authentication": serializers.CharField(),
                },
            ),
            401: UNAUTHENTICATED,
        },
    )
    def get(self, request: Request) -> Response:
        absolute = request.build_absolute_uri
        return Response(
            {
                "resources": {name: absolute(path) for name, path in api_resources().items()},
                "schema": absolute(reverse("api-schema")),
                "docs": absolute(reverse("api-docs")),
                "authentication": "Authorization: Bearer <token>; create one with "
                "POST tokens/ or on your account page",
            }
        )
