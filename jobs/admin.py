from django.contrib import admin

from jobs.models import Attempt, Experiment, ExperimentTemplate, Run, RunEvent
from tenants.admin import ReadOnlyAdminMixin


@admin.register(Experiment)
class ExperimentAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The reproducibility record: never edited."""

    list_display = ["id", "name", "tenant", "project", "owner", "flavor", "created_at"]
    list_filter = ["tenant", "flavor"]
    search_fields = ["name", "image_reference", "code_commit"]


class AttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Attempt
    extra = 0
    fields = ["number", "cluster", "state", "backend_job_id", "failure_reason", "exit_code"]


@admin.register(Run)
class RunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Runs move through their lifecycle services only (each transition a RunEvent)."""

    list_display = ["id", "tenant", "state", "flavor", "gpus", "cluster", "submitted_at"]
    list_filter = ["state", "tenant", "flavor"]
    inlines = [AttemptInline]


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["at", "run", "from_state", "to_state", "reason"]
    list_filter = ["reason"]


@admin.register(ExperimentTemplate)
class ExperimentTemplateAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Templates change on the template pages, which check and audit them."""

    list_display = ["name", "tenant", "updated_at"]
    list_filter = ["tenant"]
    search_fields = ["name", "description"]
