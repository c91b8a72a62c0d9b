"""What runs hold, what nodes have, what tenants used this month and which flavors are
overcommitted, read in plain SQL (jobs/selectors/holding_sql.py), are what the ORM read
before (its queries kept below as the reference): the same values, in the same order, summed
in the same order (GPU-hours are floats: equal means equal), over runs in every state, borrowed
runs, attempts before and after the month's start, several clusters (one disabled, one whose
inventory is out of date) and flavors (one nobody offers), and clocks at month boundaries.
The quotas page costs fewer queries than it did.
"""

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.db.models import JSONField, OuterRef, Subquery, Sum
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from clusters.models import Cluster, ClusterFlavor, ClusterNode
from clusters.services import cluster_refresh_inventory
from jobs import admission, admission_types
from jobs.calendar import month_start
from jobs.models import (
    HOLDING_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    Run,
    RunState,
    TenantMonthUsage,
)
from jobs.selectors.capacity import Overcommit, QuotaUsage, flavor_overcommits, quota_usage_list
from jobs.selectors.queue import cluster_nodes, gpu_hours_this_month, held_runs
from jobs.services.submission import run_submit
from tenants.models import GpuFlavor, Quota
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 14, 15, 9, 26, 535897, tzinfo=UTC)
# Mid month, the month's first microsecond, its last, and into the next month (attempts then
# started in an earlier month).
CLOCKS = (
    NOW,
    datetime(2026, 3, 1, tzinfo=UTC),
    datetime(2026, 4, 1, tzinfo=UTC) - timedelta(microseconds=1),
    datetime(2026, 4, 1, 0, 0, 1, tzinfo=UTC),
    datetime(2026, 5, 2, 7, tzinfo=UTC),
)


# --- the reference: the ORM's queries as they were -------------------------------------------


def orm_cluster_nodes(*, now, clusters=None) -> list[admission_types.ClusterNode]:
    rows = ClusterNode.objects.order_by("cluster__name", "name")
    if clusters is None:
        rows = rows.filter(cluster__enabled=True)
    else:
        rows = rows.filter(cluster__in=list(clusters))
    nodes = []
    for row in rows.values(
        "cluster__name",
        "cluster__inventory_at",
        "cluster__inventory_valid_until",
        "flavor__slug",
        "name",
        "gpus",
        "gpus_used",
        "gpus_used_by_gantry",
        "schedulable",
        "reason",
        "path",
    ):
        cluster, seen = row["cluster__name"], row["cluster__inventory_at"]
        schedulable, reason = row["schedulable"], row["reason"]
        valid_until = row["cluster__inventory_valid_until"]
        if schedulable and valid_until is not None and valid_until < now:
            schedulable = False
            reason = f"not seen by {cluster}'s inventory since {seen:%Y-%m-%d %H:%M:%S} UTC"
        nodes.append(
            admission_types.ClusterNode(
                cluster=cluster,
                flavor=row["flavor__slug"],
                name=row["name"],
                gpus=row["gpus"],
                outside=max(0, row["gpus_used"] - row["gpus_used_by_gantry"]),
                schedulable=schedulable,
                reason=reason,
                path=tuple(row["path"]),
            )
        )
    return nodes


def orm_held_runs(*, now) -> tuple[admission_types.HeldRun, ...]:
    live = Attempt.objects.filter(
        run=OuterRef("pk"), state__in=(AttemptState.CREATED, *LIVE_ATTEMPT_STATES)
    ).order_by("-number")
    # The latest end as the start estimates computed it (jobs/selectors/estimates.py
    # ``_held_ends``, before it moved into ``held_runs``).
    started = Attempt.objects.filter(
        run=OuterRef("pk"), state__in=LIVE_ATTEMPT_STATES, started_at__isnull=False
    ).order_by("-number")
    rows = (
        Run.objects.filter(state__in=HOLDING_STATES)
        .annotate(
            attempt_nodes=Subquery(live.values("node_list")[:1], output_field=JSONField()),
            attempt_placement=Subquery(live.values("placement")[:1], output_field=JSONField()),
            attempt_started=Subquery(started.values("started_at")[:1]),
        )
        .values(
            "id",
            "tenant__slug",
            "flavor__slug",
            "cluster__name",
            "gpus",
            "priority",
            "admitted_at",
            "submitted_at",
            "borrowed",
            "attempt_nodes",
            "attempt_placement",
            "attempt_started",
            "experiment__max_runtime_minutes",
        )
    )

    def latest_end(row) -> float:
        max_runtime_s = row["experiment__max_runtime_minutes"] * 60.0
        if row["attempt_started"] is not None:
            return row["attempt_started"].timestamp() + max_runtime_s
        placed = (row["admitted_at"] or row["submitted_at"]).timestamp()
        return max(now.timestamp(), placed + settings.GANTRY_PLACEMENT_GRACE_S) + max_runtime_s

    return tuple(
        admission_types.HeldRun(
            id=row["id"],
            tenant=row["tenant__slug"],
            flavor=row["flavor__slug"],
            cluster=row["cluster__name"],
            gpus=row["gpus"],
            priority=row["priority"],
            admitted=(row["admitted_at"] or row["submitted_at"]).timestamp(),
            borrowed=row["borrowed"],
            nodes=tuple(row["attempt_nodes"] or row["attempt_placement"] or ()),
            latest_end=latest_end(row),
        )
        for row in rows
    )


