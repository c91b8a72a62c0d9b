"""Reads for admission: its snapshot, this month's usage, the submit preview."""

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobs import admission
from jobs.calendar import month_start
from jobs.models import (
    HOLDING_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    Cluster,
    ClusterFlavor,
    FairShareUsage,
    Run,
    RunState,
    TenantMonthUsage,
)
from tenants.access import tenant_list_submittable
from tenants.models import GpuFlavor, Quota
from tenants.types import UserLike


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


def _quota_of(row: Mapping[str, Any]) -> admission.Quota:
    return admission.Quota(
        guaranteed=row["guaranteed_gpus"],
        borrow_limit=row["borrow_limit_gpus"],
        max_gpus_per_run=row["max_gpus_per_run"],
        budget_gpu_hours=row["monthly_gpu_hour_budget"],
        budget_hard=row["budget_mode"] == Quota.BudgetMode.HARD,
        weight=row["fair_share_weight"],
    )


def admission_snapshot(*, now=None) -> tuple[admission.Snapshot, dict[str, Cluster]]:
    """Everything admission needs, read in a handful of queries."""
    now = now or timezone.now()
    queued = tuple(
        admission.QueuedRun(
            id=row["id"],
            tenant=row["tenant__slug"],
            flavor=row["flavor__slug"],
            nodes=row["experiment__nodes"],
            gpus_per_node=row["experiment__gpus_per_node"],
            priority=row["priority"],
            submitted=row["submitted_at"].timestamp(),
        )
        for row in Run.objects.filter(state=RunState.QUEUED).values(
            "id",
            "tenant__slug",
            "flavor__slug",
            "experiment__nodes",
            "experiment__gpus_per_node",
            "priority",
            "submitted_at",
        )
    )
    held = tuple(
        admission.HeldRun(
            id=row["id"],
            tenant=row["tenant__slug"],
            flavor=row["flavor__slug"],
            cluster=row["cluster__name"],
            gpus=row["gpus"],
            priority=row["priority"],
            admitted=(row["admitted_at"] or row["submitted_at"]).timestamp(),
            borrowed=row["borrowed"],
        )
        for row in Run.objects.filter(state__in=HOLDING_STATES).values(
            "id",
            "tenant__slug",
            "flavor__slug",
            "cluster__name",
            "gpus",
            "priority",
            "admitted_at",
            "submitted_at",
            "borrowed",
        )
    )
    clusters: dict[str, Cluster] = {}
    pools = []
    for cf in ClusterFlavor.objects.filter(cluster__enabled=True).select_related(
        "cluster", "flavor"
    ):
        clusters[cf.cluster.name] = cf.cluster
        pools.append(
            admission.Pool(
                cluster=cf.cluster.name,
                flavor=cf.flavor.slug,
                nodes=cf.nodes,
                gpus_per_node=cf.gpus_per_node,
            )
        )
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
    snapshot = admission.Snapshot(
        queued=queued,
        held=held,
        pools=tuple(pools),
        quotas=quotas,
        budget_used=gpu_hours_this_month(now=now),
        decayed_usage=decayed,
        now=now.timestamp(),
        starvation_after_s=settings.GANTRY_STARVATION_AFTER_S,
    )
    return snapshot, clusters


def gpu_hours_this_month(*, now, tenant=None) -> dict[tuple[str, str], float]:
    """Allocated GPU-hours this month per (tenant, flavor): finished attempts from the
    ledger, running ones prorated up to ``now``."""
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
        assert started is not None  # filtered on started_at__isnull=False
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
    verdict: str  # "start", "borrow" or "wait"
    message: str

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
    *, user: UserLike, tenant: str, flavor: str, nodes: int, gpus_per_node: int, priority: int = 50
) -> AdmissionPreview:
    """Run admission on the current snapshot plus this hypothetical run, changing nothing."""
    tenant_obj = tenant_list_submittable(user=user).filter(slug=tenant).first()
    if tenant_obj is None:
        raise ValidationError({"tenant": "Unknown tenant, or you are not a member."})
    if not GpuFlavor.objects.filter(slug=flavor).exists():
        raise ValidationError({"flavor": "Unknown GPU flavor."})
    now = timezone.now()
    snapshot, _ = admission_snapshot(now=now)
    probe = admission.QueuedRun(
        id=-1,
        tenant=tenant,
        flavor=flavor,
        nodes=max(1, nodes),
        gpus_per_node=max(1, gpus_per_node),
        priority=priority,
        submitted=now.timestamp(),
    )
    decisions = admission.decide(replace(snapshot, queued=(*snapshot.queued, probe)))
    key = (tenant, flavor)
    quota = snapshot.quotas.get(key) or admission.Quota(guaranteed=0)
    in_use = sum(r.gpus for r in snapshot.held if (r.tenant, r.flavor) == key)
    idle = sum(p.capacity for p in snapshot.pools if p.flavor == flavor) - sum(
        r.gpus for r in snapshot.held if r.flavor == flavor
    )
    admit = next((a for a in decisions.admitted if a.run_id == -1), None)
    if admit is not None:
        verdict = "borrow" if admit.borrowed else "start"
        message = (
            f"Would start now on {admit.cluster}, borrowing idle GPUs (preemptible)"
            if admit.borrowed
            else f"Would start now on {admit.cluster}, within the tenant's guarantee"
        )
        if admit.over_budget:
            message += "; past the soft monthly budget, so it will be flagged"
    else:
        wait = next(w for w in decisions.waiting if w.run_id == -1)
        verdict = "wait"
        message = f"Would wait: {wait.message} (position {wait.position})"
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
    )
