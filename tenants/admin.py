from django.contrib import admin

from tenants.models import ApiToken, AuditEvent, GpuFlavor, Membership, Project, Quota, Tenant


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "cost_center", "active"]
    search_fields = ["slug", "name"]
    inlines = [ProjectInline, MembershipInline, QuotaInline]


@admin.register(GpuFlavor)
class GpuFlavorAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "memory_gb", "gpu_fraction"]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["tenant", "flavor", "guaranteed_gpus", "borrow_limit_gpus"]
    list_filter = ["flavor"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "tenant", "action", "target"]
    list_filter = ["action"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "prefix", "created_at", "expires_at", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
