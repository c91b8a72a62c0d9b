"""Telemetry stored per attempt: SDK step windows and events, per-GPU minute rollups, the
accounting computed from them (design §7), and the count of samples no attempt claimed."""

from django.db import models

from clusters.models import Cluster
from jobs.models import Attempt, CauseClass, Run
from telemetry import sdk_events
from telemetry.stragglers import Cause

SOURCE_MAX_LENGTH = 64
# The causes whose attempts are credited (issue 34: nobody pays for broken hardware), in the
# order statements list them. The user's own failures are charged.
CREDITED_CAUSES = (CauseClass.HARDWARE, CauseClass.PLATFORM)


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


class RankStepWindow(models.Model):
    """One rank's step window (an SDK ``rank_window`` event): every rank of a job reports
    its own, so a slow rank shows. ``seq`` is the rank's window number; ``(attempt, rank,
    seq)`` is the de-duplication key. At most ``rank_windows.MAX_WINDOWS_PER_RANK_HOUR``
    rows per rank and clock hour (docs/sdk.md): the ingest counts them on the (attempt,
    rank, end) index. The key's index serves every lookup by attempt, so the foreign key
    has none of its own."""

    attempt = models.ForeignKey(
        Attempt, on_delete=models.CASCADE, related_name="rank_windows", db_index=False
    )
    rank = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    world_size = models.PositiveIntegerField()
    local_rank = models.PositiveIntegerField(default=0)
    host = models.CharField(max_length=sdk_events.MAX_HOST_LENGTH)
    gpu = models.CharField(max_length=sdk_events.MAX_GPU_LENGTH)
    start = models.DateTimeField()
    end = models.DateTimeField()
    steps = models.PositiveIntegerField()
    step_time_s = models.FloatField(help_text="Mean wall seconds per step, waits included")
    data_wait_s = models.FloatField(default=0, help_text="Seconds blocked on input in total")
    comm_wait_s = models.FloatField(
        default=0, help_text="Seconds blocked on communication in total"
    )

    class Meta:
        ordering = ["attempt", "rank", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "rank", "seq"], name="rankstepwindow_unique_seq"
            ),
        ]
        indexes = [
            # An attempt's latest window and its last minutes of windows, read from the index
            # whatever its length (the straggler scan: telemetry.straggler_flags).
            models.Index(fields=["attempt", "end"], name="rankstepwindow_attempt_end"),
            # A rank's windows of one clock hour, counted for the hourly cap by the insert
            # (telemetry.services) from at most 360 index entries however long the run.
            models.Index(fields=["attempt", "rank", "end"], name="rankstepwindow_rank_end"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} rank {self.rank} window {self.seq}"


class StragglerFlag(models.Model):
    """A rank of an attempt flagged as a straggler (``telemetry.stragglers.detect``), one row
    per (attempt, rank), kept once flagged: a rank that is no longer slow was slow. Its
    figures are those of the latest scan that flagged it (docs/stragglers.md, "Flags")."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="straggler_flags")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="straggler_flags")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    # The node as the cluster names it (the attempt's node list), else the host the rank
    # reported; the GPU as the rank reported it (an index, or a UUID).
    node = models.CharField(max_length=253)
    gpu = models.CharField(max_length=sdk_events.MAX_GPU_LENGTH)
    rank = models.PositiveIntegerField()
    world_size = models.PositiveIntegerField()
    cause = models.CharField(max_length=16, choices=[(c.value, c.value) for c in Cause])
    slowdown = models.FloatField(help_text="Its time to the collective ÷ the gang's median")
    windows = models.PositiveIntegerField(help_text="Slow windows in the latest scan's look-back")
    first_window = models.PositiveIntegerField(help_text="The window its slowness was first seen")
    evidence = models.JSONField(default=dict, blank=True)
    detected_at = models.DateTimeField()
    updated_at = models.DateTimeField(help_text="The latest scan that found it slow")

    class Meta:
        ordering = ["attempt", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "rank"], name="stragglerflag_unique_rank"),
        ]
        indexes = [
            # A node's flags of the last days (node health's slow-ranks signal, the node
            # pages' counts).
            models.Index(fields=["cluster", "node", "updated_at"], name="stragglerflag_node"),
            models.Index(fields=["updated_at"], name="stragglerflag_recent"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} rank {self.rank} on {self.node}: {self.cause}"


class StragglerScan(models.Model):
    """How far an attempt's rank windows were scanned for stragglers: the latest window end
    seen (a later one calls for another scan), and whether the scan after its end was made
    (``final``: none follows)."""

    attempt = models.OneToOneField(
        Attempt, on_delete=models.CASCADE, primary_key=True, related_name="straggler_scan"
    )
    windows_until = models.DateTimeField()
    scanned_at = models.DateTimeField()
    final = models.BooleanField(default=False)
    # Why the detector could decide nothing, or not everywhere (Detection.notes).
    notes = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"straggler scan of attempt {self.attempt_id} to {self.windows_until:%H:%M:%S}"


class SdkEvent(models.Model):
    """Any other SDK event (ready, checkpoint saved / restored), stored as sent."""

    class Type(models.TextChoices):
        # The SDK's names for them, from the events' schema (step windows are rows of their own).
        READY = sdk_events.READY, "Ready"
        CHECKPOINT_SAVED = sdk_events.CHECKPOINT_SAVED, "Checkpoint saved"
        CHECKPOINT_RESTORED = sdk_events.CHECKPOINT_RESTORED, "Checkpoint restored"

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
    minute's largest framebuffer use (MiB), mean power (W), mean SM clock and its maximum
    (MHz), mean NVLink traffic (bytes/s) and the samples behind them."""

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
    sm_clock_mhz = models.FloatField(null=True, blank=True, help_text="DCGM_FI_DEV_SM_CLOCK")
    max_sm_clock_mhz = models.FloatField(
        null=True, blank=True, help_text="DCGM_FI_DEV_MAX_SM_CLOCK"
    )
    nvlink_bytes_s = models.FloatField(
        null=True,
        blank=True,
        help_text="DCGM_FI_PROF_NVLINK_TX_BYTES + DCGM_FI_PROF_NVLINK_RX_BYTES, bytes/s",
    )
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


class NodeLinkMinute(models.Model):
    """One node's InfiniBand ports during one minute, from the node exporter's counters
    (``telemetry.exposition.node_links``): traffic sent and received over all its ports and
    the growth of their error counters. Per node, not per attempt: a node's links carry
    whatever runs on it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    host = models.CharField(max_length=255)
    minute = models.DateTimeField()
    ib_bytes_s = models.FloatField(
        null=True, blank=True, help_text="Bytes/s transmitted + received, all ports"
    )
    ib_errors = models.PositiveBigIntegerField(
        default=0, help_text="Growth of symbol, link-recovery, link-down and receive errors"
    )
    ports = models.PositiveIntegerField(default=0, help_text="Ports with a traffic rate")
    samples = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster", "host", "minute"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "host", "minute"], name="nodelinkminute_unique_minute"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.host} {self.minute:%Y-%m-%d %H:%M}: {self.ib_bytes_s} B/s"


class AttemptAccounting(models.Model):
    """An attempt's allocated GPU-seconds split by design §7, in whole GPU-seconds:
    ``effective + Σ waste == allocated`` exactly. ``credited_gpu_s`` (lost + startup when
    the cause was the platform's or the hardware's) is not charged, rate cards permitting
    (``finance``)."""

    attempt = models.OneToOneField(Attempt, on_delete=models.CASCADE, related_name="accounting")
    allocated_gpu_s = models.BigIntegerField()
    effective_gpu_s = models.BigIntegerField()
    lost_gpu_s = models.BigIntegerField()
    startup_gpu_s = models.BigIntegerField()
    checkpoint_gpu_s = models.BigIntegerField()
    interactive_idle_gpu_s = models.BigIntegerField(default=0, db_default=0)
    idle_gpu_s = models.BigIntegerField()
    input_wait_gpu_s = models.BigIntegerField()
    comm_wait_gpu_s = models.BigIntegerField()
    activity_weighted_gpu_s = models.FloatField(help_text="Σ activity × time, GPU-seconds")
    queue_s = models.FloatField(null=True, blank=True, help_text="Wall seconds, not GPU-seconds")
    cause_class = models.CharField(
        max_length=10,
        choices=CauseClass.choices,
        blank=True,
        help_text="The attempt's cause class the credit was computed with",
    )
    credited_gpu_s = models.BigIntegerField(
        default=0,
        help_text="Lost + startup GPU-seconds when a platform or hardware cause ended the "
        "attempt; charged = allocated − credited",
    )
    budget_credited = models.JSONField(
        default=dict,
        blank=True,
        help_text="Credited GPU-seconds taken off the tenant's monthly budget ledger so far, "
        "per month (first day, ISO) — kept by finance's rollup",
    )
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["attempt"]

    def __str__(self) -> str:
        return f"accounting of attempt {self.attempt_id}"

    @property
    def charged_gpu_s(self) -> int:
        return self.allocated_gpu_s - self.credited_gpu_s

    @property
    def waste_gpu_s(self) -> int:
        return (
            self.lost_gpu_s
            + self.startup_gpu_s
            + self.checkpoint_gpu_s
            + self.interactive_idle_gpu_s
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
    samples = models.PositiveIntegerField(
        help_text="Samples of the gauges and link counters Gantry keeps"
    )
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
    # Each DCGM health series' last value (telemetry.exposition.health_signals.State), so a
    # counter growing between two fetches is seen, across restarts too.
    health_state = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster"]
        verbose_name_plural = "cluster telemetry"

    def __str__(self) -> str:
        return f"telemetry of {self.cluster_id}"


class WorkspaceIdleSpan(models.Model):
    """A streak of a workspace's attempt idle on every signal (telemetry/workspace_idle.py),
    from its last use; open (``ended_at`` None) while the streak goes on. Its GPU-seconds
    are the attempt's ``interactive_idle`` waste. A streak is kept once it lasted
    ``INTERACTIVE_IDLE_MIN_S`` (a person reading a cell for a minute is not waste)."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="idle_spans")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt"],
                condition=models.Q(ended_at__isnull=True),
                name="workspaceidlespan_one_open",
            ),
            models.CheckConstraint(
                condition=models.Q(ended_at__isnull=True)
                | models.Q(ended_at__gte=models.F("started_at")),
                name="workspaceidlespan_ordered",
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_id} idle from {self.started_at:%Y-%m-%d %H:%M}"
