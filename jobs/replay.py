"""What if the policy had been different: a recorded window replayed under a proposal.

``replay(history, proposal)`` drives the engine of ``jobs.replay_engine`` (admission by
``jobs.admission.decide``: placement, preemption, starvation reservations, backfill,
budgets, fair share) over the window's submissions, each run holding its GPUs for the time
it really held them once admitted (docs/what-if.md says what that means for failures,
cancels and preemptions). ``observed_outcome(history)`` says what really happened, with
the same definitions; ``jobs.replay_report`` compares the two. The data is in
``jobs.replay_types``.

Pure: no ORM, no clock, no I/O; ``progress`` and ``should_stop`` are the caller's.
"""

import bisect
import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace

from jobs.admission_types import QueuedRun, Queueing, Quota, Snapshot, queue_order
from jobs.replay_engine import Event, Gantry, Held
from jobs.replay_outcome import RunRecord, by_month, month_starts, outcome_of
from jobs.replay_outcome import nearest_rank as nearest_rank
from jobs.replay_types import (
    Actual,
    Ending,
    History,
    Holding,
    Key,
    Outcome,
    Proposal,
    Submission,
    proposed_nodes,
)

CANCEL, QUOTA, TICK = 2, 3, 4  # the engine's ARRIVAL and COMPLETION are 0 and 1
PROGRESS_STEPS = 100  # a progress report at least every 1 % of the window


class ReplayStopped(Exception):
    """``should_stop`` said so: the replay was abandoned where it was."""


