from django.contrib import admin

from finance.models import DailyUsage, RateCard
from tenants.admin import ReadOnlyAdminMixin

# Rate cards are written by a service that keeps their chain and audits it; daily usage is
# rebuilt from attempt accounting. Shown here, never edited by hand.


@admin.register(RateCard)
class RateCardAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Cards are added through the finance pages, which keep the chain of cards without gaps
    or overlaps, reprice the days after a change and audit it."""

    list_display = ("flavor", "price_per_gpu_hour", "currency", "valid_from", "valid_to")
    list_filter = ("flavor",)


@admin.register(DailyUsage)
class DailyUsageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "date",
        "tenant",
        "project",
        "user",
        "flavor",
        "cluster",
        "allocated_gpu_s",
        "rate_card",
    )
    list_filter = ("tenant", "flavor")
    date_hierarchy = "date"
