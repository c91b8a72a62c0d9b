"""A run's recorded timeline made into what a replay reads (``jobs.replay_types``).

The selector (``jobs.selectors.replay_history``) reads runs, their events and checkpoints;
here, from plain rows, each run's holds (from an admission until Gantry took its GPUs back:
the run ended, was preempted or requeued), its waits in the queue, how each hold ended, and
from that the ``Submission`` or ``Holding`` a replay starts from and the ``Actual`` it is
compared with. Also the fair-share usage and the budget use at the window's start, from the
holds before it.

Pure: no ORM, no clock, no I/O.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jobs.replay_types import Actual, Ending, Holding, Key, Submission

HOLDING = frozenset({"ADMITTED", "SUBMITTING", "PENDING", "RUNNING"})
WAITING = frozenset({"QUEUED", "PREEMPTED", "SUSPENDED"})
ENDINGS = {"SUCCEEDED": Ending.FINISHED, "FAILED": Ending.FAILED, "CANCELLED": Ending.CANCELLED}


@dataclass(frozen=True, slots=True)
class RunRow:
    id: int
    tenant: str
    flavor: str
    nodes: int
    gpus_per_node: int
    priority: int
    submitted: float  # epoch seconds
    max_runtime_s: float | None
    topology_level: str
    topology_required: bool
    state: str  # as read
    borrowed: bool

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class EventRow:
    at: float
    from_state: str
    to_state: str
    reason: str
    actor: str  # username, "" for Gantry


@dataclass(frozen=True, slots=True)
class Hold:
    since: float
    until: float | None  # None: still holding when read
    ended_by: str  # the state it left holding for: PREEMPTED, QUEUED, SUCCEEDED, …; ""
    cluster: str = ""
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Timeline:
    holds: tuple[Hold, ...]
    waits: tuple[tuple[float, float | None], ...]  # in the queue (or preempted), to admission
    cancelled_at: float | None  # a cancel of the run while it held no GPUs
    cancelled_by: str


def timeline(run: RunRow, events: Sequence[EventRow]) -> Timeline:
    """Holds and waits from the run's events (in order). A run waits from its submission and
    from each time it lost its GPUs to a preemption or a requeue, until its next admission;
    a cancel while it waits ends that wait."""
    holds: list[Hold] = []
    waits: list[tuple[float, float | None]] = []
    holding_since: float | None = None
    waiting_since: float | None = run.submitted
    cancelled_at, cancelled_by = None, ""
    for event in events:
        if event.to_state in HOLDING and holding_since is None:
            holding_since = event.at
            if waiting_since is not None:
                waits.append((waiting_since, event.at))
                waiting_since = None
        elif event.to_state not in HOLDING and holding_since is not None:
            holds.append(Hold(holding_since, event.at, event.to_state))
            holding_since = None
            if event.to_state in WAITING:
                waiting_since = event.at
        if event.reason == "CANCEL_REQUESTED" and event.actor:
            cancelled_by = event.actor
        if event.to_state == "CANCELLED":
            cancelled_by = event.actor or cancelled_by
            if event.from_state in WAITING:
                cancelled_at = event.at
            if waiting_since is not None:
                waits.append((waiting_since, event.at))
                waiting_since = None
    if holding_since is not None:
        holds.append(Hold(holding_since, None, ""))
    if waiting_since is not None:
        waits.append((waiting_since, None))
    return Timeline(tuple(holds), tuple(waits), cancelled_at, cancelled_by)


def _kept(hold: Hold, checkpoints: Sequence[float]) -> float:
    """Of a preempted hold, the work up to its last checkpoint (the next attempt resumes
    from it); 0 without one."""
    until = math.inf if hold.until is None else hold.until
    saved = [at for at in checkpoints if hold.since <= at <= until]
    return max(saved) - hold.since if saved else 0.0


def checkpoint_every(checkpoints: Sequence[float], holds: Sequence[Hold]) -> float | None:
    """The median interval between a run's checkpoints (the first counted from the start of
    its hold; one saved at that very moment measures no interval); None without
    checkpoints."""
    gaps = []
    for hold in holds:
        until = math.inf if hold.until is None else hold.until
        previous = hold.since
        for at in sorted(at for at in checkpoints if hold.since < at <= until):
            gaps.append(at - previous)
            previous = at
    if not gaps:
        return None
    gaps.sort()
    return gaps[len(gaps) // 2]


def _clip(
    since: float, until: float | None, start: float, end: float
) -> tuple[float, float] | None:
    since, stop = max(since, start), min(end if until is None else until, end)
    return (since, stop) if stop > since else None


def actual(
    run: RunRow, line: Timeline, checkpoints: Sequence[float], *, start: float, end: float
) -> Actual:
    """What really happened to the run inside [start, end)."""
    held = [c for h in line.holds if (c := _clip(h.since, h.until, start, end))]
    preempted = [
        h
        for h in line.holds
        if h.ended_by == "PREEMPTED" and h.until is not None and start <= h.until < end
    ]
    lost = sum(run.gpus * (h.until - h.since - _kept(h, checkpoints)) for h in preempted if h.until)
    return Actual(
        held=tuple(held),
        queued_s=sum((c[1] - c[0] for w in line.waits if (c := _clip(*w, start, end))), 0.0),
        started=any(h.since < end for h in line.holds),
        preemptions=len(preempted),
        lost_gpu_s=lost,
    )


def ending(run: RunRow) -> Ending:
    return ENDINGS.get(run.state, Ending.UNFINISHED)


def submission(
    run: RunRow, line: Timeline, checkpoints: Sequence[float], *, start: float, end: float
) -> Submission:
    """The run as a replay submits it: the holds ended by a failure or a requeue (a retry,
    a placement that expired) are failed attempts, each held as long; the last hold and the
    work kept from preempted holds are its run time."""
    failed, kept = [], 0.0
    last = 0.0
    for hold in line.holds:
        if hold.since < start:  # before the window: its work is done, not replayed
            continue
        length = (end if hold.until is None else hold.until) - hold.since
        if hold.ended_by == "PREEMPTED":
            kept += _kept(hold, checkpoints)
        elif hold.ended_by in WAITING:  # requeued without a preemption: a failed attempt
            failed.append(length)
        else:
            last = length
    return Submission(
        id=run.id,
        tenant=run.tenant,
        flavor=run.flavor,
        nodes=run.nodes,
        gpus_per_node=run.gpus_per_node,
        priority=run.priority,
        submitted=run.submitted,
        ran_s=last + kept,
        max_runtime_s=run.max_runtime_s,
        topology_level=run.topology_level,
        topology_required=run.topology_required,
        ended=ending(run),
        cancelled_at=line.cancelled_at,
        cancelled_by=line.cancelled_by,
        failed_attempts_s=tuple(failed),
        checkpoint_every_s=checkpoint_every(checkpoints, line.holds),
        actual=actual(run, line, checkpoints, start=start, end=end),
    )


def holding(
    run: RunRow,
    line: Timeline,
    hold: Hold,
    checkpoints: Sequence[float],
    *,
    start: float,
    end: float,
) -> Holding:
    """The run as it held GPUs at the window's start (``hold`` spans it)."""
    until = hold.until
    return Holding(
        id=run.id,
        tenant=run.tenant,
        flavor=run.flavor,
        cluster=hold.cluster,
        gpus=run.gpus,
        nodes=hold.nodes if len(hold.nodes) == run.nodes else (),
        priority=run.priority,
        submitted=run.submitted,
        admitted=hold.since,
        borrowed=run.borrowed,
        remaining_s=(end if until is None else until) - start,
        max_runtime_s=run.max_runtime_s,
        ended=Ending.UNFINISHED if until is None else ending(run),
        actual=actual(run, line, checkpoints, start=start, end=end),
    )


