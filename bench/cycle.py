"""The full admission cycle on PostgreSQL, the acceptance target of issue 3 (point 9).

``jobs.services.admission_cycle.admission_run_cycle()`` — snapshot, fair-share update,
decision, preemption, admission writes, wait reasons — on the platform of bench.workload
seeded into the ``gantry_bench`` database (its nodes as ``ClusterNode`` rows, as
``cluster_refresh_inventory`` writes them; held runs with their attempt's placement), with
10,000 and then 100,000 queued runs.

Baseline: the naive admitter of bench.naive with ``DbLedger``, which asks the database for
every number it needs, per run: the quota row, the tenant's usage (an aggregate), the runs
holding GPUs of the flavor and the nodes their attempts hold (whence each node's free GPUs
and the borrowed runs it could preempt), the month's GPU-hours; only the node inventory is
read once. It writes admissions with the same services as Gantry and every wait reason with
its own UPDATE. It runs in a transaction that is rolled back, on the same data, and must
reach the same decisions, placements included (asserted).

Celery: the cycle enqueues tasks on commit; ``bench.__main__`` points Celery at the
in-memory broker, so the enqueueing is timed but nothing runs them.
"""

import gc
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management.color import no_style
from django.db import connection, transaction
from django.db.models import Sum

from bench.naive import (
    Holding,
    Key,
    NodePool,
    Outcome,
    assumed_nodes,
    equal_shares,
    naive_decide,
    node_pools,
    outcome_of,
)
from bench.report import Section, ms, quick, ratio, timed
from bench.workload import make_snapshot
from clusters.models import Cluster, ClusterFlavor, ClusterNode
from images.models import Image
from jobs import admission, admission_types
from jobs.calendar import month_start
from jobs.models import (
    HOLDING_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    Experiment,
    FairShareUsage,
    Run,
    RunEvent,
    RunState,
    TenantMonthUsage,
    TopologyMode,
    WaitReason,
)
from jobs.selectors.queue import admission_snapshot, cluster_nodes, gpu_hours_this_month, held_runs
from jobs.selectors.runs import runs_place_in_line
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.lifecycle import run_preempt, run_transition
from tenants.models import GpuFlavor, Project, Quota, Tenant
from tenants.queueing import Queueing

CYCLES = {10_000: (5, 5), 100_000: (3, 1)}  # queued runs: idle and busy cycles measured
QUICK_CYCLES = {1_000: (1, 1), 2_000: (1, 1)}  # GANTRY_BENCH_QUICK=1: does it work?
FINISHED_PER_BUSY_CYCLE = 4
NAIVE_UP_TO = 10_000  # queued runs; the baseline is not run on larger queues
TARGET_S = 0.3
TARGET_SCALING = 12.0
BENCH_APPS = ("tenants", "images", "clusters", "jobs", "telemetry")


