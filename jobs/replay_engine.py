"""The replay engine: the platform in simulated seconds, admitting with ``jobs.admission``.

A discrete-event simulation. Events are arrivals (a run enters the queue) and completions
(a run's work is done); subclasses add their own kinds. After every batch of simultaneous
events the admitter decides once, as an admission cycle does after a submit or an end:
``Gantry`` calls ``jobs.admission.decide`` on a snapshot of the simulated platform (its
nodes, the nodes each run holds, quotas, decayed fair-share usage), so placement,
preemption, starvation reservations and backfill are the production code's. A run admitted
starts at once on the nodes admission chose and holds its GPUs until its work is done, it is
preempted, or a subclass ends it.

Pure: no ORM, no clock, no I/O. Two users: the what-if replay of a recorded history under a
proposed policy (``jobs.replay``), and the benchmarks that replay the Alibaba trace
(``bench/trace.py`` and the modules built on it), which used to carry this engine
themselves.
"""

import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobs import placement
from jobs.admission import decide, fair_share_decayed
from jobs.admission_types import (
    ClusterNode,
    Decisions,
    HeldRun,
    QueuedRun,
    Queueing,
    Quota,
    Snapshot,
)

ARRIVAL, COMPLETION = 0, 1
# (simulated time, kind, run id, the attempt a completion belongs to)
Event = tuple[float, int, int, int]
NodeKey = tuple[str, str]  # (cluster, node name)
DEFAULT_CHECKPOINT_EVERY_S = 1800.0
DEFAULT_HALF_LIFE_S = 24 * 3600.0  # GANTRY_FAIR_SHARE_HALF_LIFE_H's default
DEFAULT_STARVATION_AFTER_S = 1800.0  # GANTRY_STARVATION_AFTER_S's default


def tightness(where: placement.Placement) -> tuple[int, ...]:
    """Smaller is tighter: the deepest shared domain (as jobs.admission). A run's placements
    are all on one node or all on several, and one node is as tight as can be: those have
    nothing to compare."""
    return () if where.single_node else (-len(where.domain),)


