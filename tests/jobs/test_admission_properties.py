"""Properties of the pure admission function over random clusters of nodes (hypothesis, no
database).

The snapshots have 1-3 clusters with a topology of 0-2 levels, nodes of different sizes,
drained nodes, GPUs used by jobs from outside Gantry (now and then more than a node has left,
as when outside load grows under Gantry's runs), and held runs on known nodes (never beyond
what a node has) or on unknown ones.

Every property replays the decisions on the test's own model of each node's GPUs, in the
order ``decide`` takes them (its docstring is the contract): first the runs that keep their
tenant within its guarantee, in line (priority, then FIFO; a tenant that preemptions bring
back within its guarantee gets another pass), each one's preemptions just before its
admission and each starving one's reservation where it waits; then the borrowers'
admissions in the order given. A run held on unknown nodes is put where the contract says
admission assumes it: on the nodes with the most free GPUs. Whether a gang has a placement
is asked of ``jobs.placement.place`` (checked against a brute-force oracle in
test_placement.py) on that model. Beyond these properties, an oracle: ``decide`` must reach
exactly the decisions of the naive re-implementation in bench/naive.py on every snapshot.
The examples are derandomized, so CI runs the same ones every time.
"""

import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from bench import naive
from jobs import placement
from jobs.admission import decide, fair_share_decayed
from jobs.admission_types import (
    Admit,
    ClusterNode,
    Decisions,
    HeldRun,
    Pool,
    QueuedRun,
    Quota,
    Reservation,
    Snapshot,
    Wait,
    nodes_of,
    queue_order,
)

PROPERTY = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SCENARIO = settings(PROPERTY, max_examples=150)
THOROUGH = settings(PROPERTY, max_examples=200)  # the properties of preemption

CLUSTERS = ("c1", "c2", "c3")
FLAVORS = ("a100", "h100")
TENANTS = ("t1", "t2", "t3", "t4")
PRIORITIES = (0, 50, 100)
LEVELS = ("block", "leaf")  # widest first; "rack" below is a level no cluster has
NOW = 10_000.0
INF = float("inf")

NodeKey = tuple[str, str]  # (cluster, node name)


# --- strategies ------------------------------------------------------------------------


