"""The job-side SDK's events endpoint: parse, call one service, render.

It takes only the job's per-attempt token (the same token, checked the same way, as the
runtime report), which names the one attempt whose events it may write.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from core.api import ATTEMPT_TOKEN_RESPONSES, Conflict, ErrorSerializer
from core.parsers import BoundedJsonTextParser
from jobs.api import AttemptTokenApi, AttemptTokenAuthentication, AttemptTokenScheme
from jobs.models import Attempt
from telemetry.models import SOURCE_MAX_LENGTH
from telemetry.selectors.events_attempt import attempt_get_for_events
from telemetry.services import (
    MAX_EVENTS_BODY_BYTES,
    MAX_EVENTS_PER_BATCH,
    AttemptClosed,
    sdk_events_ingest,
)


class EventsTokenAuthentication(AttemptTokenAuthentication):
    """``AttemptTokenAuthentication`` (the same header, checks and answers) through
    ``attempt_get_for_events``: one statement that also reads what the attempt holds, which
    its ranks' windows are checked against. Every rank of a job posts here."""

    def attempt_for(self, token: str) -> Attempt | None:
        return attempt_get_for_events(token=token)


class EventsTokenScheme(OpenApiAuthenticationExtension):
    """In the API's schema, the events endpoint asks for the runtime report's scheme,
    ``attemptToken``, which ``AttemptTokenScheme`` defines, once (a second definition, by
    another class, would be a conflict)."""

    target_class = EventsTokenAuthentication
    name: list[str] = []  # defines none

    def get_security_definition(self, auto_schema):
        return []

    def get_security_requirement(self, auto_schema):
        return {AttemptTokenScheme.name: []}


class EventsParser(BoundedJsonTextParser):
    max_bytes = MAX_EVENTS_BODY_BYTES


class EventBatchSerializer(serializers.Serializer):
    """The envelope; each event is checked by the service, which skips and counts the
    invalid ones instead of failing the batch."""

    # The stubs see Field.source (a str) here; DRF takes declared fields off the class.
    source = serializers.CharField(  # type: ignore[assignment]
        min_length=1, max_length=SOURCE_MAX_LENGTH, trim_whitespace=False
    )
    sdk = serializers.CharField(required=False, allow_blank=True, max_length=200)
    dropped = serializers.IntegerField(required=False, min_value=0, default=0)
    rank = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    events = serializers.ListField(
        child=serializers.JSONField(),
        min_length=1,
        max_length=MAX_EVENTS_PER_BATCH,
        help_text="ready, step_window, checkpoint_saved, checkpoint_restored, rank_window "
        "(docs/sdk.md)",
    )


class EventBatchResultSerializer(serializers.Serializer):
    accepted = serializers.IntegerField(help_text="Events stored now")
    duplicates = serializers.IntegerField(help_text="Events already stored (a resent batch)")
    rejected = serializers.IntegerField(help_text="Unknown, malformed or refused events, skipped")
    refused = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Rank windows refused, by reason: rank_out_of_range, world_size_mismatch, "
        "gpu_not_held, window_cap",
    )
    messages = serializers.ListField(
        child=serializers.CharField(), help_text="Why, one line per distinct refusal (10 at most)"
    )


@extend_schema(tags=["attempts"])
class AttemptEventsApi(AttemptTokenApi):
    authentication_classes = [EventsTokenAuthentication]
    parser_classes = [EventsParser]

    @extend_schema(
        request=EventBatchSerializer,
        responses={
            202: EventBatchResultSerializer,
            400: OpenApiResponse(
                description="Malformed JSON or envelope, or a body that is not UTF-8 text."
            ),
            **ATTEMPT_TOKEN_RESPONSES,
            413: OpenApiResponse(ErrorSerializer, description="The body is over 256 KiB."),
        },
    )
    def post(self, request):
        """Store a batch of SDK events of the attempt the token was issued for. A resent
        batch changes nothing: its events come back as duplicates."""
        if not isinstance(request.data, dict):
            raise ValidationError({"non_field_errors": ["Expected a JSON object."]})
        envelope = EventBatchSerializer(data=request.data)
        envelope.is_valid(raise_exception=True)
        try:
            result = sdk_events_ingest(
                attempt=request.auth,
                held=request.auth.held_gpus,
                source=envelope.validated_data["source"],
                events=envelope.validated_data["events"],
            )
        except AttemptClosed as exc:
            raise Conflict(str(exc)) from None
        return Response(EventBatchResultSerializer(result).data, status=status.HTTP_202_ACCEPTED)
