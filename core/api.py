"""What every app's API shares: the error body, the answers several endpoints document
alike, and the 409 of a request that conflicts with the current state."""

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers, status
from rest_framework.exceptions import APIException


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


NOT_FOUND = OpenApiResponse(ErrorSerializer, description="Missing, or of another tenant.")
UNAUTHENTICATED = OpenApiResponse(
    ErrorSerializer, description="No credentials, or an invalid, expired or revoked token."
)
# The answers every attempt-token endpoint shares, for its OpenAPI schema.
ATTEMPT_TOKEN_RESPONSES = {
    401: OpenApiResponse(
        ErrorSerializer, description="No or an invalid attempt token, or its attempt has ended."
    ),
    409: OpenApiResponse(
        ErrorSerializer, description="The attempt ended while the request was handled."
    ),
}


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"
