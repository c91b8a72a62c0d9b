"""The shape of what a job reports about its runtime (the SDK's ``report_runtime``). Types
only: what is kept and how lives in ``jobs.services.backend_sync``."""

from rest_framework import serializers
from rest_framework.settings import api_settings

from jobs.models import RANK_VERSION_FIELDS
from jobs.serializers.common import reject_unknown

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
    error_at_exit = _report_text(
        "The CUDA or NCCL error the job exits with, reported just before it exits: the "
        "failure attribution reads it (an uncorrectable ECC error is the hardware's)."
    )
    node_list = _report_list("Every node the attempt runs on.")
    gpu_uuids = _report_list("UUID of every GPU the attempt uses (nvidia-smi -L).")

    def to_internal_value(self, data):
        value = reject_unknown(self, data, super().to_internal_value)
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


class _ReportRank(serializers.IntegerField):
    """A rank as sent: an integer, not a string or a boolean that reads as one."""

    def __init__(self, **kwargs):
        super().__init__(min_value=0, **kwargs)

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class RankReportSerializer(serializers.Serializer):
    """What a rank reports of its runtime, once (the ranks other than 0; rank 0 sends the
    full report): the versions that must agree across ranks, and its host. At least one
    version; unknown keys are rejected by name."""

    rank = _ReportRank(
        help_text="The process's global rank: at least 0, below the attempt's GPU count."
    )
    hostname = _report_text("The node the rank runs on, as the cluster names it.")
    nccl_version = _report_text("NCCL version, e.g. 2.21.5.")
    driver_version = _report_text("NVIDIA driver version, e.g. 550.54.15.")
    cuda_version = _report_text("CUDA runtime version, e.g. 12.4.")

    def to_internal_value(self, data):
        value = reject_unknown(self, data, super().to_internal_value)
        if not any(value.get(name) for name in RANK_VERSION_FIELDS):
            raise serializers.ValidationError(
                {
                    api_settings.NON_FIELD_ERRORS_KEY: [
                        f"The report names no version ({', '.join(RANK_VERSION_FIELDS)})."
                    ]
                }
            )
        return value


class RankReportResultSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    run = serializers.IntegerField()
    rank = serializers.IntegerField()
    changed = serializers.BooleanField(
        help_text="False when the rank had reported the same already."
    )
