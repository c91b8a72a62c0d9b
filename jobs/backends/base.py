"""The one interface every backend implements, and the plain data that crosses it."""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

# The key of a cluster's settings that belongs to the telemetry collector (where to read
# GPU metrics), not to the backend: backends skip it when they check their settings.
TELEMETRY_SETTINGS_KEY = "telemetry"
# What Gantry sets in every task of a multi-node job (torch.distributed's rendezvous): such
# a job's own environment may not set them too.
MULTI_NODE_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


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
class JobSpec:
    """Everything a backend needs to run one attempt; built from the experiment record."""

    name: str  # derived from the attempt id: how a resubmit finds an existing job
    attempt_id: int
    run_id: int
    tenant: str
    project: str
    image: str  # always repository@sha256:…
    command: str
    env: dict[str, str]
    flavor: str
    nodes: int
    gpus_per_node: int
    max_runtime_s: int
    checkpoint_dir: str = ""
    resume_step: int | None = None  # set when resuming from a checkpoint
    resume_uri: str = ""
    # A secret: the job gets it as GANTRY_ATTEMPT_TOKEN; a rendered spec shows "<redacted>".
    attempt_token: str = field(default="", repr=False)


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
class InventoryItem:
    flavor: str
    nodes: int
    gpus_per_node: int


class Backend(Protocol):
    def render(self, spec: JobSpec) -> str:
        """The exact script or manifest the backend will receive."""

    def submit(self, spec: JobSpec) -> str:
        """Submit, or adopt the job already named ``spec.name``; returns the backend job id."""

    def sync(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        """Status of every known job among ``refs`` (by name), in one batched call."""

    def cancel(self, ref: JobRef) -> None: ...

    def logs(self, ref: JobRef, *, tail: int) -> str: ...

    def inventory(self) -> list[InventoryItem]: ...
