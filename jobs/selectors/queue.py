"""Reads for admission: its snapshot, this month's usage, the submit preview."""

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from clusters.models import Cluster, ClusterFlavor, ClusterNode
from clusters.outside_claims import queues_of
from core.types import UserLike
from jobs import admission, admission_types, estimates, placement
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
from jobs.selectors.estimates import start_preview
from jobs.selectors.submit_context import SubmitContext
from tenants.access import tenant_list_submittable
from tenants.models import GpuFlavor, Quota, Tenant


def flavor_node_limits() -> dict[str, tuple[int, int]]:
    """flavor slug -> (largest node count, largest GPUs per node) over enabled clusters."""
    limits: dict[str, tuple[int, int]] = {}
    rows = ClusterFlavor.objects.filter(cluster__enabled=True).values_list(
        "flavor__slug", "nodes", "gpus_per_node"
    )
    for slug, nodes, gpus_per_node in rows:
        max_nodes, max_gpus = limits.get(slug, (0, 0))
        limits[slug] = (max(max_nodes, nodes), max(max_gpus, gpus_per_node))
    return limits


def resource_refusals(
    *,
    tenant: Tenant | None,
    flavor: str,
    nodes: int,
    gpus_per_node: int,
    topology_level: str = "",
    topology_mode: str = "",
    context: SubmitContext | None = None,
) -> dict[str, list[str]]:
    """Why a run of this shape is refused at submit, by field; empty when it is not: the
    flavor, node and GPU counts the enabled clusters have, the tenant's quota (none, a per-run
    maximum, guarantee + borrow limit) and whether any placement could ever exist. The submit
    validation and the submit form's preview both ask this, so they never disagree.
    ``context``: the submit context of ``tenant`` and ``flavor`` (the flavor, its node
    limits, the tenant's quota of it), for a caller that has read it already (None: this
    reads them)."""
    errors: dict[str, list[str]] = {}

    def refuse(name: str, message: str) -> None:
        errors.setdefault(name, []).append(message)

    if context is None:
        limits = flavor_node_limits().get(flavor)
        flavor_known = GpuFlavor.objects.filter(slug=flavor).exists()
    else:
        limits = context.node_limits
        flavor_known = context.flavor is not None
    if not flavor_known:
        refuse("flavor", "Unknown GPU flavor.")
    elif limits is None:
        refuse("flavor", "No enabled cluster offers this GPU flavor.")
    if nodes < 1:
        refuse("nodes", "Must be at least 1.")
    if gpus_per_node < 1:
        refuse("gpus_per_node", "Must be at least 1.")
    if errors:
        return errors
    assert limits is not None  # else refused above
    max_nodes, max_gpus = limits
    quota = None
    if tenant is not None:
        if context is None:
            # One quota per (tenant, flavor): no order to ask for (the default one joins two
            # tables).
            quota = Quota.objects.filter(tenant=tenant, flavor__slug=flavor).order_by().first()
        else:
            quota = context.quota
    largest = _largest_run(tenant=tenant, flavor=flavor, limits=limits, quota=quota)
    if nodes > max_nodes:
        refuse("nodes", f"At most {max_nodes} nodes of {flavor}.{largest}")
    if gpus_per_node > max_gpus:
        refuse("gpus_per_node", f"A {flavor} node has at most {max_gpus} GPUs.{largest}")
    if tenant is not None and not errors:
        _quota_refusals(
            refuse,
            tenant=tenant,
            flavor=flavor,
            quota=quota,
            gpus=nodes * gpus_per_node,
            largest=largest,
        )
    # The levels are read only to judge a level asked for (most runs ask for none).
    levels = topology_levels_offered(flavor=flavor) if topology_level else []
    if topology_level and topology_level not in levels:
        refuse(
            "topology_level",
            f"No cluster with {flavor} GPUs has a {topology_level!r} level "
            f"(levels: {', '.join(levels) or 'none'}).",
        )
    if not {"nodes", "gpus_per_node", "topology_level"} & set(errors):
        why = placement_never_possible(
            flavor=flavor,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            topology_level=topology_level,
            required=bool(topology_level) and topology_mode == TopologyMode.REQUIRED,
        )
        if why:
            refuse("nodes", why)
    return errors


