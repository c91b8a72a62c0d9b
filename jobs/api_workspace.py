"""The endpoint a workspace's launcher calls once its server answers (docs/workspaces.md,
"Backends"): the port, with the attempt's token. The host is the backend's word, never the
job's (``jobs.services.workspace_address``)."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error

from core.api import ATTEMPT_TOKEN_RESPONSES, Conflict, ErrorSerializer
from jobs.api import AttemptTokenApi
from jobs.services.workspace_address import (
    PORT_MAX,
    PORT_MIN,
    AddressNotYetKnown,
    workspace_address_record,
)

# Seconds the launcher is asked to wait before it reports again.
RETRY_AFTER_S = 2


class WorkspaceAddressSerializer(serializers.Serializer):
    port = serializers.IntegerField(
        min_value=PORT_MIN,
        max_value=PORT_MAX,
        help_text="The port the workspace's server answers on, on the node the job runs on.",
    )


class WorkspaceAddressResultSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    run = serializers.IntegerField()
    host = serializers.CharField(help_text="Where the proxy connects: the backend's word.")
    port = serializers.IntegerField()
    ready_at = serializers.DateTimeField()


class NotYetKnown(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Where the job runs is not known yet: report again."


@extend_schema(tags=["attempts"])
class WorkspaceAddressApi(AttemptTokenApi):
    @extend_schema(
        request=WorkspaceAddressSerializer,
        responses={
            200: WorkspaceAddressResultSerializer,
            400: OpenApiResponse(description="Field name → list of messages (`port`)."),
            **ATTEMPT_TOKEN_RESPONSES,
            409: OpenApiResponse(
                ErrorSerializer,
                description="Not a workspace, not its run's current attempt, a run that is "
                "not pending or running, or another port already reported.",
            ),
            503: OpenApiResponse(
                ErrorSerializer,
                description="The job's cluster has not said where it runs yet; report again "
                "after Retry-After seconds.",
            ),
        },
    )
    def post(self, request):
        """Report the port of the workspace server the token's attempt runs. The host is
        the one its cluster names for the job. Repeating the report changes nothing."""
        serializer = WorkspaceAddressSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            workspace = workspace_address_record(
                attempt=request.auth, port=serializer.validated_data["port"]
            )
        except AddressNotYetKnown as exc:
            raise NotYetKnown(f"{exc}: report again.") from None
        except DjangoValidationError as exc:
            if "state" in exc.message_dict:
                raise Conflict(" ".join(exc.message_dict["state"])) from None
            raise ValidationError(as_serializer_error(exc)) from None
        result = {
            "attempt": workspace.attempt_id,
            "run": workspace.run_id,
            "host": workspace.host,
            "port": workspace.port,
            "ready_at": workspace.ready_at,
        }
        response = Response(WorkspaceAddressResultSerializer(result).data)
        return response

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        if isinstance(exc, NotYetKnown):
            response["Retry-After"] = str(RETRY_AFTER_S)
        return response
