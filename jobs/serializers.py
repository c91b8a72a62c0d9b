"""Shapes of the runs API. Types only: every business rule lives in ``jobs.services``."""

import dataclasses
from collections.abc import Mapping

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import (
    Attempt,
    Experiment,
    FailureReason,
    Run,
    RunEvent,
    RunState,
    WaitReason,
)
from jobs.selectors import run_attempts, run_events
from jobs.services import ExperimentInput

_INPUT_DEFAULTS = {
    f.name: f.default_factory if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(ExperimentInput)
    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
}


def _text(name: str, **kwargs) -> serializers.CharField:
    """An optional string, as long as the Experiment column that stores it."""
    return serializers.CharField(
        max_length=Experiment._meta.get_field(name).max_length,
        allow_blank=True,
        default=_INPUT_DEFAULTS[name],
        **kwargs,
    )


def _reason(choices) -> serializers.ChoiceField:
    # Declared rather than generated: ModelSerializer drops allow_blank from read-only
    # fields, and the schema must admit "" (no reason).
    return serializers.ChoiceField(choices=choices, allow_blank=True, read_only=True)


class ExperimentInputSerializer(serializers.Serializer):
    """The fields of ``jobs.services.ExperimentInput``; unknown keys are rejected by name."""

    tenant = serializers.CharField(max_length=63, help_text="Tenant slug.")
    project = serializers.CharField(max_length=63, help_text="Project slug within the tenant.")
    image = serializers.CharField(
        max_length=400, help_text="Pinned by digest: repository@sha256:<64 hex>."
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

    def to_internal_value(self, data):
        unknown = sorted(set(data) - set(self.fields)) if isinstance(data, Mapping) else []
        errors = {}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            errors = dict(exc.detail)
        errors.update({name: ["Unknown field."] for name in unknown})
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def to_experiment_input(self) -> ExperimentInput:
        return ExperimentInput(**self.validated_data)


class RunSerializer(serializers.ModelSerializer):
    experiment_name = serializers.CharField(source="experiment.name", read_only=True)
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project = serializers.CharField(source="experiment.project.slug", read_only=True)
    flavor = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    submitted_by = serializers.CharField(source="submitted_by.username", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True, allow_null=True)
    wait_reason = _reason(WaitReason.choices)
    failure_reason = _reason(FailureReason.choices)

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


class AttemptSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    node_list = serializers.ListField(child=serializers.CharField(), read_only=True)
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
            "exit_code",
            "failure_reason",
            "failure_message",
            "submitted_at",
            "started_at",
            "finished_at",
            "rendered_spec",
        ]
        read_only_fields = fields


class RunEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", read_only=True, allow_null=True)

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
    def get_attempts(self, run: Run) -> list:
        return AttemptSerializer(run_attempts(run=run), many=True).data

    @extend_schema_field(RunEventSerializer(many=True))
    def get_events(self, run: Run) -> list:
        return RunEventSerializer(run_events(run=run), many=True).data


class RunFilterSerializer(serializers.Serializer):
    state = serializers.MultipleChoiceField(
        choices=RunState.choices, required=False, help_text="Repeat to match several states."
    )
    tenant = serializers.SlugField(max_length=63, required=False, help_text="Tenant slug.")


class ExperimentFilterSerializer(serializers.Serializer):
    tenant = serializers.SlugField(max_length=63, required=False, help_text="Tenant slug.")


class ExperimentSerializer(serializers.ModelSerializer):
    """The reproducibility record: everything needed to run the same thing again."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    image = serializers.CharField(source="image_reference", read_only=True)
    flavor = serializers.SlugRelatedField(slug_field="slug", read_only=True)
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
