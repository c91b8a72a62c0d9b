"""The simulator's stragglers (issue 36, point 5): one slow rank, one slow node or one
degraded link in a synchronous gang, and a gang placed across leaf switches. Pure: no ORM,
no clock.

An experiment asks for a straggler through its env (``Workload.from_env``)::

    GANTRY_SIM_STRAGGLER=slow_gpu        # or slow_input, degraded_link
    GANTRY_SIM_STRAGGLER_RANK=11         # which rank (default 0): its GPU, or its node
    GANTRY_SIM_STRAGGLER_FACTOR=1.5      # how much slower, 1.1 to 2.0 (default 1.5)

Ranks are numbered over the job's GPUs in the order of its nodes' names, then GPU indices
(rank 11 of 2 × 8 GPUs is GPU 3 of the second node).

The model is the lockstep of data-parallel training, as bench/stragglers.py models it
(docs/stragglers.md): per step, a rank computes (``c``), waits for its input (``d``), then
meets the others at the all-reduce, which takes a transfer ``t`` once all have arrived.
A clean gang's step is ``c + d + t`` = 1 (the profile's shares: ``d`` its data share, ``t``
its communication share). Every rank's step lasts as long as the slowest rank's time to
the collective plus the transfer; each rank's communication wait is the rest of its step:

- ``slow_gpu``: the rank's GPU computes ``factor`` times slower (its SM clock is capped at
  its maximum ÷ factor, as an admin's ``nvidia-smi -lgc`` or a firmware cap does: no
  thermal or power clock-event reason is set, so the clock below its maximum is the only
  sign; a thermal throttle is the cluster's ``faults.throttled``, clusters/sim_faults.py);
- ``slow_input``: the ranks of the rank's node wait ``factor − 1`` times their time to the
  collective longer for input (a slow local disk, a starved CPU);
- ``degraded_link``: the rank's node's InfiniBand link is degraded: its ranks reach the
  collective ``factor`` times later (their sends stall on the link, host-side work the
  SDK does not time as a wait), its traffic drops and its error counters grow
  (``telemetry.simulated``). Only a gang of two nodes or more crosses a link.

The others wait for the slow ranks: their communication wait grows, the slow ranks' does
not, and the gang's step grows, so the job runs at ``pace`` = 1 ÷ step of its normal speed.
A gang whose nodes sit under more than one leaf switch (their topology paths differ) pays
``CROSS_LEAF_TRANSFER`` times the transfer: every all-reduce crosses the spine.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


class StragglerKind(StrEnum):
    SLOW_GPU = "slow_gpu"
    SLOW_INPUT = "slow_input"
    DEGRADED_LINK = "degraded_link"


MIN_FACTOR = 1.1
MAX_FACTOR = 2.0
DEFAULT_FACTOR = 1.5
# An all-reduce across the spine: more hops, shared uplinks. An assumption of the simulator
# (fat trees are often oversubscribed 2:1 or more at the spine); it only has to be visible.
CROSS_LEAF_TRANSFER = 1.5


@dataclass(frozen=True, slots=True)
class Straggler:
    kind: StragglerKind
    rank: int
    factor: float


def straggler_from_env(env: Mapping[str, str]) -> Straggler | None:
    """The straggler an experiment's env asks for, or None. ValueError names the variable
    and says what it takes."""
    raw = env.get("GANTRY_SIM_STRAGGLER", "")
    if not raw:
        for name in ("GANTRY_SIM_STRAGGLER_RANK", "GANTRY_SIM_STRAGGLER_FACTOR"):
            if name in env:
                raise ValueError(f"{name} needs GANTRY_SIM_STRAGGLER")
        return None
    kinds = ", ".join(kind.value for kind in StragglerKind)
    if raw not in {kind.value for kind in StragglerKind}:
        raise ValueError(f"GANTRY_SIM_STRAGGLER must be one of {kinds}, got {raw!r}")
    rank_text = env.get("GANTRY_SIM_STRAGGLER_RANK", "0")
    if not rank_text.isascii() or not rank_text.isdigit():
        raise ValueError(f"GANTRY_SIM_STRAGGLER_RANK must be a rank (0, 1, …), got {rank_text!r}")
    factor_text = env.get("GANTRY_SIM_STRAGGLER_FACTOR", str(DEFAULT_FACTOR))
    try:
        factor = float(factor_text)
    except ValueError:
        factor = float("nan")
    if not MIN_FACTOR <= factor <= MAX_FACTOR:
        raise ValueError(
            f"GANTRY_SIM_STRAGGLER_FACTOR must be a number from {MIN_FACTOR} to {MAX_FACTOR}, "
            f"got {factor_text!r}"
        )
    return Straggler(StragglerKind(raw), int(rank_text), factor)


@dataclass(frozen=True, slots=True)
class RankShare:
    """One rank's waits as shares of the gang's step (0–1)."""

    data: float
    comm: float


@dataclass(frozen=True, slots=True)
class Lockstep:
    step: float  # the gang's step ÷ a clean gang's on one leaf (≥ 1)
    ranks: tuple[RankShare, ...]  # by rank
    slow_ranks: frozenset[int]
    cross_leaf: bool

    @property
    def pace(self) -> float:
        """The share of its normal speed the job keeps."""
        return 1 / self.step


def lockstep(
    *,
    data_share: float,
    comm_share: float,
    nodes: Sequence[str],
    paths: Mapping[str, tuple[str, ...]],
    straggler: Straggler | None,
) -> Lockstep:
    """The gang's step and each rank's waits, for ranks on ``nodes`` (the node of each rank,
    by rank) placed on ``paths`` (node → topology path; a node without one is apart from
    none). Raises ValueError for a straggler rank outside the gang."""
    world = len(nodes)
    compute = 1 - data_share - comm_share
    normal = compute + data_share
    gang_nodes = set(nodes)
    cross_leaf = len({paths.get(node, ()) for node in gang_nodes}) > 1
    transfer = comm_share * (CROSS_LEAF_TRANSFER if cross_leaf else 1)
    reach = [normal] * world
    data = [data_share] * world
    slow: set[int] = set()
    if straggler is not None:
        if not 0 <= straggler.rank < world:
            raise ValueError(f"straggler rank {straggler.rank} is not a rank of {world}")
        factor, node = straggler.factor, nodes[straggler.rank]
        if straggler.kind is StragglerKind.SLOW_GPU:
            slow = {straggler.rank}
        elif straggler.kind is StragglerKind.SLOW_INPUT or len(gang_nodes) > 1:
            slow = {rank for rank in range(world) if nodes[rank] == node}
        for rank in slow:
            if straggler.kind is StragglerKind.SLOW_GPU:
                reach[rank] = compute * factor + data_share
            else:
                reach[rank] = normal * factor
            if straggler.kind is StragglerKind.SLOW_INPUT:
                data[rank] = data_share + (factor - 1) * normal
    if not slow and not cross_leaf:  # the clean gang: its profile's shares, exactly
        return Lockstep(1.0, (RankShare(data_share, comm_share),) * world, frozenset(), False)
    step = max(reach, default=normal) + transfer
    shares = tuple(RankShare(data[r] / step, (step - reach[r]) / step) for r in range(world))
    return Lockstep(step, shares, frozenset(slow), cross_leaf)
