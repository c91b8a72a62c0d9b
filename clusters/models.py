"""Clusters, their nodes and flavors, and the simulator's jobs: what the backends read and
report. The tables keep the ``jobs_*`` names they had before the models moved here from
``jobs`` (clusters/migrations/0001_initial.py changed Django's state only)."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from clusters.health import NodeHealth
from tenants.models import QUEUEING_CHOICES, GpuFlavor, slug_validator
from tenants.queueing import QUEUEING_DEFAULT, QUEUEING_MAX_LENGTH, Queueing


class Cluster(models.Model):
    class Backend(models.TextChoices):
        SIMULATOR = "simulator", "Simulator"
        KUBERNETES = "kubernetes", "Kubernetes"
        SLURM = "slurm", "Slurm"

    name = models.SlugField(max_length=63, unique=True, validators=[slug_validator])
    backend = models.CharField(max_length=16, choices=Backend.choices)
    # Connection settings; secrets appear only as references (e.g. an env var name), never values.
    settings = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # The node inventory (ClusterNode rows): when it was last read whole, what went wrong
    # since, the names of the cluster's topology levels (widest first) and what an operator
    # should fix in its settings or nodes.
    inventory_at = models.DateTimeField(null=True, blank=True)
    # Past this, admission treats the nodes as unknown (it places nothing on them) until
    # the next refresh; null for a cluster whose inventory cannot go out of date.
    inventory_valid_until = models.DateTimeField(null=True, blank=True)
    inventory_error = models.TextField(blank=True)
    topology_levels = models.JSONField(default=list, blank=True)
    inventory_problems = models.JSONField(default=list, blank=True)
    # Jobs from outside Gantry waiting for GPUs, as the last inventory read them
    # (``clusters.outside_claims.claims_record``): what admission must not preempt for.
    outside_claims = models.JSONField(default=dict, blank=True)
    # What Gantry does about each class of node-health signal, and its limits; only what
    # differs from the defaults (clusters.health_policy), set by platform admins, audited.
    health_policy = models.JSONField(default=dict, blank=True)
    # What a tenant's later runs do here while the first in line cannot start; a tenant's
    # own policy (``Tenant.queueing``) overrides it. Set by platform admins, audited.
    queueing = models.CharField(
        max_length=QUEUEING_MAX_LENGTH,
        choices=QUEUEING_CHOICES,
        default=QUEUEING_DEFAULT.value,
        help_text="What later runs do while the first in line cannot start: strict, backfill "
        "or best-effort (docs/admission.md, Backfill)",
    )

    class Meta:
        db_table = "jobs_cluster"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(queueing__in=[policy.value for policy in Queueing]),
                name="cluster_queueing_known",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ClusterNode(models.Model):
    """A GPU node of a cluster as its backend last reported it; admission places gangs on
    these. GPUs held by Gantry's runs come from the runs themselves, not from here: only
    the load from outside Gantry (``gpus_used - gpus_used_by_gantry``) is taken from it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="+")
    gpus = models.PositiveIntegerField()
    gpus_used = models.PositiveIntegerField(default=0)
    gpus_used_by_gantry = models.PositiveIntegerField(default=0)
    schedulable = models.BooleanField(default=True)
    reason = models.CharField(max_length=500, blank=True)
    path = models.JSONField(default=list, blank=True, help_text="Topology domains, widest first")
    updated_at = models.DateTimeField()
    # Gantry's own view of the node's health (design §10), apart from what the backend says
    # (``schedulable``): a quarantined node takes no new work from Gantry's placement
    # whatever its backend says, from the next admission cycle on.
    health = models.CharField(
        max_length=12,
        choices=[(h.value, h.value.capitalize()) for h in NodeHealth],
        default=NodeHealth.HEALTHY.value,
    )
    health_reason = models.CharField(max_length=500, blank=True)
    health_since = models.DateTimeField(null=True, blank=True)
    # The quarantine as pushed to the backend (Slurm drain, Kubernetes cordon and taint):
    # when it took, and why it did not (a permission error, say: Gantry still excludes it).
    fenced_at = models.DateTimeField(null=True, blank=True)
    fence_error = models.TextField(blank=True)

    class Meta:
        db_table = "jobs_clusternode"
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="cluster_node_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    @property
    def gpus_outside(self) -> int:
        """GPUs held by jobs Gantry did not submit."""
        return max(0, self.gpus_used - self.gpus_used_by_gantry)


