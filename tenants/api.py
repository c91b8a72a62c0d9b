"""API tokens: exchange a username and password for a token, revoke the token in use."""

from collections.abc import Mapping

from django.contrib.auth import authenticate
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import Throttled, ValidationError
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from core.parsers import JsonTextParser
from tenants.authentication import ApiTokenAuthentication, refused_by_lockout
from tenants.models import ApiToken, max_length_of
from tenants.services.tokens import (
    API_TOKEN_DEFAULT_DAYS,
    API_TOKEN_MAX_DAYS,
    api_token_issue,
    api_token_revoke,
)
from tenants.throttling import Limit, claim


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Describes ``ApiTokenAuthentication`` in the OpenAPI schema (and Swagger UI's login)."""

    target_class = ApiTokenAuthentication
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}


class TokenCreateRequestSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False)
    name = serializers.CharField(max_length=max_length_of(ApiToken, "name"), default="api")
    expires_in_days = serializers.IntegerField(
        min_value=1,
        max_value=API_TOKEN_MAX_DAYS,
        default=API_TOKEN_DEFAULT_DAYS,
        help_text=f"Lifetime of the token; {API_TOKEN_DEFAULT_DAYS} days unless given.",
    )


class TokenCreatedSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="The secret. It is shown once and never stored.")
    prefix = serializers.CharField(help_text="Identifies the token in lists without the secret.")
    expires_at = serializers.DateTimeField(allow_null=True)


class TokenCreateThrottle(BaseThrottle):
    """Slows password guessing: 10 requests a minute per client address and username, so
    one client guessing passwords cannot lock everyone else behind the same proxy out.
    Counted in the shared cache (``tenants.throttling``): the limit holds however many web
    workers and hosts serve the API."""

    scope = "token-create"
    limit = Limit(requests=10, window_s=60)
    retry_after_s: float | None = None

    def ident(self, request) -> str:
        """Client address and username (case-folded): whose attempts are counted together."""
        data = request.data if isinstance(request.data, Mapping) else {}
        username = str(data.get("username", ""))[:150].lower()
        return f"{self.get_ident(request)}:{username}"

    def allow_request(self, request, view):
        self.retry_after_s = claim(scope=self.scope, ident=self.ident(request), limit=self.limit)
        return self.retry_after_s is None

    def wait(self):
        return self.retry_after_s


@extend_schema(tags=["tokens"])
class TokenCreateApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [TokenCreateThrottle]
    parser_classes = [JsonTextParser]

    @extend_schema(
        request=TokenCreateRequestSerializer,
        responses={
            201: TokenCreatedSerializer,
            400: OpenApiResponse(description="Invalid input or wrong username/password."),
            429: OpenApiResponse(description="Too many attempts; retry later."),
        },
        auth=[],
    )
    def post(self, request):
        serializer = TokenCreateRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        # The lockout is checked and the attempt counted by the login backend
        # (``ThrottledModelBackend``), as for every password login.
        user = authenticate(request, username=data["username"], password=data["password"])
        lockout = refused_by_lockout(request)
        if lockout is not None:
            raise Throttled(wait=lockout.retry_after_s, detail=lockout.message)
        if user is None:
            raise ValidationError(
                {api_settings.NON_FIELD_ERRORS_KEY: ["Wrong username or password."]}
            )
        # The serializer holds the service's limits, so its rules pass here too.
        token, secret = api_token_issue(
            user=user, name=data["name"], expires_in_days=data["expires_in_days"]
        )
        body = {"token": secret, "prefix": token.prefix, "expires_at": token.expires_at}
        return Response(TokenCreatedSerializer(body).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["tokens"])
class TokenRevokeApi(APIView):
    # Only a token can revoke itself; a browser session has no "current token".
    authentication_classes = [ApiTokenAuthentication]
    permission_classes = [IsAuthenticated]

    @extend_schema(
        request=None,
        responses={
            204: OpenApiResponse(description="Revoked; the token no longer works."),
            401: OpenApiResponse(description="No token, or an invalid, expired or revoked one."),
        },
    )
    def delete(self, request):
        api_token_revoke(token=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)