def _largest_run(
    *, tenant: Tenant | None, flavor: str, limits: tuple[int, int], quota: Quota | None
) -> str:
    """The largest run of ``flavor`` that could ever start (for ``tenant``: within its quota,
    with every node free), said after a refusal of a run too large, so the person knows what
    to ask for instead, after a space. "" when the tenant may run none (the refusal says why)."""
    max_nodes, max_gpus = limits
    cap = max_nodes * max_gpus
    if tenant is not None:
        if quota is None:
            return ""
        cap = min(cap, quota.guaranteed_gpus + quota.borrow_limit_gpus)
        if quota.max_gpus_per_run is not None:
            cap = min(cap, quota.max_gpus_per_run)
    nodes, per_node = placement.largest_shape(
        max_nodes=max_nodes, max_gpus_per_node=max_gpus, max_gpus=cap
    )
    if nodes == 0:
        return ""
    whose = f" for tenant {tenant.slug}" if tenant is not None else ""
    return (
        f" The largest {flavor} run that could ever start{whose}: {nodes * per_node} GPUs "
        f"({nodes} node{'s' if nodes > 1 else ''} × {per_node})."
    )


def _quota_refusals(
    refuse, *, tenant: Tenant, flavor: str, quota: Quota | None, gpus: int, largest: str
) -> None:
    """What the tenant's quota of the flavor (None: it has none) could never admit."""
    ceiling = 0 if quota is None else quota.guaranteed_gpus + quota.borrow_limit_gpus
    if quota is None or ceiling == 0:
        refuse("flavor", f"Tenant {tenant.slug} has no quota for {flavor}.")
    elif quota.max_gpus_per_run is not None and gpus > quota.max_gpus_per_run:
        refuse(
            "gpus_per_node",
            f"This run asks for {gpus} GPUs; tenant {tenant.slug} may use at most "
            f"{quota.max_gpus_per_run} {flavor} GPUs per run.{largest}",
        )
    elif gpus > ceiling:
        refuse(
            "gpus_per_node",
            f"This run asks for {gpus} GPUs and could never start: tenant {tenant.slug} may "
            f"hold at most {ceiling} {flavor} GPUs ({quota.guaranteed_gpus} guaranteed + "
            f"{quota.borrow_limit_gpus} borrowed).{largest}",
        )


def placement_never_possible(
    *, flavor: str, nodes: int, gpus_per_node: int, topology_level: str = "", required: bool = False
) -> str:
    """Why no enabled cluster could place this gang even with every node free and taking
    work; "" when one could. What a submit is refused for, not what it waits for."""
    by_cluster: dict[str, tuple[tuple[str, ...], list[placement.Node]]] = {}
    for cluster, levels, name, gpus, path in ClusterNode.objects.filter(
        cluster__enabled=True, flavor__slug=flavor
    ).values_list("cluster__name", "cluster__topology_levels", "name", "gpus", "path"):
        entry = by_cluster.setdefault(cluster, (tuple(levels), []))
        entry[1].append(placement.Node(name, gpus, gpus, path=tuple(path)))
    if not by_cluster:
        return f"No enabled cluster has {flavor} GPUs."
    within = f" in one {topology_level}" if required else ""
    level_known = False
    for levels, cluster_nodes in by_cluster.values():
        level = None
        if required:
            if topology_level not in levels:
                continue
            level = levels.index(topology_level) + 1
            level_known = True
        gang = placement.Gang(nodes, gpus_per_node, required_level=level)
        if placement.place(cluster_nodes, gang) is not None:
            return ""
    if required and not level_known:
        return f"No cluster with {flavor} GPUs has a {topology_level} level."
    return f"No single cluster has {nodes} nodes with {gpus_per_node} {flavor} GPUs each{within}."


def topology_levels_offered(*, flavor: str | None = None) -> list[str]:
    """The topology levels of enabled clusters (with GPUs of ``flavor``), widest first."""
    clusters = Cluster.objects.filter(enabled=True)
    if flavor is not None:
        clusters = clusters.filter(nodes__flavor__slug=flavor).distinct()
    levels: list[str] = []
    for names in clusters.order_by("name").values_list("topology_levels", flat=True):
        levels += [name for name in names if name not in levels]
    return levels


