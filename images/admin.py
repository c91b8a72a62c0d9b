from django.contrib import admin

from images.models import Image, Registry


@admin.register(Registry)
class RegistryAdmin(admin.ModelAdmin):
    """Read-only: registries change through the catalog pages, which validate and audit."""

    list_display = ["name", "url", "auth_kind", "username", "password_secret_ref", "enabled"]
    list_filter = ["auth_kind", "enabled"]
    search_fields = ["name", "url"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["repository", "tag", "digest", "status", "visible_to_all", "check_status"]
    list_filter = ["status", "visible_to_all", "check_status", "registry"]
    search_fields = ["repository", "tag", "digest"]
    filter_horizontal = ["allowed_tenants"]
    readonly_fields = [
        "registry",
        "media_type",
        "architecture",
        "os",
        "created",
        "size_bytes",
        "cuda_version",
        "nccl_version",
        "frameworks",
        "last_checked_at",
        "check_status",
        "check_message",
    ]