# Compact draws: one draw picks several fields from a table whose first entry is the
# simplest, so examples stay cheap to generate and still shrink towards simple ones.
QUOTA_EXTRAS = (
    (None, None, True),
    (None, None, False),
    (None, None, True),
    (4, None, True),
    (8, None, True),
    (16, None, True),
    (None, 10.0, True),
    (None, 10.0, False),
    (None, 500.0, True),
    (None, 500.0, False),
)  # (max_gpus_per_run, budget_gpu_hours, budget_hard)
# (GPUs, GPUs used from outside Gantry, schedulable)
NODE_SIZES = (
    (8, 0, True), (4, 0, True), (2, 0, True), (8, 0, True), (4, 0, True), (8, 0, True),
    (8, 1, True), (8, 4, True), (4, 2, True), (8, 8, True), (8, 0, False), (4, 0, False),
)  # fmt: skip
# (block, leaf, whether the node lacks its last label)
PLACES = ((0, 0, False), (0, 1, False), (1, 0, False), (1, 1, False)) * 2 + ((0, 0, True),)
# (nodes, GPUs per node)
RUN_SHAPES = (
    (1, 1), (1, 2), (1, 4), (1, 8), (1, 3), (1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (2, 8),
    (2, 1), (3, 1), (3, 4), (3, 8),
)  # fmt: skip
# (level, required); no cluster has a "rack" level
TOPOLOGIES = (
    ("", False), ("", False), ("block", False), ("leaf", False), ("block", True),
    ("leaf", True), ("", False), ("leaf", True), ("rack", True),
)  # fmt: skip


# (borrowed flag flipped, as after a quota change; nodes known)
HELD_KINDS = ((False, True), (False, True), (False, False), (True, True), (False, True))
PRIORITIES_AND_TIMES = tuple(
    (priority, float(admitted)) for admitted in range(0, 9_001, 1_500) for priority in PRIORITIES
)  # of held runs
PRIORITIES_AND_MINUTES = tuple(
    (priority, minute) for minute in range(0, 51, 5) for priority in PRIORITIES
)  # of queued runs, submitted that many minutes ago


_INTEGERS: dict[tuple[int, int], st.SearchStrategy[int]] = {}


def between(draw, low: int, high: int) -> int:
    """``draw(st.integers(low, high))`` with the strategy built once (building strategies
    costs more than drawing from them)."""
    if (low, high) not in _INTEGERS:
        _INTEGERS[(low, high)] = st.integers(low, high)
    return draw(_INTEGERS[(low, high)])


def pick(draw, options):
    """One of ``options``, shrinking towards the first."""
    return options[between(draw, 0, len(options) - 1)]


@st.composite
def quotas(draw) -> Quota:
    max_gpus_per_run, budget, hard = pick(draw, QUOTA_EXTRAS)
    return Quota(
        guaranteed=between(draw, 0, 32),
        borrow_limit=between(draw, 0, 24),
        max_gpus_per_run=max_gpus_per_run,
        budget_gpu_hours=budget,
        budget_hard=hard,
        weight=between(draw, 1, 4),
    )


@st.composite
def inventories(draw, *, crowded: bool, flavors: tuple[str, ...]):
    """Nodes of 2, 4 or 8 GPUs per (cluster, flavor), some drained, some with outside load,
    each under a path of its cluster's depth (0-2 levels; now and then one label short)."""
    clusters = CLUSTERS[: 1 if crowded else between(draw, 1, 3)]
    nodes: list[ClusterNode] = []
    levels: dict[str, tuple[str, ...]] = {}
    for cluster in clusters:
        depth = pick(draw, (2, 0, 1, 2))
        if depth or pick(draw, (False, True)):
            levels[cluster] = LEVELS[:depth]
        for flavor in flavors:
            if not crowded and between(draw, 0, 3) == 0:
                continue
            for index in range(between(draw, 1, 4 if crowded else 5)):
                gpus, outside, schedulable = pick(draw, NODE_SIZES)
                block, leaf, short = pick(draw, PLACES)
                path = (f"b{block}", f"b{block}-l{leaf}")[: depth - 1 if short and depth else depth]
                nodes.append(
                    ClusterNode(
                        cluster,
                        flavor,
                        f"{cluster}-{flavor}-{index:02d}",
                        gpus,
                        outside=outside,
                        schedulable=schedulable,
                        reason="" if schedulable else "drained: bad DIMM",
                        path=path,
                    )
                )
    if not nodes:
        nodes.append(ClusterNode(clusters[0], flavors[0], f"{clusters[0]}-{flavors[0]}-00", 8))
    return nodes, levels


@st.composite
def snapshots(draw, *, starvation=None) -> Snapshot:
    """1-3 clusters, 1-2 flavors, 1-4 tenants, held runs that fit their nodes, 0-20 queued
    runs, some of which need their nodes in one block or leaf ("rack": no cluster has it).

    Half of the snapshots are crowded (one cluster, one flavor, 1-4 nodes), where runs
    compete. ``starvation`` fixes ``starvation_after_s``; otherwise it is drawn."""
    crowded = pick(draw, (False, True))
    flavors = FLAVORS[: 1 if crowded else between(draw, 1, 2)]
    tenants = TENANTS[: between(draw, 1, 4)]
    nodes, levels = draw(inventories(crowded=crowded, flavors=flavors))

    quota_of: dict[tuple[str, str], Quota] = {}
    budget_used: dict[tuple[str, str], float] = {}
    decayed: dict[tuple[str, str], float] = {}
    for tenant in tenants:
        for flavor in flavors:
            key = (tenant, flavor)
            if between(draw, 0, 7) == 0:
                continue  # no quota for this flavor
            quota = quota_of[key] = draw(quotas())
            if quota.budget_gpu_hours is not None:
                budget = quota.budget_gpu_hours
                budget_used[key] = pick(draw, (0.0, budget, budget / 2, 2 * budget))
            if pick(draw, (False, True)):
                decayed[key] = float(between(draw, 0, 10**6))

    # Held runs: an equal share on each of 1-3 nodes of one pool, never beyond what a node
    # has; borrowed when beyond the guarantee (sometimes flipped, as after a quota change);
    # one in four on nodes admission does not know.
    pools: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
    for node in nodes:
        pools[(node.cluster, node.flavor)].append(node)
    room = {node.name: node.gpus - node.outside for node in nodes}
    held_parts = []
    usage: dict[tuple[str, str], int] = defaultdict(int)
    for (cluster, flavor), members in pools.items():
        for _ in range(between(draw, 0, 3)):
            share = pick(draw, (4, 1, 2, 8, 3, 2, 1))
            fits = [node.name for node in members if room[node.name] >= share]
            if not fits:
                continue
            first = between(draw, 0, len(fits) - 1)
            count = between(draw, 1, min(3, len(fits)))
            on = tuple((fits[first:] + fits[:first])[:count][::-1])  # not always sorted
            for name in on:
                room[name] -= share
            tenant = pick(draw, tenants)
            key = (tenant, flavor)
            guaranteed = quota_of[key].guaranteed if key in quota_of else 0
            borrowed = usage[key] + share * count > guaranteed
            flipped, known = pick(draw, HELD_KINDS)
            usage[key] += share * count
            held_parts.append(
                (
                    tenant,
                    flavor,
                    cluster,
                    share * count,
                    *pick(draw, PRIORITIES_AND_TIMES),
                    borrowed != flipped,
                    on if known else (),
                )
            )
    # Now and then outside load grows on a node under Gantry's runs: it is over-committed.
    if between(draw, 0, 3) == 0:
        index = between(draw, 0, len(nodes) - 1)
        node = nodes[index]
        if node.gpus - node.outside > room[node.name]:
            nodes[index] = replace(node, outside=node.outside + room[node.name] + 1)

    pairs = [(tenant, flavor) for tenant in tenants for flavor in flavors]
    size = between(draw, 0, 20)  # uniform, where lists would favour short ones
    queued_parts = [
        (
            *pick(draw, pairs),
            *pick(draw, RUN_SHAPES),
            *pick(draw, PRIORITIES_AND_MINUTES),
            *pick(draw, TOPOLOGIES),
        )
        for _ in range(size)
    ]
    ids = list(range(1, len(held_parts) + len(queued_parts) + 1))
    random.Random(between(draw, 0, 2**16)).shuffle(ids)
    held = tuple(HeldRun(ids[i], *part) for i, part in enumerate(held_parts))
    queued = tuple(
        QueuedRun(
            ids[len(held_parts) + i],
            tenant,
            flavor,
            count,
            per_node,
            priority,
            NOW - 60.0 * minute,
            topology_level=level,
            topology_required=required,
        )
        for i, (tenant, flavor, count, per_node, priority, minute, level, required) in enumerate(
            queued_parts
        )
    )
    if starvation is None:
        starvation = pick(draw, (INF, 0.0, 600.0, 1800.0))
    return Snapshot(
        queued=queued,
        held=held,
        nodes=tuple(nodes),
        quotas=quota_of,
        budget_used=budget_used,
        decayed_usage=decayed,
        now=NOW,
        starvation_after_s=starvation,
        levels=levels,
    )


@st.composite
def snapshots_with_a_reclaimable_head(draw) -> Snapshot:
    """A random snapshot whose first run in line belongs to a tenant that stays within its
    guarantee, with no limits and no budget in the way; other tenants' guarantees are often
    raised too. On some clusters of its flavor the free GPUs of the nodes are filled with
    borrowed runs of a lender (on one node or an equal share of two; some on unknown nodes),
    so that it has to reclaim them; the lender is sometimes a tenant with runs in line,
    which a reclaim can bring back within its guarantee."""
    snapshot = draw(snapshots())
    if not snapshot.queued:
        return snapshot
    head = min(snapshot.queued, key=queue_order)
    key = (head.tenant, head.flavor)
    usage = Counter()
    for run in snapshot.held:
        usage[(run.tenant, run.flavor)] += run.gpus
    quota_of = dict(snapshot.quotas)
    for other, quota in snapshot.quotas.items():
        if pick(draw, (False, True)):
            quota_of[other] = replace(quota, guaranteed=usage[other] + between(draw, 0, 16))
    quota_of[key] = Quota(
        guaranteed=usage[key] + head.gpus + between(draw, 0, 8),
        borrow_limit=between(draw, 0, 8),
        weight=between(draw, 1, 4),
    )
    lender = pick(draw, ("lender", *sorted({r.tenant for r in snapshot.queued} - {head.tenant})))
    model = Model(snapshot)
    lent = []
    next_id = 1 + max(r.id for r in (*snapshot.queued, *snapshot.held))
    for cluster in sorted({n.cluster for n in snapshot.nodes if n.flavor == head.flavor}):
        if not pick(draw, (True, True, True, False)):
            continue
        left = {k: model.free(k) for k in model.pools[(cluster, head.flavor)]}
        for k in sorted(left):
            while left[k] > 0:
                partner = [o for o in sorted(left) if o != k and left[o] > 0]
                share = between(draw, 1, left[k])
                on = [k]
                if partner and pick(draw, (False, True)):
                    other = pick(draw, partner)
                    share = min(share, left[other])
                    on.append(other)
                for each in on:
                    left[each] -= share
                lent.append(
                    HeldRun(
                        id=next_id,
                        tenant=lender,
                        flavor=head.flavor,
                        cluster=cluster,
                        gpus=share * len(on),
                        priority=pick(draw, PRIORITIES),
                        admitted=float(between(draw, 0, 9_000)),
                        borrowed=True,
                        nodes=tuple(name for _, name in on) if between(draw, 0, 4) else (),
                    )
                )
                next_id += 1
    return replace(snapshot, quotas=quota_of, held=snapshot.held + tuple(lent))


# --- the model: each node's GPUs as the cycle goes -------------------------------------


def required_depth(snapshot: Snapshot, run: QueuedRun, cluster: str) -> int | None:
    """The depth of the path the run's nodes must share on ``cluster``: None for anywhere,
    -1 when the cluster lacks the level (the run cannot go there)."""
    if not (run.topology_required and run.topology_level):
        return None
    levels = tuple(snapshot.levels.get(cluster, ()))
    return levels.index(run.topology_level) + 1 if run.topology_level in levels else -1


class Model:
    """Per node: GPUs used by Gantry's runs (held, then admitted), GPUs held for starving
    runs, and the nodes they fence. Free = GPUs - outside - used (negative if over-committed);
    available = free less what is held for starving runs, at least 0."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.nodes: dict[NodeKey, ClusterNode] = {(n.cluster, n.name): n for n in snapshot.nodes}
        self.pools: dict[tuple[str, str], list[NodeKey]] = defaultdict(list)
        for key in sorted(self.nodes):
            node = self.nodes[key]
            self.pools[(node.cluster, node.flavor)].append(key)
        self.used: Counter[NodeKey] = Counter()
        self.reserved: Counter[NodeKey] = Counter()
        self.fenced: set[NodeKey] = set()
        self.on: dict[int, dict[NodeKey, int]] = {}  # run id -> GPUs per node
        self.borrowed: dict[int, HeldRun] = {}  # snapshot runs that are borrowed, still held
        self.usage: Counter[tuple[str, str]] = Counter()  # (tenant, flavor) -> GPUs
        unknown = []
        for run in snapshot.held:
            self.usage[(run.tenant, run.flavor)] += run.gpus
            if (run.cluster, run.flavor) not in self.pools:
                continue
            if run.borrowed:
                self.borrowed[run.id] = run
            if run.nodes:
                share = run.gpus // len(run.nodes)
                self.hold(run.id, {(run.cluster, name): share for name in run.nodes})
            else:
                unknown.append(run)
        # The contract: a run on unknown nodes is assumed on the nodes with the most free GPUs
        # (after the runs whose nodes are known), the oldest such run first.
        for run in sorted(unknown, key=lambda r: (r.admitted, r.id)):
            on, left = {}, run.gpus
            for key in sorted(
                self.pools[(run.cluster, run.flavor)], key=lambda k: (-self.free(k), k)
            ):
                taken = min(left, max(0, self.free(key)))
                if taken:
                    on[key] = taken
                    left -= taken
            self.hold(run.id, on)

    def copy(self) -> "Model":
        other = object.__new__(Model)
        other.__dict__.update(self.__dict__)
        for name in ("used", "reserved", "fenced", "on", "borrowed", "usage"):
            setattr(other, name, type(getattr(self, name))(getattr(self, name)))
        return other

    def free(self, key: NodeKey, returned: int = 0) -> int:
        node = self.nodes[key]
        return node.gpus - node.outside - self.used[key] + returned

    def available(self, key: NodeKey, returned: int = 0) -> int:
        return max(0, self.free(key, returned) - self.reserved[key])

    def hold(self, run_id: int, on: dict[NodeKey, int]) -> None:
        self.on[run_id] = on
        for key, gpus in on.items():
            self.used[key] += gpus

    def release(self, run_id: int) -> None:
        for key, gpus in self.on.pop(run_id, {}).items():
            self.used[key] -= gpus
        self.borrowed.pop(run_id, None)

    def place(
        self, run: QueuedRun, cluster: str, returned: Counter | None = None
    ) -> placement.Placement | None:
        """Where ``run`` fits on ``cluster`` if the runs behind ``returned`` (GPUs per node)
        were gone: jobs.placement on the available GPUs, at the run's required level."""
        depth = required_depth(self.snapshot, run, cluster)
        if depth == -1:
            return None
        returned = returned or Counter()
        view = [
            placement.Node(
                name=key[1],
                gpus=self.nodes[key].gpus,
                free=self.available(key, returned[key]),
                schedulable=self.nodes[key].schedulable,
                path=self.nodes[key].path,
            )
            for key in self.pools[(cluster, run.flavor)]
        ]
        return placement.place(view, placement.Gang(run.nodes, run.gpus_per_node, depth))

    def clusters_of(self, flavor: str) -> list[str]:
        return sorted({cluster for cluster, f in self.pools if f == flavor})

    def reclaimable(self, run: QueuedRun, cluster: str) -> list[HeldRun]:
        """Borrowed runs of other tenants on the run's pool that touch no fenced node."""
        return [
            victim
            for victim in self.borrowed.values()
            if (victim.cluster, victim.flavor) == (cluster, run.flavor)
            and victim.tenant != run.tenant
            and not self.fenced.intersection(self.on.get(victim.id, {}))
        ]

    def gpus_of(self, runs) -> Counter:
        freed: Counter[NodeKey] = Counter()
        for each in runs:
            freed.update(self.on.get(each.id, {}))
        return freed


@dataclass
class Step:
    """One admission as ``decide`` took it."""

    run: QueuedRun
    admit: Admit
    victims: list[HeldRun]
    before: Model  # just before it: after earlier decisions, before its preemptions
    after_victims: Model  # its preemptions applied
    usage_before: int  # the tenant's GPUs of the flavor before the admission
    guaranteed: bool  # decided among the runs within their guarantee


@dataclass
class CapacityWait:
    """A run within its guarantee that waits for capacity, and the model at its turn."""

    run: QueuedRun
    before: Model
    fences_known: bool  # False after a starving run fenced nodes with no GPUs held for it


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)
    capacity_waits: list[CapacityWait] = field(default_factory=list)
    held_for: dict[int, dict[NodeKey, int]] = field(default_factory=dict)  # by reservation
    final: Model | None = None
    initial: Model | None = None
    passes: int = 0  # over the runs within their guarantee


