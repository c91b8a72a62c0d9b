from django.contrib import admin

from jobs.models import (
    Attempt,
    Cluster,
    ClusterFlavor,
    Experiment,
    ExperimentTemplate,
    Run,
    RunEvent,
)


class ClusterFlavorInline(admin.TabularInline):
    model = ClusterFlavor
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "backend", "enabled", "last_sync_at", "last_error"]
    inlines = [ClusterFlavorInline]


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "tenant", "project", "owner", "flavor", "created_at"]
    list_filter = ["tenant", "flavor"]
    search_fields = ["name", "image_reference", "code_commit"]
    raw_id_fields = ["owner", "image", "cloned_from"]


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    fields = ["number", "cluster", "state", "backend_job_id", "failure_reason", "exit_code"]
    readonly_fields = fields
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "state", "flavor", "gpus", "cluster", "submitted_at"]
    list_filter = ["state", "tenant", "flavor"]
    raw_id_fields = ["experiment", "submitted_by"]
    inlines = [AttemptInline]


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ["at", "run", "from_state", "to_state", "reason"]
    list_filter = ["reason"]
    raw_id_fields = ["run", "attempt", "actor"]


@admin.register(ExperimentTemplate)
class ExperimentTemplateAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "updated_at"]
    list_filter = ["tenant"]
    search_fields = ["name", "description"]
    raw_id_fields = ["created_by"]
