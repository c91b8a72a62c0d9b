"""Reads for admission: its snapshot (queued and held runs, nodes, quotas), what is held
and free, this month's usage, and the fingerprint that tells a cycle nothing changed."""

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from clusters.health import NodeHealth
from clusters.models import Cluster, ClusterNode
from clusters.outside_claims import queues_of
from jobs import admission, admission_types
from jobs.calendar import month_start, next_month
from jobs.models import (
    HOLDING_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    FairShareUsage,
    Run,
    RunState,
    TopologyMode,
)
from jobs.selectors import holding_sql
from tenants.models import Quota, Tenant

# A quota's columns as admission reads them (``quota_of``), with its (tenant, flavor) slugs.
QUOTA_VALUES = (
    "tenant__slug",
    "flavor__slug",
    "guaranteed_gpus",
    "borrow_limit_gpus",
    "max_gpus_per_run",
    "monthly_gpu_hour_budget",
    "budget_mode",
    "fair_share_weight",
)


def quota_of(row: Mapping[str, Any]) -> admission_types.Quota:
    """A quota as admission reads it, from its columns: a row read with ``QUOTA_VALUES`` or
    a ``quota.update`` audit event's before or after (the what-if replay's history)."""
    return admission_types.Quota(
        guaranteed=row["guaranteed_gpus"],
        borrow_limit=row["borrow_limit_gpus"],
        max_gpus_per_run=row["max_gpus_per_run"],
        budget_gpu_hours=row["monthly_gpu_hour_budget"],
        budget_hard=row["budget_mode"] == Quota.BudgetMode.HARD,
        weight=row["fair_share_weight"],
    )


def quotas_now() -> dict[tuple[str, str], admission_types.Quota]:
    """Every active tenant's quotas as they are, by (tenant, flavor) slug."""
    return {
        (row["tenant__slug"], row["flavor__slug"]): quota_of(row)
        for row in Quota.objects.filter(tenant__active=True).values(*QUOTA_VALUES)
    }


# The reason a quarantined node takes no work, before Gantry's why (which only platform
# admins see on the node map).
QUARANTINED = "quarantined by Gantry"


def cluster_nodes(
    *, now, clusters: Iterable[Cluster] | None = None
) -> list[admission_types.ClusterNode]:
    """The node inventory of every enabled cluster (or of ``clusters``), for admission, in
    one query.

    A cluster whose inventory is out of date (past ``inventory_valid_until``) keeps its
    nodes, so held runs are still counted, but none takes work until the next refresh."""
    rows = holding_sql.cluster_node_rows(
        cluster_ids=None if clusters is None else [cluster.pk for cluster in clusters]
    )
    nodes = []
    for (
        cluster,
        seen,
        valid_until,
        flavor,
        name,
        gpus,
        gpus_used,
        gpus_used_by_gantry,
        schedulable,
        reason,
        path,
        health,
        health_reason,
    ) in rows:
        if health == NodeHealth.QUARANTINED:
            # Gantry's own exclusion, whatever the backend says (it may not be allowed to
            # drain the node, or not have done so yet).
            schedulable = False
            reason = f"{QUARANTINED}: {health_reason or 'no reason given'}"
        elif schedulable and valid_until is not None and valid_until < now:
            schedulable = False
            reason = f"not seen by {cluster}'s inventory since {seen:%Y-%m-%d %H:%M:%S} UTC"
        nodes.append(
            admission_types.ClusterNode(
                cluster=cluster,
                flavor=flavor,
                name=name,
                gpus=gpus,
                outside=max(0, gpus_used - gpus_used_by_gantry),
                schedulable=schedulable,
                reason=reason,
                path=tuple(path),
            )
        )
    return nodes


