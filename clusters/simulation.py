"""The simulator's pure parts: workload profiles (their outcome and what their work looks
like), progress, checkpoints, the virtual cluster's nodes and node placement.

A simulated job's "step" is one simulated second of work, so a checkpoint at step 600 means
600 s of work are saved. No ORM, no clock.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clusters.sim_stragglers import (
    Lockstep,
    Straggler,
    StragglerKind,
    lockstep,
    straggler_from_env,
)

PROFILES = {
    # name: (share of the work done before the outcome, outcome, exit code, failure reason)
    "compute-bound": (1.0, "SUCCEEDED", 0, ""),
    "input-bound": (1.0, "SUCCEEDED", 0, ""),
    "comm-bound": (1.0, "SUCCEEDED", 0, ""),
    "idle": (1.0, "SUCCEEDED", 0, ""),
    "crash": (0.6, "FAILED", 1, "USER_EXIT"),
    "oom": (0.3, "FAILED", 137, "OOM_GPU"),
}
DEFAULT_PROFILE = "compute-bound"


@dataclass(frozen=True, slots=True)
class ProfileSignals:
    """What a profile's work looks like to telemetry (``telemetry.simulated``) and how its
    step splits (``clusters.sim_stragglers``)."""

    activity: float  # GPU activity (0-1) while working
    tensor_share: float  # tensor-core activity as a share of the activity
    data_share: float  # share of step time waiting for input
    comm_share: float  # share of step time waiting on communication
    reports_steps: bool = True  # False: a notebook-like job without a training loop


SIGNALS = {
    "compute-bound": ProfileSignals(0.92, 0.7, 0.01, 0.02),
    "input-bound": ProfileSignals(0.30, 0.7, 0.60, 0.02),
    "comm-bound": ProfileSignals(0.45, 0.7, 0.03, 0.45),
    "idle": ProfileSignals(0.01, 0.0, 0.0, 0.0, reports_steps=False),
    "crash": ProfileSignals(0.90, 0.7, 0.03, 0.02),
    "oom": ProfileSignals(0.90, 0.7, 0.03, 0.02),
}
DEFAULT_DURATION_S = 1200
DEFAULT_CHECKPOINT_EVERY_S = 300
STARTUP_S = 30


def _env_int(env: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}")
    return value


@dataclass(frozen=True, slots=True)
class Workload:
    profile: str
    duration_s: int  # simulated seconds of work when nothing goes wrong
    checkpoint_every_s: int = DEFAULT_CHECKPOINT_EVERY_S  # 0: never checkpoints
    resume_step: int = 0  # the checkpointed step this attempt starts from
    # A straggler in the gang (clusters.sim_stragglers): its kind ("" for none), its rank and
    # how much slower; flat fields, so a job's stored workload reads back with Workload(**).
    straggler: str = ""
    straggler_rank: int = 0
    straggler_factor: float = 1.0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Workload":
        """Read the workload hint an experiment gives the simulator through its env."""
        profile = env.get("GANTRY_SIM_PROFILE", DEFAULT_PROFILE)
        if profile not in PROFILES:
            raise ValueError(
                f"GANTRY_SIM_PROFILE must be one of {', '.join(sorted(PROFILES))}, got {profile!r}"
            )
        month = 30 * 86400
        straggler = straggler_from_env(env)
        return cls(
            profile=profile,
            duration_s=_env_int(env, "GANTRY_SIM_DURATION_S", DEFAULT_DURATION_S, 1, month),
            checkpoint_every_s=_env_int(
                env, "GANTRY_SIM_CHECKPOINT_EVERY_S", DEFAULT_CHECKPOINT_EVERY_S, 0, month
            ),
            resume_step=_env_int(env, "GANTRY_RESUME_STEP", 0, 0, month),
            straggler=straggler.kind.value if straggler else "",
            straggler_rank=straggler.rank if straggler else 0,
            straggler_factor=straggler.factor if straggler else 1.0,
        )

    @property
    def straggling(self) -> Straggler | None:
        if not self.straggler:
            return None
        return Straggler(StragglerKind(self.straggler), self.straggler_rank, self.straggler_factor)

    @property
    def end_step(self) -> int:
        """The step where the job ends: all its work, or where its profile fails."""
        share, state, _, _ = PROFILES[self.profile]
        failing_at = int(self.duration_s * share)
        if state == "FAILED" and self.resume_step < failing_at:
            return failing_at
        return self.duration_s

    @property
    def fails(self) -> bool:
        return self.end_step < self.duration_s or (
            PROFILES[self.profile][1] == "FAILED" and self.resume_step < self.end_step
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    state: str  # RUNNING, SUCCEEDED, FAILED
    ends_at_s: float  # wall seconds after start when the job ends
    exit_code: int | None = None
    failure_reason: str = ""


def outcome_at(
    workload: Workload, *, elapsed_s: float, max_runtime_s: float, speedup: float = 1.0
) -> Outcome:
    """Where a job that started ``elapsed_s`` seconds of wall time ago stands.

    One clock for people: the time limit ``max_runtime_s`` is wall time, like every limit,
    duration and estimate Gantry shows. The speed-up only shortens the simulated work: a
    workload of ``duration_s`` simulated seconds takes ``duration_s / speedup`` seconds of
    wall time, and a 1-minute limit stops it after one minute whatever the speed-up."""
    _, state, exit_code, reason = PROFILES[workload.profile]
    ends_at = work_wall_s(workload, speedup=speedup)
    if max_runtime_s < ends_at:
        if elapsed_s >= max_runtime_s:
            return Outcome("FAILED", max_runtime_s, None, "TIMEOUT")
        return Outcome("RUNNING", max_runtime_s)
    if elapsed_s >= ends_at:
        if workload.fails:
            return Outcome(state, ends_at, exit_code, reason)
        return Outcome("SUCCEEDED", ends_at, 0, "")
    return Outcome("RUNNING", ends_at)


def work_wall_s(workload: Workload, *, speedup: float) -> float:
    """Wall seconds the workload's simulated work takes (start-up included), time limit
    aside: what the simulator knows of a job's length before it starts."""
    return (STARTUP_S + max(0, workload.end_step - workload.resume_step)) / speedup


