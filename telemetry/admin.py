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


@admin.register(StepWindow)
class StepWindowAdmin(admin.ModelAdmin):
    list_display = ("attempt", "source", "seq", "start", "end", "steps", "step_time_s")
    list_select_related = ("attempt",)
    raw_id_fields = ("attempt",)
    search_fields = ("=attempt__id", "source")


@admin.register(SdkEvent)
class SdkEventAdmin(admin.ModelAdmin):
    list_display = ("attempt", "source", "seq", "type", "ts")
    list_filter = ("type",)
    list_select_related = ("attempt",)
    raw_id_fields = ("attempt",)
    search_fields = ("=attempt__id", "source")


@admin.register(GpuMinute)
class GpuMinuteAdmin(admin.ModelAdmin):
    list_display = ("attempt", "host", "gpu", "minute", "activity", "samples")
    list_select_related = ("attempt",)
    raw_id_fields = ("attempt",)
    search_fields = ("=attempt__id", "host")


@admin.register(AttemptAccounting)
class AttemptAccountingAdmin(admin.ModelAdmin):
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
class UnmappedSamplesAdmin(admin.ModelAdmin):
    list_display = ("minute", "source", "count")
    list_filter = ("source",)


@admin.register(RawScrape)
class RawScrapeAdmin(admin.ModelAdmin):
    list_display = ("cluster", "origin", "fetched_at", "size", "samples", "rejected")
    list_filter = ("cluster",)
    exclude = ("body",)  # compressed bytes: nothing to read in a form


@admin.register(ClusterTelemetry)
class ClusterTelemetryAdmin(admin.ModelAdmin):
    list_display = ("cluster", "fetched_until", "rolled_up_until", "last_error_at", "updated_at")
