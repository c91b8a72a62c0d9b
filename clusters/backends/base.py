"""The one interface every backend implements, and the plain data that crosses it."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from clusters.health import Signal
from clusters.job_env import gantry_environment

# The key of a cluster's settings that belongs to the telemetry collector (where to read
# GPU metrics), not to the backend: backends skip it when they check their settings.
TELEMETRY_SETTINGS_KEY = "telemetry"
# What Gantry sets in every task of a multi-node job (torch.distributed's rendezvous): such
# a job's own environment may not set them too.
MULTI_NODE_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
# What runs the experiment's command, a shell line as its author typed it, on every backend:
# one shell, so the line means the same everywhere (``$'…'``, ``[[ ]]``, ``echo -e`` differ
# between bash and a POSIX sh such as dash).
COMMAND_SHELL = ("/bin/bash", "-c")


class BackendError(Exception):
    pass


class TransientBackendError(BackendError):
    """The backend could not be reached or asked us to come back: retry, change nothing."""


class PermanentBackendError(BackendError):
    """The backend refused the job: record the reason, do not retry."""

    def __init__(self, message: str, *, failure_reason: str = "UNKNOWN"):
        super().__init__(message)
        self.failure_reason = failure_reason


@dataclass(frozen=True, slots=True)
class WorkspaceSpec:
    """What a workspace's job needs beyond a batch job's (docs/workspaces.md, "Backends"):
    the job runs Gantry's launcher, which starts ``server`` under ``base_url`` with
    ``token`` as its only accepted secret, and reports the port it listens on."""

    server: str  # jupyter, vscode (jobs.models.WorkspaceServer)
    base_url: str  # /w/<run id>/: the proxy serves the path untouched
    # A secret: the job gets it as GANTRY_WORKSPACE_TOKEN, a rendered spec shows
    # "<redacted>". Set only on the copy the submit hands to ``submit``, like the attempt's.
    token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything a backend needs to run one attempt; built from the experiment record."""

    name: str  # derived from the attempt id: how a resubmit finds an existing job
    attempt_id: int
    run_id: int
    tenant: str
    project: str
    image: str  # always repository@sha256:…
    command: str
    env: dict[str, str]  # the experiment's own; Gantry's are added by ``job_env``
    flavor: str
    nodes: int
    gpus_per_node: int
    max_runtime_s: int
    checkpoint_dir: str = ""
    api_url: str = ""  # where the job reports (GANTRY_API_URL)
    resume_step: int | None = None  # set when resuming from a checkpoint
    resume_uri: str = ""
    # A secret: the job gets it as GANTRY_ATTEMPT_TOKEN; a rendered spec shows "<redacted>".
    # Set only on the copy the submit hands to ``submit``: a spec built to render has none.
    attempt_token: str = field(default="", repr=False)
    # Where admission placed the gang: the nodes the job must start on (sorted names), and
    # the topology level the experiment asked for (a name of the cluster's levels, such as
    # "leaf"), required or only preferred. Empty: the backend places the job itself.
    placement: tuple[str, ...] = ()
    topology_level: str = ""
    topology_required: bool = False
    # It takes GPUs that a preemption is freeing for it: a backend that can (``reclaim_first``)
    # starts it there before any job that was queued for them earlier.
    reclaiming: bool = False
    # Nodes the job must not run on (where an earlier attempt of its run failed for the
    # hardware's sake): Slurm ``--exclude``, Kubernetes node affinity ``NotIn``.
    excluded_nodes: tuple[str, ...] = ()
    # Set for a run of kind interactive: the job is a workspace's server.
    workspace: WorkspaceSpec | None = None


def job_env(spec: JobSpec) -> dict[str, str]:
    """The environment every backend gives the job, its token aside: the experiment's
    variables and Gantry's own (``clusters.job_env.GANTRY_ENV``), sorted by name."""
    gantry = gantry_environment(
        api_url=spec.api_url,
        image=spec.image,
        checkpoint_dir=spec.checkpoint_dir,
        resume_uri=spec.resume_uri,
        resume_step=spec.resume_step,
        workspace_server=spec.workspace.server if spec.workspace else "",
        workspace_base_url=spec.workspace.base_url if spec.workspace else "",
    )
    return dict(sorted({**spec.env, **gantry}.items()))


@dataclass(frozen=True, slots=True)
class JobRef:
    name: str
    backend_job_id: str = ""


