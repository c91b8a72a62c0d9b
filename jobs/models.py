from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from clusters.models import Cluster
from images.models import Image
from jobs.durations import RunDuration
from jobs.experiment_fields import COMMIT_PATTERN, ExperimentField

# Re-exported: every model of the app is importable from jobs.models.
from jobs.usage_models import BudgetAlert as BudgetAlert
from jobs.usage_models import FairShareUsage as FairShareUsage
from jobs.usage_models import TenantMonthUsage as TenantMonthUsage
from jobs.workspace_models import RunKind
from jobs.workspace_models import Workspace as Workspace
from jobs.workspace_models import WorkspaceServer as WorkspaceServer
from tenants.models import GpuFlavor, Project, Tenant, slug_validator

MAX_COMMAND_BYTES = 16 * 1024
MAX_PARAMS_BYTES = 64 * 1024


class TopologyMode(models.TextChoices):
    PREFERRED = "preferred", "Preferred: as tight as the free nodes allow"
    REQUIRED = "required", "Required: wait until one domain of the level has room"


class Experiment(models.Model):
    """The reproducibility record: everything needed to run the same thing again."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="experiments")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="experiments")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="experiments"
    )
    name = models.CharField(max_length=200)
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="experiments")
    image_reference = models.CharField(max_length=400, help_text="repository@sha256:… as run")
    command = models.TextField()
    env = models.JSONField(default=dict, blank=True)
    code_repository = models.CharField(max_length=500, blank=True)
    code_commit = models.CharField(
        max_length=40, blank=True, validators=[RegexValidator(COMMIT_PATTERN)]
    )
    dataset_uri = models.CharField(max_length=500, blank=True)
    dataset_version = models.CharField(max_length=200, blank=True)
    params = models.JSONField(default=dict, blank=True)
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="+")
    nodes = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpus_per_node = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    priority = models.IntegerField(
        default=50, validators=[MinValueValidator(0), MaxValueValidator(100)]
    )
    max_runtime_minutes = models.PositiveIntegerField(default=24 * 60)
    max_restarts = models.PositiveIntegerField(default=0)
    checkpoint_dir = models.CharField(max_length=500, blank=True)
    # The topology the gang asks for: a level of the clusters' topology (e.g. "leaf") that
    # all its nodes must share (required) or should share (preferred); empty: as tight as
    # admission can place it.
    topology_level = models.CharField(max_length=63, blank=True)
    topology_mode = models.CharField(
        max_length=9, choices=TopologyMode.choices, default=TopologyMode.PREFERRED
    )
    cloned_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="clones"
    )
    # The template it was submitted from, if any: how long that template's runs take
    # predicts how long this one's will (jobs.selectors.estimates).
    template = models.ForeignKey(
        "ExperimentTemplate",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="experiments",
    )
    gantry_version = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The experiments list, newest first (keyset pages, jobs.selectors.experiments).
            models.Index(fields=["tenant", "-created_at", "-id"], name="experiment_tenant_recent"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(nodes__gte=1), name="experiment_nodes_positive"),
            models.CheckConstraint(
                condition=Q(gpus_per_node__gte=1), name="experiment_gpus_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def values_of(self, fields: Iterable[ExperimentField]) -> dict[str, Any]:
        """The values of ``fields`` (``jobs.experiment_fields``) as recorded here, those kept
        as a row of another table by the name a request gives it (a slug, the reference)."""
        return {
            field.name: _RECORDED_AS[field.name](self)
            if field.name in _RECORDED_AS
            else getattr(self, field.name)
            for field in fields
        }

    @property
    def topology_required(self) -> bool:
        return bool(self.topology_level) and self.topology_mode == TopologyMode.REQUIRED

    @property
    def image_repository(self) -> str:
        return self.image_reference.partition("@")[0]

    @property
    def image_digest(self) -> str:
        """``sha256:…`` as run ("" for a reference without a digest)."""
        return self.image_reference.partition("@")[2]


# The experiment fields an Experiment keeps as a row of another table, read as a request
# names them.
_RECORDED_AS: dict[str, Callable[["Experiment"], object]] = {
    "tenant": lambda experiment: experiment.tenant.slug,
    "project": lambda experiment: experiment.project.slug,
    "image": lambda experiment: experiment.image_reference,
    "flavor": lambda experiment: experiment.flavor.slug,
    "cloned_from": lambda experiment: experiment.cloned_from_id,
}


class RunState(models.TextChoices):
    QUEUED = "QUEUED", "Queued"
    ADMITTED = "ADMITTED", "Admitted"
    SUBMITTING = "SUBMITTING", "Submitting"
    PENDING = "PENDING", "Pending on cluster"
    RUNNING = "RUNNING", "Running"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    PREEMPTED = "PREEMPTED", "Preempted"
    # A workspace whose GPUs were released while its files are kept; Resume queues it again.
    SUSPENDED = "SUSPENDED", "Suspended"


# States in which a run holds GPUs of its cluster (as far as admission is concerned).
HOLDING_STATES = (RunState.ADMITTED, RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)
TERMINAL_STATES = (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


class FailureReason(models.TextChoices):
    OOM_GPU = "OOM_GPU", "GPU out of memory"
    OOM_HOST = "OOM_HOST", "Host out of memory"
    NODE_FAILURE = "NODE_FAILURE", "Node failure"
    GPU_XID = "GPU_XID", "GPU error (XID)"
    NCCL = "NCCL", "NCCL / communication error"
    IMAGE_PULL = "IMAGE_PULL", "Image pull failed"
    TIMEOUT = "TIMEOUT", "Time limit reached"
    PREEMPTED = "PREEMPTED", "Preempted"
    CANCELLED = "CANCELLED", "Cancelled"
    USER_EXIT = "USER_EXIT", "Exited with an error"
    LOST = "LOST", "Lost by the backend"
    UNKNOWN = "UNKNOWN", "Unknown"


class CauseClass(models.TextChoices):
    """Whose fault an attempt's end was (design §10): the program's, the platform's, or the
    hardware's. Platform and hardware ends are retried elsewhere and credited."""

    USER = "user", "User"
    PLATFORM = "platform", "Platform"
    HARDWARE = "hardware", "Hardware"


