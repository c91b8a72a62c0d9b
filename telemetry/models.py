"""Telemetry stored per attempt: SDK step windows and events, per-GPU minute rollups, the
accounting computed from them (design §7), and the count of samples no attempt claimed."""

from django.conf import settings
from django.db import models
from django.db.models import F

from jobs.models import Attempt, Cluster
from tenants.models import GpuFlavor, Project, Tenant

SOURCE_MAX_LENGTH = 64


class StepWindow(models.Model):
    """An SDK ``step_window`` event: ``steps`` steps over [start, end) and where the time
    went. ``(attempt, source, seq)`` is the SDK's de-duplication key."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="step_windows")
    source = models.CharField(max_length=SOURCE_MAX_LENGTH)
    seq = models.PositiveBigIntegerField()
    start = models.DateTimeField()
    end = models.DateTimeField()
    steps = models.PositiveIntegerField()
    step_time_s = models.FloatField()
    data_wait_s = models.FloatField(default=0)
    comm_wait_s = models.FloatField(default=0)
    checkpoint_s = models.FloatField(default=0)
    step = models.PositiveBigIntegerField(null=True, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["attempt", "start", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "source", "seq"], name="stepwindow_unique_seq"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} {self.source}#{self.seq}: {self.steps} steps"


class SdkEvent(models.Model):
    """Any other SDK event (ready, checkpoint saved / restored), stored as sent."""

    class Type(models.TextChoices):
        READY = "ready", "Ready"
        CHECKPOINT_SAVED = "checkpoint_saved", "Checkpoint saved"
        CHECKPOINT_RESTORED = "checkpoint_restored", "Checkpoint restored"

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="sdk_events")
    source = models.CharField(max_length=SOURCE_MAX_LENGTH)
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=32, choices=Type.choices)
    ts = models.DateTimeField()
    payload = models.JSONField(default=dict, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["attempt", "ts", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "source", "seq"], name="sdkevent_unique_seq"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} {self.source}#{self.seq}: {self.type}"


class GpuMinute(models.Model):
    """One GPU of one attempt during one minute: means of the activity gauges (0–1), the
    minute's largest framebuffer use (MiB), mean power (W) and the samples behind them."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="gpu_minutes")
    host = models.CharField(max_length=255)
    gpu = models.CharField(max_length=16)
    minute = models.DateTimeField()
    activity = models.FloatField(null=True, blank=True)
    sm_active = models.FloatField(null=True, blank=True)
    tensor_active = models.FloatField(null=True, blank=True)
    dram_active = models.FloatField(null=True, blank=True)
    fb_used = models.FloatField(null=True, blank=True)
    power = models.FloatField(null=True, blank=True)
    xid = models.IntegerField(default=0)
    samples = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["attempt", "host", "gpu", "minute"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "host", "gpu", "minute"], name="gpuminute_unique_minute"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} {self.host}/{self.gpu} {self.minute:%Y-%m-%d %H:%M}"


class AttemptAccounting(models.Model):
    """An attempt's allocated GPU-seconds split by design §7, in whole GPU-seconds:
    ``effective + Σ waste == allocated`` exactly."""

    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="accounting")
    allocated_gpu_s = models.BigIntegerField()
    effective_gpu_s = models.BigIntegerField()
    lost_gpu_s = models.BigIntegerField()
    startup_gpu_s = models.BigIntegerField()
    checkpoint_gpu_s = models.BigIntegerField()
    idle_gpu_s = models.BigIntegerField()
    input_wait_gpu_s = models.BigIntegerField()
    comm_wait_gpu_s = models.BigIntegerField()
    activity_weighted_gpu_s = models.FloatField(help_text="Σ activity × time, GPU-seconds")
    queue_s = models.FloatField(null=True, blank=True, help_text="Wall seconds, not GPU-seconds")
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["attempt"]

    def __str__(self) -> str:
        return f"accounting of attempt {self.attempt_id}"

    @property
    def waste_gpu_s(self) -> int:
        return (
            self.lost_gpu_s
            + self.startup_gpu_s
            + self.checkpoint_gpu_s
            + self.idle_gpu_s
            + self.input_wait_gpu_s
            + self.comm_wait_gpu_s
        )