def at(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


# --- the database ----------------------------------------------------------------------


def truncate() -> None:
    tables = {get_user_model()._meta.db_table}
    for label in BENCH_APPS:
        for model in apps.get_app_config(label).get_models(include_auto_created=True):
            tables.add(model._meta.db_table)
    quoted = ", ".join(connection.ops.quote_name(t) for t in sorted(tables))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {quoted} RESTART IDENTITY CASCADE")


def vacuum() -> None:
    """What autovacuum would do between cycles; keeps every measurement on equal terms."""
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


@contextmanager
def explicit_submitted_at() -> Iterator[None]:
    """bulk_create would stamp every run with the current time (auto_now_add)."""
    field = Run._meta.get_field("submitted_at")
    field.auto_now_add = False
    try:
        yield
    finally:
        field.auto_now_add = True


def seed(snapshot: admission_types.Snapshot) -> None:
    """Write ``snapshot`` into the empty database; run ids are the snapshot's ids."""
    truncate()
    now = at(snapshot.now)
    slugs = sorted({tenant for tenant, _ in snapshot.quotas})
    user_model = get_user_model()
    users = user_model.objects.bulk_create(
        [user_model(username=f"bench-{slug}", password=make_password(None)) for slug in slugs]
    )
    tenants = Tenant.objects.bulk_create([Tenant(slug=slug, name=slug) for slug in slugs])
    projects = Project.objects.bulk_create(
        [Project(tenant=tenant, slug="main", name="Main") for tenant in tenants]
    )
    by_slug = {t.slug: (t, p, u) for t, p, u in zip(tenants, projects, users, strict=True)}
    image = Image.objects.create(
        repository="registry.example.org/bench/train",
        digest="sha256:" + "0" * 64,
        status=Image.Status.APPROVED,
    )
    flavors = {
        f.slug: f
        for f in GpuFlavor.objects.bulk_create(
            [
                GpuFlavor(slug=slug, name=slug, memory_gb=80)
                for slug in sorted({n.flavor for n in snapshot.nodes})
            ]
        )
    }
    pools = node_pools(snapshot.nodes, snapshot.levels)
    pools_by_cluster: dict[str, list[NodePool]] = {}
    for pool in (pool for flavor_pools in pools.values() for pool in flavor_pools):
        pools_by_cluster.setdefault(pool.cluster, []).append(pool)
    clusters = {
        c.name: c
        for c in Cluster.objects.bulk_create(
            [
                Cluster(
                    name=name,
                    backend=Cluster.Backend.SIMULATOR,
                    settings={
                        "pools": [
                            {
                                "flavor": p.flavor,
                                "nodes": len(p.nodes),
                                "gpus_per_node": max(n.gpus for n in p.nodes),
                            }
                            for p in cluster_pools
                        ],
                        "topology": list(snapshot.levels.get(name, ())),
                    },
                    topology_levels=list(snapshot.levels.get(name, ())),
                    # The snapshot's policy (strict where it names none, as the naive
                    # admitter decides): the cycle must decide what ``decide`` did.
                    queueing=snapshot.queueing.get(name, Queueing.STRICT),
                    inventory_at=now,
                )
                for name, cluster_pools in sorted(pools_by_cluster.items())
            ]
        )
    }
    # The inventory as cluster_refresh_inventory writes it: GPUs used on each node, of them
    # by Gantry's runs (the rest is outside load), and ClusterFlavor in brief.
    gantry_on: dict[tuple[str, str], int] = defaultdict(int)
    held = {run.id: run for run in snapshot.held}
    for run_id, on in admission.held_placements(snapshot).items():
        for name, gpus in on.items():
            gantry_on[(held[run_id].cluster, name)] += gpus
    ClusterNode.objects.bulk_create(
        [
            ClusterNode(
                cluster=clusters[n.cluster], name=n.name, flavor=flavors[n.flavor], gpus=n.gpus,
                gpus_used=gantry_on[(n.cluster, n.name)] + n.outside,
                gpus_used_by_gantry=gantry_on[(n.cluster, n.name)], schedulable=n.schedulable,
                reason=n.reason, path=list(n.path), updated_at=now,
            )
            for n in snapshot.nodes
        ],
        batch_size=5000,
    )  # fmt: skip
    ClusterFlavor.objects.bulk_create(
        [
            ClusterFlavor(
                cluster=clusters[p.cluster], flavor=flavors[p.flavor], nodes=len(p.nodes),
                gpus_per_node=max(n.gpus for n in p.nodes), gpus=sum(n.gpus for n in p.nodes),
            )
            for flavor_pools in pools.values()
            for p in flavor_pools
        ]
    )  # fmt: skip
    Quota.objects.bulk_create(
        [
            Quota(
                tenant=by_slug[tenant][0],
                flavor=flavors[flavor],
                guaranteed_gpus=q.guaranteed,
                borrow_limit_gpus=q.borrow_limit,
                max_gpus_per_run=q.max_gpus_per_run,
                monthly_gpu_hour_budget=None
                if q.budget_gpu_hours is None
                else int(q.budget_gpu_hours),
                budget_mode=Quota.BudgetMode.HARD if q.budget_hard else Quota.BudgetMode.SOFT,
                fair_share_weight=q.weight,
            )
            for (tenant, flavor), q in snapshot.quotas.items()
        ]
    )
    FairShareUsage.objects.bulk_create(
        [
            FairShareUsage(
                tenant=by_slug[tenant][0], flavor=flavors[flavor], decayed_gpu_seconds=value,
                updated_at=now,
            )
            for (tenant, flavor), value in snapshot.decayed_usage.items()
        ]
    )  # fmt: skip
    TenantMonthUsage.objects.bulk_create(
        [
            TenantMonthUsage(
                tenant=by_slug[tenant][0], flavor=flavors[flavor],
                month=month_start(now).date(), gpu_seconds=hours * 3600,
            )
            for (tenant, flavor), hours in snapshot.budget_used.items()
        ]
    )  # fmt: skip

    def experiment(
        run_id: int, tenant: str, flavor: str, nodes: int, per_node: int, priority, level=""
    ):
        tenant_row, project, user = by_slug[tenant]
        return Experiment(
            id=run_id, tenant=tenant_row, project=project, owner=user, name=f"bench-{run_id}",
            image=image, image_reference=image.reference, command="python train.py",
            flavor=flavors[flavor], nodes=nodes, gpus_per_node=per_node, priority=priority,
            gantry_version="bench", topology_level=level,
            topology_mode=TopologyMode.REQUIRED if level else TopologyMode.PREFERRED,
        )  # fmt: skip

    experiments, runs, attempts = [], [], []
    for held in snapshot.held:
        assert held.nodes and held.gpus % len(held.nodes) == 0, "a held run without its nodes"
        nodes = len(held.nodes)
        experiments.append(
            experiment(held.id, held.tenant, held.flavor, nodes, held.gpus // nodes, held.priority)
        )
        runs.append(
            Run(
                id=held.id, experiment_id=held.id, tenant=by_slug[held.tenant][0],
                flavor=flavors[held.flavor], gpus=held.gpus, priority=held.priority,
                submitted_by=by_slug[held.tenant][2], state=RunState.RUNNING,
                cluster=clusters[held.cluster], borrowed=held.borrowed,
                submitted_at=at(held.admitted) - timedelta(minutes=1),
                admitted_at=at(held.admitted), started_at=at(held.admitted),
            )
        )  # fmt: skip
        attempts.append(
            Attempt(
                run_id=held.id, number=1, cluster=clusters[held.cluster],
                state=AttemptState.RUNNING, backend_job_id=f"bench-{held.id}",
                submitted_at=at(held.admitted), started_at=at(held.admitted),
                placement=list(held.nodes), node_list=list(held.nodes),
            )
        )  # fmt: skip
    for queued in snapshot.queued:
        experiments.append(
            experiment(
                queued.id, queued.tenant, queued.flavor, queued.nodes, queued.gpus_per_node,
                queued.priority, queued.topology_level,
            )
        )  # fmt: skip
        runs.append(
            Run(
                id=queued.id, experiment_id=queued.id, tenant=by_slug[queued.tenant][0],
                flavor=flavors[queued.flavor], gpus=queued.gpus, priority=queued.priority,
                submitted_by=by_slug[queued.tenant][2], submitted_at=at(queued.submitted),
            )
        )  # fmt: skip
    Experiment.objects.bulk_create(experiments, batch_size=5000)
    with explicit_submitted_at():
        Run.objects.bulk_create(runs, batch_size=5000)
    Attempt.objects.bulk_create(attempts, batch_size=5000)
    with connection.cursor() as cursor:
        for statement in connection.ops.sequence_reset_sql(no_style(), [Experiment, Run]):
            cursor.execute(statement)
    vacuum()


# --- the naive admitter on the database --------------------------------------------------


class DbLedger:
    """Every answer is a fresh query; only the node inventory and names are read once."""

    def __init__(self, *, now: datetime):
        self.now = now
        self.gone: list[Holding] = []  # preempted this cycle: they did enter their nodes
        nodes = cluster_nodes(now=now)
        clusters = {c.name: c for c in Cluster.objects.filter(enabled=True)}
        self.clusters = clusters
        self.tenant_ids = dict(Tenant.objects.values_list("slug", "id"))
        self.node_pools = node_pools(
            nodes, {name: tuple(c.topology_levels) for name, c in clusters.items()}
        )
        # Runs whose attempt has no nodes recorded: where admission assumes them, fixed for
        # the cycle as admission fixes it when it reads the snapshot.
        self.assumed = assumed_nodes(held_runs(now=now), nodes)

    def pools(self, flavor: str) -> list[NodePool]:
        return self.node_pools.get(flavor, [])

    def holdings(self, flavor: str) -> dict[str, list[Holding]]:
        holding = Run.objects.filter(flavor__slug=flavor, state__in=HOLDING_STATES)
        found: dict[str, list[Holding]] = defaultdict(list)
        placed = {
            run_id: tuple(node_list or placement)
            for run_id, node_list, placement in Attempt.objects.filter(
                run__in=holding, state__in=(AttemptState.CREATED, *LIVE_ATTEMPT_STATES)
            ).values_list("run_id", "node_list", "placement")
        }
        for r in holding.values(
            "id", "tenant__slug", "cluster__name", "gpus", "priority", "admitted_at",
            "submitted_at", "borrowed",
        ):  # fmt: skip
            run = admission_types.HeldRun(
                id=r["id"], tenant=r["tenant__slug"], flavor=flavor, cluster=r["cluster__name"],
                gpus=r["gpus"], priority=r["priority"],
                admitted=(r["admitted_at"] or r["submitted_at"]).timestamp(),
                borrowed=r["borrowed"], nodes=placed.get(r["id"], ()),
            )  # fmt: skip
            on = equal_shares(run) if run.nodes else self.assumed.get(run.id, {})
            found[run.cluster].append(Holding(run, on))
        return found

    def quota(self, key: Key) -> admission_types.Quota | None:
        row = (
            Quota.objects.filter(tenant__slug=key[0], flavor__slug=key[1], tenant__active=True)
            .values(
                "guaranteed_gpus", "borrow_limit_gpus", "max_gpus_per_run",
                "monthly_gpu_hour_budget", "budget_mode", "fair_share_weight",
            )
            .first()
        )  # fmt: skip
        if row is None:
            return None
        return admission_types.Quota(
            guaranteed=row["guaranteed_gpus"],
            borrow_limit=row["borrow_limit_gpus"],
            max_gpus_per_run=row["max_gpus_per_run"],
            budget_gpu_hours=row["monthly_gpu_hour_budget"],
            budget_hard=row["budget_mode"] == Quota.BudgetMode.HARD,
            weight=row["fair_share_weight"],
        )

    def budget_used(self, key: Key) -> float:
        used = gpu_hours_this_month(now=self.now, tenant=self.tenant_ids[key[0]])
        return used.get(key, 0.0)

    def usage(self, key: Key) -> int:
        holding = Run.objects.filter(
            tenant__slug=key[0], flavor__slug=key[1], state__in=HOLDING_STATES
        )
        return holding.aggregate(gpus=Sum("gpus"))["gpus"] or 0

    def shares(self) -> dict[Key, tuple[float, int, int]]:
        usage = {
            (tenant, flavor): gpus
            for tenant, flavor, gpus in Run.objects.filter(state__in=HOLDING_STATES)
            .order_by()
            .values_list("tenant__slug", "flavor__slug")
            .annotate(Sum("gpus"))
        }
        decayed = {
            (tenant, flavor): value
            for tenant, flavor, value in FairShareUsage.objects.values_list(
                "tenant__slug", "flavor__slug", "decayed_gpu_seconds"
            )
        }
        return {
            (tenant, flavor): (
                decayed.get((tenant, flavor), 0.0),
                usage.get((tenant, flavor), 0),
                w,
            )
            for tenant, flavor, w in Quota.objects.filter(tenant__active=True).values_list(
                "tenant__slug", "flavor__slug", "fair_share_weight"
            )
        }

    def admit(
        self, run: admission_types.QueuedRun, pool: NodePool, nodes: tuple[str, ...], *,
        borrowed: bool, over_budget: bool,
    ) -> None:  # fmt: skip
        row = Run.objects.get(pk=run.id)
        cluster = self.clusters[pool.cluster]
        claimed = run_transition(
            run=row,
            to=RunState.ADMITTED,
            expected=(RunState.QUEUED,),
            reason="ADMITTED",
            message=f"Admitted to {cluster.name} on {', '.join(nodes)}: {row.gpus} GPUs",
            cluster=cluster,
            admitted_at=self.now,
            borrowed=borrowed,
            over_budget=over_budget,
            wait_reason="",
            wait_message="",
        )
        if claimed:
            Attempt.objects.create(
                run=row,
                number=row.attempts.count() + 1,
                cluster=cluster,
                resumed_from=row.checkpoints.order_by("-step").first(),
                placement=list(nodes),
            )

    def preempted(self) -> list[Holding]:
        return list(self.gone)

    def preempt(self, victim: Holding, *, by: admission_types.QueuedRun) -> None:
        self.gone.append(victim)
        run_preempt(
            run=Run.objects.get(pk=victim.run.id),
            message=f"tenant {by.tenant} reclaimed {by.gpus} {by.flavor} GPUs for run {by.id}",
        )


def naive_cycle(now: datetime) -> Outcome:
    """One naive admission cycle, rolled back so that the data stays as it was."""
    with transaction.atomic():
        queued = tuple(
            admission_types.QueuedRun(
                id=r["id"], tenant=r["tenant__slug"], flavor=r["flavor__slug"],
                nodes=r["experiment__nodes"], gpus_per_node=r["experiment__gpus_per_node"],
                priority=r["priority"], submitted=r["submitted_at"].timestamp(),
                topology_level=r["experiment__topology_level"],
                topology_required=r["experiment__topology_mode"] == TopologyMode.REQUIRED,
            )
            for r in Run.objects.filter(state=RunState.QUEUED).values(
                "id", "tenant__slug", "flavor__slug", "experiment__nodes",
                "experiment__gpus_per_node", "priority", "submitted_at",
                "experiment__topology_level", "experiment__topology_mode",
            )
        )  # fmt: skip
        outcome = naive_decide(
            queued,
            DbLedger(now=now),
            now=now.timestamp(),
            starvation_after_s=settings.GANTRY_STARVATION_AFTER_S,
        )
        for run_id, reason, _ in outcome.waiting:
            # The position is counted when read (as Gantry does), not written.
            Run.objects.filter(pk=run_id).update(
                wait_reason=reason, wait_message=WaitReason(reason).label
            )
        transaction.set_rollback(True)
    return outcome


# --- measuring ---------------------------------------------------------------------------


class QueryCounter:
    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def measure(fn: Callable[[], object]) -> tuple[float, int, object]:
    """Seconds, database round trips and the result of ``fn()``."""
    counter = QueryCounter()
    gc.collect()  # the benchmark's own garbage (seeding, earlier cycles) is not the cycle's
    with connection.execute_wrapper(counter):
        seconds, result = timed(fn)
    return seconds, counter.count, result


def check_first_cycle(expected: Outcome, now: datetime) -> None:
    """The cycle wrote what the pure decision on the seeded snapshot says."""
    admitted = tuple(
        sorted(
            (run_id, cluster, tuple(placement), borrowed, over_budget)
            for run_id, cluster, placement, borrowed, over_budget in Attempt.objects.filter(
                run__state=RunState.ADMITTED, run__admitted_at=now
            ).values_list(
                "run_id", "run__cluster__name", "placement", "run__borrowed", "run__over_budget"
            )
        )
    )
    assert admitted == tuple(sorted(expected.admitted)), "the cycle admitted other runs"
    preempted = set(RunEvent.objects.filter(reason="PREEMPTED").values_list("run_id", flat=True))
    assert preempted == {victim for victim, _ in expected.preempted}, "other runs preempted"
    queued = list(Run.objects.filter(state=RunState.QUEUED))
    runs_place_in_line(queued)  # positions are counted when read: they must be the decision's
    waiting = {(run.pk, run.wait_reason, run.queue_position) for run in queued}
    assert waiting == set(expected.waiting), "the cycle wrote other wait reasons or positions"


def finish_some(rng: random.Random, now: datetime) -> None:
    """Some running runs end, as between two cycles on a busy cluster."""
    running = list(
        Run.objects.filter(state=RunState.RUNNING).order_by("id").values_list("id", flat=True)
    )
    ended = rng.sample(running, FINISHED_PER_BUSY_CYCLE)
    Run.objects.filter(pk__in=ended).update(state=RunState.SUCCEEDED, finished_at=now)
    Attempt.objects.filter(run_id__in=ended).update(state=AttemptState.SUCCEEDED, finished_at=now)


@dataclass
class Measured:
    label: str
    gantry: list[tuple[float, int]]  # seconds, queries of each cycle measured
    naive: tuple[float, int] | None
    admitted: int
    preempted: int


def expect_next(
    now: datetime, *, with_naive: bool
) -> tuple[admission_types.Decisions, tuple | None]:
    """What the next cycle should decide, and the naive admitter's time for it."""
    expected = admission.decide(admission_snapshot(now=now)[0])
    naive = None
    if with_naive:
        seconds, queries, outcome = measure(lambda: naive_cycle(now))
        assert outcome == outcome_of(expected), "the naive admitter decided otherwise"
        naive = (seconds, queries)
    vacuum()
    return expected, naive


def gantry_cycle(now: datetime, expected: admission_types.Decisions) -> tuple[float, int]:
    seconds, queries, summary = measure(lambda: admission_run_cycle(now=now))
    assert (summary.admitted, summary.preempted) == (
        len(expected.admitted),
        len(expected.preempted),
    ), "the cycle decided otherwise"
    return seconds, queries


def steady(label: str, cycles: int, *, now: datetime, with_naive: bool, before=None) -> Measured:
    """Cycles after the first; the naive admitter runs before the first of them."""
    measured = Measured(label, [], None, 0, 0)
    for i in range(cycles):
        if before is not None:
            before()
        expected, naive = expect_next(now, with_naive=with_naive and i == 0)
        measured.naive = measured.naive or naive
        measured.gantry.append(gantry_cycle(now, expected))
        measured.admitted += len(expected.admitted)
        measured.preempted += len(expected.preempted)
    return measured


def measure_size(queued: int, cycles: tuple[int, int]) -> tuple[float, list[Measured]]:
    idle_cycles, busy_cycles = cycles
    with_naive = queued <= NAIVE_UP_TO
    snapshot = make_snapshot(queued=queued)
    seed_s, _ = timed(lambda: seed(snapshot))
    now = at(snapshot.now)

    expected = outcome_of(admission.decide(snapshot))
    naive = None
    if with_naive:
        seconds, queries, outcome = measure(lambda: naive_cycle(now))
        assert outcome == expected, "the naive admitter decided otherwise"
        naive = (seconds, queries)
        vacuum()
    seconds, queries, _ = measure(lambda: admission_run_cycle(now=now))
    check_first_cycle(expected, now)
    first = Measured(
        "first", [(seconds, queries)], naive, len(expected.admitted), len(expected.preempted)
    )

    idle = steady("steady, idle", idle_cycles, now=now, with_naive=with_naive)
    rng = random.Random(queued)
    busy = steady(
        "steady, busy",
        busy_cycles,
        now=now,
        with_naive=with_naive,
        before=lambda: finish_some(rng, now),
    )
    return seed_s, [first, idle, busy]


def run(cycles: dict[int, tuple[int, int]] | None = None) -> list[Section]:
    """``cycles``: queued runs -> idle and busy cycles measured, the smaller size first."""
    cycles = cycles or (QUICK_CYCLES if quick() else CYCLES)
    small_size, large_size = min(cycles), max(cycles)
    section = Section(
        title="Admission cycle on PostgreSQL (issue 3, point 9)",
        intro=(
            "One `jobs.services.admission_cycle.admission_run_cycle()`: 100 tenants, 4 flavors, "
            "10 simulator clusters × 4 flavors × 25 nodes × 8 GPUs in 2 topology levels "
            "(1,000 `ClusterNode` rows, 8,000 GPUs, some outside load, one drained node per "
            "cluster), 85 % held by about 1,070 running runs placed on nodes (the borrowed ones "
            "preemptible), a quota for every tenant and flavor (some with hard or soft "
            "budgets), database `gantry_bench`. "
            "*First*: the cycle on fresh data (it admits, preempts and writes every wait "
            "reason). *Steady, idle*: the following cycles, nothing changed in between. "
            f"*Steady, busy*: {FINISHED_PER_BUSY_CYCLE} running runs ended before each cycle, "
            "so it admits runs and queue positions shift. Times are medians over the cycles "
            "measured (admitted and preempted: totals). Baseline: the naive admitter "
            "(`bench/naive.py` with `DbLedger` in `bench/cycle.py`) on the same data, rolled "
            "back; its decisions, placements included, are asserted equal to Gantry's."
        ),
        columns=[
            "queued runs", "cycle", "cycles", "admitted", "preempted", "Gantry", "queries",
            "naive baseline", "queries", "speed-up",
        ],
    )  # fmt: skip
    medians: dict[tuple[int, str], float] = {}
    idle_runs: list[tuple[int, Measured]] = []
    naive_s: list[float] = []
    for queued, counts in sorted(cycles.items()):
        seed_s, measured = measure_size(queued, counts)
        idle_runs.append((queued, measured[1]))
        naive_s += [m.naive[0] for m in measured if m.naive]
        for m in measured:
            gantry = statistics.median(s for s, _ in m.gantry)
            medians[(queued, m.label)] = gantry
            section.rows.append(
                [
                    f"{queued:,}",
                    m.label,
                    str(len(m.gantry)),
                    f"{m.admitted:,}",
                    f"{m.preempted:,}",
                    ms(gantry),
                    f"{max(q for _, q in m.gantry):,}",
                    ms(m.naive[0]) if m.naive else "not run",
                    f"{m.naive[1]:,}" if m.naive else "",
                    ratio(m.naive[0], gantry) if m.naive else "",
                ]
            )
        section.notes.append(
            f"{queued:,} queued: seeding took {seed_s:.1f} s; cycles: "
            + "; ".join(f"{m.label} " + ", ".join(ms(s) for s, _ in m.gantry) for m in measured)
            + "."
        )
    small, large = medians[(small_size, "steady, idle")], medians[(large_size, "steady, idle")]
    churn = [(q, m) for q, m in idle_runs if m.admitted or m.preempted]
    if churn:
        section.notes.append(
            "The idle cycles still admitted and preempted runs ("
            + "; ".join(f"{q:,} queued: {m.admitted} and {m.preempted}" for q, m in churn)
            + "); see benchmarks-notes.md."
        )
    section.notes += [
        f"Target ≤ {TARGET_S * 1000:.0f} ms, {small_size:,} queued, steady idle cycle: "
        f"{ms(small)} — {'met' if small <= TARGET_S else 'missed'}. Busy: "
        f"{ms(medians[(small_size, 'steady, busy')])}; first: "
        f"{ms(medians[(small_size, 'first')])}.",
        f"{large_size:,} / {small_size:,} queued, steady idle cycle: {ratio(large, small)} "
        f"(target ≤ {TARGET_SCALING:.0f}×: "
        f"{'met' if large <= TARGET_SCALING * small else 'missed'}); busy: "
        f"{ratio(medians[(large_size, 'steady, busy')], medians[(small_size, 'steady, busy')])}"
        f"; first: {ratio(medians[(large_size, 'first')], medians[(small_size, 'first')])}.",
        f"The naive baseline runs on {NAIVE_UP_TO:,} queued runs only: it takes "
        f"{ms(min(naive_s))} to {ms(max(naive_s))} per cycle there, and its per-run UPDATE of "
        "every wait reason grows with the queue.",
    ]
    return [section]