def replay(
    history: History,
    proposal: Proposal | None = None,
    *,
    progress: Callable[[float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Outcome:
    """The window replayed under ``proposal`` (None: the policy in force, to compare with
    ``observed_outcome``). ``progress`` gets the share of the window simulated (0 to 1) at
    least every 1 % of it; ``should_stop`` is asked after every batch of events and a True
    raises ``ReplayStopped``. A proposal with errors (``Proposal.validate``) is refused
    with ``ValueError``; its warnings are the caller's to confirm."""
    proposal = proposal or Proposal()
    problems = proposal.validate(history)
    if problems.errors:
        raise ValueError(" ".join(problems.errors))
    simulation = _Replay(history, proposal, progress=progress, should_stop=should_stop)
    simulation.run()
    return outcome_of(
        history, simulation.quotas, simulation.records(), capacity_gpus=simulation.capacity_gpus
    )


def observed_outcome(history: History) -> Outcome:
    """What really happened in the window, with the definitions of ``replay``."""
    records = [
        _record_of(s, s.actual, counted=s.submitted >= history.start) for s in history.submissions
    ]
    records.extend(_record_of(h, h.actual, counted=False) for h in history.holding)
    quotas = dict(history.quotas)
    for change in history.quota_changes:
        _set_quota(quotas, (change.tenant, change.flavor), change.quota)
    return outcome_of(history, quotas, records, capacity_gpus=sum(n.gpus for n in history.nodes))


def _record_of(run: Submission | Holding, actual: Actual, *, counted: bool) -> RunRecord:
    return RunRecord(
        tenant=run.tenant, flavor=run.flavor, gpus=run.gpus, counted=counted,
        queued_s=actual.queued_s, started=actual.started, held=list(actual.held),
        preemptions=actual.preemptions, lost_gpu_s=actual.lost_gpu_s,
    )  # fmt: skip


def _set_quota(quotas: dict[Key, Quota], key: Key, quota: Quota | None) -> None:
    if quota is None:
        quotas.pop(key, None)
    else:
        quotas[key] = quota


class _Replay(Gantry):
    explain = False  # the messages of waiting runs: nobody reads them here
    # Skip the cycles that could not admit or preempt anything (``_nothing_can_start``):
    # the outcome is the same, sooner (bench/replay.py measures both).
    skip_idle_cycles = True

    def __init__(
        self,
        history: History,
        proposal: Proposal,
        *,
        progress: Callable[[float], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        self.history, self.proposal = history, proposal
        # A run submitted after the window (a history built by hand) never arrives.
        self.submissions = {s.id: s for s in history.submissions if s.submitted < history.end}
        self.holders = {h.id: h for h in history.holding}
        # The work of each attempt still to come after the current one.
        self.segments: dict[int, list[float]] = {}
        work = {}
        for s in self.submissions.values():
            last = s.ran_s
            if s.ended == Ending.UNFINISHED or s.cancelled_at is not None:
                # Its whole need is unknown: it runs until cancelled, or to its limit.
                last = max(last, math.inf if s.max_runtime_s is None else s.max_runtime_s)
            first, *rest = (*s.failed_attempts_s, last)
            work[s.id] = first
            self.segments[s.id] = list(rest)
        arrivals = [(max(s.submitted, history.start), s.id) for s in self.submissions.values()]
        quotas = dict(history.quotas)
        quotas.update(proposal.quotas)
        super().__init__(
            arrivals, work, proposed_nodes(history, proposal.nodes), until=history.end,
            quotas=quotas,
        )  # fmt: skip
        self.now = history.start
        self.half_life_s = proposal.fair_share_half_life_s or history.fair_share_half_life_s
        self.checkpoint_every_s = None  # per run: kept_work
        self.starvation_after_s = (
            history.starvation_after_s
            if proposal.starvation_after_s is None
            else proposal.starvation_after_s
        )
        self.preemption = proposal.preemption is not False
        self.queueing_of.update(history.queueing)
        self.queueing_of.update(proposal.queueing)
        self.tenant_queueing = {**history.tenant_queueing, **proposal.tenant_queueing}
        for key, usage in history.decayed_usage.items():
            self.decayed[key] = usage
            self.used.add(key)
        self.progress, self.should_stop = progress, should_stop
        self.next_report = 0
        self.record: dict[int, RunRecord] = {}
        self.hold_from: dict[int, float] = {}
        self.cancelled: set[int] = set()
        # Per (tenant, flavor): its queued runs in queue order (a heap; runs no longer
        # queued are dropped when met) and how many of each shape (nodes, GPUs per node).
        self.lines: dict[Key, list[tuple[tuple[int, float, int], int]]] = defaultdict(list)
        self.line_shapes: dict[Key, Counter[tuple[int, int]]] = defaultdict(Counter)
        self.free_sorted: dict[tuple[str, str], tuple[int, list[int]]] = {}
        self.strict: dict[Key, bool] = {}
        self.fitting: dict[tuple[str, int, int], bool] = {}  # this cycle's answers
        self.borrowed: Counter[str] = Counter()  # flavor -> borrowed runs holding GPUs
        self.cycles = self.skipped = 0
        self.months = month_starts(history.start, history.end)
        self.budgets = any(q.budget_gpu_hours is not None for q in quotas.values()) or any(
            c.quota is not None and c.quota.budget_gpu_hours is not None
            for c in history.quota_changes
        )
        self.month_used: dict[tuple[str, str, int], float] = defaultdict(float)  # GPU-s
        for s in self.submissions.values():
            self.record[s.id] = RunRecord(s.tenant, s.flavor, s.gpus, s.submitted >= history.start)
            if s.cancelled_at is not None and s.cancelled_at <= history.end:
                self.events.append((max(s.cancelled_at, history.start), CANCEL, s.id, 0))
        for index, change in enumerate(history.quota_changes):
            if (change.tenant, change.flavor) not in proposal.quotas:
                self.events.append((change.at, QUOTA, index, 0))
        ticks = {
            history.start + history.seconds * i / PROGRESS_STEPS for i in range(1, PROGRESS_STEPS)
        }
        ticks.update(m for m in self.months[1:] if m < history.end)
        self.events.extend((at, TICK, 0, 0) for at in sorted(ticks))
        self.events.sort()
        for h in history.holding:
            self._hold_at_start(h)

    # --- the runs --------------------------------------------------------------------------

    def queued_run(self, run_id: int) -> QueuedRun:
        s = self.submissions.get(run_id)
        if s is None:
            h = self.holders[run_id]
            nodes, per_node = h.gang
            return QueuedRun(
                id=h.id, tenant=h.tenant, flavor=h.flavor, nodes=nodes, gpus_per_node=per_node,
                priority=h.priority, submitted=h.submitted, max_runtime_s=h.max_runtime_s,
            )  # fmt: skip
        return QueuedRun(
            id=s.id, tenant=s.tenant, flavor=s.flavor, nodes=s.nodes,
            gpus_per_node=s.gpus_per_node, priority=s.priority, submitted=s.submitted,
            topology_level=s.topology_level, topology_required=s.topology_required,
            max_runtime_s=s.max_runtime_s,
        )  # fmt: skip

    def _hold_at_start(self, h: Holding) -> None:
        """A run holding GPUs when the window begins: on its nodes, as admission had it."""
        self.record[h.id] = RunRecord(h.tenant, h.flavor, h.gpus, counted=False, started=True)
        remaining = h.remaining_s
        if h.ended == Ending.UNFINISHED:  # to its time limit
            limit = math.inf if h.max_runtime_s is None else h.admitted + h.max_runtime_s
            remaining = max(remaining, limit - self.now)
        self.remaining[h.id] = remaining
        self.segments[h.id] = []
        self.enqueue(h.id)
        run = self.queued[h.id]
        nodes = h.nodes
        if not nodes or any(
            self.nodes.free.get((h.cluster, name), 0) < run.gpus_per_node for name in nodes
        ):
            # Not known, gone in the proposal, or taken by what is now outside load: where
            # placement puts it on its cluster, else on no node (its quota still counts).
            where = self.nodes.place(run, [h.cluster])
            nodes = where[1] if where else ()
        self.admitted(h.id, h.cluster, borrowed=h.borrowed)
        self.held[h.id].admitted = h.admitted
        self.start(h.id, nodes)
        self.waited.pop(h.id, None)

    def start(self, run_id: int, nodes: tuple[str, ...]) -> None:
        super().start(run_id, nodes)
        self.hold_from[run_id] = self.now
        self.record[run_id].started = True
        held = self.held[run_id]
        if held.borrowed:
            self.borrowed[held.run.flavor] += 1

    def release(self, run_id: int) -> Held:
        held = super().release(run_id)
        if held.borrowed and held.started is not None:
            self.borrowed[held.run.flavor] -= 1
        since = self.hold_from.pop(run_id, None)
        if since is not None:
            self._held(run_id, since, self.now)
        return held

    def _held(self, run_id: int, since: float, until: float) -> None:
        record = self.record[run_id]
        record.held.append((since, until))
        if self.budgets:
            for month, seconds in by_month(self.months, since, until):
                self.month_used[(record.tenant, record.flavor, month)] += record.gpus * seconds

    def finish(self, run_id: int) -> None:
        super().finish(run_id)
        segments = self.segments[run_id]
        if segments:  # the attempt failed: a retry goes back to the queue
            self.remaining[run_id] = segments.pop(0)
            self.enqueue(run_id)

    def kept_work(self, run_id: int, ran: float) -> float:
        s = self.submissions.get(run_id)
        every = None if s is None else s.checkpoint_every_s
        return 0.0 if not every else math.floor(ran / every) * every

    def preempted(self, run_id: int, held: Held, *, lost_gpu_s: float) -> None:
        record = self.record[run_id]
        record.preemptions += 1
        record.lost_gpu_s += lost_gpu_s

    def handle(self, event: Event) -> None:
        _, kind, ident, _ = event
        if kind == CANCEL:
            self._cancel(ident)
        elif kind == QUOTA:
            change = self.history.quota_changes[ident]
            _set_quota(self.quotas, (change.tenant, change.flavor), change.quota)
        elif kind != TICK:
            super().handle(event)

    def enqueue(self, run_id: int) -> None:
        super().enqueue(run_id)
        self._count(self.queued[run_id], 1)

    def admitted(self, run_id: int, cluster: str, *, borrowed: bool) -> Held:
        self._count(self.queued[run_id], -1)
        return super().admitted(run_id, cluster, borrowed=borrowed)

    def _count(self, run: QueuedRun, change: int) -> None:
        key = (run.tenant, run.flavor)
        self.line_shapes[key][(run.nodes, run.gpus_per_node)] += change
        if change > 0:
            heapq.heappush(self.lines[key], (queue_order(run), run.id))

    def _cancel(self, run_id: int) -> None:
        if run_id in self.queued:
            self._count(self.queued.pop(run_id), -1)
            self.waited[run_id] = (
                self.waited.get(run_id, 0.0) + self.now - self.waiting_since.pop(run_id)
            )
        elif run_id in self.held:
            self.release(run_id)
        self.remaining[run_id] = 0.0
        self.segments[run_id] = []
        self.cancelled.add(run_id)

    # --- the cycle -------------------------------------------------------------------------

    def cycle(self) -> None:
        self.cycles += 1
        self.fitting.clear()
        if self.skip_idle_cycles and self._nothing_can_start():
            self.skipped += 1
            return
        super().cycle()

    def _nothing_can_start(self) -> bool:
        """Whether ``decide`` would surely admit and preempt nothing now. A run is admitted
        only within its quota (guarantee plus borrow limit, the largest run), onto GPUs free
        now or freed by preempting borrowed runs for a run within its guarantee; under the
        strict queueing policy only the first in its tenant's line of the flavor
        (docs/admission.md). Reservations, budgets and topology only hold runs back. So:
        no run that may be decided fits the free GPUs of its flavor's clusters, and none
        within its guarantee has a borrowed run to reclaim."""
        for key, shapes in self.line_shapes.items():
            quota = self.quotas.get(key)
            if quota is None:
                continue
            tenant, flavor = key
            used = self.holding[key]
            if self._strict(tenant, flavor):
                head = self._head(key)
                candidates = [] if head is None else [(head.nodes, head.gpus_per_node)]
            else:
                candidates = [shape for shape, count in shapes.items() if count > 0]
            for nodes, per_node in candidates:
                gpus = nodes * per_node
                if used + gpus > quota.guaranteed + quota.borrow_limit or (
                    quota.max_gpus_per_run is not None and gpus > quota.max_gpus_per_run
                ):
                    continue
                if self._fits(flavor, nodes, per_node):
                    return False
                if self.preemption and used + gpus <= quota.guaranteed and self.borrowed[flavor]:
                    return False
        return True

    def _strict(self, tenant: str, flavor: str) -> bool:
        key = (tenant, flavor)
        if key not in self.strict:
            policy = self.tenant_queueing.get(tenant)
            self.strict[key] = (
                policy == Queueing.STRICT
                if policy is not None
                else all(
                    self.queueing_of.get(cluster, Queueing.STRICT) == Queueing.STRICT
                    for cluster in self.nodes.clusters.get(flavor, [])
                )
            )
        return self.strict[key]

    def _head(self, key: Key) -> QueuedRun | None:
        line = self.lines[key]
        while line and line[0][1] not in self.queued:
            heapq.heappop(line)
        return self.queued[line[0][1]] if line else None

    def _fits(self, flavor: str, nodes: int, per_node: int) -> bool:
        """Whether some cluster of the flavor has ``nodes`` nodes taking work with
        ``per_node`` GPUs free each: where a gang of that shape has a placement (a required
        topology level and excluded nodes only narrow it). Asked once per shape and cycle."""
        shape = (flavor, nodes, per_node)
        if shape not in self.fitting:
            self.fitting[shape] = any(
                len(free) - bisect.bisect_left(free, per_node) >= nodes
                for free in self._free_by_cluster(flavor)
            )
        return self.fitting[shape]

    def _free_by_cluster(self, flavor: str) -> list[list[int]]:
        """Per cluster of the flavor, the free GPUs of its nodes that take work, sorted;
        kept until the cluster changes."""
        lists = []
        for cluster in self.nodes.clusters.get(flavor, []):
            version = self.nodes.version[cluster]
            known = self.free_sorted.get((cluster, flavor))
            if known is None or known[0] != version:
                free = sorted(
                    self.nodes.free[(cluster, node.name)]
                    for node in self.nodes.pools[(cluster, flavor)]
                    if node.schedulable
                )
                known = self.free_sorted[(cluster, flavor)] = (version, free)
            lists.append(known[1])
        return lists

    def snapshot(self) -> Snapshot:
        held = tuple(self.as_held.values())
        if not self.preemption:
            held = tuple(replace(run, borrowed=False) if run.borrowed else run for run in held)
        return Snapshot(
            queued=tuple(self.queued.values()),
            held=held,
            nodes=tuple(self.nodes.node.values()),
            quotas=self.quotas,
            budget_used=self._budget_used() if self.budgets else {},
            decayed_usage=dict(self.decayed),
            now=self.now,
            starvation_after_s=self.starvation_after_s,
            levels=self.history.levels,
            queueing=self.queueing_of,
            tenant_queueing=self.tenant_queueing,
        )

    def _budget_used(self) -> dict[Key, float]:
        """GPU-hours this month per (tenant, flavor), as ``gpu_hours_this_month`` counts them:
        ended holds, and the held runs' time so far."""
        month = bisect.bisect_right(self.months, self.now) - 1
        since = self.months[month]
        used: dict[Key, float] = defaultdict(float)
        if month == 0:
            for key, hours in self.history.budget_used.items():
                used[key] += hours * 3600
        for (tenant, flavor, of_month), seconds in self.month_used.items():
            if of_month == month:
                used[(tenant, flavor)] += seconds
        for run_id, start in self.hold_from.items():
            record = self.record[run_id]
            used[(record.tenant, record.flavor)] += record.gpus * (self.now - max(start, since))
        return {key: seconds / 3600 for key, seconds in used.items()}

    def batch_done(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise ReplayStopped
        if self.progress is not None:
            done = (self.now - self.history.start) / (self.history.seconds or 1)
            # (the ticks are at whole percents; a float a hair below one still counts)
            step = min(PROGRESS_STEPS, math.floor(done * PROGRESS_STEPS + 1e-9))
            if step > self.next_report:
                self.next_report = step
                self.progress(step / PROGRESS_STEPS)

    # --- the results -----------------------------------------------------------------------

    def run(self) -> None:
        super().run()
        for run_id, since in list(self.hold_from.items()):
            self._held(run_id, since, self.history.end)
        for run_id, since in self.waiting_since.items():
            self.waited[run_id] = self.waited.get(run_id, 0.0) + self.history.end - since
        if self.progress is not None and self.next_report < PROGRESS_STEPS:
            self.progress(1.0)

    @property
    def capacity_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.node.values())

    def records(self) -> list[RunRecord]:
        for run_id, waited in self.waited.items():
            self.record[run_id].queued_s = waited
        return list(self.record.values())