class UnmappedSamples(models.Model):
    """Samples of one source in one minute that matched no attempt: counted, never dropped
    silently, so platform admins can see GPUs used outside Gantry or mapping gaps."""

    minute = models.DateTimeField()
    source = models.CharField(max_length=200)
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-minute", "source"]
        verbose_name_plural = "unmapped samples"
        constraints = [
            models.UniqueConstraint(fields=["minute", "source"], name="unmapped_unique_minute"),
        ]

    def __str__(self) -> str:
        return f"{self.count} unmapped samples from {self.source} at {self.minute:%H:%M}"


class RawScrape(models.Model):
    """One body a telemetry source delivered, as received (zlib-compressed exposition text):
    the raw samples the minute rollups are computed from, kept for
    ``GANTRY_TELEMETRY_RAW_RETENTION_H`` hours so a window can be rolled up again."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    origin = models.CharField(max_length=300)
    fetched_at = models.DateTimeField()
    first_sample_at = models.DateTimeField(null=True, blank=True)
    last_sample_at = models.DateTimeField(null=True, blank=True)
    body = models.BinaryField()
    size = models.PositiveIntegerField(help_text="Uncompressed bytes")
    samples = models.PositiveIntegerField(help_text="Samples of the gauges Gantry keeps")
    rejected = models.PositiveIntegerField(
        default=0, help_text="Malformed, non-finite or out-of-range lines"
    )

    class Meta:
        ordering = ["cluster", "fetched_at", "id"]
        indexes = [
            models.Index(fields=["cluster", "last_sample_at"], name="rawscrape_cluster_last"),
            models.Index(fields=["fetched_at"], name="rawscrape_fetched"),
        ]

    def __str__(self) -> str:
        return f"{self.origin} at {self.fetched_at:%Y-%m-%d %H:%M:%S}"


class ClusterTelemetry(models.Model):
    """The collector's checkpoint for one cluster: how far its source has been read and how
    far minute rollups are final. Advanced in the same transaction as the rows it covers,
    so a crash repeats a window instead of skipping or double-counting it."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="telemetry")
    fetched_until = models.DateTimeField(null=True, blank=True)
    rolled_up_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster"]
        verbose_name_plural = "cluster telemetry"

    def __str__(self) -> str:
        return f"telemetry of {self.cluster_id}"


# --- finance ---------------------------------------------------------------------------------


class RateCard(models.Model):
    """The price of one GPU-hour of a flavor from ``valid_from`` (00:00 UTC) until the next
    card of the flavor starts. A flavor's cards follow each other without gaps or overlaps:
    adding a card ends the one before it (design §8)."""

    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="rate_cards")
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3, help_text="ISO 4217 code, e.g. EUR")
    valid_from = models.DateField()
    valid_to = models.DateField(null=True, blank=True, help_text="Exclusive; empty: open-ended")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
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
    """GPU-seconds and cost of one UTC day, per tenant, project, user, flavor and cluster,
    from attempt accounting (design §8). Rebuilt a whole day at a time, so rebuilding a day
    gives the same rows; the days of an attempt add up to its accounting exactly."""

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
    idle_gpu_s = models.BigIntegerField()
    input_wait_gpu_s = models.BigIntegerField()
    comm_wait_gpu_s = models.BigIntegerField()
    unpriced_gpu_s = models.BigIntegerField(help_text="GPU-seconds no rate card covered")
    cost = models.DecimalField(max_digits=16, decimal_places=2)
    effective_cost = models.DecimalField(max_digits=16, decimal_places=2)

    class Meta:
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
    def waste_cost(self):
        return self.cost - self.effective_cost


class UsageRollupState(models.Model):
    """Where the DailyUsage rollup stands (one row): accounting computed after
    ``accounted_until`` is not in DailyUsage yet; days from ``rates_changed_from`` on must
    be priced again."""

    accounted_until = models.DateTimeField(null=True, blank=True)
    rates_changed_from = models.DateField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"daily usage up to accounting of {self.accounted_until}"