def orm_gpu_hours_this_month(*, now, tenant=None) -> dict[tuple[str, str], float]:
    month = month_start(now)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    ledger = TenantMonthUsage.objects.filter(month=month.date())
    live = Attempt.objects.filter(state__in=LIVE_ATTEMPT_STATES, started_at__isnull=False)
    if tenant is not None:
        ledger, live = ledger.filter(tenant=tenant), live.filter(run__tenant=tenant)
    for tenant_slug, flavor, gpu_seconds in ledger.values_list(
        "tenant__slug", "flavor__slug", "gpu_seconds"
    ):
        seconds[(tenant_slug, flavor)] += gpu_seconds
    for tenant_slug, flavor, gpus, started in live.values_list(
        "run__tenant__slug", "run__flavor__slug", "run__gpus", "started_at"
    ):
        seconds[(tenant_slug, flavor)] += gpus * max(
            0.0, (now - max(started, month)).total_seconds()
        )
    return {key: value / 3600 for key, value in seconds.items()}


def orm_flavor_overcommits() -> list[Overcommit]:
    guaranteed = (
        Quota.objects.values("flavor_id", "flavor__slug")
        .annotate(gpus=Sum("guaranteed_gpus"))
        .values_list("flavor_id", "flavor__slug", "gpus")
    )
    capacity = dict(
        ClusterFlavor.objects.filter(cluster__enabled=True)
        .values("flavor_id")
        .annotate(gpus=Sum("gpus"))
        .values_list("flavor_id", "gpus")
    )
    return sorted(
        (
            Overcommit(flavor=slug, guaranteed=gpus, capacity=capacity.get(flavor_id, 0))
            for flavor_id, slug, gpus in guaranteed
            if gpus > capacity.get(flavor_id, 0)
        ),
        key=lambda overcommit: overcommit.flavor,
    )


def orm_quota_usage_list(*, quotas, tenant=None, now) -> list[QuotaUsage]:
    held = orm_held_runs(now=now)
    in_use: dict[tuple[str, str], int] = defaultdict(int)
    for run in held:
        in_use[(run.tenant, run.flavor)] += run.gpus
    snapshot = admission_types.Snapshot(
        queued=(), held=held, nodes=tuple(orm_cluster_nodes(now=now)), quotas={}
    )
    free = admission.free_gpus(snapshot)
    hours = orm_gpu_hours_this_month(now=now, tenant=tenant)
    return [
        QuotaUsage(
            quota=quota,
            in_use=in_use.get((quota.tenant.slug, quota.flavor.slug), 0),
            idle=free.get(quota.flavor.slug, 0),
            gpu_hours=hours.get((quota.tenant.slug, quota.flavor.slug), 0.0),
        )
        for quota in quotas
    ]


# --- a varied world -----------------------------------------------------------------------


