"""Quotas against capacity: what platform admins change, and what every quota page shows.

Quotas live in ``tenants``, which knows nothing of clusters and runs; the checks and figures
that need them (which flavors enabled clusters offer, GPUs held by runs, GPU-hours used)
are joined here.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from clusters.models import Cluster, ClusterFlavor
from clusters.selectors import flavor_capacity, offered_flavor_slugs
from clusters.services import cluster_refresh_inventory
from core.types import UserLike
from jobs.enqueue import admission_cycle_enqueue
from jobs.models import HOLDING_STATES, Run, RunState
from jobs.selectors import holding_sql
from jobs.selectors.queue import gpu_hours_this_month, gpu_occupancy
from tenants.access import membership_can_manage
from tenants.models import GpuFlavor, Membership, Quota, Tenant
from tenants.selectors import tenant_get_viewable
from tenants.services import MAX_STORED_INT, audit_record, quota_update

# --- reads -------------------------------------------------------------------------------


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


def _held_gpus(*, flavor_ids: Iterable[int]) -> dict[tuple[int, int], int]:
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


# --- writes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaChange:
    quota: Quota
    in_use: int  # GPUs the tenant's runs hold now
    overcommit: Overcommit | None = None  # the flavor's guarantees after the change

    @property
    def beyond_guarantee(self) -> int:
        return max(0, self.in_use - self.quota.guaranteed_gpus)


@transaction.atomic
def quota_update_checked(
    *,
    tenant: Tenant,
    flavor: GpuFlavor,
    guaranteed_gpus: int,
    borrow_limit_gpus: int,
    max_gpus_per_run: int | None,
    monthly_gpu_hour_budget: int | None,
    budget_mode: str,
    fair_share_weight: int,
    actor: UserLike,
    confirm_overcommit: bool = False,
) -> QuotaChange:
    """``tenants.services.quota_update`` with the flavors enabled clusters offer, so a borrow
    limit on a flavor nobody offers is refused; then an admission cycle applies the change.

    Raising a guarantee so that the flavor's guarantees add up to more than its capacity
    needs ``confirm_overcommit``: without it, ValidationError on ``confirm_overcommit`` and
    nothing is written; with it, saved and audited as "quota.overcommit" too. A guarantee
    below what the tenant's runs hold is allowed (they keep running); the result says by
    how much they exceed it.
    """
    # The flavor's quota rows, locked: two admins raising guarantees at once see each other.
    before = dict(
        Quota.objects.select_for_update()
        .filter(flavor=flavor)
        .order_by("tenant_id")
        .values_list("tenant_id", "guaranteed_gpus")
    ).get(tenant.pk, 0)
    # Saved in a savepoint first, so every other field is checked as usual (and named first);
    # refusing the overcommit then rolls the save and its audit row back.
    with transaction.atomic():
        quota = quota_update(
            tenant=tenant,
            flavor=flavor,
            guaranteed_gpus=guaranteed_gpus,
            borrow_limit_gpus=borrow_limit_gpus,
            max_gpus_per_run=max_gpus_per_run,
            monthly_gpu_hour_budget=monthly_gpu_hour_budget,
            budget_mode=budget_mode,
            fair_share_weight=fair_share_weight,
            offered_flavors=offered_flavor_slugs(),
            actor=actor,
        )
        overcommit = flavor_overcommit(flavor=flavor)
        raises_overcommit = overcommit is not None and quota.guaranteed_gpus > before
        if raises_overcommit and not confirm_overcommit:
            assert overcommit is not None
            raise ValidationError(
                {
                    "confirm_overcommit": [
                        f"{overcommit.message} Confirm to save the guarantee of "
                        f"{quota.guaranteed_gpus:,} anyway, or lower it."
                    ]
                }
            )
    if raises_overcommit and overcommit is not None:
        audit_record(
            actor=actor,
            action="quota.overcommit",
            target=f"{tenant.slug}:{flavor.slug}",
            tenant=tenant,
            after={"guaranteed": overcommit.guaranteed, "capacity": overcommit.capacity},
        )
    in_use = _held_gpus(flavor_ids=[flavor.pk]).get((tenant.pk, flavor.pk), 0)
    admission_cycle_enqueue()
    return QuotaChange(quota=quota, in_use=in_use, overcommit=overcommit)


@transaction.atomic
def cluster_capacity_set(
    *, cluster: Cluster, flavor: GpuFlavor, nodes: int, gpus_per_node: int, actor: UserLike
) -> ClusterFlavor:
    """Set a simulator cluster's pool of ``flavor`` to ``nodes`` × ``gpus_per_node`` and
    refresh the capacity admission uses; audited as "cluster.capacity".

    Other backends report their capacity through their inventory: refused for them.
    """
    errors: dict[str, list[str]] = {}
    for name, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if not isinstance(value, int) or isinstance(value, bool):
            errors[name] = ["Enter a whole number."]
        elif value < 1:
            errors[name] = ["Must be at least 1."]
        elif value > MAX_STORED_INT:
            errors[name] = [f"At most {MAX_STORED_INT}."]
    if cluster.backend != Cluster.Backend.SIMULATOR:
        errors["__all__"] = [
            f"{cluster.name} is a {cluster.get_backend_display()} cluster: its capacity comes "
            "from the cluster's inventory and cannot be edited here."
        ]
    if errors:
        raise ValidationError(errors)

    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    pools = [dict(pool) for pool in cluster.settings.get("pools", [])]
    pool = next((p for p in pools if p.get("flavor") == flavor.slug), None)
    before = (
        None
        if pool is None
        else {"nodes": int(pool["nodes"]), "gpus_per_node": int(pool["gpus_per_node"])}
    )
    after = {"nodes": nodes, "gpus_per_node": gpus_per_node}
    if before != after:
        if pool is None:
            pools.append({"flavor": flavor.slug, **after})
        else:
            pool.update(after)
        cluster.settings = {**cluster.settings, "pools": pools}
        cluster.save(update_fields=["settings"])
        audit_record(
            actor=actor,
            action="cluster.capacity",
            target=f"{cluster.name}:{flavor.slug}",
            before=before,
            after=after,
        )
        admission_cycle_enqueue()
    cluster_refresh_inventory(cluster=cluster)
    return ClusterFlavor.objects.select_related("flavor").get(cluster=cluster, flavor=flavor)
