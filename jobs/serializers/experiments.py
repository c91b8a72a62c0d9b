"""Shapes of the experiments API: a request to submit one, and the reproducibility record.
Types only: every rule lives in ``jobs.services.submission``."""

from rest_framework import serializers

from jobs.experiment_fields import INPUT_FIELDS, RECORD_ORDER, ExperimentField
from jobs.models import Experiment, TopologyMode
from jobs.serializers.common import reject_unknown
from jobs.services.submission import ExperimentInput
from tenants.models import GpuFlavor, Project, Tenant


def _input(field: ExperimentField) -> serializers.Field:
    """The API's parser of one field: its type, its length and whether it may be left out.
    The other limits are the service's to check, with its messages, except an id's: out of
    range, it is no experiment."""
    options: dict = {"help_text": field.doc} if field.doc else {}
    if not field.required:
        options["default"] = dict if field.default == {} else field.default
    if field.choices:
        return serializers.ChoiceField(choices=TopologyMode.choices, allow_blank=True, **options)
    if field.type == "object":
        child: serializers.Field = serializers.JSONField()
        if field.name == "env":  # names to strings, as given
            child = serializers.CharField(allow_blank=True, trim_whitespace=False)
        return serializers.DictField(child=child, **options)
    if field.type == "integer":
        if field.default is None:
            return serializers.IntegerField(
                min_value=field.minimum, max_value=field.maximum, allow_null=True, **options
            )
        return serializers.IntegerField(**options)
    if field.widget == "textarea":  # a shell command, as typed
        return serializers.CharField(allow_blank=True, trim_whitespace=False, **options)
    return serializers.CharField(
        max_length=field.max_length, allow_blank=not field.required, **options
    )


class ExperimentInputSerializer(serializers.Serializer):
    """The fields of ``jobs.services.submission.ExperimentInput``, from
    ``jobs.experiment_fields``; unknown keys are rejected by name."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {field.name: _input(field) for field in INPUT_FIELDS}

    def to_internal_value(self, data):
        return reject_unknown(self, data, super().to_internal_value)

    def to_experiment_input(self) -> ExperimentInput:
        return ExperimentInput(**self.validated_data)


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
        # Whose it is, then the record's fields in the order of its diff.
        fields = [
            "id",
            "tenant",
            "project",
            "owner",
            "name",
            *RECORD_ORDER,
            "total_gpus",
            "cloned_from",
            "created_at",
        ]
        read_only_fields = fields
