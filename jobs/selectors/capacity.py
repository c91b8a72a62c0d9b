"""Quotas against capacity: what every quota, member and cluster page shows.

Quotas live in ``tenants``, which knows nothing of clusters and runs; the figures that need
them (GPUs held by runs, GPU-hours used, which flavors' guarantees exceed their capacity)
are joined here. The changes they inform are in ``jobs/services/capacity.py``.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Sum
from django.utils import timezone

from clusters.models import Cluster
from clusters.selectors import flavor_capacity
from core.types import UserLike
from jobs.models import HOLDING_STATES, Run, RunState
from jobs.selectors import holding_sql
from jobs.selectors.queue import gpu_hours_this_month, gpu_occupancy
from tenants.access import membership_can_manage
from tenants.models import GpuFlavor, Membership, Quota, Tenant
from tenants.selectors import tenant_get_viewable


@dataclass(frozen=True)
class MemberUsage:
    """A member of a tenant, their role and what their runs of the tenant hold now."""

    membership: Membership
    gpus_held: int  # by runs admitted, submitting, pending or running
    runs_holding: int
    runs_queued: int


def member_usage_list(*, tenant: Tenant) -> list[MemberUsage]:
    """Every member of ``tenant`` (admins first, then by name) with their GPUs in use now;
    two queries whatever the number of members."""
    memberships = Membership.objects.filter(tenant=tenant).select_related("user")
    rows = (
        Run.objects.filter(tenant=tenant, state__in=(*HOLDING_STATES, RunState.QUEUED))
        .values("submitted_by", "state")
        .annotate(runs=Count("id"), gpus=Sum("gpus"))
    )
    held: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])  # gpus, holding, queued
    for row in rows:
        counts = held[row["submitted_by"]]
        if row["state"] == RunState.QUEUED:
            counts[2] += row["runs"]
        else:
            counts[0] += row["gpus"]
            counts[1] += row["runs"]
    usages = [
        MemberUsage(membership, *held.get(membership.user_id, (0, 0, 0)))
        for membership in memberships
    ]
    admin_first: dict[str, int] = {Membership.Role.TENANT_ADMIN: 0}
    return sorted(
        usages,
        key=lambda u: (admin_first.get(u.membership.role, 1), u.membership.user.get_username()),
    )


def tenant_get_members_viewable(*, user: UserLike, slug: str) -> Tenant:
    """The tenant whose members ``user`` may list and manage: its tenant admins and platform
    admins. DoesNotExist for a tenant the user cannot see; 403 for one they see but do not
    administer."""
    tenant = tenant_get_viewable(user=user, slug=slug)
    if not membership_can_manage(user=user, tenant=tenant):
        raise PermissionDenied("Only the tenant's admins and platform admins see its members.")
    return tenant


def borrowable_gpus(*, guaranteed: int, borrow_limit: int, in_use: int, idle: int) -> int:
    """GPUs a tenant could borrow right now beyond its guarantee (as admission would lend
    them: up to the borrow limit, from idle GPUs only)."""
    room = guaranteed + borrow_limit - max(in_use, guaranteed)
    return max(0, min(room, idle))


@dataclass(frozen=True)
class QuotaUsage:
    """One quota with what its tenant uses of it now and this month."""

    quota: Quota
    in_use: int  # GPUs held by the tenant's runs (admitted, submitting, pending, running)
    idle: int  # GPUs of the flavor no run holds, over enabled clusters
    gpu_hours: float  # allocated this month, running attempts prorated

    @property
    def borrowable(self) -> int:
        return borrowable_gpus(
            guaranteed=self.quota.guaranteed_gpus,
            borrow_limit=self.quota.borrow_limit_gpus,
            in_use=self.in_use,
            idle=self.idle,
        )

    @property
    def beyond_guarantee(self) -> int:
        """GPUs held beyond the guarantee: borrowed, or left over after the guarantee was
        lowered below what runs hold."""
        return max(0, self.in_use - self.quota.guaranteed_gpus)

    @property
    def budget_left(self) -> float | None:
        budget = self.quota.monthly_gpu_hour_budget
        return None if budget is None else max(0.0, budget - self.gpu_hours)

    @property
    def burn_percent(self) -> float | None:
        """Share of the monthly budget used, in percent (may exceed 100 with a soft budget)."""
        budget = self.quota.monthly_gpu_hour_budget
        if budget is None:
            return None
        if budget == 0:
            return 100.0 if self.gpu_hours > 0 else 0.0
        return 100 * self.gpu_hours / budget


def held_gpus_by_tenant_flavor(*, flavor_ids: Iterable[int]) -> dict[tuple[int, int], int]:
    """(tenant id, flavor id) -> GPUs held by runs, in one aggregate query."""
    rows = (
        Run.objects.filter(state__in=HOLDING_STATES, flavor_id__in=list(flavor_ids))
        .values("tenant_id", "flavor_id")
        .annotate(gpus=Sum("gpus"))
        .values_list("tenant_id", "flavor_id", "gpus")
    )
    return {(tenant_id, flavor_id): gpus for tenant_id, flavor_id, gpus in rows}


def quota_usage_list(
    *, quotas: Sequence[Quota], tenant: Tenant | None = None, now=None
) -> list[QuotaUsage]:
    """Usage of each of ``quotas`` (a page of them, tenant and flavor selected), in a fixed
    number of queries whatever their number. ``tenant``: all quotas are of this tenant.
    Idle GPUs are counted as admission counts them: on nodes that take work, less what
    Gantry's runs and jobs from outside Gantry hold there."""
    now = now or timezone.now()
    flavor_ids = {quota.flavor_id for quota in quotas}
    if not flavor_ids:
        return []
    occupancy = gpu_occupancy(now=now)
    hours = gpu_hours_this_month(now=now, tenant=tenant)
    return [
        QuotaUsage(
            quota=quota,
            in_use=occupancy.in_use.get((quota.tenant.slug, quota.flavor.slug), 0),
            idle=occupancy.free.get(quota.flavor.slug, 0),
            gpu_hours=hours.get((quota.tenant.slug, quota.flavor.slug), 0.0),
        )
        for quota in quotas
    ]


