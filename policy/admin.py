"""What-if reports in Django admin: read only. They are asked for, cancelled and shared on
their pages, where each act is checked and audited."""

from django.contrib import admin

from policy.models import ReplayReport


@admin.register(ReplayReport)
class ReplayReportAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "requested_by", "created_at", "window_start", "window_end")
    list_filter = ("status", "shared")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
