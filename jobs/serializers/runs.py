"""Shapes of the runs API's runs, attempts and events. Types only: every business rule lives
in ``jobs.services``."""

from datetime import datetime, tzinfo
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from jobs.attribution import cause_words
from jobs.models import (
    Attempt,
    AttemptState,
    CauseClass,
    FailureReason,
    Run,
    RunEvent,
    RunKind,
    RunState,
    WaitReason,
)
from jobs.selectors.estimates import START_RECORD_DAYS, shows_full_limits, start_records
from jobs.selectors.runs import run_attempts, run_events
from tenants.models import GpuFlavor, Tenant


def _reason(choices) -> serializers.ChoiceField:
    # Declared rather than generated: ModelSerializer drops allow_blank from read-only
    # fields, and the schema must admit "" (no reason).
    return serializers.ChoiceField(choices=choices, allow_blank=True, read_only=True)


# --- Output by hand -------------------------------------------------------------------------
# The runs API writes runs, their attempts and their events with a ``to_representation`` of
# their own rather than DRF's generic walk over the field objects (Serializer's), which costs
# most of a run list's CPU: a page of 50 runs is 1,300 values, each looked up through a field
# (get_attribute, None check, to_representation). Reading the attributes directly gives the
# same values for what the ORM returns, keys in the same order; the declared fields stay, as
# the OpenAPI schema of the output. tests/jobs/test_api_output.py proves both alike for runs
# in every state. A field added to Meta.fields must be added to the dict too (the test fails
# until it is).

# DRF's own fields, for what is cheap to leave to them.
_DATETIME = serializers.DateTimeField(read_only=True)
_RUN_STATE = serializers.ChoiceField(choices=RunState.choices, read_only=True)
_RUN_KIND = serializers.ChoiceField(choices=RunKind.choices, read_only=True)
_ATTEMPT_STATE = serializers.ChoiceField(choices=AttemptState.choices, read_only=True)
_WAIT_REASON = serializers.ChoiceField(choices=WaitReason.choices, read_only=True)
_FAILURE_REASON = serializers.ChoiceField(choices=FailureReason.choices, read_only=True)


def _iso_zone() -> tzinfo | None:
    """The time zone DRF's DateTimeField (without a format or zone of its own) writes
    datetimes in when it writes ISO 8601; None when it would not (then ``_datetime`` leaves
    every value to DRF's field)."""
    output_format = api_settings.DATETIME_FORMAT
    if not settings.USE_TZ or output_format is None or output_format.lower() != ISO_8601:
        return None
    return timezone.get_current_timezone()


def _datetime(value: datetime | None, zone: tzinfo | None) -> str | None:
    """``DateTimeField.to_representation``: an aware datetime in ``zone`` (``_iso_zone``)
    as ISO 8601, UTC as Z; anything else through DRF's own field."""
    if value is None:
        return None
    if zone is None or not isinstance(value, datetime) or value.utcoffset() is None:
        return _DATETIME.to_representation(value)
    try:
        text = value.astimezone(zone).isoformat()
    except OverflowError:
        return _DATETIME.to_representation(value)  # DRF's own error
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _string(value: Any) -> str | None:
    return None if value is None else str(value)


def _integer(value: Any) -> int | None:
    return None if value is None else int(value)


def _strings(values: list | None) -> list[str | None] | None:
    """A ListField of CharFields."""
    if values is None:
        return None
    return [None if value is None else str(value) for value in values]


def _json_object(value: dict | None) -> dict[str, Any] | None:
    """A DictField of JSONFields."""
    if value is None:
        return None
    return {str(key): item for key, item in value.items()}


