"""Per-rank step windows (issue 36): which of a ``rank_window`` event's claims the server
refuses, and the cap that keeps their rows bounded. Pure: no Django.

A rank window says "rank r of a world of n, on host h driving GPU g, did these steps".
It is refused, with a message that says why, when

* the rank is not below the world size;
* the world size is not the attempt's GPU count (Gantry runs one rank per GPU, so a
  different world size means the job's ranks cannot be matched to its GPUs);
* the attempt's GPUs are known and the host and GPU are not among them (a GPU UUID is
  checked against the UUIDs the runtime report listed);
* the rank already stored ``MAX_WINDOWS_PER_RANK_HOUR`` windows ending in that clock hour
  (the new windows of a batch counted in the order they end): the statement that stores
  them counts (``telemetry.services``), this module says why.
"""

from dataclasses import dataclass
from typing import Any

# One window per 10 s on average: 360 rows per rank and hour at most, whatever a job sends
# (the SDK's default window is 30 s, 120 rows). docs/sdk.md says so.
MAX_WINDOWS_PER_RANK_HOUR = 360
# The ways a GPU is named by UUID (``nvidia-smi -L``, CUDA_VISIBLE_DEVICES).
UUID_PREFIXES = ("GPU-", "MIG-")

RANK_OUT_OF_RANGE = "rank_out_of_range"
WORLD_SIZE_MISMATCH = "world_size_mismatch"
GPU_NOT_HELD = "gpu_not_held"
WINDOW_CAP = "window_cap"
REFUSALS = (RANK_OUT_OF_RANGE, WORLD_SIZE_MISMATCH, GPU_NOT_HELD, WINDOW_CAP)


@dataclass(frozen=True, slots=True)
class RankWindowIn:
    """One ``rank_window`` event, schema-checked; ``seq`` is the rank's window number."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    gpu: str
    seq: int
    start: float
    end: float
    steps: int
    step_time_s: float
    data_wait_s: float
    comm_wait_s: float


def rank_window_in(raw: dict[str, Any]) -> RankWindowIn:
    """A schema-checked ``rank_window`` event (``telemetry.sdk_events``) as plain data."""
    return RankWindowIn(
        rank=raw["rank"],
        local_rank=raw.get("local_rank", 0),
        world_size=raw["world_size"],
        host=raw["host"],
        gpu=raw["gpu"],
        seq=raw["window"],
        start=float(raw["start"]),
        end=float(raw["end"]),
        steps=raw["steps"],
        step_time_s=float(raw["step_time_s"]),
        data_wait_s=float(raw.get("data_wait_s", 0.0)),
        comm_wait_s=float(raw.get("comm_wait_s", 0.0)),
    )


@dataclass(frozen=True, slots=True)
class HeldGpus:
    """What the attempt holds: its GPU count, and when known its (host, GPU index) pairs
    (hosts by short name) and the UUIDs of its GPUs."""

    count: int
    pairs: frozenset[tuple[str, str]] | None = None
    uuids: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    message: str


def short_host(name: str) -> str:
    """A host's name without its domain, in lower case: DCGM, Slurm and ``hostname`` name
    the same node ``gpu-07`` or ``gpu-07.cluster.example``."""
    return name.split(".", 1)[0].lower()


def refusal(window: RankWindowIn, held: HeldGpus) -> Refusal | None:
    """Why ``window`` cannot be stored for an attempt that holds ``held``, or None."""
    if window.rank >= window.world_size:
        return Refusal(
            RANK_OUT_OF_RANGE,
            f"rank {window.rank} is not below the world size {window.world_size}.",
        )
    if window.world_size != held.count:
        return Refusal(
            WORLD_SIZE_MISMATCH,
            f"world size {window.world_size} contradicts the attempt's {held.count} GPUs "
            "(one rank per GPU).",
        )
    if window.gpu.startswith(UUID_PREFIXES):
        if held.uuids and window.gpu not in held.uuids:
            return Refusal(
                GPU_NOT_HELD,
                f"rank {window.rank} reports GPU {window.gpu}, "
                "which is not one of the attempt's GPUs.",
            )
    elif held.pairs is not None and (short_host(window.host), window.gpu) not in held.pairs:
        return Refusal(
            GPU_NOT_HELD,
            f"rank {window.rank} reports GPU {window.gpu} of {window.host}, "
            "which the attempt does not hold.",
        )
    return None


def cap_refusal(window: RankWindowIn) -> Refusal:
    return Refusal(
        WINDOW_CAP,
        f"rank {window.rank} already sent {MAX_WINDOWS_PER_RANK_HOUR} windows ending in this "
        "hour (one per 10 s at most).",
    )