class NodeHealthEvent(models.Model):
    """One node-health signal and what Gantry did about it, or a person's act on a node
    (quarantine, return to service with a note): the node's history. A flood of the same
    signal from one GPU is one row whose ``count`` and ``last_observed_at`` grow. Kept when
    the node leaves the inventory: it names the node, it does not point at its row."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    node = models.CharField(max_length=253)
    gpu = models.CharField(max_length=64, blank=True)
    source = models.CharField(max_length=16)  # clusters.health.Source, or "person"
    signal = models.CharField(max_length=32)  # clusters.health.SignalClass, or the act
    code = models.CharField(max_length=64, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    observed_at = models.DateTimeField()
    last_observed_at = models.DateTimeField()
    count = models.PositiveIntegerField(default=1)
    recorded_at = models.DateTimeField()
    action = models.CharField(max_length=24, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-observed_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "node", "-observed_at"], name="nodehealth_node_recent"),
            models.Index(fields=["-observed_at"], name="nodehealth_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.node} {self.signal} {self.code} at {self.observed_at:%Y-%m-%d %H:%M}"


class NodeHealthCheck(models.Model):
    """An active health check of one node, asked for by a platform admin: a short job the
    backend runs pinned to the node (``Backend.health_check``), followed by the periodic
    sync (``clusters.services.health_checks``); its verdict is recorded through
    ``node_health_check_record`` (a pass lets a node return to service where the policy
    asks for one)."""

    class State(models.TextChoices):
        PENDING = "pending"  # asked for, not submitted yet
        RUNNING = "running"  # submitted: the backend runs or queues it
        PASSED = "passed"
        FAILED = "failed"
        INCONCLUSIVE = "inconclusive"  # cancelled, timed out, never submitted: no verdict

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    node = models.CharField(max_length=253)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    requested_at = models.DateTimeField()
    job_name = models.CharField(max_length=64, blank=True)
    backend_job_id = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    finished_at = models.DateTimeField(null=True, blank=True)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "node", "-requested_at"], name="nodecheck_node_recent"),
            models.Index(fields=["state"], name="nodecheck_state"),
        ]

    def __str__(self) -> str:
        return f"health check {self.pk} of {self.node}: {self.state}"


class ClusterFlavor(models.Model):
    """Capacity of one flavor on one cluster in brief, refreshed from the node inventory:
    how many nodes have it, the most GPUs one node has, and the GPUs of all of them."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="flavors")
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="+")
    nodes = models.PositiveIntegerField()
    gpus_per_node = models.PositiveIntegerField()
    gpus = models.PositiveIntegerField()

    class Meta:
        db_table = "jobs_clusterflavor"
        ordering = ["cluster__name", "flavor__slug"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "flavor"], name="cluster_flavor_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}: {self.nodes}×{self.gpus_per_node} {self.flavor.slug}"

    @property
    def capacity_gpus(self) -> int:
        return self.gpus


class SimulatedJob(models.Model):
    """State of the built-in simulator backend: one row per simulated batch job."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100, unique=True)
    flavor = models.CharField(max_length=63)
    nodes = models.PositiveIntegerField()
    gpus_per_node = models.PositiveIntegerField()
    profile = models.JSONField(default=dict)
    max_runtime_s = models.PositiveIntegerField()
    state = models.CharField(max_length=12, default="PENDING")
    allocation = models.JSONField(default=dict, blank=True, help_text="node -> GPU indices")
    placement = models.JSONField(default=list, blank=True, help_text="The nodes to start on")
    submitted_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_reason = models.CharField(max_length=16, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        db_table = "jobs_simulatedjob"
        indexes = [models.Index(fields=["cluster", "state"], name="simjob_cluster_state")]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class SimulatedFence(models.Model):
    """The simulator backend's own drain of a node (``fence``): the node takes no new
    simulated jobs until ``unfence`` sets ``released_at``. One row per node, kept after the
    release: the release resets the node's GPUs (their last XID reads 0 again)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    node = models.CharField(max_length=253)
    reason = models.CharField(max_length=500)
    fenced_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "node"], name="simulated_fence_unique"),
        ]

    def __str__(self) -> str:
        state = "released" if self.released_at else "fenced"
        return f"{self.cluster_id}/{self.node} ({state})"
