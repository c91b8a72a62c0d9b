from django.contrib import admin

from clusters.models import Cluster, ClusterFlavor
from tenants.admin import AuditedAdmin, ReadOnlyAdminMixin


class ClusterFlavorInline(ReadOnlyAdminMixin, admin.TabularInline):
    """Capacity comes from the backend's inventory, or the capacity page for simulators."""

    model = ClusterFlavor
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(AuditedAdmin):
    list_display = ["name", "backend", "enabled", "last_sync_at", "last_error"]
    inlines = [ClusterFlavorInline]
    # What the backends report: the sync writes it, nobody edits it.
    readonly_fields = [
        "last_sync_at",
        "last_error",
        "inventory_at",
        "inventory_valid_until",
        "inventory_error",
        "topology_levels",
        "inventory_problems",
        "outside_claims",
    ]