def precheck(snapshot: Snapshot, run: QueuedRun) -> Wait | None:
    """The quota and budget gates, which depend on nothing but the snapshot."""
    key = (run.tenant, run.flavor)
    quota = snapshot.quotas.get(key)
    if quota is None or quota.guaranteed + quota.borrow_limit == 0:
        return Wait.NO_QUOTA
    if quota.max_gpus_per_run is not None and run.gpus > quota.max_gpus_per_run:
        return Wait.TOO_LARGE
    if (
        quota.budget_gpu_hours is not None
        and quota.budget_hard
        and snapshot.budget_used.get(key, 0.0) >= quota.budget_gpu_hours
    ):
        return Wait.BUDGET_EXHAUSTED
    return None


def starving(snapshot: Snapshot, run: QueuedRun) -> bool:
    return snapshot.now >= run.submitted + snapshot.starvation_after_s


def replay(snapshot: Snapshot, decisions: Decisions) -> Trace:
    """Apply the decisions in the order ``decide`` takes them (see the module docstring).

    The runs within their guarantee come first: in line, each tenant and flavor until its
    first run that would go beyond the guarantee or waits; a tenant that preemptions bring
    back within its guarantee gets another pass. Each of them must be admitted unborrowed
    (the next such Admit) or wait with CAPACITY; a starving one's reservation is applied
    where it waits: up to ``gpus_per_node`` of each of its nodes' available GPUs. Then the
    borrowed admissions, in the order given (the borrowers' reservations, made among them at
    turns the decisions do not tell, are left to the final state)."""
    model = Model(snapshot)
    trace = Trace(initial=model.copy())
    queued = {r.id: r for r in snapshot.queued}
    held = {r.id: r for r in snapshot.held}
    admits = {a.run_id: a for a in decisions.admitted}
    waits = {w.run_id: w for w in decisions.waiting}
    reservations = {r.run_id: r for r in decisions.reservations}
    victims_of: dict[int, list[HeldRun]] = defaultdict(list)
    for preempt in decisions.preempted:
        victims_of[preempt.by_run_id].append(held[preempt.run_id])
    guaranteed = [a for a in decisions.admitted if not a.borrowed]
    assert list(decisions.admitted) == guaranteed + [a for a in decisions.admitted if a.borrowed]
    hidden_fences: set[str] = set()  # flavors on which a starving run may have fenced nodes

    def apply(admit: Admit, *, within: bool) -> None:
        run = queued[admit.run_id]
        before = model.copy()
        for victim in victims_of[run.id]:
            model.release(victim.id)
            model.usage[(victim.tenant, victim.flavor)] -= victim.gpus
        key = (run.tenant, run.flavor)
        trace.steps.append(
            Step(run, admit, victims_of[run.id], before, model.copy(), model.usage[key], within)
        )
        model.hold(-run.id, {(admit.cluster, name): run.gpus_per_node for name in admit.nodes})
        model.usage[key] += run.gpus

    order = sorted(snapshot.queued, key=queue_order)
    lines: dict[tuple[str, str], list[QueuedRun]] = defaultdict(list)
    for run in order:
        lines[(run.tenant, run.flavor)].append(run)
    blocked: set[tuple[str, str]] = set()
    borrowers: dict[tuple[str, str], int] = {}
    taken = 0
    pending = order
    while pending:
        trace.passes += 1
        for run in pending:
            key = (run.tenant, run.flavor)
            if key in blocked or key in borrowers:
                continue
            gate = precheck(snapshot, run)
            if gate is not None:
                assert run.id in waits and waits[run.id].reason == gate, (run, gate)
                blocked.add(key)
                continue
            if model.usage[key] + run.gpus > snapshot.quotas[key].guaranteed:
                borrowers[key] = lines[key].index(run)
                continue
            if run.id in admits:
                assert taken < len(guaranteed), f"run {run.id} admitted as a borrower"
                assert guaranteed[taken].run_id == run.id, (
                    f"run {guaranteed[taken].run_id} admitted before run {run.id}, ahead of it"
                )
                taken += 1
                apply(admits[run.id], within=True)
                continue
            assert run.id in waits and waits[run.id].reason == Wait.CAPACITY, (run, admits, waits)
            trace.capacity_waits.append(
                CapacityWait(run, model.copy(), run.flavor not in hidden_fences)
            )
            blocked.add(key)
            reservation = reservations.get(run.id)
            if reservation is not None:
                held_for = {}
                for name in reservation.nodes:
                    node = (reservation.cluster, name)
                    if node in model.nodes:
                        held_for[node] = min(model.available(node), run.gpus_per_node)
                        model.reserved[node] += held_for[node]
                        model.fenced.add(node)
                trace.held_for[run.id] = held_for
            elif starving(snapshot, run):
                hidden_fences.add(run.flavor)
        returned = {
            key: index
            for key, index in borrowers.items()
            if model.usage[key] + lines[key][index].gpus <= snapshot.quotas[key].guaranteed
        }
        for key in returned:
            del borrowers[key]
        pending = sorted(
            (run for key, index in returned.items() for run in lines[key][index:]),
            key=queue_order,
        )
    assert taken == len(guaranteed), f"{guaranteed[taken:]} were not within their guarantee"
    for admit in decisions.admitted[taken:]:
        apply(admit, within=False)
    trace.final = model
    return trace