class WaitReason(models.TextChoices):
    QUOTA = "QUOTA", "Guaranteed quota in use, no borrowing"
    BORROW_LIMIT = "BORROW_LIMIT", "Borrow limit reached"
    NO_IDLE = "NO_IDLE", "No idle GPUs to borrow"
    CAPACITY = "CAPACITY", "Not enough GPUs, even by reclaiming"
    BEHIND_HEAD = "BEHIND_HEAD", "Behind an earlier run of the tenant"
    NO_QUOTA = "NO_QUOTA", "No quota for this flavor"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED", "Monthly GPU-hour budget spent"
    TOO_LARGE = "TOO_LARGE", "Larger than the quota allows per run"
    BACKEND = "BACKEND", "Held by the cluster"  # admitted and submitted, not started there


class Run(models.Model):
    """One request to execute an experiment."""

    experiment = models.ForeignKey(Experiment, on_delete=models.PROTECT, related_name="runs")
    # Denormalized from the experiment: scoping and admission read them on hot paths.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="runs")
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="+")
    gpus = models.PositiveIntegerField()
    kind = models.CharField(max_length=12, choices=RunKind.choices, default=RunKind.BATCH)
    priority = models.IntegerField(default=50)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs"
    )
    state = models.CharField(max_length=12, choices=RunState.choices, default=RunState.QUEUED)
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    borrowed = models.BooleanField(
        default=False, help_text="Admitted beyond the tenant's guarantee: preemptible"
    )
    over_budget = models.BooleanField(
        default=False, help_text="Admitted past a soft monthly GPU-hour budget"
    )
    wait_reason = models.CharField(max_length=16, choices=WaitReason.choices, blank=True)
    # Long enough for a reason that names each of up to 8 nodes with its own figure and why
    # its GPUs are not free (jobs.placement.explain), so none is cut off.
    wait_message = models.CharField(max_length=1000, blank=True)
    # Its place in line among the queued runs of its flavor (1 is next), set by the selectors
    # that show runs (jobs.selectors.runs ``runs_place_in_line``): counted when read, never
    # stored, since every admission would shift it for every run behind.
    queue_position: int | None = None
    # What a run list shows beside it, set by ``runs_usage`` (jobs.selectors.runs) for a
    # page of runs at once: the GPU-hours its attempts held, and how long it waited or ran.
    gpu_hours: float | None = None
    duration: RunDuration | None = None
    # The track record of its full-limits estimate, as a page shows it beside it: set for
    # the runs it shows, from one query (jobs.selectors.estimates ``start_records_shown``).
    start_record: str = ""
    failure_reason = models.CharField(max_length=16, choices=FailureReason.choices, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    # Requeues after a platform or hardware end: not counted against max_restarts, bounded
    # apart so a run cannot loop on broken hardware.
    platform_retries = models.PositiveIntegerField(default=0)
    # Nodes its next attempts must not be placed on (where an earlier one failed for the
    # hardware's sake): admission leaves them out, the backend is told to exclude them.
    excluded_nodes = models.JSONField(default=list, blank=True)
    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # When a queued run should start (jobs.estimates, refreshed by jobs.tasks.estimate_starts
    # at a bounded cadence, never per request), two estimates, neither a promise (work let in
    # first moves both): ``start_full_limits_at`` if every run ahead uses its whole max
    # runtime, ``start_expected_at`` by how long such runs really take. No number, and
    # ``start_note`` says why, where the runs ahead have no known end.
    start_full_limits_at = models.DateTimeField(null=True, blank=True)
    start_expected_at = models.DateTimeField(null=True, blank=True)
    start_note = models.CharField(max_length=300, blank=True)
    # Where it should start and the runs whose end frees those nodes (ids, shown to a viewer
    # only as far as they may see them).
    start_nodes = models.JSONField(default=list, blank=True)
    start_behind = models.JSONField(default=list, blank=True)
    start_estimated_at = models.DateTimeField(null=True, blank=True)
    # The track record of ``start_full_limits_at``, which work let in first can move
    # (docs/admission.md): the two estimates that stood when the run was admitted (the last
    # it had while queued: admission clears them), kept from before its first start, and how
    # many seconds that first start came after the full-limits one (negative: before it;
    # None: it had no estimate, and nothing is recorded). Summed per flavor by
    # jobs.selectors.estimates ``start_records``.
    start_full_limits_was = models.DateTimeField(null=True, blank=True)
    start_expected_was = models.DateTimeField(null=True, blank=True)
    start_missed_by_s = models.FloatField(null=True, blank=True)
    # The one-time key of the form that queued the run: the same form sent twice (a double
    # click, the back button, a replayed POST) finds this run instead of queueing another.
    submission_key = models.UUIDField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "flavor"], name="run_state_flavor"),
            models.Index(fields=["tenant", "-submitted_at"], name="run_tenant_recent"),
            # A person's latest runs (their home page): the first few read from the index,
            # not found among every run of their tenants.
            models.Index(
                fields=["submitted_by", "-submitted_at", "-id"], name="run_submitter_recent"
            ),
            # The run list filtered by state, newest first (keyset pages, jobs.selectors).
            models.Index(
                fields=["tenant", "state", "-submitted_at", "-id"], name="run_tenant_state_recent"
            ),
            # The start estimates' track record: the recent first starts that had one, their
            # flavor and by how much each missed it, read from the index alone (one range of
            # it for every flavor a page shows), however many runs never had an estimate.
            models.Index(
                fields=["started_at", "flavor", "start_missed_by_s"],
                condition=Q(start_missed_by_s__isnull=False),
                name="run_start_record",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="run_gpus_positive"),
            models.CheckConstraint(
                condition=Q(kind__in=[kind.value for kind in RunKind]), name="run_kind_known"
            ),
            models.UniqueConstraint(
                fields=["submitted_by", "submission_key"],
                condition=Q(submission_key__isnull=False),
                name="run_submission_key_once",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def start_full_limits_met(self) -> bool | None:
        """Whether its first start came by the full-limits estimate it was admitted with;
        None when it had none (or has not started)."""
        return None if self.start_missed_by_s is None else self.start_missed_by_s <= 0


class AttemptState(models.TextChoices):
    CREATED = "CREATED", "Created"
    SUBMITTING = "SUBMITTING", "Submitting"
    PENDING = "PENDING", "Pending"
    RUNNING = "RUNNING", "Running"
    SUCCEEDED = "SUCCEEDED", "Succeeded"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    PREEMPTED = "PREEMPTED", "Preempted"
    LOST = "LOST", "Lost"


LIVE_ATTEMPT_STATES = (AttemptState.SUBMITTING, AttemptState.PENDING, AttemptState.RUNNING)
# An attempt in one of these is over for good: its job is gone and its token dead.
ENDED_ATTEMPT_STATES = (
    AttemptState.SUCCEEDED,
    AttemptState.FAILED,
    AttemptState.CANCELLED,
    AttemptState.PREEMPTED,
    AttemptState.LOST,
)


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey("Attempt", on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveBigIntegerField()
    uri = models.CharField(max_length=2048)  # as long as the SDK accepts
    saved_at = models.DateTimeField()
    save_seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["run", "step"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "step"], name="checkpoint_unique_step"),
        ]

    def __str__(self) -> str:
        return f"checkpoint step {self.step} of run {self.run_id}"


