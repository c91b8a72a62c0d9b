"""Quotas against capacity: what platform admins change (a quota, checked against the
flavors clusters offer and their capacity; a simulator cluster's pools).

Quotas live in ``tenants``, which knows nothing of clusters and runs; the checks that need
them are joined here, on the reads of ``jobs/selectors/capacity.py``.
"""

from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction

from clusters.models import Cluster, ClusterFlavor
from clusters.selectors import offered_flavor_slugs
from clusters.services import cluster_refresh_inventory
from core.types import UserLike
from jobs.enqueue import admission_cycle_enqueue
from jobs.selectors.capacity import Overcommit, flavor_overcommit, held_gpus_by_tenant_flavor
from tenants.models import GpuFlavor, Quota, Tenant
from tenants.services.audit import audit_record
from tenants.services.quotas import MAX_STORED_INT, quota_update


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
    """``tenants.services.quotas.quota_update`` with the flavors enabled clusters offer, so a
    borrow limit on a flavor nobody offers is refused; then an admission cycle applies the
    change.

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
    in_use = held_gpus_by_tenant_flavor(flavor_ids=[flavor.pk]).get((tenant.pk, flavor.pk), 0)
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