def decided(snapshot: Snapshot) -> Decisions:
    """``decide(snapshot)``, with both in full in the report if the test fails."""
    decisions = decide(snapshot)
    note(f"snapshot = {snapshot!r}")
    note(f"decisions = {decisions!r}")
    return decisions


# --- counterexamples found: explicit examples of the properties they break ----------------

# A borrowed run holds all 4 GPUs of a node on which outside load has since grown to 1: the
# node is over-committed by 1. Reclaiming the borrowed run frees 3 GPUs, not 4; admission
# counts 4 (it adds the victims' GPUs to the free GPUs floored at 0) and places a 4-GPU run
# there.
OVER_COMMITTED_RECLAIM = Snapshot(
    queued=(QueuedRun(2, "t1", "a100", 1, 4, 0, 0.0),),
    held=(HeldRun(1, "t2", "a100", "c1", 4, 0, 0.0, True, ("c1-a100-00",)),),
    nodes=(ClusterNode("c1", "a100", "c1-a100-00", 4, outside=1),),
    quotas={("t1", "a100"): Quota(4), ("t2", "a100"): Quota(0, borrow_limit=4)},
)

# A starving run (1000 s in line, 600 s allowed) needs 8 GPUs on one node. Node 00 has 2
# free (a run holds 6 until it ends); a job from outside Gantry uses 1 GPU of node 01, which
# has 7 free but can never give 8. Admission holds node 01 for it (7 > 2), not node 00.
HELD_ON_OUTSIDE_LOAD = Snapshot(
    queued=(QueuedRun(2, "t1", "a100", 1, 8, 0, 0.0),),
    held=(HeldRun(1, "t2", "a100", "c1", 6, 0, 0.0, False, ("c1-a100-00",)),),
    nodes=(
        ClusterNode("c1", "a100", "c1-a100-00", 8),
        ClusterNode("c1", "a100", "c1-a100-01", 8, outside=1),
    ),
    quotas={("t1", "a100"): Quota(8), ("t2", "a100"): Quota(8)},
    now=1000.0,
    starvation_after_s=600.0,
)

# Not a bug: a tenant that a reclaim brings back within its guarantee reclaims in the same
# cycle. Run 10 of tenant A is first in line but beyond A's guarantee (A's borrowed run 1
# holds 8 of its 4); run 11 of B reclaims run 1; then run 10 is within A's guarantee and, in a
# second pass, reclaims D's run 3.
RECLAIM_BRINGS_BACK = Snapshot(
    queued=(
        QueuedRun(10, "A", "a100", 1, 4, 50, 100.0),
        QueuedRun(11, "B", "a100", 1, 8, 50, 200.0),
    ),
    held=(
        HeldRun(1, "A", "a100", "c1", 8, 50, 0.0, True, ("c1-a100-00",)),
        HeldRun(2, "C", "a100", "c1", 4, 50, 0.0, False, ("c1-a100-01",)),
        HeldRun(3, "D", "a100", "c1", 4, 50, 0.0, True, ("c1-a100-01",)),
    ),
    nodes=nodes_of(Pool("c1", "a100", 2, 8)),
    quotas={
        ("A", "a100"): Quota(4, borrow_limit=8),
        ("B", "a100"): Quota(8),
        ("C", "a100"): Quota(8),
        ("D", "a100"): Quota(0, borrow_limit=8),
    },
)


# --- 1. no admitted run is unplaceable; 2. no node is over-committed -----------------


@PROPERTY
@example(OVER_COMMITTED_RECLAIM)
@given(snapshots() | snapshots_with_a_reclaimable_head())
def test_every_admitted_gang_lands_on_nodes_that_have_its_gpus_free(snapshot):
    decisions = decided(snapshot)
    for step in replay(snapshot, decisions).steps:
        run, admit, model = step.run, step.admit, step.after_victims
        note(f"run {run}, admitted {admit}")
        assert len(admit.nodes) == run.nodes
        assert list(admit.nodes) == sorted(set(admit.nodes))  # distinct, sorted
        for name in admit.nodes:
            key = (admit.cluster, name)
            assert key in model.nodes, f"no node {name} on {admit.cluster}"
            node = model.nodes[key]
            assert node.flavor == run.flavor
            assert node.schedulable
            # Free after this cycle's earlier decisions and its own preemptions, less what
            # runs starving ahead of it hold there.
            assert model.free(key) - model.reserved[key] >= run.gpus_per_node, (
                f"node {name}: {model.free(key)} free, {model.reserved[key]} held for "
                f"starving runs, {run.gpus_per_node} needed"
            )


@PROPERTY
@example(OVER_COMMITTED_RECLAIM)
@given(snapshots() | snapshots_with_a_reclaimable_head())
def test_no_node_is_over_committed_after_the_decisions(snapshot):
    decisions = decided(snapshot)
    trace = replay(snapshot, decisions)
    admitted_on = {(a.cluster, name) for a in decisions.admitted for name in a.nodes}
    for key, node in trace.initial.nodes.items():
        if trace.initial.free(key) >= 0 or key in admitted_on:
            assert trace.final.free(key) >= 0, f"{key}: {trace.final.used[key]} used of {node}"
        else:  # over-committed already (outside load grew) and nothing placed there
            assert trace.final.used[key] <= trace.initial.used[key], key


def max_flow(capacity: dict[tuple[str, str], int], source: str, sink: str) -> int:
    """The maximum flow through a small graph (augmenting paths)."""
    residual: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (a, b), c in capacity.items():
        residual[a][b] += c
    flow = 0
    while True:
        parent, frontier = {source: source}, [source]
        while frontier and sink not in parent:
            a = frontier.pop()
            for b, c in residual[a].items():
                if c > 0 and b not in parent:
                    parent[b] = a
                    frontier.append(b)
        if sink not in parent:
            return flow
        path, b = [], sink
        while b != source:
            path.append((parent[b], b))
            b = parent[b]
        push = min(residual[a][b] for a, b in path)
        for a, b in path:
            residual[a][b] -= push
            residual[b][a] += push
        flow += push


@PROPERTY
@example(HELD_ON_OUTSIDE_LOAD)
@given(snapshots(starvation=0.0) | snapshots())
def test_reservations_hold_free_gpus_of_their_nodes_and_never_the_same_ones(snapshot):
    decisions = decided(snapshot)
    trace = replay(snapshot, decisions)
    queued = {r.id: r for r in snapshot.queued}
    waits = {w.run_id: w.reason for w in decisions.waiting}
    assert len({r.run_id for r in decisions.reservations}) == len(decisions.reservations)
    graph: dict[tuple[str, str], int] = {}
    for reservation in decisions.reservations:
        run = queued[reservation.run_id]
        assert waits[run.id] in (Wait.CAPACITY, Wait.NO_IDLE)
        assert starving(snapshot, run)
        assert (reservation.flavor, len(reservation.nodes)) == (run.flavor, run.nodes)
        assert list(reservation.nodes) == sorted(set(reservation.nodes))
        assert 0 < reservation.gpus <= run.gpus
        for name in reservation.nodes:
            node = trace.final.nodes[(reservation.cluster, name)]
            assert node.flavor == run.flavor and node.schedulable
            # A node it can fit on once Gantry's runs there end (outside load stays).
            assert node.gpus - node.outside >= run.gpus_per_node, node
        assert_in_one_domain(snapshot, run, reservation.cluster, reservation.nodes)
        if run.id in trace.held_for:  # held where it waits, among the guaranteed runs
            assert sum(trace.held_for[run.id].values()) == reservation.gpus
        graph[("source", f"r{run.id}")] = reservation.gpus
        for name in reservation.nodes:
            graph[(f"r{run.id}", name)] = run.gpus_per_node  # up to what it needs on each
    # No later run took them: the GPUs held fit into what is free once everything is
    # applied, no node's GPUs held twice (a flow of all of them exists).
    for (cluster, name), _ in trace.final.nodes.items():
        graph[(name, "sink")] = max(0, trace.final.free((cluster, name)))
    wanted = sum(r.gpus for r in decisions.reservations)
    assert max_flow(graph, "source", "sink") == wanted