def varied_world(world) -> GpuFlavor:
    """Two more clusters (sim-2, its inventory out of date from mid month; sim-off,
    disabled), a flavor with a quota nobody offers, runs in every state on several clusters
    and flavors, borrowed runs, attempts started last month and this one, and the ledger of
    both months. Returns the flavor nobody offers."""
    l4 = GpuFlavor.objects.create(slug="l4", name="NVIDIA L4", memory_gb=24)
    for name, pools in (
        ("sim-2", [{"flavor": "a100-80gb", "nodes": 2, "gpus_per_node": 8}]),
        ("sim-off", [{"flavor": "h100-80gb", "nodes": 3, "gpus_per_node": 4}]),
    ):
        cluster = Cluster.objects.create(
            name=name, backend=Cluster.Backend.SIMULATOR, settings={"speedup": 1000, "pools": pools}
        )
        cluster_refresh_inventory(cluster=cluster)
    Cluster.objects.filter(name="sim-off").update(enabled=False)
    Cluster.objects.filter(name="sim-2").update(inventory_valid_until=NOW + timedelta(hours=1))
    ClusterNode.objects.filter(cluster=world.cluster, name__endswith="1").update(
        gpus_used=5, gpus_used_by_gantry=2
    )
    ClusterNode.objects.filter(cluster=world.cluster, name__endswith="2").update(
        schedulable=False, reason="drained for maintenance"
    )
    Quota.objects.create(tenant=world.nlp, flavor=l4, guaranteed_gpus=3)
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(
        guaranteed_gpus=40, borrow_limit_gpus=7
    )
    clusters = {cluster.name: cluster for cluster in Cluster.objects.all()}
    nodes = {
        cluster: list(
            ClusterNode.objects.filter(cluster__name=cluster).values_list("name", flat=True)
        )
        for cluster in clusters
    }
    last_month = NOW - timedelta(days=20)
    # (submitted, user, flavor, gpus per node, state, cluster, borrowed, attempts), each
    # attempt (state, started, node list, placement).
    runs = [
        (
            last_month,
            "researcher_a",
            "a100",
            8,
            RunState.RUNNING,
            "sim-1",
            False,
            [
                (AttemptState.FAILED, last_month, ["x"], []),
                (
                    AttemptState.RUNNING,
                    last_month + timedelta(hours=3, seconds=0.3),
                    nodes["sim-1"][:1],
                    [],
                ),
            ],
        ),
        (
            NOW - timedelta(days=3),
            "researcher_b",
            "a100",
            4,
            RunState.RUNNING,
            "sim-2",
            True,
            [
                (
                    AttemptState.RUNNING,
                    NOW - timedelta(days=2, microseconds=7),
                    nodes["sim-2"][:1],
                    [],
                ),
            ],
        ),
        (
            NOW - timedelta(days=1),
            "researcher_a2",
            "h100",
            2,
            RunState.PENDING,
            "sim-1",
            False,
            [
                (AttemptState.PENDING, None, [], [nodes["sim-1"][-1]]),
            ],
        ),
        (
            NOW - timedelta(hours=5),
            "researcher_b",
            "h100",
            3,
            RunState.SUBMITTING,
            "sim-1",
            True,
            [
                (AttemptState.FAILED, NOW - timedelta(hours=4), [nodes["sim-1"][0]], []),
                (AttemptState.CREATED, None, [], [nodes["sim-1"][-2]]),
            ],
        ),
        (NOW - timedelta(hours=2), "researcher_a", "a100", 1, RunState.ADMITTED, "sim-1", True, []),
        (NOW - timedelta(hours=1), "researcher_a", "a100", 2, RunState.QUEUED, None, False, []),
        (
            NOW - timedelta(days=9),
            "researcher_a",
            "a100",
            8,
            RunState.SUCCEEDED,
            "sim-1",
            False,
            [
                (AttemptState.SUCCEEDED, NOW - timedelta(days=9), nodes["sim-1"][:1], []),
            ],
        ),
        (
            NOW - timedelta(days=2),
            "researcher_a2",
            "a100",
            3,
            RunState.RUNNING,
            "sim-1",
            False,
            [
                (
                    AttemptState.RUNNING,
                    NOW - timedelta(days=1, seconds=1.5),
                    nodes["sim-1"][1:2],
                    [],
                ),
            ],
        ),
    ]
    flavors = {"a100": world.a100, "h100": world.h100}
    for submitted, user, flavor, gpus_per_node, state, cluster, borrowed, attempts in runs:
        with time_machine.travel(submitted, tick=False):
            run = run_submit(
                user=getattr(world, user),
                data=experiment_input(
                    world,
                    tenant="nlp" if user == "researcher_b" else "vision",
                    project="llm" if user == "researcher_b" else "detection",
                    flavor=flavors[flavor].slug,
                    gpus_per_node=gpus_per_node,
                ),
            )
        for number, (attempt_state, started, node_list, placement) in enumerate(attempts, 1):
            Attempt.objects.create(
                run=run,
                number=number,
                cluster=clusters[cluster],
                state=attempt_state,
                started_at=started,
                node_list=node_list,
                placement=placement,
            )
        Run.objects.filter(pk=run.pk).update(
            state=state,
            cluster=clusters.get(cluster),
            borrowed=borrowed,
            admitted_at=None if state == RunState.QUEUED else submitted + timedelta(seconds=9),
        )
    for tenant, flavor, month, gpu_seconds in (
        (world.vision, world.a100, NOW, 123456.789),
        (world.vision, world.h100, NOW, 0.1),
        (world.nlp, world.a100, NOW, 98765.4321),
        (world.nlp, l4, NOW, 7.0),
        (world.vision, world.a100, last_month, 55555.5),
        (world.vision, world.a100, NOW + timedelta(days=30), 44.25),
    ):
        TenantMonthUsage.objects.create(
            tenant=tenant, flavor=flavor, month=month_start(month).date(), gpu_seconds=gpu_seconds
        )
    return l4


# --- parity -------------------------------------------------------------------------------