def _quota_of(row: Mapping[str, Any]) -> admission_types.Quota:
    return admission_types.Quota(
        guaranteed=row["guaranteed_gpus"],
        borrow_limit=row["borrow_limit_gpus"],
        max_gpus_per_run=row["max_gpus_per_run"],
        budget_gpu_hours=row["monthly_gpu_hour_budget"],
        budget_hard=row["budget_mode"] == Quota.BudgetMode.HARD,
        weight=row["fair_share_weight"],
    )


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
    ) in rows:
        if schedulable and valid_until is not None and valid_until < now:
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


def held_runs() -> tuple[admission_types.HeldRun, ...]:
    """Every run that holds GPUs now, with the nodes it holds them on (where the backend
    runs it if it said so, else where admission placed it), in one query."""
    rows = holding_sql.held_run_rows(
        holding=HOLDING_STATES, live=(AttemptState.CREATED, *LIVE_ATTEMPT_STATES)
    )
    return tuple(
        admission_types.HeldRun(
            id=run_id,
            tenant=tenant,
            flavor=flavor,
            cluster=cluster,
            gpus=gpus,
            priority=priority,
            admitted=(admitted_at or submitted_at).timestamp(),
            borrowed=borrowed,
            nodes=tuple(attempt_nodes or attempt_placement or ()),
        )
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
        ) in rows
    )


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
    held = held_runs()
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
        *(("wait_reason", "wait_message") if written is not None else ()),
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
            )
        )
        if written is not None:
            written[row[0]] = (row[9], row[10])
    queued = tuple(queued_runs)
    held = held_runs()
    clusters = {cluster.name: cluster for cluster in Cluster.objects.filter(enabled=True)}
    nodes = cluster_nodes(now=now)
    quotas = {
        (row["tenant__slug"], row["flavor__slug"]): _quota_of(row)
        for row in Quota.objects.filter(tenant__active=True).values(
            "tenant__slug",
            "flavor__slug",
            "guaranteed_gpus",
            "borrow_limit_gpus",
            "max_gpus_per_run",
            "monthly_gpu_hour_budget",
            "budget_mode",
            "fair_share_weight",
        )
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
        levels={name: tuple(cluster.topology_levels) for name, cluster in clusters.items()},
        outside=queues_of({name: cluster.outside_claims for name, cluster in clusters.items()}),
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


@dataclass(frozen=True)
class AdmissionPreview:
    """What the submit form shows before submitting: the quota picture and the verdict."""

    tenant: str
    flavor: str
    gpus: int
    guaranteed: int
    borrow_limit: int
    in_use: int
    idle: int  # idle GPUs of the flavor across enabled clusters
    budget_gpu_hours: float | None
    budget_used_gpu_hours: float
    budget_mode: str
    verdict: str  # "start", "borrow", "wait" or "cannot" (the submit would be refused)
    message: str
    start: str = ""  # when it would start, from the last start forecast, if it would wait

    @property
    def borrowable(self) -> int:
        """GPUs the tenant could borrow right now beyond its guarantee."""
        room = self.guaranteed + self.borrow_limit - max(self.in_use, self.guaranteed)
        return max(0, min(room, self.idle))

    @property
    def budget_left_gpu_hours(self) -> float | None:
        if self.budget_gpu_hours is None:
            return None
        return max(0.0, self.budget_gpu_hours - self.budget_used_gpu_hours)


def admission_preview(
    *,
    user: UserLike,
    tenant: str,
    flavor: str,
    nodes: int,
    gpus_per_node: int,
    priority: int = 50,
    topology_level: str = "",
    topology_required: bool = False,
) -> AdmissionPreview:
    """Run admission on the current snapshot plus this hypothetical run, changing nothing."""
    tenant_obj = tenant_list_submittable(user=user).filter(slug=tenant).first()
    if tenant_obj is None:
        raise ValidationError({"tenant": "Unknown tenant, or you are not a member."})
    if not GpuFlavor.objects.filter(slug=flavor).exists():
        raise ValidationError({"flavor": "Unknown GPU flavor."})
    refusals = resource_refusals(
        tenant=tenant_obj,
        flavor=flavor,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        topology_level=topology_level,
        topology_mode=TopologyMode.REQUIRED if topology_required else "",
    )
    now = timezone.now()
    snapshot, _ = admission_snapshot(now=now)
    probe = admission_types.QueuedRun(
        id=-1,
        tenant=tenant,
        flavor=flavor,
        nodes=max(1, nodes),
        gpus_per_node=max(1, gpus_per_node),
        priority=priority,
        submitted=now.timestamp(),
        topology_level=topology_level,
        topology_required=topology_required,
    )
    decisions = admission.decide(replace(snapshot, queued=(*snapshot.queued, probe)))
    key = (tenant, flavor)
    quota = snapshot.quotas.get(key) or admission_types.Quota(guaranteed=0)
    in_use = sum(r.gpus for r in snapshot.held if (r.tenant, r.flavor) == key)
    idle = admission.free_gpus(snapshot).get(flavor, 0)
    admit = next((a for a in decisions.admitted if a.run_id == -1), None)
    start = ""
    if refusals:
        verdict = "cannot"
        message = "Cannot run: " + " ".join(m for messages in refusals.values() for m in messages)
    elif admit is not None:
        verdict = "borrow" if admit.borrowed else "start"
        where = f"{admit.cluster} ({', '.join(admit.nodes)})"
        message = (
            f"Would start now on {where}, borrowing idle GPUs (preemptible)"
            if admit.borrowed
            else f"Would start now on {where}, within the tenant's guarantee"
        )
        if admit.over_budget:
            message += "; past the soft monthly budget, so it will be flagged"
    else:
        wait = next(w for w in decisions.waiting if w.run_id == -1)
        verdict = "wait"
        message = f"Would wait: {wait.message} (position {wait.position})"
        if wait.reason in estimates.STUCK:
            # Decided now, not by the stored forecast, which may predate it (a hard budget
            # spent since the last refresh would otherwise read as a start already past).
            start = f"no start estimate: {estimates.STUCK[wait.reason]}"
        else:
            preview = start_preview(probe=probe, snapshot=snapshot)
            if preview is not None:
                start = preview.summary(now=now)
    return AdmissionPreview(
        tenant=tenant,
        flavor=flavor,
        gpus=probe.gpus,
        guaranteed=quota.guaranteed,
        borrow_limit=quota.borrow_limit,
        in_use=in_use,
        idle=max(0, idle),
        budget_gpu_hours=quota.budget_gpu_hours,
        budget_used_gpu_hours=snapshot.budget_used.get(key, 0.0),
        budget_mode="hard" if quota.budget_hard else "soft",
        verdict=verdict,
        message=message,
        start=start,
    )


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def admission_fingerprint(*, now: datetime) -> tuple[str, datetime] | None:
    """What admission reads, condensed: a digest of every queued and held run (state,
    priority, cluster, borrowed), the live attempts' nodes, the node inventory, the
    clusters, quotas and tenants, and which budgets are spent; with the moment until which
    the same inputs give the same decisions (the next run to start starving, the next
    inventory to go stale, the next month). A few aggregate queries in PostgreSQL, no rows
    read into Python. None on other databases: there every cycle decides in full."""
    if connection.vendor != "postgresql":
        return None
    # Identifiers are model tables (quoted); every value is a parameter.
    queries: dict[str, tuple[str, list[Any]]] = {
        "runs": (
            f"SELECT count(*), sum(hashtext(concat_ws('|', id, state, priority, cluster_id, "  # noqa: S608
            f"borrowed)))::text FROM {_table(Run)} WHERE state = ANY(%s)",
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
            f"gpus, gpus_used, gpus_used_by_gantry, schedulable, reason, path::text)))::text "
            f"FROM {_table(ClusterNode)}",
            [],
        ),
        "clusters": (
            # Not inventory_valid_until: each refresh moves it; when it passes is a moment.
            # Outside jobs as admission reads them: not their expected starts ("next").
            f"SELECT count(*), sum(hashtext(concat_ws('|', id, name, enabled, "  # noqa: S608
            "topology_levels::text, (outside_claims - 'next')::text)))::text "
            f"FROM {_table(Cluster)}",
            [],
        ),
        "quotas": (
            f"SELECT count(*), sum(hashtext(concat_ws('|', q.id, q.tenant_id, q.flavor_id, "  # noqa: S608
            "q.guaranteed_gpus, q.borrow_limit_gpus, q.max_gpus_per_run, "
            "q.monthly_gpu_hour_budget, q.budget_mode, q.fair_share_weight, t.active, t.slug"
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