# --- 3. gangs, every run decided once, order -------------------------------------------


@PROPERTY
@given(snapshots())
def test_gang_is_all_or_nothing_and_every_run_is_decided_once(snapshot):
    decisions = decided(snapshot)
    queued = {r.id: r for r in snapshot.queued}
    admitted = [a.run_id for a in decisions.admitted]
    waiting = [w.run_id for w in decisions.waiting]
    assert sorted(admitted + waiting) == sorted(queued)  # each exactly once, none invented
    for admit in decisions.admitted:
        assert len(set(admit.nodes)) == queued[admit.run_id].nodes  # the whole gang at once
    preempted = [p.run_id for p in decisions.preempted]
    assert len(preempted) == len(set(preempted))
    assert set(preempted) <= {r.id for r in snapshot.held}

    by_flavor = defaultdict(list)
    for wait in decisions.waiting:
        by_flavor[queued[wait.run_id].flavor].append(wait)
    for waits in by_flavor.values():
        assert [w.position for w in waits] == list(range(1, len(waits) + 1))
        order = [queue_order(queued[w.run_id]) for w in waits]
        assert order == sorted(order)  # position 1 is first in line: priority, then FIFO


@PROPERTY
@given(snapshots())
def test_within_a_tenant_and_flavor_runs_start_by_priority_then_fifo(snapshot):
    decisions = decided(snapshot)
    admitted = {a.run_id for a in decisions.admitted}
    reasons = {w.run_id: w.reason for w in decisions.waiting}
    lines = defaultdict(list)
    for run in sorted(snapshot.queued, key=queue_order):
        lines[(run.tenant, run.flavor)].append(run.id)
    for key, line in lines.items():
        started = [run_id in admitted for run_id in line]
        # The admitted runs are the first in line: a waiting run holds back the rest...
        assert started == sorted(started, reverse=True), key
        # ...which wait behind it, while it carries its own reason.
        waiting = [reasons[run_id] for run_id in line if run_id not in admitted]
        if waiting:
            assert waiting[0] != Wait.BEHIND_HEAD
            assert set(waiting[1:]) <= {Wait.BEHIND_HEAD}


# --- 4. required topology --------------------------------------------------------------


def assert_in_one_domain(snapshot: Snapshot, run: QueuedRun, cluster: str, names) -> None:
    depth = required_depth(snapshot, run, cluster)
    assert depth != -1, f"run {run.id} needs a {run.topology_level} that {cluster} lacks"
    if depth is None:
        return
    paths = {node.name: node.path for node in snapshot.nodes if node.cluster == cluster}
    assert all(len(paths[name]) >= depth for name in names), (run, names)
    assert len({paths[name][:depth] for name in names}) == 1, (run, names)


@PROPERTY
@given(snapshots())
def test_a_required_topology_level_is_respected(snapshot):
    decisions = decided(snapshot)
    queued = {r.id: r for r in snapshot.queued}
    for admit in decisions.admitted:
        assert_in_one_domain(snapshot, queued[admit.run_id], admit.cluster, admit.nodes)


# --- tenant limits and budgets ---------------------------------------------------------


@PROPERTY
@given(snapshots())
def test_tenant_limits_hold_at_every_admission(snapshot):
    decisions = decided(snapshot)
    for step in replay(snapshot, decisions).steps:
        run = step.run
        key = (run.tenant, run.flavor)
        quota = snapshot.quotas.get(key)
        assert quota is not None, f"run {run.id} admitted without a quota"
        after = step.usage_before + run.gpus
        assert after <= quota.guaranteed + quota.borrow_limit
        # Preemptible exactly when the admission goes beyond the guarantee.
        assert step.admit.borrowed == (after > quota.guaranteed)
        if quota.max_gpus_per_run is not None:
            assert run.gpus <= quota.max_gpus_per_run
        spent = (
            quota.budget_gpu_hours is not None
            and snapshot.budget_used.get(key, 0.0) >= quota.budget_gpu_hours
        )
        assert not (spent and quota.budget_hard), f"run {run.id} admitted past a hard budget"
        assert step.admit.over_budget == spent


@PROPERTY
@given(snapshots())
def test_final_usage_stays_within_guarantee_plus_borrow_limit(snapshot):
    decisions = decided(snapshot)
    queued = {r.id: r for r in snapshot.queued}
    gone = {p.run_id for p in decisions.preempted}
    initial, final = Counter(), Counter()
    for run in snapshot.held:
        initial[(run.tenant, run.flavor)] += run.gpus
        if run.id not in gone:
            final[(run.tenant, run.flavor)] += run.gpus
    for admit in decisions.admitted:
        run = queued[admit.run_id]
        final[(run.tenant, run.flavor)] += run.gpus
    for key, gpus in final.items():
        quota = snapshot.quotas.get(key, Quota(0))
        assert gpus <= max(initial[key], quota.guaranteed + quota.borrow_limit), key


# --- 5. preemption only of borrowed runs of others, only when it makes the run placeable --


@PROPERTY
@given(snapshots() | snapshots_with_a_reclaimable_head())
def test_only_borrowed_runs_of_others_are_preempted_for_a_guaranteed_admission(snapshot):
    decisions = decided(snapshot)
    held = {r.id: r for r in snapshot.held}
    queued = {r.id: r for r in snapshot.queued}
    admits = {a.run_id: a for a in decisions.admitted}
    for preempt in decisions.preempted:
        victim = held[preempt.run_id]
        assert victim.borrowed
        admit = admits[preempt.by_run_id]  # for a run admitted in the same decision
        assert not admit.borrowed
        reclaimer = queued[preempt.by_run_id]
        assert victim.tenant != reclaimer.tenant
        assert (victim.cluster, victim.flavor) == (admit.cluster, reclaimer.flavor)


@THOROUGH
@example(OVER_COMMITTED_RECLAIM)
@example(RECLAIM_BRINGS_BACK)
@given(snapshots() | snapshots_with_a_reclaimable_head())
def test_preemption_only_when_the_run_has_no_placement_and_every_victim_is_needed(snapshot):
    decisions = decided(snapshot)
    for step in replay(snapshot, decisions).steps:
        if not step.victims:
            continue
        run, before = step.run, step.before
        note(f"run {run} admitted {step.admit} preempting {step.victims}")
        # It had no placement on the available GPUs of any cluster...
        for cluster in before.clusters_of(run.flavor):
            assert before.place(run, cluster) is None, cluster
        # ...its victims were reclaimable there (none on a node a starving run waits on)...
        reclaimable = {v.id for v in before.reclaimable(run, step.admit.cluster)}
        assert {v.id for v in step.victims} <= reclaimable
        # ...their GPUs make a placement, and without any one of them there is none.
        freed = before.gpus_of(step.victims)
        assert before.place(run, step.admit.cluster, freed) is not None
        for victim in step.victims:
            assert before.place(run, step.admit.cluster, freed - before.gpus_of([victim])) is None


# --- 6. a run within its guarantee waits for capacity only when no reclaim places it ----


