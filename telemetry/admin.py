from django.contrib import admin

from telemetry.models import (
    AttemptAccounting,
    ClusterTelemetry,
    GpuMinute,
    RawScrape,
    SdkEvent,
    StepWindow,
    UnmappedSamples,
)
from tenants.admin import ReadOnlyAdminMixin

# Telemetry is what machines measured and what Gantry computed from it: shown here, never
# edited by hand (accounting and statements are recomputed from it).


@admin.register(StepWindow)
class StepWindowAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("attempt", "source", "seq", "start", "end", "steps", "step_time_s")
    list_select_related = ("attempt",)
    raw_id_fields = ("attempt",)
    search_fields = ("=attempt__id", "source")


@admin.register(SdkEvent)
class SdkEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("attempt", "source", "seq", "type", "ts")
    list_filter = ("type",)
    list_select_related = ("attempt",)
    raw_id_fields = ("attempt",)
    search_fields = ("=attempt__id", "source")


@admin.register(GpuMinute)
class GpuMinuteAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("attempt", "host", "gpu", "minute", "activity", "samples")
    list_select_related = ("attempt",)
    raw_id_fields = ("attempt",)
    search_fields = ("=attempt__id", "host")


@admin.register(AttemptAccounting)
class AttemptAccountingAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "attempt",
        "allocated_gpu_s",
        "effective_gpu_s",
        "lost_gpu_s",
        "idle_gpu_s",
        "input_wait_gpu_s",
        "computed_at",
    )
    list_select_related = ("attempt",)
    raw_id_fields = ("attempt",)


@admin.register(UnmappedSamples)
class UnmappedSamplesAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("minute", "source", "count")
    list_filter = ("source",)


@admin.register(RawScrape)
class RawScrapeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("cluster", "origin", "fetched_at", "size", "samples", "rejected")
    list_filter = ("cluster",)
    exclude = ("body",)  # compressed bytes: nothing to read


@admin.register(ClusterTelemetry)
class ClusterTelemetryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("cluster", "fetched_until", "rolled_up_until", "last_error_at", "updated_at")