def step_at(workload: Workload, *, elapsed_s: float) -> int:
    """The last completed step ``elapsed_s`` simulated seconds after the job started."""
    done = max(0.0, min(elapsed_s - STARTUP_S, workload.end_step - workload.resume_step))
    return workload.resume_step + int(done)


def checkpoint_steps(workload: Workload, *, elapsed_s: float) -> list[int]:
    """Steps at which this attempt has saved a checkpoint so far."""
    if workload.checkpoint_every_s <= 0:
        return []
    every = workload.checkpoint_every_s
    first = (workload.resume_step // every + 1) * every
    return list(range(first, step_at(workload, elapsed_s=elapsed_s) + 1, every))


def gang_gpus(allocation: Mapping[str, Sequence[int]]) -> list[tuple[str, int]]:
    """The (node, GPU index) of each rank of a job holding ``allocation``, by rank: nodes in
    name order, then GPU indices (one rank per GPU)."""
    return [(node, gpu) for node in sorted(allocation) for gpu in sorted(allocation[node])]


def gang_lockstep(
    workload: Workload,
    allocation: Mapping[str, Sequence[int]],
    paths: Mapping[str, tuple[str, ...]],
) -> Lockstep:
    """How the job's gang steps (``clusters.sim_stragglers.lockstep``) on ``allocation``
    (node → GPU indices) placed on ``paths`` (node → topology path)."""
    signals = SIGNALS[workload.profile]
    return lockstep(
        data_share=signals.data_share,
        comm_share=signals.comm_share,
        nodes=[node for node, _ in gang_gpus(allocation)],
        paths=paths,
        straggler=workload.straggling,
    )


def place(
    free: dict[str, list[int]], *, nodes: int, gpus_per_node: int
) -> dict[str, list[int]] | None:
    """First-fit gang placement: ``nodes`` nodes with ``gpus_per_node`` free GPUs each, or None.

    ``free`` maps node name -> free GPU indices; nodes are tried in name order.
    """
    chosen: dict[str, list[int]] = {}
    for node in sorted(free):
        indices = sorted(free[node])
        if len(indices) >= gpus_per_node:
            chosen[node] = indices[:gpus_per_node]
            if len(chosen) == nodes:
                return chosen
    return None


# --- the virtual cluster's nodes -----------------------------------------------------------

DEFAULT_LEVELS = ("block", "leaf")


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    flavor: str
    gpus: int
    path: tuple[str, ...] = ()  # topology domains, widest first
    drained: str = ""  # why it takes no work; empty: it does
    outside: int = 0  # GPUs busy with load that does not come from Gantry


@dataclass(frozen=True, slots=True)
class SimLayout:
    nodes: tuple[SimNode, ...]
    levels: tuple[str, ...]
    problems: tuple[str, ...] = ()


def sim_layout(cluster: str, settings: Mapping[str, Any]) -> SimLayout:
    """The nodes a simulated cluster's settings describe. Each pool::

        {"flavor": "a100-80gb", "nodes": 8, "gpus_per_node": 8,
         "domains": [2, 2],                        # 2 blocks of 2 leaf switches, filled in order
         "drained": {"<node>": "bad DIMM"},        # nodes that take no work, and why
         "outside": {"<node>": 2}}                 # GPUs used by jobs from outside Gantry

    Nodes are named ``<cluster>-<flavor>-00``, ``-01``, …; ``settings["topology"]`` names
    the levels (default block, leaf). Entries that name no node of the pool, or ask for
    more GPUs than a node has, are left out and reported as problems.
    """
    problems: list[str] = []
    nodes: list[SimNode] = []
    depth = 0
    for pool in settings.get("pools", []):
        flavor = str(pool["flavor"])
        count, gpus = int(pool["nodes"]), int(pool["gpus_per_node"])
        domains = [int(d) for d in pool.get("domains", [])]
        if any(d < 1 for d in domains):
            problems.append(f"pool {flavor}: domains must be positive, got {domains}")
            domains = []
        depth = max(depth, len(domains))
        names = [f"{cluster}-{flavor}-{i:02d}" for i in range(count)]
        drained = {str(k): str(v) for k, v in (pool.get("drained") or {}).items()}
        outside = dict(pool.get("outside") or {})
        for name in sorted(set(drained) | set(outside)):
            if name not in names:
                problems.append(f"pool {flavor}: no node named {name}")
        leaves = math.prod(domains) if domains else 1
        per_leaf = max(1, math.ceil(count / leaves))
        for index, name in enumerate(names):
            path: tuple[str, ...] = ()
            if domains:
                leaf = index // per_leaf
                digits = []
                for size in reversed(domains):
                    digits.append(leaf % size + 1)
                    leaf //= size
                digits.reverse()
                path = tuple(
                    f"{DEFAULT_LEVELS[level] if level < len(DEFAULT_LEVELS) else 'level'}-"
                    + ".".join(str(d) for d in digits[: level + 1])
                    for level in range(len(domains))
                )
            load = int(outside.get(name, 0))
            if not 0 <= load <= gpus:
                problems.append(f"node {name}: outside load {load} is not within 0..{gpus}")
                load = 0
            nodes.append(SimNode(name, flavor, gpus, path, drained.get(name, ""), load))
    named = [str(level) for level in settings.get("topology", DEFAULT_LEVELS)]
    levels = tuple(named[:depth]) + tuple(f"level-{i + 1}" for i in range(len(named), depth))
    return SimLayout(tuple(nodes), levels, tuple(problems))