@THOROUGH
@example(RECLAIM_BRINGS_BACK)
@given(snapshots() | snapshots_with_a_reclaimable_head())
def test_a_run_within_its_guarantee_waits_for_capacity_only_if_no_reclaim_places_it(snapshot):
    """At the turn of a run within its guarantee that waits with CAPACITY (after the earlier
    admissions, preemptions and reservations of the cycle), on no cluster of its flavor do
    the available GPUs (free less what starving runs ahead hold), plus those of every
    borrowed run of another tenant not touching a node a starving run waits on, give a
    placement at its required level. Skipped for a run after a starving run of its flavor
    that fenced nodes with no GPUs held for it (no Reservation says which)."""
    decisions = decided(snapshot)
    for wait in replay(snapshot, decisions).capacity_waits:
        if not wait.fences_known:
            continue
        run, before = wait.run, wait.before
        for cluster in before.clusters_of(run.flavor):
            victims = before.reclaimable(run, cluster)
            note(f"run {run} waits; on {cluster} it could reclaim {victims}")
            assert before.place(run, cluster, before.gpus_of(victims)) is None, cluster


@THOROUGH
@example(OVER_COMMITTED_RECLAIM)
@given(snapshots_with_a_reclaimable_head())
def test_the_first_run_in_line_is_admitted_exactly_when_a_reclaim_can_place_it(snapshot):
    if not snapshot.queued:
        return
    head = min(snapshot.queued, key=queue_order)
    model = Model(snapshot)
    fitting = [
        cluster
        for cluster in model.clusters_of(head.flavor)
        if model.place(head, cluster, model.gpus_of(model.reclaimable(head, cluster)))
    ]
    note(f"head {head}, clusters where it can reclaim {fitting}")
    decisions = decided(snapshot)
    admitted = {a.run_id: a.cluster for a in decisions.admitted}
    assert (head.id in admitted) == bool(fitting)
    if head.id in admitted:
        assert admitted[head.id] in fitting


# --- 7. determinism --------------------------------------------------------------------


@settings(PROPERTY, max_examples=80)
@given(snapshots() | snapshots_with_a_reclaimable_head(), st.integers(0, 2**32 - 1))
def test_same_snapshot_in_any_order_gives_the_same_decisions(snapshot, seed):
    rng = random.Random(seed)

    def shuffled(items) -> list:
        items = list(items)
        rng.shuffle(items)
        return items

    reordered = replace(
        snapshot,
        queued=tuple(shuffled(snapshot.queued)),
        held=tuple(
            replace(run, nodes=tuple(shuffled(run.nodes))) for run in shuffled(snapshot.held)
        ),
        nodes=tuple(shuffled(snapshot.nodes)),
        quotas=dict(shuffled(snapshot.quotas.items())),
        budget_used=dict(shuffled(snapshot.budget_used.items())),
        decayed_usage=dict(shuffled(snapshot.decayed_usage.items())),
        levels=dict(shuffled(snapshot.levels.items())),
    )
    assert decide(reordered) == decided(snapshot)


# --- 8. an oracle: the naive re-implementation reaches the same decisions ----------------


@settings(PROPERTY, max_examples=300)
@example(OVER_COMMITTED_RECLAIM)
@example(HELD_ON_OUTSIDE_LOAD)
@example(RECLAIM_BRINGS_BACK)
@given(snapshots() | snapshots_with_a_reclaimable_head() | snapshots(starvation=0.0))
def test_decisions_are_those_of_the_naive_reimplementation(snapshot):
    """bench/naive.py follows the same rules the straightforward way: no derived state, every
    usage, free GPU and borrowed run worked out again from the runs that hold GPUs (the
    benchmarks assert it agrees on large snapshots). On small random ones every decision must
    be the same: each admission with its cluster, nodes, borrowed and over-budget flags, each
    preemption and for whom, each wait's reason and position, each reservation's nodes and
    GPUs. About 1 ms per snapshot for either."""
    decisions = decided(snapshot)
    expected = naive.naive_decide(
        snapshot.queued,
        naive.MemoryLedger(snapshot),
        now=snapshot.now,
        starvation_after_s=snapshot.starvation_after_s,
    )
    assert naive.outcome_of(decisions) == expected


# --- 9. no starvation under a stream of smaller runs -----------------------------------


@dataclass(frozen=True)
class Arrival:
    tenant: str
    gpus: int
    runtime: int  # steps
    priority: int


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[ClusterNode, ...]
    levels: dict[str, tuple[str, ...]]
    quotas: dict[tuple[str, str], Quota]
    big: QueuedRun  # submitted at step 0, first in line
    initial: tuple[tuple[HeldRun, int], ...]  # (run, step at which it ends)
    arrivals: tuple[tuple[Arrival, ...], ...]  # per step
    starvation_after_s: float
    max_runtime: int  # steps; every run, initial ones included, ends within it

    @property
    def bound(self) -> int:
        """The last step at which the big run may start (see docs/admission.md)."""
        return math.ceil(self.starvation_after_s) + self.max_runtime - 1


@dataclass
class Outcome:
    started: int | None  # the step the big run was admitted at, None: not by the bound
    reserved: list[tuple[int, tuple[str, str, tuple[str, ...]]]]  # (step, where held)


def simulate(scenario: Scenario) -> Outcome:
    """One admission cycle per step (one second), up to the bound. A step first ends the
    runs that are due, then queues the step's arrivals, then decides and applies the
    decisions (checking that no node takes more than it has); a preempted run goes back to
    the queue with its place in line."""
    queued = {scenario.big.id: scenario.big}
    runtime: dict[int, int] = {}
    submitted = {run.id: run.admitted for run, _ in scenario.initial}
    held = {run.id: (run, end) for run, end in scenario.initial}
    room = {node.name: node.gpus - node.outside for node in scenario.nodes}
    next_id = 1 + max([scenario.big.id, *held])
    outcome = Outcome(None, [])
    for step in range(scenario.bound + 1):
        held = {rid: (run, end) for rid, (run, end) in held.items() if end > step}
        for arrival in scenario.arrivals[step] if step < len(scenario.arrivals) else ():
            queued[next_id] = QueuedRun(
                next_id, arrival.tenant, "a100", 1, arrival.gpus, arrival.priority, float(step)
            )
            runtime[next_id] = arrival.runtime
            submitted[next_id] = float(step)
            next_id += 1
        decisions = decide(
            Snapshot(
                queued=tuple(queued.values()),
                held=tuple(run for run, _ in held.values()),
                nodes=scenario.nodes,
                quotas=scenario.quotas,
                now=float(step),
                starvation_after_s=scenario.starvation_after_s,
                levels=scenario.levels,
            )
        )
        for reservation in decisions.reservations:
            if reservation.run_id == scenario.big.id:
                where = (reservation.cluster, reservation.flavor, reservation.nodes)
                outcome.reserved.append((step, where))
        for preempt in decisions.preempted:
            victim, _ = held.pop(preempt.run_id)
            queued[victim.id] = QueuedRun(
                victim.id, victim.tenant, "a100", len(victim.nodes),
                victim.gpus // len(victim.nodes), victim.priority, submitted[victim.id],
            )  # fmt: skip
            runtime.setdefault(victim.id, scenario.max_runtime)
        for admit in decisions.admitted:
            run = queued.pop(admit.run_id)
            held[run.id] = (
                HeldRun(run.id, run.tenant, "a100", admit.cluster, run.gpus, run.priority,
                        float(step), admit.borrowed, admit.nodes),
                step + runtime.get(run.id, scenario.max_runtime),
            )  # fmt: skip
        used = Counter()
        for run, _ in held.values():
            for name in run.nodes:
                used[name] += run.gpus // len(run.nodes)
        assert all(used[name] <= room[name] for name in used), (step, used)
        if scenario.big.id in held:
            outcome.started = step
            break
    return outcome


