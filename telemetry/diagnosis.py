"""Plain-words diagnosis of one attempt, following the troubleshooting tree of design §7:
a failure first (its reason and the next step), then where the GPU time went — low
activity because of input, communication or idleness; high activity without Tensor Cores;
time lost to failures, startup or checkpoints. Pure: an Accounting and a few aggregate
signals in, findings out.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from telemetry.accounting import IDLE_THRESHOLD, Accounting

# Mean GR_ENGINE activity under which a job is not keeping its GPUs busy. Princeton's
# jobstats colours 15-25 % red/black and compares with a 50 % cluster mean; a training job
# that is neither starved nor synchronising sits well above half.
LOW_ACTIVITY = 0.5
# Activity at which the GPU is busy enough that the precision of its math matters.
HIGH_ACTIVITY = 0.5
# PIPE_TENSOR_ACTIVE under which the Tensor Cores are essentially unused: mixed-precision
# or TF32 training of transformers and CNNs runs them well above 10 %.
LOW_TENSOR_ACTIVITY = 0.05
# Shares of step time spent waiting: a fifth of every step is worth an engineer's hour.
HIGH_DATA_WAIT = 0.2
HIGH_COMM_WAIT = 0.2
# Shares of the allocation: idle, startup and checkpoint stalls above a tenth are worth
# acting on; lost work above 5 % means checkpoints are too far apart.
HIGH_IDLE_SHARE = 0.1
HIGH_STARTUP_SHARE = 0.1
HIGH_CHECKPOINT_SHARE = 0.1
HIGH_LOST_SHARE = 0.05


class FailureReason(StrEnum):
    OOM_GPU = "OOM_GPU"
    OOM_HOST = "OOM_HOST"
    NODE_FAILURE = "NODE_FAILURE"
    GPU_XID = "GPU_XID"
    NCCL = "NCCL"
    IMAGE_PULL = "IMAGE_PULL"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    CANCELLED = "CANCELLED"
    USER_EXIT = "USER_EXIT"
    LOST = "LOST"
    UNKNOWN = "UNKNOWN"


NEXT_STEP = {
    FailureReason.OOM_GPU: (
        "Out of GPU memory: lower the per-GPU batch size (keep the global batch with "
        "gradient accumulation), enable activation checkpointing or bf16, or choose a "
        "flavor with more GPU memory."
    ),
    FailureReason.OOM_HOST: (
        "Out of host memory: use fewer DataLoader workers or a smaller prefetch_factor, "
        "memory-map the dataset instead of loading it into RAM, or request more memory."
    ),
    FailureReason.NODE_FAILURE: (
        "The node failed (not your code): the run is requeued from its latest checkpoint "
        "while it has restarts left; checkpoint more often to lose less work."
    ),
    FailureReason.GPU_XID: (
        "GPU hardware error (XID): platform admins are told about the node; resubmit and "
        "the run is placed on other GPUs."
    ),
    FailureReason.NCCL: (
        "NCCL error (a peer died or the network timed out): read the log of the first "
        "rank that failed, rerun with NCCL_DEBUG=INFO, and report the nodes if it repeats "
        "on the same ones."
    ),
    FailureReason.IMAGE_PULL: (
        "The image could not be pulled: check that the digest still exists in the "
        "registry and that the tenant's pull secret is valid."
    ),
    FailureReason.TIMEOUT: (
        "Timed out at the run's time limit: raise the maximum runtime, or checkpoint "
        "regularly so the run resumes where it stopped."
    ),
    FailureReason.PREEMPTED: (
        "Preempted to give GPUs back to a guaranteed quota: the run resumes from its "
        "latest checkpoint; stay within your guaranteed quota to avoid preemption, and "
        "checkpoint often when borrowing."
    ),
    FailureReason.CANCELLED: (
        "Cancelled: the run events say by whom (a user or the idle-GPU policy)."
    ),
    FailureReason.USER_EXIT: (
        "The training script exited with an error: read the traceback at the end of the "
        "log, fix it and resubmit."
    ),
    FailureReason.LOST: (
        "The cluster lost track of the job: the run is requeued from its latest "
        "checkpoint while it has restarts left; report it to platform admins if it repeats."
    ),
    FailureReason.UNKNOWN: (
        "Failed for a reason Gantry could not classify: read the end of the log and the "
        "run events, and report it to platform admins if they show nothing."
    ),
}


class Code(StrEnum):
    FAILURE = "failure"
    INPUT_BOUND = "input_bound"
    COMM_BOUND = "comm_bound"
    IDLE = "idle"
    INTERACTIVE_IDLE = "interactive_idle"
    LOW_ACTIVITY = "low_activity"
    TENSOR_CORES_UNUSED = "tensor_cores_unused"
    LOST_WORK = "lost_work"
    SLOW_STARTUP = "slow_startup"
    CHECKPOINT_STALLS = "checkpoint_stalls"
    # The branches ``telemetry.verdicts`` adds (issue 36).
    MEMORY_BOUND = "memory_bound"
    SLOW_RANK = "slow_rank"
    PLACEMENT_SPREAD = "placement_spread"
    NVLINK = "nvlink"
    INFINIBAND = "infiniband"
    DRIVER_TOO_OLD = "driver_too_old"
    NCCL_MISMATCH = "nccl_mismatch"
    NODE_HEALTH = "node_health"


@dataclass(frozen=True, slots=True)
class Signals:
    """Aggregates over the attempt: activity means from the minute rollups (None without
    telemetry), wait shares of step time from the SDK step windows."""

    mean_activity: float | None = None
    mean_tensor_activity: float | None = None
    data_wait_share: float = 0.0
    comm_wait_share: float = 0.0
    failure_reason: str = ""  # a FailureReason, "" when the attempt did not fail


@dataclass(frozen=True, slots=True)
class Finding:
    """One verdict: its code, a sentence with its figures and the next step, the figures
    themselves for the API, and the node to act on when it names one. Two findings are equal
    by code and text (the text states the figures)."""

    code: Code
    text: str
    numbers: Mapping[str, object] = field(default_factory=dict, compare=False)
    node: str = field(default="", compare=False)


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def _gpu_hours(gpu_seconds: float) -> str:
    return f"{gpu_seconds / 3600:,.1f} GPU-hours"


def diagnose(accounting: Accounting, signals: Signals) -> list[Finding]:
    """Findings, most urgent first; an empty list means nothing to fix."""
    findings = _failure(signals)
    allocated = float(accounting.allocated)
    if not allocated:
        return findings
    waits = _waits(accounting, signals)
    return [
        *findings,
        *waits,
        *_unused_workspace(accounting, allocated=allocated),
        *_low_use(accounting, signals, allocated=allocated, waiting=bool(waits)),
        *_tensor_cores(signals),
        *_time_lost(accounting, allocated=allocated),
    ]


def _failure(signals: Signals) -> list[Finding]:
    """The next step after a failure; a reason Gantry does not know reads as UNKNOWN."""
    if not signals.failure_reason:
        return []
    try:
        reason = FailureReason(signals.failure_reason)
    except ValueError:
        reason = FailureReason.UNKNOWN
    return [Finding(Code.FAILURE, NEXT_STEP[reason], {"reason": reason.value})]


def _waits(accounting: Accounting, signals: Signals) -> list[Finding]:
    """Input-bound (when the GPUs were not busy anyway) and communication-bound."""
    findings: list[Finding] = []
    activity = signals.mean_activity
    if signals.data_wait_share >= HIGH_DATA_WAIT and (activity is None or activity < LOW_ACTIVITY):
        findings.append(
            Finding(
                Code.INPUT_BOUND,
                "Input-bound: shard the dataset, add DataLoader workers, use local NVMe "
                f"cache. The GPUs waited for data {_percent(signals.data_wait_share)} of "
                f"the step time ({_gpu_hours(float(accounting.input_wait))}).",
                {
                    "data_wait_share": round(signals.data_wait_share, 4),
                    "input_wait_gpu_s": float(accounting.input_wait),
                },
            )
        )
    if signals.comm_wait_share >= HIGH_COMM_WAIT:
        findings.append(
            Finding(
                Code.COMM_BOUND,
                "Communication-bound: keep the run inside one topology domain (one NVLink "
                "island or leaf switch), check with NCCL_DEBUG=INFO that NCCL uses "
                "InfiniBand/RoCE and not TCP sockets, and communicate less often (larger "
                "per-GPU batch, gradient accumulation). The GPUs waited on communication "
                f"{_percent(signals.comm_wait_share)} of the step time "
                f"({_gpu_hours(float(accounting.comm_wait))}).",
                {
                    "comm_wait_share": round(signals.comm_wait_share, 4),
                    "comm_wait_gpu_s": float(accounting.comm_wait),
                },
            )
        )
    return findings


def _unused_workspace(accounting: Accounting, *, allocated: float) -> list[Finding]:
    """A workspace held its GPUs while nobody used it (telemetry/workspace_idle.py)."""
    share = float(accounting.interactive_idle) / allocated
    if share < HIGH_IDLE_SHARE:
        return []
    return [
        Finding(
            Code.INTERACTIVE_IDLE,
            f"Interactive idle: nobody used the workspace (no kernel or terminal ran, "
            f"nothing was done through Gantry, the GPUs were idle) for {_percent(share)} of "
            f"the allocation ({_gpu_hours(float(accounting.interactive_idle))}). Suspend it "
            "when you step away: Resume brings it back with its files.",
            {
                "interactive_idle_share": round(share, 4),
                "interactive_idle_gpu_s": float(accounting.interactive_idle),
            },
        )
    ]


def _low_use(
    accounting: Accounting, signals: Signals, *, allocated: float, waiting: bool
) -> list[Finding]:
    """Idle GPUs, or else low activity that no wait explains."""
    idle_share = float(accounting.idle) / allocated
    activity = signals.mean_activity
    if idle_share >= HIGH_IDLE_SHARE:
        return [
            Finding(
                Code.IDLE,
                f"Idle: the GPUs were below {_percent(IDLE_THRESHOLD)} activity for "
                f"{_percent(idle_share)} of the allocation ({_gpu_hours(float(accounting.idle))}). "
                "Stop interactive sessions when you are not using them, request fewer GPUs, "
                "or move preprocessing off the GPU job.",
                {"idle_share": round(idle_share, 4), "idle_gpu_s": float(accounting.idle)},
            )
        ]
    if activity is not None and activity < LOW_ACTIVITY and not waiting:
        return [
            Finding(
                Code.LOW_ACTIVITY,
                f"Low GPU activity ({_percent(activity)}) without input or "
                "communication waits: profile a few steps (torch.profiler) for CPU-side "
                "work, small batches or host-device synchronisation.",
                {"activity": round(activity, 4)},
            )
        ]
    return []


def _tensor_cores(signals: Signals) -> list[Finding]:
    """Busy GPUs whose Tensor Cores stay unused."""
    activity, tensor = signals.mean_activity, signals.mean_tensor_activity
    if not (
        activity is not None
        and activity >= HIGH_ACTIVITY
        and tensor is not None
        and tensor < LOW_TENSOR_ACTIVITY
    ):
        return []
    return [
        Finding(
            Code.TENSOR_CORES_UNUSED,
            "Tensor Cores unused: use mixed precision (bf16/fp16 with torch.autocast) or "
            "enable TF32 for fp32 matmuls, and keep matrix dimensions multiples of 8. "
            f"Tensor activity {_percent(tensor)} at {_percent(activity)} GPU activity.",
            {"tensor_activity": round(tensor, 4), "activity": round(activity, 4)},
        )
    ]


def _time_lost(accounting: Accounting, *, allocated: float) -> list[Finding]:
    """Work lost after the last checkpoint, slow startup and checkpoint stalls."""

    def share(gpu_seconds: Fraction) -> float:
        return float(gpu_seconds) / allocated

    findings: list[Finding] = []
    if share(accounting.lost) >= HIGH_LOST_SHARE:
        findings.append(
            Finding(
                Code.LOST_WORK,
                f"Lost work: {_gpu_hours(float(accounting.lost))} "
                f"({_percent(share(accounting.lost))}) of progress after the last usable "
                "checkpoint was thrown away; checkpoint more often.",
                {"lost_share": round(share(accounting.lost), 4)},
            )
        )
    if share(accounting.startup) >= HIGH_STARTUP_SHARE:
        findings.append(
            Finding(
                Code.SLOW_STARTUP,
                f"Slow startup: {_percent(share(accounting.startup))} of the allocation "
                "passed before the first training step; use a smaller image, stage data on "
                "local disk, and load the checkpoint in parallel.",
                {"startup_share": round(share(accounting.startup), 4)},
            )
        )
    if share(accounting.checkpoint) >= HIGH_CHECKPOINT_SHARE:
        findings.append(
            Finding(
                Code.CHECKPOINT_STALLS,
                f"Checkpoint stalls: training was blocked saving or restoring checkpoints "
                f"{_percent(share(accounting.checkpoint))} of the allocation; save "
                "asynchronously or less often.",
                {"checkpoint_share": round(share(accounting.checkpoint), 4)},
            )
        )
    return findings