@pytest.mark.parametrize("now", CLOCKS)
def test_held_runs_are_the_orms(world, now):
    varied_world(world)

    held = held_runs(now=now)

    assert held == orm_held_runs(now=now)
    assert len(held) == 6  # admitted, submitting, pending, three running
    assert {run.borrowed for run in held} == {True, False}
    # Nodes from the live attempt's node list, from its placement, and none (admitted).
    assert len({run.nodes for run in held}) == 6
    assert () in {run.nodes for run in held}


def test_a_queued_run_without_a_cluster_is_not_held_and_one_without_attempts_is(world):
    varied_world(world)
    Run.objects.filter(state=RunState.ADMITTED).update(cluster=None)

    assert held_runs(now=NOW) == orm_held_runs(now=NOW)
    assert any(run.cluster is None and run.nodes == () for run in held_runs(now=NOW))


@pytest.mark.parametrize("now", CLOCKS)
def test_cluster_nodes_are_the_orms(world, now):
    varied_world(world)

    assert cluster_nodes(now=now) == orm_cluster_nodes(now=now)
    every = list(Cluster.objects.all())
    assert cluster_nodes(now=now, clusters=every) == orm_cluster_nodes(now=now, clusters=every)
    assert cluster_nodes(now=now, clusters=[]) == orm_cluster_nodes(now=now, clusters=[]) == []


def test_a_stale_inventory_reads_as_the_orm_reads_it(world):
    varied_world(world)
    later = NOW + timedelta(hours=2)  # past sim-2's inventory_valid_until

    nodes = cluster_nodes(now=later)

    assert nodes == orm_cluster_nodes(now=later)
    assert any("not seen by sim-2's inventory since" in node.reason for node in nodes)
    assert not any(node.cluster == "sim-off" for node in nodes)


@pytest.mark.parametrize("now", CLOCKS)
def test_gpu_hours_this_month_are_the_orms_to_the_last_bit(world, now):
    varied_world(world)

    with time_machine.travel(now, tick=False):
        for tenant in (None, world.vision, world.nlp, world.vision.pk):
            assert gpu_hours_this_month(now=now, tenant=tenant) == orm_gpu_hours_this_month(
                now=now, tenant=tenant
            )
    assert gpu_hours_this_month(now=NOW)  # not trivially empty


def test_overcommits_are_the_orms(world):
    varied_world(world)

    overcommits = flavor_overcommits()

    assert overcommits == orm_flavor_overcommits()
    # a100: 40 + 16 guaranteed, 32 + 16 on enabled clusters; l4: 3, nobody offers it; h100
    # of the disabled cluster does not count: 16 on sim-1 for 16 guaranteed.
    assert overcommits == [
        Overcommit(flavor="a100-80gb", guaranteed=56, capacity=48),
        Overcommit(flavor="l4", guaranteed=3, capacity=0),
    ]
    assert [type(o.guaranteed) for o in overcommits] == [int, int]
    assert [type(o.capacity) for o in overcommits] == [int, int]


def test_no_quota_no_overcommit(world):
    Quota.objects.all().delete()

    assert flavor_overcommits() == orm_flavor_overcommits() == []


@pytest.mark.parametrize("now", CLOCKS)
def test_quota_usages_are_the_orms(world, now):
    varied_world(world)
    quotas = list(
        Quota.objects.select_related("tenant", "flavor").order_by("tenant__slug", "flavor__slug")
    )
    vision_quotas = [quota for quota in quotas if quota.tenant_id == world.vision.pk]

    with time_machine.travel(now, tick=False):
        usages = quota_usage_list(quotas=quotas, now=now)
        assert usages == orm_quota_usage_list(quotas=quotas, now=now)
        assert quota_usage_list(
            quotas=vision_quotas, tenant=world.vision, now=now
        ) == orm_quota_usage_list(quotas=vision_quotas, tenant=world.vision, now=now)
    figures = [
        (u.in_use, u.idle, u.borrowable, u.beyond_guarantee, u.budget_left, u.burn_percent)
        for u in usages
    ]
    assert figures == [
        (u.in_use, u.idle, u.borrowable, u.beyond_guarantee, u.budget_left, u.burn_percent)
        for u in orm_quota_usage_list(quotas=quotas, now=now)
    ]
    assert any(u.in_use for u in usages) and any(u.gpu_hours for u in usages)


def test_the_quotas_page_costs_fewer_queries(client, world):
    varied_world(world)
    client.force_login(world.researcher_a)

    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("jobs:quota_list"))

    assert response.status_code == 200
    # Session, user, roles, tenants, quotas, held runs, nodes, ledger, live attempts,
    # overcommits, notifications: 13 before (two for the overcommits, and a COUNT).
    assert len(queries) == 11
