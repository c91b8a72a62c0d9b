from django.contrib import admin

from images.models import Image


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["repository", "tag", "digest", "status", "visible_to_all"]
    list_filter = ["status", "visible_to_all"]
    search_fields = ["repository", "tag", "digest"]
    filter_horizontal = ["allowed_tenants"]