def _held_latest_end(
    *, started: datetime | None, admitted: float, max_runtime_s: float, now: datetime
) -> float:
    """When a held run frees its GPUs at the latest (epoch seconds): its start plus its max
    runtime; not started, the end of the placement grace (it starts by then, or goes back
    to the queue, jobs.services.backend_sync) or now if that is past, plus its max runtime.
    The one definition: admission's backfill and the start estimates read it from
    ``HeldRun.latest_end``."""
    if started is not None:
        return started.timestamp() + max_runtime_s
    placed = admitted + settings.GANTRY_PLACEMENT_GRACE_S
    return max(now.timestamp(), placed) + max_runtime_s


def held_runs(*, now: datetime) -> tuple[admission_types.HeldRun, ...]:
    """Every run that holds GPUs now, with the nodes it holds them on (where the backend
    runs it if it said so, else where admission placed it) and when it frees them at the
    latest (``_held_latest_end``, as of ``now``), in one query."""
    rows = holding_sql.held_run_rows(
        holding=HOLDING_STATES, live=(AttemptState.CREATED, *LIVE_ATTEMPT_STATES)
    )
    held = []
    for (
        run_id,
        tenant,
        flavor,
        cluster,
        gpus,
        priority,
        admitted_at,
        submitted_at,
        borrowed,
        attempt_nodes,
        attempt_placement,
        attempt_started,
        max_runtime_minutes,
    ) in rows:
        admitted = (admitted_at or submitted_at).timestamp()
        held.append(
            admission_types.HeldRun(
                id=run_id,
                tenant=tenant,
                flavor=flavor,
                cluster=cluster,
                gpus=gpus,
                priority=priority,
                admitted=admitted,
                borrowed=borrowed,
                nodes=tuple(attempt_nodes or attempt_placement or ()),
                latest_end=_held_latest_end(
                    started=attempt_started,
                    admitted=admitted,
                    max_runtime_s=max_runtime_minutes * 60.0,
                    now=now,
                ),
            )
        )
    return tuple(held)


def gpus_held() -> dict[tuple[str, str], int]:
    """GPUs held now per (tenant, flavor): one aggregate query."""
    return {
        (row["tenant__slug"], row["flavor__slug"]): row["gpus"]
        for row in Run.objects.filter(state__in=HOLDING_STATES)
        .values("tenant__slug", "flavor__slug")
        .annotate(gpus=Sum("gpus"))
        .order_by()
    }


@dataclass(frozen=True)
class Occupancy:
    in_use: dict[tuple[str, str], int]  # (tenant, flavor) -> GPUs its runs hold
    free: dict[str, int]  # flavor -> free GPUs, as admission counts them


def gpu_occupancy(*, now) -> Occupancy:
    """What tenants hold and what is free per flavor, with one definition of holding
    (docs/admission.md): two queries."""
    held = held_runs(now=now)
    in_use: dict[tuple[str, str], int] = defaultdict(int)
    for run in held:
        in_use[(run.tenant, run.flavor)] += run.gpus
    snapshot = admission_types.Snapshot(
        queued=(), held=held, nodes=tuple(cluster_nodes(now=now)), quotas={}
    )
    return Occupancy(in_use=dict(in_use), free=admission.free_gpus(snapshot))