@dataclass(frozen=True, slots=True)
class CheckpointReport:
    """A checkpoint the job reported (through the job-side SDK, or simulated)."""

    step: int
    uri: str
    saved_at: datetime
    save_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class JobStatus:
    state: str  # PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED, PREEMPTED
    backend_job_id: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    failure_reason: str = ""
    message: str = ""
    node_list: list[str] = field(default_factory=list)
    checkpoints: tuple[CheckpointReport, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """One node with GPUs of a flavor, as the backend sees it now."""

    name: str
    flavor: str  # the Gantry flavor slug of its GPUs
    gpus: int
    # GPUs that jobs hold now, and of those the ones held by jobs Gantry submitted (named
    # after an attempt, or labelled with one): the rest is load from outside Gantry.
    gpus_used: int = 0
    gpus_used_by_gantry: int = 0
    schedulable: bool = True
    reason: str = ""  # why it takes no new work, in the backend's words ("drained: …")
    path: tuple[str, ...] = ()  # its topology domains, widest first (block, leaf switch)
    # What the backend says about its health now (Slurm state and reason, Kubernetes
    # conditions and taints), as node-health signals (clusters.health).
    signals: tuple[Signal, ...] = ()


@dataclass(frozen=True, slots=True)
class PendingClaim:
    """A job from outside Gantry that waits for GPUs of a flavor: the cluster starts it as
    soon as GPUs it fits on come free, before a job Gantry submits after it."""

    job: str  # how the backend names it: "Slurm job 812", "pod team-a/train-0"
    flavor: str
    nodes: int
    gpus_per_node: int
    priority: int | None = None  # the backend's own figure, where it has one
    expected_start: datetime | None = None  # the backend's estimate (Slurm: squeue --start)
    expected_nodes: tuple[str, ...] = ()  # where the backend plans to start it, if it says
    # The only nodes it may run on (a required node list or node selector); empty: any
    # node of its flavor.
    eligible: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a cluster has: its GPU nodes, the names of its topology levels (widest first,
    one per element of a node's path) and problems worth showing an operator (a topology
    label that no node carries, a node reporting an impossible GPU count); and the jobs
    from outside Gantry waiting for GPUs (``claims``), with ``claims_error`` saying why
    that queue could not be read whole (then no preemption relies on it)."""

    nodes: tuple[NodeInventory, ...]
    levels: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    claims: tuple[PendingClaim, ...] = ()
    claims_error: str = ""


@dataclass(frozen=True, slots=True)
class InventoryItem:
    """A flavor's capacity in brief: its node count and the largest node's GPUs."""

    flavor: str
    nodes: int
    gpus_per_node: int


def inventory_items(inventory: Inventory) -> list[InventoryItem]:
    """Capacity per flavor in brief: every node of the flavor, and the most GPUs one has."""
    by_flavor: dict[str, list[int]] = {}
    for node in inventory.nodes:
        by_flavor.setdefault(node.flavor, []).append(node.gpus)
    return [
        InventoryItem(flavor=flavor, nodes=len(counts), gpus_per_node=max(counts))
        for flavor, counts in sorted(by_flavor.items())
    ]


class Backend(Protocol):
    # How long a node inventory stays true enough to place runs by; None when nothing but
    # Gantry changes it (the simulator).
    inventory_max_age_s: float | None
    # Whether the job starts on the nodes admission placed it on. Not with a queueing layer
    # that places jobs itself (Kueue): its wait is then its own, never a lapsed placement.
    honours_placement: bool
    # Whether a job submitted for GPUs a preemption frees starts there before the jobs from
    # outside Gantry that were waiting for them (Slurm: submitted with top priority before
    # the preempted jobs are cancelled). Where not, admission does not preempt for GPUs a
    # waiting outside job would take (``Inventory.claims``).
    reclaim_first: bool

    def render(self, spec: JobSpec) -> str:
        """The exact script or manifest the backend will receive."""

    def submit(self, spec: JobSpec, *, may_exist: bool = True) -> str:
        """Submit, or adopt the job already named ``spec.name``; returns the backend job id.

        ``may_exist=False``: the caller recorded that it is about to submit this attempt for
        the first time (``jobs.services.backend_submit``), so no earlier try can have reached
        the cluster and the look-up for a job to adopt may be skipped. After a redelivery, a
        crash or a timeout it is True, and a job that got through is adopted."""

    def sync(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        """Status of every known job among ``refs`` (by name), in one batched call."""

    def cancel(self, ref: JobRef) -> None: ...

    def logs(self, ref: JobRef, *, tail: int) -> str: ...

    def inventory(self) -> Inventory:
        """Every GPU node with what is free on it, whether it takes work and where it sits
        in the topology; in one or a few batched calls."""

    def fence(self, node: str, reason: str) -> None:
        """Take the node out of the backend's scheduling with Gantry's reason (Slurm drain,
        Kubernetes cordon and taint); idempotent. BackendError says why it could not."""

    def unfence(self, node: str) -> None:
        """Undo ``fence``: the node takes work again (Slurm resume, uncordon and untaint)."""

    def workspace_address(self, ref: JobRef, *, port: int) -> tuple[str, int]:
        """Where the proxy reaches the workspace server of job ``ref``, which reported that
        it listens on ``port``: the host is the backend's word (the node the job runs on,
        as the backend resolves it), never the job's. PermanentBackendError when the job
        cannot be a workspace there (not running, a port the backend does not route);
        TransientBackendError when the backend could not say yet."""

    def workspace_release(self, *, run_id: int, tenant: str) -> None:
        """Let go of what the backend keeps of workspace run ``run_id`` of ``tenant`` across
        its attempts (its files: Kubernetes deletes its volume) once it has ended for good;
        never called on a suspend. Idempotent: what is gone already is done. BackendError
        when the backend could not: Gantry asks again."""

    def health_check(self, node: str, *, check_id: int, flavor: str, gpus: int) -> JobRef:
        """Submit the cluster's health check (its ``health_check`` setting) to ``node``,
        holding its ``gpus`` GPUs of ``flavor``, as job ``gantry-hc<check_id>``; ``sync``
        follows it and ``clusters.backends.health_check.health_check_result`` reads its end.
        BackendError when the cluster has no such setting or the node cannot be checked."""
