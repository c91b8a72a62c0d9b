from django.contrib import admin

from images.models import Image, Registry
from tenants.admin import ReadOnlyAdminMixin


@admin.register(Registry)
class RegistryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: registries change through the catalog pages, which validate and audit."""

    list_display = ["name", "url", "auth_kind", "username", "password_secret_ref", "enabled"]
    list_filter = ["auth_kind", "enabled"]
    search_fields = ["name", "url"]


@admin.register(Image)
class ImageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: importing, approving, blocking and who may use an image change through the
    catalog pages, which audit them."""

    list_display = ["repository", "tag", "digest", "status", "visible_to_all", "check_status"]
    list_filter = ["status", "visible_to_all", "check_status", "registry"]
    search_fields = ["repository", "tag", "digest"]