class Attempt(models.Model):
    """One backend submission of a run."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="attempts")
    state = models.CharField(
        max_length=12, choices=AttemptState.choices, default=AttemptState.CREATED
    )
    backend_job_id = models.CharField(max_length=200, blank=True)
    rendered_spec = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The sync's re-drives of its submit (``attempt_redrive_stuck_submits``): how many, and
    # when the last was sent; each waits twice as long as the one before.
    submit_redrives = models.PositiveSmallIntegerField(default=0)
    submit_redriven_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_reason = models.CharField(max_length=16, choices=FailureReason.choices, blank=True)
    failure_message = models.TextField(blank=True)
    # Whose fault its end was, once ended unsuccessfully, and the evidence: the node, GPU,
    # signal, code and time that made it so (jobs.attribution).
    cause_class = models.CharField(max_length=10, choices=CauseClass.choices, blank=True)
    cause_evidence = models.JSONField(default=dict, blank=True)
    backend_error = models.TextField(blank=True, help_text="Last transient backend error")
    node_list = models.JSONField(default=list, blank=True)
    # The nodes admission placed the attempt on (what the backend is told to use); the
    # node_list is where the backend reports it runs.
    placement = models.JSONField(default=list, blank=True)
    gpu_uuids = models.JSONField(default=list, blank=True)
    # Its placement spans more than one domain of the cluster's narrowest topology level:
    # how long, from its admission, it would have waited for one inside such a domain
    # (``jobs.admission_types.Admit.tighter_wait_s``). Null: not spread, or no bound known.
    tighter_wait_s = models.FloatField(null=True, blank=True)
    resumed_from = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    runtime_env = models.JSONField(
        default=dict, blank=True, help_text="Versions the job reported (driver, CUDA, NCCL, …)"
    )
    runtime_reported_at = models.DateTimeField(
        null=True, blank=True, help_text="When the job last reported a changed runtime"
    )
    # Preempted for this attempt of another run: where the backend starts that one first
    # (``reclaim_first``), this attempt's job is cancelled only once that one was submitted.
    preempted_for = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reclaimed_from"
    )

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_unique_number"),
        ]
        indexes = [models.Index(fields=["cluster", "state"], name="attempt_cluster_state")]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        """The backend object's name: derived from the id, so a resubmit can find it."""
        return f"gantry-a{self.pk}"

    @property
    def nodes(self) -> list[str]:
        """Where it ran (the backend's word), else where it was placed."""
        return list(self.node_list or self.placement or [])

    @property
    def is_ended(self) -> bool:
        """Over for good: nothing more will be reported about it ("not yet" no longer holds)."""
        return self.state not in (AttemptState.CREATED, *LIVE_ATTEMPT_STATES)