def admission_snapshot(
    *, now=None, written: dict[int, tuple[str, str]] | None = None
) -> tuple[admission_types.Snapshot, dict[str, Cluster]]:
    """Everything admission needs, read in a handful of queries. ``written``, if given, is
    filled with each queued run's wait reason and message as stored, from the same query
    (the cycle rewrites only those that change)."""
    now = now or timezone.now()
    rows = Run.objects.filter(state=RunState.QUEUED).values_list(
        "id",
        "tenant__slug",
        "flavor__slug",
        "experiment__nodes",
        "experiment__gpus_per_node",
        "priority",
        "submitted_at",
        "experiment__topology_level",
        "experiment__topology_mode",
        "excluded_nodes",
        "experiment__max_runtime_minutes",
        *(("wait_reason", "wait_message") if written is not None else ()),
        "workspace__extended_minutes",
    )
    queued_runs = []
    for row in rows:
        queued_runs.append(
            admission_types.QueuedRun(
                id=row[0],
                tenant=row[1],
                flavor=row[2],
                nodes=row[3],
                gpus_per_node=row[4],
                priority=row[5],
                submitted=row[6].timestamp(),
                topology_level=row[7],
                topology_required=row[8] == TopologyMode.REQUIRED,
                excluded=tuple(sorted(row[9] or ())),
                max_runtime_s=(row[10] + (row[-1] or 0)) * 60.0,
            )
        )
        if written is not None:
            written[row[0]] = (row[11], row[12])
    queued = tuple(queued_runs)
    held = held_runs(now=now)
    clusters = {cluster.name: cluster for cluster in Cluster.objects.filter(enabled=True)}
    nodes = cluster_nodes(now=now)
    quota_rows = list(
        # A tenant without a quota has no run admission decides on: read with the quotas.
        Quota.objects.filter(tenant__active=True).values(*QUOTA_VALUES, "tenant__queueing")
    )
    quotas = {(row["tenant__slug"], row["flavor__slug"]): quota_of(row) for row in quota_rows}
    tenant_queueing = {
        row["tenant__slug"]: admission_types.Queueing(row["tenant__queueing"])
        for row in quota_rows
        if row["tenant__queueing"]
    }
    decayed = {
        (tenant, flavor): gpu_seconds
        for tenant, flavor, gpu_seconds in FairShareUsage.objects.values_list(
            "tenant__slug", "flavor__slug", "decayed_gpu_seconds"
        )
    }
    snapshot = admission_types.Snapshot(
        queued=queued,
        held=held,
        nodes=tuple(nodes),
        quotas=quotas,
        budget_used=gpu_hours_this_month(now=now),
        decayed_usage=decayed,
        now=now.timestamp(),
        starvation_after_s=settings.GANTRY_STARVATION_AFTER_S,
        start_grace_s=settings.GANTRY_PLACEMENT_GRACE_S,
        levels={name: tuple(cluster.topology_levels) for name, cluster in clusters.items()},
        outside=queues_of({name: cluster.outside_claims for name, cluster in clusters.items()}),
        queueing={
            name: admission_types.Queueing(cluster.queueing) for name, cluster in clusters.items()
        },
        tenant_queueing=tenant_queueing,
    )
    return snapshot, clusters


