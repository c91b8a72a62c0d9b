"""Shapes of the runs API. Types only: every business rule lives in ``jobs.services``."""

import dataclasses
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from jobs.models import (
    Attempt,
    Experiment,
    FailureReason,
    Run,
    RunEvent,
    RunState,
    TopologyMode,
    WaitReason,
)
from jobs.selectors.runs import run_attempts, run_events
from jobs.services.submission import ExperimentInput
from tenants.models import MAX_ID, GpuFlavor, Project, Tenant, max_length_of

_INPUT_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(ExperimentInput)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
}


def _text(name: str, **kwargs) -> serializers.CharField:
    """An optional string, as long as the Experiment column that stores it."""
    return serializers.CharField(
        max_length=max_length_of(Experiment, name),
        allow_blank=True,
        default=_INPUT_DEFAULTS[name],
        **kwargs,
    )


def _reject_unknown(serializer: serializers.Serializer, data, parse):
    """Parse ``data``, reporting unknown keys by name along with every other error."""
    unknown = sorted(set(data) - set(serializer.fields)) if isinstance(data, Mapping) else []
    errors: dict[str, Any] = {}
    try:
        value = parse(data)
    except serializers.ValidationError as exc:
        assert isinstance(exc.detail, dict)  # a serializer's errors are by field
        errors = dict(exc.detail)
    errors.update({name: ["Unknown field."] for name in unknown})
    if errors:
        raise serializers.ValidationError(errors)
    return value


def _reason(choices) -> serializers.ChoiceField:
    # Declared rather than generated: ModelSerializer drops allow_blank from read-only
    # fields, and the schema must admit "" (no reason).
    return serializers.ChoiceField(choices=choices, allow_blank=True, read_only=True)


class ExperimentInputSerializer(serializers.Serializer):
    """The fields of ``jobs.services.ExperimentInput``; unknown keys are rejected by name."""

    tenant = serializers.CharField(max_length=63, help_text="Tenant slug.")
    project = serializers.CharField(max_length=63, help_text="Project slug within the tenant.")
    image = serializers.CharField(
        max_length=400,
        help_text="repository@sha256:<64 hex>, or repository:tag (resolved to a digest at submit).",
    )
    command = serializers.CharField(
        allow_blank=True, trim_whitespace=False, help_text="Shell command, at most 16 KiB."
    )
    flavor = serializers.CharField(max_length=63, help_text="GPU flavor slug, e.g. a100-80gb.")
    nodes = serializers.IntegerField()
    gpus_per_node = serializers.IntegerField()
    name = _text("name")
    code_repository = _text("code_repository")
    code_commit = _text("code_commit", help_text="40 lowercase hex characters.")
    dataset_uri = _text("dataset_uri")
    dataset_version = _text("dataset_version")
    params = serializers.DictField(
        child=serializers.JSONField(),
        default=_INPUT_DEFAULTS["params"],
        help_text="A JSON object of hyperparameters, at most 64 KiB.",
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        default=_INPUT_DEFAULTS["env"],
        help_text="Non-secret environment variables: names to strings.",
    )
    priority = serializers.IntegerField(default=_INPUT_DEFAULTS["priority"])
    max_runtime_minutes = serializers.IntegerField(default=_INPUT_DEFAULTS["max_runtime_minutes"])
    max_restarts = serializers.IntegerField(default=_INPUT_DEFAULTS["max_restarts"])
    checkpoint_dir = _text("checkpoint_dir")
    topology_level = _text(
        "topology_level",
        help_text="A topology level of the clusters (e.g. leaf): the gang's nodes share one "
        "domain of it. Empty: as tight as admission can place it.",
    )
    topology_mode = serializers.ChoiceField(
        choices=TopologyMode.choices,
        allow_blank=True,
        default=_INPUT_DEFAULTS["topology_mode"],
        help_text="required: wait until one domain of the level has room; preferred (also "
        "empty): as tight as the free nodes allow.",
    )
    cloned_from = serializers.IntegerField(
        min_value=1,
        max_value=MAX_ID,
        allow_null=True,
        default=_INPUT_DEFAULTS["cloned_from"],
        help_text="Id of the experiment this one is a clone of: an experiment of the same "
        "tenant that you can read.",
    )

    def to_internal_value(self, data):
        return _reject_unknown(self, data, super().to_internal_value)

    def to_experiment_input(self) -> ExperimentInput:
        return ExperimentInput(**self.validated_data)


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
            "start_latest_at",
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
            "start_expected_at": {
                "help_text": "When a queued run should start, by how long runs like the ones "
                "ahead really take; null when there is no estimate (see start_note)."
            },
            "start_latest_at": {
                "help_text": "When a queued run starts at the latest if every run ahead uses "
                "its whole max runtime and no other work is let in first."
            },
            "start_note": {"help_text": "Why a queued run has no start estimate."},
            "start_estimated_at": {"help_text": "When the estimates were computed."},
        }

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if instance.state != RunState.QUEUED:  # estimates are for waiting runs only
            data |= dict.fromkeys(
                ("start_expected_at", "start_latest_at", "start_estimated_at"), None
            )
            data["start_note"] = ""
        return data


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
            "submitted_at",
            "started_at",
            "finished_at",
            "rendered_spec",
            "runtime_env",
            "gpu_uuids",
            "runtime_reported_at",
        ]
        read_only_fields = fields


class RunEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", read_only=True, allow_null=True)
    # Read from ``run_events``: the admin-only detail for platform admins, else the message.
    message = serializers.CharField(source="shown_message", read_only=True)

    class Meta:
        model = RunEvent
        fields = ["at", "from_state", "to_state", "reason", "message", "actor"]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    image = serializers.CharField(source="experiment.image_reference", read_only=True)
    attempts = serializers.SerializerMethodField()
    events = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "image", "attempts", "events"]
        read_only_fields = fields

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


class ExperimentFilterSerializer(serializers.Serializer):
    tenant = serializers.SlugField(max_length=63, required=False, help_text="Tenant slug.")


class ExperimentSerializer(serializers.ModelSerializer):
    """The reproducibility record: everything needed to run the same thing again."""

    tenant: "serializers.SlugRelatedField[Tenant]" = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    project: "serializers.SlugRelatedField[Project]" = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    owner = serializers.CharField(source="owner.username", read_only=True)
    image = serializers.CharField(source="image_reference", read_only=True)
    flavor: "serializers.SlugRelatedField[GpuFlavor]" = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    total_gpus = serializers.IntegerField(read_only=True)
    params = serializers.DictField(child=serializers.JSONField(), read_only=True)
    env = serializers.DictField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = Experiment
        fields = [
            "id",
            "tenant",
            "project",
            "owner",
            "name",
            "image",
            "command",
            "env",
            "code_repository",
            "code_commit",
            "dataset_uri",
            "dataset_version",
            "params",
            "flavor",
            "nodes",
            "gpus_per_node",
            "total_gpus",
            "topology_level",
            "topology_mode",
            "priority",
            "max_runtime_minutes",
            "max_restarts",
            "checkpoint_dir",
            "cloned_from",
            "gantry_version",
            "created_at",
        ]
        read_only_fields = fields


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


# --- the job's runtime report ---------------------------------------------------------------

MAX_REPORT_TEXT = 200
MAX_REPORT_ITEMS = 1024
MAX_REPORT_FRAMEWORKS = 64


class _ReportText(serializers.CharField):
    """A string as sent: numbers are not turned into text, so what is stored is what the
    job wrote."""

    def __init__(self, **kwargs):
        super().__init__(max_length=MAX_REPORT_TEXT, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


def _report_text(help_text: str) -> serializers.CharField:
    return _ReportText(required=False, help_text=help_text)


def _report_list(help_text: str) -> serializers.ListField:
    return serializers.ListField(
        child=_ReportText(),
        max_length=MAX_REPORT_ITEMS,
        required=False,
        help_text=help_text,
    )


class RuntimeReportSerializer(serializers.Serializer):
    """What a job reports about where and with what it runs. Every field is optional, but
    a report names at least one; unknown keys are rejected by name."""

    driver_version = _report_text("NVIDIA driver version, e.g. 550.54.15.")
    cuda_version = _report_text("CUDA runtime version, e.g. 12.4.")
    cudnn_version = _report_text("cuDNN version, e.g. 9.1.0.")
    nccl_version = _report_text("NCCL version, e.g. 2.21.5.")
    python_version = _report_text("Python version, e.g. 3.11.9.")
    framework = serializers.DictField(
        child=_ReportText(),
        required=False,
        help_text=f'Framework name to version, e.g. {{"torch": "2.4.0"}}; at most '
        f"{MAX_REPORT_FRAMEWORKS} entries.",
    )
    hostname = _report_text("Host name of the reporting process (rank 0).")
    kernel_version = _report_text("Linux kernel release.")
    node_list = _report_list("Every node the attempt runs on.")
    gpu_uuids = _report_list("UUID of every GPU the attempt uses (nvidia-smi -L).")

    def to_internal_value(self, data):
        value = _reject_unknown(self, data, super().to_internal_value)
        if not value:
            raise serializers.ValidationError(
                {api_settings.NON_FIELD_ERRORS_KEY: ["The report names no field."]}
            )
        return value

    def validate_framework(self, value: dict) -> dict:
        if len(value) > MAX_REPORT_FRAMEWORKS:
            raise serializers.ValidationError(f"At most {MAX_REPORT_FRAMEWORKS} frameworks.")
        if any(not name or len(name) > MAX_REPORT_TEXT for name in value):
            raise serializers.ValidationError(
                f"A framework name has 1 to {MAX_REPORT_TEXT} characters."
            )
        if any("\x00" in name for name in value):  # PostgreSQL's jsonb cannot hold U+0000
            raise serializers.ValidationError("A framework name must not contain NUL characters.")
        return value


class RuntimeReportResultSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    run = serializers.IntegerField()
    changed = serializers.BooleanField(help_text="False when the report repeated what was stored.")
    runtime_env = serializers.DictField(child=serializers.JSONField())
    node_list = serializers.ListField(child=serializers.CharField())
    gpu_uuids = serializers.ListField(child=serializers.CharField())
    runtime_reported_at = serializers.DateTimeField(allow_null=True)