@st.composite
def starvation_scenarios(draw, *, max_clusters: int = 1) -> Scenario:
    """Tenant big waits, within its guarantee, for ``nodes`` whole nodes (in one domain at
    a level it may require), while tenant small (within its guarantee, borrowing, or both)
    submits 1-3 runs of up to half a node at every step. Each cluster has such a domain of
    free-to-be nodes; some also have nodes in other leaves, larger nodes, drained nodes and
    nodes with GPUs used from outside Gantry (for good: the outside load does not change)."""
    gpus_per_node = pick(draw, (4, 8))
    count = between(draw, 1, 2)
    nodes, levels = [], {}
    for c in range(between(draw, 1, max_clusters)):
        cluster = f"c{c + 1}"
        depth = between(draw, 0, 2)
        levels[cluster] = LEVELS[:depth]
        shapes = [(gpus_per_node, 0, True, (0, 0))] * count  # the domain it can use
        extra = st.sampled_from(
            (
                (gpus_per_node, 0, True, (0, 0)),  # one more in the domain
                (gpus_per_node, 0, True, (0, 1)),  # another leaf
                (2 * gpus_per_node, 0, True, (1, 0)),  # a larger node elsewhere
                (gpus_per_node, 0, False, (0, 0)),  # drained
                (gpus_per_node, 1, True, (0, 0)),  # outside load: it never fits there
                (gpus_per_node, gpus_per_node // 2, True, (0, 0)),
            )
        )
        shapes += draw(st.lists(extra, max_size=3))
        for index, (gpus, outside, schedulable, (block, leaf)) in enumerate(shapes):
            nodes.append(
                ClusterNode(
                    cluster, "a100", f"{cluster}-n{index}", gpus, outside, schedulable,
                    "" if schedulable else "drained", (f"b{block}", f"b{block}-l{leaf}")[:depth],
                )
            )  # fmt: skip
    capacity = sum(node.gpus for node in nodes if node.schedulable)
    max_runtime = between(draw, 1, 6)
    starvation_after_s = draw(
        st.sampled_from((0, 0.5, 1, 2)) | st.integers(0, 12) | st.floats(0, 12, allow_nan=False)
    )
    # Mostly a guarantee large enough for small's runs to hold the nodes without borrowing:
    # the big run cannot reclaim those GPUs and has to wait for them.
    small_guaranteed = pick(draw, (0, capacity // 2, capacity, capacity, capacity))
    quotas = {
        ("big", "a100"): Quota(guaranteed=count * gpus_per_node),
        ("small", "a100"): Quota(
            guaranteed=small_guaranteed,
            borrow_limit=between(draw, 0 if small_guaranteed else 1, capacity),
        ),
    }
    initial = []
    small_usage = 0
    for node in nodes:
        left = between(draw, (node.gpus - node.outside) // 2, node.gpus - node.outside)
        while left > 0:
            gpus = between(draw, 1, left)
            left -= gpus
            small_usage += gpus
            run = HeldRun(
                1000 + len(initial), "small", "a100", node.cluster, gpus, 50, -1.0,
                small_usage > small_guaranteed, (node.name,),
            )  # fmt: skip
            initial.append((run, between(draw, 0, max_runtime - 1)))  # admitted at step -1
    horizon = math.ceil(starvation_after_s) + max_runtime
    arrival = st.builds(
        Arrival,
        tenant=st.just("small"),
        gpus=st.integers(1, gpus_per_node // 2),
        runtime=st.integers(1, max_runtime),
        priority=st.sampled_from((50, 10)),  # never ahead of the big run
    )
    arrivals = draw(
        st.lists(
            st.lists(arrival, min_size=1, max_size=4).map(tuple),
            min_size=horizon,
            max_size=horizon,
        )
    )
    # Where the clusters have levels, the big run may need its nodes in one block or leaf
    # (every cluster has one with enough nodes), or prefer it.
    common = min(len(each) for each in levels.values())
    level = draw(st.sampled_from(("", *LEVELS[:common])))
    big = QueuedRun(
        0, "big", "a100", count, gpus_per_node, 50, 0.0,
        topology_level=level, topology_required=bool(level) and draw(st.booleans()),
    )  # fmt: skip
    return Scenario(
        nodes=tuple(nodes),
        levels=levels,
        quotas=quotas,
        big=big,
        initial=tuple(initial),
        arrivals=tuple(arrivals),
        starvation_after_s=starvation_after_s,
        max_runtime=max_runtime,
    )


def held_until(run_id, tenant, node, gpus, end, *, borrowed=False, cluster="c1"):
    """A run admitted at step -1 on ``node`` that ends at step ``end``."""
    return (HeldRun(run_id, tenant, "a100", cluster, gpus, 50, -1.0, borrowed, (node,)), end)


def small(gpus, *, tenant="small"):
    return (Arrival(tenant, gpus, runtime=4, priority=50),)


# Counterexamples found: two 8-GPU nodes, the big run (one whole node) starving from step 0,
# runs of at most 4 steps: it must start by step 3.

# At step 0 node 00 has 4 free GPUs, 01 has 2: 00 is held, a run of step 0 takes 01's 2
# until step 4. At step 1 a run ends on 01, which has 6 free: the hold moves there, and a
# run of step 1 takes 00's 4 until step 5. The big run starts at step 4.
HOLD_MOVES = Scenario(
    nodes=nodes_of(Pool("c1", "a100", 2, 8)),
    levels={},
    quotas={("big", "a100"): Quota(8), ("small", "a100"): Quota(16)},
    big=QueuedRun(0, "big", "a100", 1, 8, 50, 0.0),
    initial=(
        held_until(1, "small", "c1-a100-00", 4, end=3),
        held_until(2, "small", "c1-a100-01", 6, end=1),
    ),
    arrivals=(small(2), small(4), (), (), (), (), ()),
    starvation_after_s=0,
    max_runtime=4,
)

# A job from outside Gantry uses 1 GPU of node 01 for good, so the big run never fits
# there; yet 01 is held (7 GPUs available against 00's 2), while runs of steps 0 and 1 take
# 00's GPUs until steps 4 and 5. The big run starts at step 5.
HOLD_ON_OUTSIDE_LOAD = Scenario(
    nodes=(
        ClusterNode("c1", "a100", "c1-a100-00", 8),
        ClusterNode("c1", "a100", "c1-a100-01", 8, outside=1),
    ),
    levels={},
    quotas={("big", "a100"): Quota(8), ("small", "a100"): Quota(16)},
    big=QueuedRun(0, "big", "a100", 1, 8, 50, 0.0),
    initial=(held_until(1, "small", "c1-a100-00", 6, end=1),),
    arrivals=(small(2), small(4), (), (), (), (), ()),
    starvation_after_s=0,
    max_runtime=4,
)


@SCENARIO
@example(HOLD_MOVES)
@example(HOLD_ON_OUTSIDE_LOAD)
@given(starvation_scenarios())
def test_a_waiting_run_starts_within_the_starvation_bound(scenario):
    note(f"scenario = {scenario!r}")
    outcome = simulate(scenario)
    note(f"started at step {outcome.started}, bound {scenario.bound}, held {outcome.reserved}")
    assert outcome.started is not None and outcome.started <= scenario.bound


@SCENARIO
@given(starvation_scenarios(max_clusters=3))
def test_a_waiting_run_starts_within_the_starvation_bound_with_several_clusters(scenario):
    note(f"scenario = {scenario!r}")
    outcome = simulate(scenario)
    note(f"started at step {outcome.started}, bound {scenario.bound}, held {outcome.reserved}")
    assert outcome.started is not None and outcome.started <= scenario.bound


# --- examples: the starvation rules on nodes ---------------------------------------------


def test_a_starving_run_keeps_the_nodes_it_reserved():
    # HOLD_MOVES: node 00 is held from step 0 (nothing entered it since), so the run of step
    # 1 takes 01's GPUs, and the big run starts on 00 when its run ends at step 3.
    assert HOLD_MOVES.bound == 3
    outcome = simulate(HOLD_MOVES)
    assert {where for _, where in outcome.reserved} == {("c1", "a100", ("c1-a100-00",))}
    assert outcome.started == 3


def test_a_starving_run_does_not_hold_nodes_it_can_never_fit_on():
    # HOLD_ON_OUTSIDE_LOAD: node 00 is held (2 GPUs); the runs of steps 0 and 1 go to 01;
    # the big run starts on 00 when its run ends at step 1.
    outcome = simulate(HOLD_ON_OUTSIDE_LOAD)
    assert outcome.reserved == [(0, ("c1", "a100", ("c1-a100-00",)))]
    assert outcome.started == 1


def test_a_reclaim_counts_only_the_gpus_the_victims_free():
    # OVER_COMMITTED_RECLAIM: after the reclaim, 3 GPUs are free on the only node; the
    # 4-GPU run waits (and nothing is preempted for it).
    decisions = decide(OVER_COMMITTED_RECLAIM)
    assert (decisions.admitted, decisions.preempted) == ((), ())
    assert [(w.run_id, w.reason) for w in decisions.waiting] == [(2, Wait.CAPACITY)]


def test_a_later_guaranteed_run_does_not_reclaim_gpus_on_the_reserved_nodes():
    # The big run starves from step 0 on a node held by a guaranteed run and a borrowed
    # run, both ending at step 3. At step 2 another tenant's run, within its guarantee but
    # behind the big run, may not preempt the borrowed run and take its GPUs until step 6.
    scenario = Scenario(
        nodes=nodes_of(Pool("c1", "a100", 1, 8)),
        levels={},
        quotas={
            ("big", "a100"): Quota(8),
            ("owner", "a100"): Quota(8),
            ("lender", "a100"): Quota(0, borrow_limit=8),
            ("small", "a100"): Quota(8),
        },
        big=QueuedRun(0, "big", "a100", 1, 8, 50, 0.0),
        initial=(
            held_until(1, "owner", "c1-a100-00", 4, end=3),
            held_until(2, "lender", "c1-a100-00", 4, end=3, borrowed=True),
        ),
        arrivals=((), (), small(4), (), (), (), ()),
        starvation_after_s=0,
        max_runtime=4,
    )
    assert simulate(scenario).started == 3


def test_a_later_guaranteed_run_reclaims_off_the_reserved_nodes():
    # The same on two nodes: the big run cannot fit even by reclaiming and holds node 00 (3
    # free); the later run reclaims the borrowed run on node 01, not the one on 00.
    decisions = decide(
        Snapshot(
            queued=(
                QueuedRun(1, "big", "a100", 1, 8, 50, 0.0),
                QueuedRun(2, "small", "a100", 1, 2, 50, 500.0),
            ),
            held=(
                HeldRun(8, "owner", "a100", "c1", 3, 50, 0.0, False, ("c1-a100-00",)),
                HeldRun(9, "lender", "a100", "c1", 2, 50, 0.0, True, ("c1-a100-00",)),
                HeldRun(10, "owner", "a100", "c1", 6, 50, 0.0, False, ("c1-a100-01",)),
                HeldRun(11, "lender", "a100", "c1", 2, 50, 0.0, True, ("c1-a100-01",)),
            ),
            nodes=nodes_of(Pool("c1", "a100", 2, 8)),
            quotas={
                ("big", "a100"): Quota(8),
                ("small", "a100"): Quota(8),
                ("owner", "a100"): Quota(8),
                ("lender", "a100"): Quota(0, borrow_limit=8),
            },
            now=1000.0,
            starvation_after_s=600.0,
        )
    )
    assert decisions.reservations == (Reservation(1, "c1", "a100", 3, ("c1-a100-00",)),)
    assert decisions.admitted == (Admit(2, "c1", nodes=("c1-a100-01",)),)
    assert [p.run_id for p in decisions.preempted] == [11]


def test_a_tenant_that_a_reclaim_brings_back_within_its_guarantee_reclaims_at_once():
    decisions = decide(RECLAIM_BRINGS_BACK)
    assert decisions.admitted == (
        Admit(11, "c1", nodes=("c1-a100-00",)),
        Admit(10, "c1", nodes=("c1-a100-01",)),
    )
    assert [(p.run_id, p.by_run_id) for p in decisions.preempted] == [(1, 11), (3, 10)]
    assert replay(RECLAIM_BRINGS_BACK, decisions).passes == 2


def test_two_starving_borrowers_never_hold_the_same_gpus():
    quotas = {
        ("x", "a100"): Quota(0, borrow_limit=8),
        ("y", "a100"): Quota(0, borrow_limit=8),
        ("z", "a100"): Quota(8),
    }
    decisions = decide(
        Snapshot(
            queued=(
                QueuedRun(1, "x", "a100", 1, 8, 50, 0.0),
                QueuedRun(2, "y", "a100", 1, 8, 50, 0.0),
            ),
            held=(HeldRun(9, "z", "a100", "c1", 4, 50, 0.0, False, ("c1-a100-00",)),),
            nodes=nodes_of(Pool("c1", "a100", 1, 8)),
            quotas=quotas,
            now=1000.0,
            starvation_after_s=600.0,
        )
    )
    # x holds the 4 free GPUs of the only node; y is told nothing is free for it.
    assert decisions.reservations == (Reservation(1, "c1", "a100", 4, ("c1-a100-00",)),)
    assert [(w.run_id, w.reason) for w in decisions.waiting] == [
        (1, Wait.NO_IDLE),
        (2, Wait.NO_IDLE),
    ]
    assert decisions.waiting[1].message.startswith(
        "tenant y uses 0 of 0 guaranteed a100 GPUs; to borrow idle ones, this run needs 8 "
        "a100 GPUs on one node; 0 a100 GPUs are free"
    )


# --- fair-share decay ---------------------------------------------------------------------------


@PROPERTY
@given(
    usage=st.floats(min_value=0, max_value=1e12),
    gpus=st.integers(min_value=0, max_value=10_000),
    first=st.floats(min_value=0, max_value=90 * 86400),
    second=st.floats(min_value=0, max_value=90 * 86400),
    half_life=st.floats(min_value=60, max_value=30 * 86400),
)
def test_fair_share_decay_does_not_depend_on_how_often_cycles_run(
    usage, gpus, first, second, half_life
):
    """One update over an interval equals two over its parts: no cadence, midnight or month
    end between cycles changes a tenant's decayed usage."""
    once = fair_share_decayed(
        usage, gpus_held=gpus, elapsed_s=first + second, half_life_s=half_life
    )
    parts = fair_share_decayed(
        fair_share_decayed(usage, gpus_held=gpus, elapsed_s=first, half_life_s=half_life),
        gpus_held=gpus,
        elapsed_s=second,
        half_life_s=half_life,
    )
    assert math.isclose(once, parts, rel_tol=1e-9, abs_tol=1e-6)


def test_fair_share_decay_halves_old_usage_each_half_life_and_saturates_while_held():
    day = 86400.0
    assert fair_share_decayed(1000.0, gpus_held=0, elapsed_s=day, half_life_s=day) == 500.0
    assert fair_share_decayed(1000.0, gpus_held=0, elapsed_s=0.0, half_life_s=day) == 1000.0
    # Held GPUs for one half-life: tau * (1 - 1/2) GPU-seconds each, tau = half-life / ln 2.
    assert math.isclose(
        fair_share_decayed(0.0, gpus_held=8, elapsed_s=day, half_life_s=day),
        8 * day / math.log(2) / 2,
        rel_tol=1e-12,
    )
    # Held for ever: the usage tends to GPUs * tau, never beyond it.
    limit = 8 * day / math.log(2)
    held_long = fair_share_decayed(0.0, gpus_held=8, elapsed_s=100 * day, half_life_s=day)
    assert math.isclose(held_long, limit, rel_tol=1e-12) and held_long <= limit


# --- an excluded node is never in its run's placement ----------------------------------------


@PROPERTY
@given(snapshots(), st.data())
def test_an_excluded_node_is_never_in_the_runs_placement_nor_held_for_it(snapshot, data):
    names = sorted({node.name for node in snapshot.nodes})
    queued = tuple(
        replace(run, excluded=tuple(sorted(data.draw(st.sets(st.sampled_from(names))))))
        if names
        else run
        for run in snapshot.queued
    )
    snapshot = replace(snapshot, queued=queued)
    excluded = {run.id: set(run.excluded) for run in queued}
    decisions = decided(snapshot)
    for admit in decisions.admitted:
        assert not excluded[admit.run_id].intersection(admit.nodes), admit
    for reservation in decisions.reservations:
        assert not excluded[reservation.run_id].intersection(reservation.nodes), reservation
