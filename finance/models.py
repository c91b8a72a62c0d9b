"""Finance (design §8): rate cards per flavor, effective-dated; the per-day rollup of attempt
accounting the statements are read from, and where that rollup stands.

The tables keep the names they had when these models lived in ``telemetry``: moving the
models to this app changed Django's state only (``finance/migrations/0001_initial.py``)."""

from django.conf import settings
from django.db import models
from django.db.models import F

from clusters.models import Cluster
from tenants.models import GpuFlavor, Project, Tenant


class RateCard(models.Model):
    """The price of one GPU-hour of a flavor from ``valid_from`` (00:00 UTC) until the next
    card of the flavor starts. A flavor's cards follow each other without gaps or overlaps:
    adding a card ends the one before it (design §8). ``credit_policy`` says whether the
    GPU-seconds a platform or hardware fault cost (lost + startup) are credited or charged
    under it."""

    class CreditPolicy(models.TextChoices):
        CREDIT = "credit", "Credit platform and hardware failures"
        CHARGE = "charge", "Charge them like any other GPU time"

    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="rate_cards")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3, help_text="ISO 4217 code, e.g. EUR")
    valid_from = models.DateField()
    valid_to = models.DateField(null=True, blank=True, help_text="Exclusive; empty: open-ended")
    credit_policy = models.CharField(
        max_length=6, choices=CreditPolicy.choices, default=CreditPolicy.CREDIT
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "telemetry_ratecard"
        ordering = ["flavor", "valid_from"]
        constraints = [
            models.UniqueConstraint(fields=["flavor", "valid_from"], name="ratecard_unique_start"),
            models.CheckConstraint(
                condition=models.Q(price_per_gpu_hour__gte=0), name="ratecard_price_not_negative"
            ),
            models.CheckConstraint(
                condition=models.Q(valid_to__isnull=True) | models.Q(valid_to__gt=F("valid_from")),
                name="ratecard_ends_after_it_starts",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.flavor_id}: {self.price_per_gpu_hour} {self.currency} from {self.valid_from}"


class DailyUsage(models.Model):
    """GPU-seconds of one UTC day, per tenant, project, user, flavor and cluster, from
    attempt accounting (design §8), and the rate card that prices them. Rebuilt a whole day
    at a time, so rebuilding a day gives the same rows; the days of an attempt add up to its
    accounting exactly.

    No money is stored: rate cards start at 00:00 UTC, so a flavor's day has one price, and
    a statement line's cost is its whole GPU-seconds × that price, rounded once
    (``finance.costing.line_cost``)."""

    date = models.DateField()
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    attempts = models.PositiveIntegerField(help_text="Attempts with GPU time on this day")
    allocated_gpu_s = models.BigIntegerField()
    effective_gpu_s = models.BigIntegerField()
    lost_gpu_s = models.BigIntegerField()
    startup_gpu_s = models.BigIntegerField()
    checkpoint_gpu_s = models.BigIntegerField()
    interactive_idle_gpu_s = models.BigIntegerField(default=0, db_default=0)
    idle_gpu_s = models.BigIntegerField()
    input_wait_gpu_s = models.BigIntegerField()
    comm_wait_gpu_s = models.BigIntegerField()
    unpriced_gpu_s = models.BigIntegerField(help_text="GPU-seconds no rate card covered")
    # Per credited cause (telemetry.models.CREDITED_CAUSES): GPU-seconds not charged because
    # a hardware or platform fault ended the attempt; charged = allocated - both.
    credited_hardware_gpu_s = models.BigIntegerField(default=0)
    credited_platform_gpu_s = models.BigIntegerField(default=0)
    rate_card = models.ForeignKey(
        RateCard,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The card in force on the day; empty: no card, the GPU-seconds are unpriced",
    )

    class Meta:
        db_table = "telemetry_dailyusage"
        ordering = ["date", "tenant", "project", "user", "flavor", "cluster"]
        constraints = [
            models.UniqueConstraint(
                fields=["date", "tenant", "project", "user", "flavor", "cluster"],
                name="dailyusage_unique_key",
            ),
        ]
        indexes = [models.Index(fields=["tenant", "date"], name="dailyusage_tenant_date")]
        verbose_name_plural = "daily usage"

    def __str__(self) -> str:
        return f"{self.date} {self.tenant_id}/{self.project_id} {self.allocated_gpu_s} GPU-s"

    @property
    def waste_gpu_s(self) -> int:
        return self.allocated_gpu_s - self.effective_gpu_s

    @property
    def credited_gpu_s(self) -> int:
        return self.credited_hardware_gpu_s + self.credited_platform_gpu_s

    @property
    def charged_gpu_s(self) -> int:
        return self.allocated_gpu_s - self.credited_gpu_s


class UsageRollupState(models.Model):
    """Where the DailyUsage rollup stands (one row): accounting computed after
    ``accounted_until`` is not in DailyUsage yet; days from ``rates_changed_from`` on must
    be priced again."""

    accounted_until = models.DateTimeField(null=True, blank=True)
    rates_changed_from = models.DateField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "telemetry_usagerollupstate"

    def __str__(self) -> str:
        return f"daily usage up to accounting of {self.accounted_until}"