def decayed_usage(
    holds: Iterable[tuple[Key, int, float, float | None]], *, at: float, half_life_s: float
) -> dict[Key, float]:
    """Fair-share usage at ``at`` from the holds before it ((tenant, flavor), GPUs, since,
    until): each GPU-second decayed by its age, as ``jobs.admission.fair_share_decayed``
    integrates it."""
    tau = half_life_s / math.log(2)
    usage: dict[Key, float] = {}
    for key, gpus, since, until in holds:
        stop = min(at, at if until is None else until)
        if stop <= since:
            continue
        # the integral of gpus * exp(-(at - t) / tau) dt over [since, stop]
        part = gpus * tau * (math.exp(-(at - stop) / tau) - math.exp(-(at - since) / tau))
        usage[key] = usage.get(key, 0.0) + part
    return usage


def used_since(
    holds: Iterable[tuple[Key, int, float, float | None]], *, since: float, until: float
) -> dict[Key, float]:
    """GPU-hours held in [since, until) per (tenant, flavor)."""
    used: dict[Key, float] = {}
    for key, gpus, start, stop in holds:
        clipped = _clip(start, stop, since, until)
        if clipped:
            used[key] = used.get(key, 0.0) + gpus * (clipped[1] - clipped[0]) / 3600
    return used