def held_gpus_by_pool(*, clusters: Iterable[Cluster]) -> dict[tuple[int, int], int]:
    """(cluster id, flavor id) -> GPUs held by runs on it, in one aggregate query."""
    rows = (
        Run.objects.filter(state__in=HOLDING_STATES, cluster__in=list(clusters))
        .values("cluster_id", "flavor_id")
        .annotate(gpus=Sum("gpus"))
        .values_list("cluster_id", "flavor_id", "gpus")
    )
    return {(cluster_id, flavor_id): gpus for cluster_id, flavor_id, gpus in rows}


@dataclass(frozen=True)
class Overcommit:
    """The guarantees of a flavor add up to more GPUs than the enabled clusters have."""

    flavor: str
    guaranteed: int  # every tenant's guarantee of the flavor, summed
    capacity: int  # GPUs of the flavor on enabled clusters

    @property
    def excess(self) -> int:
        return self.guaranteed - self.capacity

    @property
    def message(self) -> str:
        """For platform admins: the figures."""
        return (
            f"The {self.flavor} guarantees of all tenants add up to {self.guaranteed:,} GPUs, "
            f"{self.excess:,} more than the {self.capacity:,} the enabled clusters have: they "
            "cannot all be kept at once, and a tenant within its guarantee may wait."
        )

    @property
    def tenant_message(self) -> str:
        """For members of tenants: the fact, without other tenants' guarantees."""
        return (
            f"The {self.flavor} guarantees of all tenants add up to more than the "
            f"{self.capacity:,} GPUs the enabled clusters have: a run within its tenant's "
            "guarantee may wait."
        )


def flavor_overcommit(*, flavor: GpuFlavor) -> Overcommit | None:
    """The flavor's overcommit as the quotas stand, or None."""
    guaranteed = Quota.objects.filter(flavor=flavor).aggregate(gpus=Sum("guaranteed_gpus"))["gpus"]
    capacity = flavor_capacity(flavor_ids=[flavor.pk]).get(flavor.pk, 0)
    if (guaranteed or 0) <= capacity:
        return None
    return Overcommit(flavor=flavor.slug, guaranteed=guaranteed, capacity=capacity)


def flavor_overcommits() -> list[Overcommit]:
    """Every flavor whose guarantees exceed its capacity, by slug; one query."""
    return sorted(
        (
            Overcommit(flavor=slug, guaranteed=guaranteed, capacity=capacity)
            for slug, guaranteed, capacity in holding_sql.flavor_guarantee_rows()
            if guaranteed > capacity
        ),
        key=lambda overcommit: overcommit.flavor,
    )