# The columns RunSerializer reads, for a page of runs to load only them (a third less to load
# than whole rows). One it reads but that is missing here costs a query per run
# (test_lists_use_a_fixed_number_of_queries counts them).
RUN_COLUMNS = (
    "id",
    "tenant_id",
    "kind",
    "gpus",
    "priority",
    "submitted_by_id",
    "state",
    "wait_reason",
    "wait_message",
    "start_expected_at",
    "start_full_limits_at",
    "start_note",
    "start_estimated_at",
    "borrowed",
    "failure_reason",
    "restarts",
    "submitted_at",
    "admitted_at",
    "started_at",
    "finished_at",
    "cancel_requested_at",
    "experiment__name",
    "experiment__project__slug",
    "flavor__slug",
    "cluster__name",
)

# The columns RunDetailSerializer reads of a run got through run_get_viewable (which selects
# its tenant and submitter too); its attempts and events come in queries of their own.
RUN_DETAIL_COLUMNS = (
    *RUN_COLUMNS,
    "tenant__slug",
    "submitted_by__username",
    "experiment__image_reference",
)


class RunSerializer(serializers.ModelSerializer):
    experiment_name = serializers.CharField(source="experiment.name", read_only=True)
    tenant: "serializers.SlugRelatedField[Tenant]" = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    project = serializers.CharField(source="experiment.project.slug", read_only=True)
    flavor: "serializers.SlugRelatedField[GpuFlavor]" = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    submitted_by = serializers.CharField(source="submitted_by.username", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True, allow_null=True)
    wait_reason = _reason(WaitReason.choices)
    failure_reason = _reason(FailureReason.choices)
    queue_position = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="A queued run's place in line among the queued runs of its flavor (1 is "
        "next): priority, then submission order.",
    )

    class Meta:
        model = Run
        fields = [
            "id",
            "kind",
            "experiment",
            "experiment_name",
            "tenant",
            "project",
            "flavor",
            "gpus",
            "priority",
            "submitted_by",
            "state",
            "wait_reason",
            "wait_message",
            "queue_position",
            "start_expected_at",
            "start_full_limits_at",
            "start_note",
            "start_estimated_at",
            "cluster",
            "borrowed",
            "failure_reason",
            "restarts",
            "submitted_at",
            "admitted_at",
            "started_at",
            "finished_at",
            "cancel_requested_at",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "kind": {"help_text": "batch, or interactive: a workspace (/api/v1/workspaces/)."},
            "start_expected_at": {
                "help_text": "When a queued run should start, by how long runs like the ones "
                "ahead really take; null when there is no estimate (see start_note)."
            },
            "start_full_limits_at": {
                "help_text": "When a queued run should start if every run ahead uses its "
                "whole max runtime: an estimate, not a promise (a run let in first moves it); "
                "null when there is no estimate (see start_note)."
            },
            "start_note": {"help_text": "Why a queued run has no start estimate."},
            "start_estimated_at": {"help_text": "When the estimates were computed."},
        }

    def to_representation(self, instance: Run) -> dict[str, Any]:
        # By hand (see "Output by hand" above), in the order of Meta.fields.
        zone = _iso_zone()
        queued = instance.state == RunState.QUEUED  # estimates are for waiting runs only
        experiment = instance.experiment
        cluster = instance.cluster
        return {
            "id": int(instance.pk),
            "kind": _RUN_KIND.to_representation(instance.kind),
            "experiment": instance.experiment_id,
            "experiment_name": str(experiment.name),
            "tenant": instance.tenant.slug,
            "project": str(experiment.project.slug),
            "flavor": instance.flavor.slug,
            "gpus": int(instance.gpus),
            "priority": int(instance.priority),
            "submitted_by": str(instance.submitted_by.username),
            "state": _RUN_STATE.to_representation(instance.state),
            "wait_reason": _WAIT_REASON.to_representation(instance.wait_reason),
            "wait_message": str(instance.wait_message),
            "queue_position": _integer(instance.queue_position),
            "start_expected_at": _datetime(instance.start_expected_at, zone) if queued else None,
            "start_full_limits_at": _datetime(instance.start_full_limits_at, zone)
            if queued
            else None,
            "start_note": str(instance.start_note) if queued else "",
            "start_estimated_at": _datetime(instance.start_estimated_at, zone) if queued else None,
            "cluster": None if cluster is None else str(cluster.name),
            "borrowed": bool(instance.borrowed),
            "failure_reason": _FAILURE_REASON.to_representation(instance.failure_reason),
            "restarts": int(instance.restarts),
            "submitted_at": _datetime(instance.submitted_at, zone),
            "admitted_at": _datetime(instance.admitted_at, zone),
            "started_at": _datetime(instance.started_at, zone),
            "finished_at": _datetime(instance.finished_at, zone),
            "cancel_requested_at": _datetime(instance.cancel_requested_at, zone),
        }


class AttemptSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    node_list = serializers.ListField(child=serializers.CharField(), read_only=True)
    gpu_uuids = serializers.ListField(child=serializers.CharField(), read_only=True)
    placement = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="The nodes admission placed the attempt on; node_list is where it runs.",
    )
    runtime_env = serializers.DictField(
        child=serializers.JSONField(),
        read_only=True,
        help_text="What the job reported about its runtime: driver, CUDA, NCCL versions, …",
    )
    failure_reason = _reason(FailureReason.choices)
    cause_class = _reason(CauseClass.choices)
    cause_evidence = serializers.DictField(
        child=serializers.CharField(allow_blank=True),
        read_only=True,
        help_text="What made the cause so: node, gpu, signal, code, at (ISO 8601), detail; "
        "{} when it has none (the attempt's own nodes only, never another tenant's jobs).",
    )
    cause = serializers.SerializerMethodField(
        help_text='The cause in words, e.g. "a hardware fault on its node (XID 79 on GPU 3)".'
    )

    class Meta:
        model = Attempt
        fields = [
            "id",
            "number",
            "state",
            "cluster",
            "backend_job_id",
            "node_list",
            "placement",
            "exit_code",
            "failure_reason",
            "failure_message",
            "cause_class",
            "cause_evidence",
            "cause",
            "submitted_at",
            "started_at",
            "finished_at",
            "rendered_spec",
            "runtime_env",
            "gpu_uuids",
            "runtime_reported_at",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField())
    def get_cause(self, instance: Attempt) -> str:
        return cause_words(instance.cause_class, instance.cause_evidence or {})

    def to_representation(self, instance: Attempt) -> dict[str, Any]:
        # By hand (see "Output by hand" above), in the order of Meta.fields.
        zone = _iso_zone()
        return {
            "id": int(instance.pk),
            "number": int(instance.number),
            "state": _ATTEMPT_STATE.to_representation(instance.state),
            "cluster": str(instance.cluster.name),
            "backend_job_id": str(instance.backend_job_id),
            "node_list": _strings(instance.node_list),
            "placement": _strings(instance.placement),
            "exit_code": _integer(instance.exit_code),
            "failure_reason": _FAILURE_REASON.to_representation(instance.failure_reason),
            "failure_message": str(instance.failure_message),
            "cause_class": str(instance.cause_class),
            "cause_evidence": {
                str(key): str(value) for key, value in (instance.cause_evidence or {}).items()
            },
            "cause": cause_words(instance.cause_class, instance.cause_evidence or {}),
            "submitted_at": _datetime(instance.submitted_at, zone),
            "started_at": _datetime(instance.started_at, zone),
            "finished_at": _datetime(instance.finished_at, zone),
            "rendered_spec": str(instance.rendered_spec),
            "runtime_env": _json_object(instance.runtime_env),
            "gpu_uuids": _strings(instance.gpu_uuids),
            "runtime_reported_at": _datetime(instance.runtime_reported_at, zone),
        }


class RunEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", read_only=True, allow_null=True)
    # Read from ``run_events``: the admin-only detail for platform admins, else the message.
    message = serializers.CharField(source="shown_message", read_only=True)

    class Meta:
        model = RunEvent
        fields = ["at", "from_state", "to_state", "reason", "message", "actor"]
        read_only_fields = fields

    def to_representation(self, instance: RunEvent) -> dict[str, Any]:
        # By hand (see "Output by hand" above), in the order of Meta.fields.
        actor = instance.actor
        return {
            "at": _datetime(instance.at, _iso_zone()),
            "from_state": str(instance.from_state),
            "to_state": str(instance.to_state),
            "reason": str(instance.reason),
            "message": _string(instance.shown_message),  # type: ignore[attr-defined]
            "actor": None if actor is None else str(actor.username),
        }


class RestartExcludingSerializer(serializers.Serializer):
    """What restarting a run without one of its nodes takes: the node, by the cluster's name
    for it (a straggler flag's ``node``)."""

    node = serializers.CharField(
        max_length=253,
        help_text="The node to leave out: one of the nodes the run's live attempt runs on.",
    )


class StartRecordSerializer(serializers.Serializer):
    """The track record of the full-limits estimate (``jobs.selectors.estimates.StartRecord``)."""

    flavor = serializers.CharField()
    days = serializers.IntegerField(help_text="How far back the record looks.")
    started = serializers.IntegerField(
        help_text="Runs of the flavor that first started in those days with a full-limits "
        "estimate standing."
    )
    met = serializers.IntegerField(help_text="Of those, how many started by it.")
    worst_miss_s = serializers.FloatField(
        allow_null=True,
        help_text="The furthest any of them started after it, in seconds; null if none did.",
    )
    last_met_at = serializers.DateTimeField(
        allow_null=True, help_text="The latest start of one that met its estimate."
    )


class RunDetailSerializer(RunSerializer):
    image = serializers.CharField(source="experiment.image_reference", read_only=True)
    attempts = serializers.SerializerMethodField()
    events = serializers.SerializerMethodField()
    start_record = serializers.SerializerMethodField(
        help_text="Beside a queued run's start_full_limits_at, how such estimates of its "
        "flavor fared: an estimate, not a promise. Null for a run without one."
    )

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "image", "attempts", "events", "start_record"]
        read_only_fields = fields

    def to_representation(self, instance: Run) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["image"] = str(instance.experiment.image_reference)
        data["attempts"] = self.get_attempts(instance)
        data["events"] = self.get_events(instance)
        data["start_record"] = self.get_start_record(instance)
        return data

    @extend_schema_field(StartRecordSerializer(allow_null=True))
    def get_start_record(self, run: Run) -> dict[str, Any] | None:
        if not shows_full_limits(run):
            return None
        flavor = run.flavor.slug
        record = start_records(flavors=[flavor], now=timezone.now())[flavor]
        return {
            "flavor": record.flavor,
            "days": START_RECORD_DAYS,
            "started": record.started,
            "met": record.met,
            "worst_miss_s": record.worst_miss_s,
            "last_met_at": _datetime(record.last_met_at, _iso_zone()),
        }

    @extend_schema_field(AttemptSerializer(many=True))
    def get_attempts(self, run: Run) -> list[Any]:
        # The stubs type .data of every Serializer as a dict; with many=True it is a list.
        return AttemptSerializer(run_attempts(run=run), many=True).data  # type: ignore[return-value]

    @extend_schema_field(RunEventSerializer(many=True))
    def get_events(self, run: Run) -> list[Any]:
        # The stubs type .data of every Serializer as a dict; with many=True it is a list.
        # Without a request (no viewer known) the timeline is the one every member reads.
        request = self.context.get("request")
        viewer = request.user if request is not None else AnonymousUser()
        events = run_events(run=run, user=viewer)
        return RunEventSerializer(events, many=True).data  # type: ignore[return-value]


class RunFilterSerializer(serializers.Serializer):
    state = serializers.MultipleChoiceField(
        choices=RunState.choices, required=False, help_text="Repeat to match several states."
    )
    tenant = serializers.SlugField(max_length=63, required=False, help_text="Tenant slug.")