class Nodes:
    """The clusters' GPU nodes as their backend sees them: the GPUs free on each, less the
    load from outside Gantry and Gantry's runs placed there. A gang goes where
    ``jobs.placement`` puts it; of several clusters, where admission would (the tightest
    placement, then the fewest GPUs left on the chosen nodes, then the name)."""

    def __init__(self, nodes: Iterable[ClusterNode]) -> None:
        self.node = {(n.cluster, n.name): n for n in nodes}
        self.free = {key: n.gpus - n.outside for key, n in self.node.items()}
        self.pools: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
        for key in sorted(self.node):
            node = self.node[key]
            self.pools[(node.cluster, node.flavor)].append(node)
        self.clusters: dict[str, list[str]] = defaultdict(list)
        for cluster, flavor in sorted(self.pools):
            self.clusters[flavor].append(cluster)
        self.version: Counter[str] = Counter()  # per cluster: bumped by every change
        # Schedulable nodes with every GPU free, per flavor: where a full-node gang can start.
        self.whole: Counter[str] = Counter(
            n.flavor for key, n in self.node.items() if self.is_whole(key)
        )

    def is_whole(self, key: NodeKey) -> bool:
        node = self.node[key]
        return node.schedulable and self.free[key] == node.gpus

    def capacity(self) -> dict[str, int]:
        """GPUs per flavor, the nodes' GPUs (what an operator sets quotas against)."""
        gpus: dict[str, int] = defaultdict(int)
        for n in self.node.values():
            gpus[n.flavor] += n.gpus
        return dict(gpus)

    def change(self, cluster: str, names: Iterable[str], gpus: int) -> None:
        """``gpus`` more free on each of ``names`` (fewer when negative)."""
        self.version[cluster] += 1
        for name in names:
            key = (cluster, name)
            before = self.is_whole(key)
            self.free[key] += gpus
            assert 0 <= self.free[key] <= self.node[key].gpus - self.node[key].outside, key
            self.whole[self.node[key].flavor] += self.is_whole(key) - before

    def place(self, run: QueuedRun, clusters: Iterable[str]) -> tuple[str, tuple[str, ...]] | None:
        best: tuple[str, tuple[str, ...]] | None = None
        best_rank: tuple[tuple[int, ...], int, str] | None = None
        for cluster in clusters:
            pool = self.pools.get((cluster, run.flavor), [])
            view = [
                placement.Node(n.name, n.gpus, self.free[(cluster, n.name)], n.schedulable, n.path)
                for n in pool
            ]
            where = placement.place(view, placement.Gang(run.nodes, run.gpus_per_node))
            if where is None:
                continue
            left = sum(self.free[(cluster, name)] - run.gpus_per_node for name in where.nodes)
            rank = (tightness(where), left, cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (cluster, where.nodes), rank
        return best


@dataclass
class Held:
    """An admitted run: on its nodes once placed (``started`` set), else at the backend."""

    run: QueuedRun
    cluster: str
    borrowed: bool
    admitted: float
    nodes: tuple[str, ...] = ()
    started: float | None = None


class Simulation:
    """The platform in simulated time; subclasses are the admission policies.

    ``arrivals``: (when, run id) of each run entering the queue; ``work``: run id -> the
    seconds of GPU time it needs once started; ``until``: stop then even if runs are left.
    A subclass says what a run looks like in the queue (``queued_run``) and admits
    (``admit``)."""

    def __init__(
        self,
        arrivals: Iterable[tuple[float, int]],
        work: Mapping[int, float],
        nodes: Iterable[ClusterNode],
        *,
        until: float = math.inf,
    ) -> None:
        self.nodes = Nodes(nodes)
        self.until = until
        self.events: list[Event] = [(at, ARRIVAL, run_id, 0) for at, run_id in arrivals]
        heapq.heapify(self.events)
        self.queued: dict[int, QueuedRun] = {}  # in arrival order, requeued runs last
        self.waiting_since: dict[int, float] = {}  # until it starts on nodes
        self.waited: dict[int, float] = {}  # run id -> its queue time so far, every wait
        self.remaining = dict(work)  # work left, in seconds
        self.held: dict[int, Held] = {}
        self.backend: dict[int, Held] = {}  # admitted, no nodes yet: in admission order
        self.attempts: dict[int, int] = defaultdict(int)
        self.placed_gpus = 0
        self.now = 0.0

    def queued_run(self, run_id: int) -> QueuedRun:
        raise NotImplementedError

    def run(self) -> None:
        while self.events and self.events[0][0] <= self.until:
            now = self.events[0][0]
            self.advance(now)
            while self.events and self.events[0][0] == now:
                self.handle(heapq.heappop(self.events))
            if self.queued:
                self.cycle()
            self.backend_start()
            self.batch_done()
        if self.until < math.inf:
            self.advance(self.until)
        assert all(
            left == 0 or run_id in self.waiting_since or self.running(run_id)
            for run_id, left in self.remaining.items()
        ), "a run ended without doing its work"

    def handle(self, event: Event) -> None:
        _, kind, run_id, attempt = event
        if kind == ARRIVAL:
            self.enqueue(run_id)
        elif kind == COMPLETION and self.attempts[run_id] == attempt and self.running(run_id):
            self.finish(run_id)

    def cycle(self) -> None:
        """One admission cycle (there are queued runs)."""
        self.admit()

    def batch_done(self) -> None:
        """After each batch of simultaneous events and the cycle that followed it."""

    def advance(self, now: float) -> None:
        """Time passes: subclasses add up what the platform did meanwhile."""
        self.now = now

    def enqueue(self, run_id: int) -> None:
        self.queued[run_id] = self.queued_run(run_id)
        self.waiting_since.setdefault(run_id, self.now)

    def running(self, run_id: int) -> bool:
        held = self.held.get(run_id)
        return held is not None and held.started is not None

    def admitted(self, run_id: int, cluster: str, *, borrowed: bool) -> Held:
        """Out of the queue, holding its GPUs (and quota) from now; at the backend."""
        held = Held(self.queued.pop(run_id), cluster, borrowed, self.now)
        self.held[run_id] = self.backend[run_id] = held
        return held

    def start(self, run_id: int, nodes: tuple[str, ...]) -> None:
        """The backend starts the admitted run on ``nodes``."""
        held = self.backend.pop(run_id)
        self.nodes.change(held.cluster, nodes, -held.run.gpus_per_node)
        held.nodes, held.started = nodes, self.now
        self.placed_gpus += held.run.gpus
        waited = self.now - self.waiting_since.pop(run_id)
        self.waited[run_id] = self.waited.get(run_id, 0.0) + waited
        self.attempts[run_id] += 1
        completion = (self.now + self.remaining[run_id], COMPLETION, run_id)
        heapq.heappush(self.events, (*completion, self.attempts[run_id]))

    def backend_start(self) -> None:
        """Runs admitted without nodes start where the backend finds room (none here)."""

    def release(self, run_id: int) -> Held:
        held = self.held.pop(run_id)
        if held.started is None:
            del self.backend[run_id]
        else:
            self.nodes.change(held.cluster, held.nodes, held.run.gpus_per_node)
            self.placed_gpus -= held.run.gpus
        return held

    def finish(self, run_id: int) -> None:
        self.release(run_id)
        self.remaining[run_id] = 0.0

    def admit(self) -> None:
        raise NotImplementedError


class Admitting(Simulation):
    """An admitter with quotas, fair share and preemption. ``quotas``: (tenant, flavor) ->
    its quota; a subclass may set ``self.quotas`` after this constructor instead."""

    half_life_s = DEFAULT_HALF_LIFE_S
    # A preempted run loses the work since its last checkpoint, taken every this many
    # seconds of its run (None: none, it loses all it did).
    checkpoint_every_s: float | None = DEFAULT_CHECKPOINT_EVERY_S

    def __init__(
        self,
        arrivals: Iterable[tuple[float, int]],
        work: Mapping[int, float],
        nodes: Iterable[ClusterNode],
        *,
        until: float = math.inf,
        quotas: Mapping[tuple[str, str], Quota] | None = None,
    ) -> None:
        super().__init__(arrivals, work, nodes, until=until)
        self.quotas: dict[tuple[str, str], Quota] = dict(quotas or {})
        self.holding: dict[tuple[str, str], int] = defaultdict(int)
        self.decayed: dict[tuple[str, str], float] = defaultdict(float)
        self.used: set[tuple[str, str]] = set()  # keys that ever held GPUs: the rest stay 0

    def advance(self, now: float) -> None:
        """Fair-share usage decays and grows as jobs.services.usage.fair_share_update has it."""
        elapsed = now - self.now
        if elapsed > 0:
            # fair_share_decayed is linear in the usage and the GPUs held: two factors do.
            kept = fair_share_decayed(
                1.0, gpus_held=0, elapsed_s=elapsed, half_life_s=self.half_life_s
            )
            per_gpu = fair_share_decayed(
                0.0, gpus_held=1, elapsed_s=elapsed, half_life_s=self.half_life_s
            )
            for key in self.used:
                self.decayed[key] = self.decayed[key] * kept + self.holding[key] * per_gpu
        super().advance(now)

    def admitted(self, run_id: int, cluster: str, *, borrowed: bool) -> Held:
        held = super().admitted(run_id, cluster, borrowed=borrowed)
        key = (held.run.tenant, held.run.flavor)
        self.holding[key] += held.run.gpus
        self.used.add(key)
        return held

    def release(self, run_id: int) -> Held:
        held = super().release(run_id)
        self.holding[(held.run.tenant, held.run.flavor)] -= held.run.gpus
        return held

    def kept_work(self, run_id: int, ran: float) -> float:
        """Of ``ran`` seconds of a preempted attempt, the work its next attempt resumes from."""
        every = self.checkpoint_every_s
        return 0.0 if every is None else math.floor(ran / every) * every

    def preempt(self, run_id: int) -> None:
        """Back to the queue; a run that had started loses the work since its last
        checkpoint, one still waiting at the backend loses nothing."""
        held = self.release(run_id)
        lost = 0.0
        if held.started is not None:
            ran = self.now - held.started
            kept = self.kept_work(run_id, ran)
            self.remaining[run_id] -= kept
            lost = held.run.gpus * (ran - kept)
        self.preempted(run_id, held, lost_gpu_s=lost)
        self.enqueue(run_id)

    def preempted(self, run_id: int, held: Held, *, lost_gpu_s: float) -> None:
        """What a subclass counts of a preemption (``lost_gpu_s``: the work thrown away)."""


class Gantry(Admitting):
    """``jobs.admission.decide`` on a snapshot of the simulated platform; the backend starts
    each run at once on the nodes admission placed it on. Every cluster has the queueing
    policy ``queueing``."""

    queueing = Queueing.STRICT
    starvation_after_s = DEFAULT_STARVATION_AFTER_S
    explain = True  # decide's messages: the benchmarks read them, a what-if replay does not

    def __init__(
        self,
        arrivals: Iterable[tuple[float, int]],
        work: Mapping[int, float],
        nodes: Iterable[ClusterNode],
        *,
        until: float = math.inf,
        quotas: Mapping[tuple[str, str], Quota] | None = None,
    ) -> None:
        super().__init__(arrivals, work, nodes, until=until, quotas=quotas)
        self.as_held: dict[int, HeldRun] = {}  # the held runs as the snapshot has them
        clusters = sorted({cluster for cluster, _ in self.nodes.node})
        self.queueing_of: dict[str, Queueing] = dict.fromkeys(clusters, self.queueing)

    def start(self, run_id: int, nodes: tuple[str, ...]) -> None:
        super().start(run_id, nodes)
        h = self.held[run_id]
        run = h.run
        self.as_held[run_id] = HeldRun(
            id=run_id, tenant=run.tenant, flavor=run.flavor, cluster=h.cluster, gpus=run.gpus,
            priority=run.priority, admitted=h.admitted, borrowed=h.borrowed, nodes=nodes,
            latest_end=None if run.max_runtime_s is None else self.now + run.max_runtime_s,
        )  # fmt: skip

    def release(self, run_id: int) -> Held:
        self.as_held.pop(run_id, None)
        return super().release(run_id)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            queued=tuple(self.queued.values()),
            held=tuple(self.as_held.values()),
            nodes=tuple(self.nodes.node.values()),
            quotas=self.quotas,
            decayed_usage=dict(self.decayed),
            now=self.now,
            starvation_after_s=self.starvation_after_s,
            queueing=self.queueing_of,
        )

    def admit(self) -> None:
        decisions = decide(self.snapshot(), explain=self.explain)
        for preempted in decisions.preempted:
            self.preempt(preempted.run_id)
        for admit in decisions.admitted:
            self.admitted(admit.run_id, admit.cluster, borrowed=admit.borrowed)
            self.start(admit.run_id, admit.nodes)
        self.decided(decisions)

    def decided(self, decisions: Decisions) -> None:
        """What a subclass reads of each cycle's decisions, once they are carried out."""