def gpu_hours_this_month(*, now, tenant=None) -> dict[tuple[str, str], float]:
    """Allocated GPU-hours this month per (tenant, flavor): finished attempts from the
    ledger, running ones prorated up to ``now``. ``tenant``: only this one (or its id)."""
    month = month_start(now)
    tenant_id = None if tenant is None else getattr(tenant, "pk", tenant)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for tenant_slug, flavor, gpu_seconds in holding_sql.month_usage_rows(
        month=month.date(), tenant_id=tenant_id
    ):
        seconds[(tenant_slug, flavor)] += gpu_seconds
    for tenant_slug, flavor, gpus, started in holding_sql.started_attempt_rows(
        live=LIVE_ATTEMPT_STATES, tenant_id=tenant_id
    ):
        seconds[(tenant_slug, flavor)] += gpus * max(
            0.0, (now - max(started, month)).total_seconds()
        )
    return {key: value / 3600 for key, value in seconds.items()}


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def admission_fingerprint(*, now: datetime) -> tuple[str, datetime] | None:
    """What admission reads, condensed: a digest of every queued and held run (state,
    priority, cluster, borrowed, excluded nodes), the live attempts' nodes, the node
    inventory (with Gantry's health of each node), the clusters, quotas and tenants (with
    their queueing policies), and
    which budgets are spent; with the moment until which
    the same inputs give the same decisions (the next run to start starving, the next
    inventory to go stale, the next month). A few aggregate queries in PostgreSQL, no rows
    read into Python. None on other databases: there every cycle decides in full."""
    if connection.vendor != "postgresql":
        return None
    # Identifiers are model tables (quoted); every value is a parameter.
    queries: dict[str, tuple[str, list[Any]]] = {
        "runs": (
            f"SELECT count(*), sum(hashtext(concat_ws('|', id, state, priority, cluster_id, "  # noqa: S608
            f"borrowed, excluded_nodes::text)))::text FROM {_table(Run)} WHERE state = ANY(%s)",
            [[RunState.QUEUED, *HOLDING_STATES]],
        ),
        "attempts": (
            f"SELECT count(*), sum(hashtext(concat_ws('|', id, run_id, state, "  # noqa: S608
            f"node_list::text, placement::text)))::text FROM {_table(Attempt)} "
            "WHERE state = ANY(%s)",
            [[AttemptState.CREATED, *LIVE_ATTEMPT_STATES]],
        ),
        "nodes": (
            f"SELECT count(*), sum(hashtext(concat_ws('|', id, cluster_id, flavor_id, name, "  # noqa: S608
            # Gantry's own view too: a quarantine takes the node out at the next cycle.
            f"gpus, gpus_used, gpus_used_by_gantry, schedulable, reason, path::text, health, "
            f"health_reason)))::text "
            f"FROM {_table(ClusterNode)}",
            [],
        ),
        "clusters": (
            # Not inventory_valid_until: each refresh moves it; when it passes is a moment.
            # Outside jobs as admission reads them: not their expected starts ("next").
            f"SELECT count(*), sum(hashtext(concat_ws('|', id, name, enabled, queueing, "  # noqa: S608
            "topology_levels::text, (outside_claims - 'next')::text)))::text "
            f"FROM {_table(Cluster)}",
            [],
        ),
        "quotas": (
            f"SELECT count(*), sum(hashtext(concat_ws('|', q.id, q.tenant_id, q.flavor_id, "  # noqa: S608
            "q.guaranteed_gpus, q.borrow_limit_gpus, q.max_gpus_per_run, "
            "q.monthly_gpu_hour_budget, q.budget_mode, q.fair_share_weight, t.active, t.slug, "
            "t.queueing"
            f")))::text FROM {_table(Quota)} q JOIN {_table(Tenant)} t ON t.id = q.tenant_id",
            [],
        ),
    }
    parts = []
    with connection.cursor() as cursor:
        for name, (sql, params) in queries.items():
            cursor.execute(sql, params)
            count, digest = cursor.fetchone()
            parts.append(f"{name}:{count}:{digest}")
        # The next moments at which time alone changes a decision.
        starving_after = timedelta(seconds=settings.GANTRY_STARVATION_AFTER_S)
        cursor.execute(
            f"SELECT min(submitted_at) FROM {_table(Run)} "  # noqa: S608
            "WHERE state = %s AND submitted_at > %s",
            [RunState.QUEUED, now - starving_after],
        )
        (first_not_starving,) = cursor.fetchone()
        cursor.execute(
            f"SELECT min(inventory_valid_until) FROM {_table(Cluster)} "  # noqa: S608
            "WHERE enabled AND inventory_valid_until > %s",
            [now],
        )
        (next_stale,) = cursor.fetchone()
    budgets = {
        (row["tenant__slug"], row["flavor__slug"]): row["monthly_gpu_hour_budget"]
        for row in Quota.objects.filter(monthly_gpu_hour_budget__isnull=False).values(
            "tenant__slug", "flavor__slug", "monthly_gpu_hour_budget"
        )
    }
    if budgets:
        used = gpu_hours_this_month(now=now)
        spent = sorted(
            key
            for key, limit in budgets.items()
            if limit is not None and used.get(key, 0.0) >= limit
        )
        parts.append(f"spent:{spent}")
    month = month_start(now)
    moments = [next_month(month)]
    if first_not_starving is not None:
        moments.append(first_not_starving + starving_after)
    if next_stale is not None:
        moments.append(next_stale)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest(), min(moments)