class AttemptToken(models.Model):
    """A token issued to a job of the attempt, kept only as its SHA-256.

    One per submit try: a retried submit cannot know which token an earlier try handed the
    cluster (its job may be adopted), so every digest issued while the attempt is being
    submitted stays valid; each is random and names this attempt only. All die with the
    attempt: a token is refused once the attempt is no longer live (``jobs.api``).
    """

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True)
    issued_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"token of attempt {self.attempt_id} issued {self.issued_at:%Y-%m-%d %H:%M:%S}"


# What every rank reports of its runtime, in the runtime report's names: the versions that
# must agree across the ranks of a job, and the host (``AttemptRankRuntime``).
RANK_VERSION_FIELDS = ("nccl_version", "driver_version", "cuda_version")
RANK_REPORT_FIELDS = ("hostname", *RANK_VERSION_FIELDS)


class AttemptRankRuntime(models.Model):
    """The versions one rank of an attempt reported (``jobs.services.rank_runtime``): those
    that must agree across ranks, NCCL's above all. A row per rank, so at most one per GPU
    of the attempt (one rank per GPU); a rank that reports again replaces its row."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="rank_runtimes")
    rank = models.PositiveIntegerField()
    hostname = models.CharField(max_length=200, blank=True)
    nccl_version = models.CharField(max_length=200, blank=True)
    driver_version = models.CharField(max_length=200, blank=True)
    cuda_version = models.CharField(max_length=200, blank=True)
    reported_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "rank"], name="attempt_rank_runtime_unique"),
        ]

    def __str__(self) -> str:
        return f"rank {self.rank} of attempt {self.attempt_id}"


# The reason of the event that warns a run's owner of its idle GPUs (a batch run's or a
# workspace's), which the run's page and the workspace's card show while it holds.
IDLE_WARNING_EVENT = "IDLE_WARNING"


class RunEvent(models.Model):
    """The run's timeline: every transition with its reason and actor."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12, blank=True)
    reason = models.CharField(max_length=32, blank=True)
    # What everyone who may see the run reads: it names no other tenant, nor a project, user
    # or run of one (a run of its own tenant, yes: the head a backfilled run started ahead of).
    message = models.TextField(blank=True)
    # The same event with the names a platform admin needs (which tenant's run reclaimed the
    # GPUs); shown to platform admins only, blank when ``message`` says it all.
    admin_detail = models.TextField(blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["run", "at", "id"]

    def __str__(self) -> str:
        return f"{self.at:%H:%M:%S} {self.from_state}→{self.to_state} {self.reason}"


class ExperimentTemplate(models.Model):
    """Defaults, locks and ranges a submission starts from (jobs.spec.template_apply).

    ``values`` is a partial spec; ``locked`` lists dotted spec names submissions may not
    change; ``ranges`` maps dotted integer fields to ``{"min": n, "max": m}``. A template
    without a tenant is global: platform admins manage it, every tenant may use it.
    """

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    name = models.SlugField(max_length=63, validators=[slug_validator])
    description = models.TextField(blank=True)
    values = models.JSONField(default=dict, blank=True)
    locked = models.JSONField(default=list, blank=True)
    ranges = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="template_tenant_name_unique"),
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(tenant__isnull=True),
                name="template_global_name_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug if self.tenant is not None else 'global'}/{self.name}"


class StartForecast(models.Model):
    """The latest forward simulation of one flavor's queue (jobs.estimates.Forecast as
    JSON), kept so the submit preview can tell when a run not yet submitted would start
    without simulating again. One row per flavor, replaced by each refresh."""

    flavor = models.OneToOneField(GpuFlavor, on_delete=models.CASCADE, related_name="+")
    computed_at = models.DateTimeField()
    latest = models.JSONField()  # with the max runtimes
    expected = models.JSONField()  # with the durations predicted from history
    # What the refresh that wrote it took (seconds of wall time): the next one waits at least
    # GANTRY_ESTIMATE_COST_FACTOR times as long, so estimating stays a small share of a core.
    duration_s = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"start forecast for {self.flavor_id} at {self.computed_at:%Y-%m-%d %H:%M}"


class AdmissionState(models.Model):
    """The last full admission cycle's inputs, condensed (jobs.selectors.queue
    ``admission_fingerprint``): a cycle that finds the same inputs before ``valid_until``
    decides nothing new and stops there. One row."""

    fingerprint = models.CharField(max_length=64)
    valid_until = models.DateTimeField()
    decided_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"admission inputs {self.fingerprint[:12]} decided at {self.decided_at:%H:%M:%S}"
