"""Shapes of the workspaces API. Types only: the rules live in ``jobs.services.workspaces``,
what a card says in ``jobs.workspace_card`` (through ``jobs.selectors.workspaces``)."""

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from jobs.models import RunState, WaitReason, WorkspaceServer
from jobs.serializers.common import reject_unknown
from jobs.services.workspaces import WorkspaceInput
from jobs.workspace_card import PHASES
from tenants.models import WORKSPACE_MAX_HOURS


class WorkspaceInputSerializer(serializers.Serializer):
    """The fields of ``jobs.services.workspaces.WorkspaceInput``; unknown keys are rejected
    by name. The service checks the rest (membership, image, flavor, the tenant's hours)."""

    tenant = serializers.SlugField(max_length=63)
    project = serializers.SlugField(max_length=63)
    image = serializers.CharField(
        max_length=400, help_text="repository@sha256:<digest>, or repository:tag."
    )
    flavor = serializers.SlugField(max_length=63)
    gpus = serializers.IntegerField(min_value=1, max_value=64, help_text="On one node.")
    server = serializers.ChoiceField(
        choices=WorkspaceServer.choices, default=WorkspaceServer.JUPYTER
    )
    name = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    hours = serializers.IntegerField(
        min_value=1,
        max_value=WORKSPACE_MAX_HOURS,
        default=4,
        help_text="Its limit; within the tenant's workspace_max_hours, extensions included.",
    )

    def to_internal_value(self, data):
        return reject_unknown(self, data, super().to_internal_value)

    def to_workspace_input(self) -> WorkspaceInput:
        return WorkspaceInput(**self.validated_data)


class WorkspaceExtendSerializer(serializers.Serializer):
    hours = serializers.IntegerField(
        min_value=1, max_value=WORKSPACE_MAX_HOURS, help_text="Hours to add to its limit."
    )

    def to_internal_value(self, data):
        return reject_unknown(self, data, super().to_internal_value)


class WorkspaceStepSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField(source="label", help_text="In words, e.g. Server ready.")
    at = serializers.DateTimeField(allow_null=True, help_text="Null: not reached.")


class WorkspaceSerializer(serializers.Serializer):
    """A workspace's card (``jobs.selectors.workspaces.WorkspaceCard``)."""

    id = serializers.IntegerField(source="run.pk", help_text="Its run's id.")
    name = serializers.CharField(source="run.experiment.name")
    tenant = serializers.CharField(source="run.tenant.slug")
    project = serializers.CharField(source="run.experiment.project.slug")
    owner = serializers.CharField(source="run.submitted_by.username")
    server = serializers.ChoiceField(source="workspace.server", choices=WorkspaceServer.choices)
    image = serializers.CharField(source="run.experiment.image_reference")
    flavor = serializers.CharField(source="run.flavor.slug")
    gpus = serializers.IntegerField(source="run.gpus")
    state = serializers.ChoiceField(source="run.state", choices=RunState.choices)
    phase = serializers.ChoiceField(choices=[(phase, phase) for phase in PHASES])
    wait_reason = serializers.ChoiceField(
        source="run.wait_reason", choices=WaitReason.choices, allow_blank=True
    )
    wait_message = serializers.CharField(source="run.wait_message", allow_blank=True)
    start_expected_at = serializers.DateTimeField(
        source="run.start_expected_at",
        allow_null=True,
        help_text="While queued: when it should start.",
    )
    start_full_limits_at = serializers.DateTimeField(
        source="run.start_full_limits_at",
        allow_null=True,
        help_text="While queued: when it starts at the latest if every run ahead uses its "
        "whole time limit.",
    )
    limit_minutes = serializers.SerializerMethodField(
        help_text="Its limit: the hours it was launched with and every extension."
    )
    extended_minutes = serializers.IntegerField(source="workspace.extended_minutes")
    time_left_s = serializers.SerializerMethodField(
        help_text="Seconds it may still run; null before it started and once it ended."
    )
    url = serializers.CharField(
        allow_blank=True,
        help_text="Where it opens (through Gantry's proxy): only for its owner, once its "
        "server answers; else empty.",
    )
    idle_warning = serializers.CharField(
        allow_blank=True,
        help_text="While its owner is warned of it being idle: the warning (why, since when, "
        "when it will be suspended); else empty.",
    )
    steps = WorkspaceStepSerializer(many=True)
    can_extend = serializers.BooleanField()
    can_stop = serializers.BooleanField()

    def get_limit_minutes(self, card) -> int:
        return int(card.run.experiment.max_runtime_minutes + card.workspace.extended_minutes)

    def get_time_left_s(self, card) -> int | None:
        return None if card.time_left is None else int(card.time_left.total_seconds())


# The page is one object, though it answers a list action (which the schema would make an array).
@extend_schema_serializer(many=False)
class WorkspacePageSerializer(serializers.Serializer):
    next = serializers.URLField(
        allow_null=True, help_text="Older workspaces; null on the last page."
    )
    previous = serializers.URLField(
        allow_null=True, help_text="Newer workspaces; null on the newest page."
    )
    results = WorkspaceSerializer(many=True)
