"""What tenants have used: the monthly ledger and decayed fair-share usage.

The ledger (``TenantMonthUsage``, what budgets burn) counts charged GPU-seconds: an
attempt's allocation is added when it ends (``usage_record_attempt``), and the GPU-seconds
credited for a platform or hardware fault are taken off again once they are known
(``usage_credit_attempt``, called by finance's rollup, which knows the attempt's accounting
and its rate card's credit policy)."""

from collections.abc import Mapping
from datetime import date

from django.conf import settings
from django.db.models import F

from core.bulk import rows_update
from jobs import admission
from jobs.calendar import split_by_month
from jobs.models import (
    Attempt,
    FairShareUsage,
    TenantMonthUsage,
)
from tenants.models import GpuFlavor, Tenant


def usage_record_attempt(*, attempt: Attempt, started, finished) -> None:
    """Add a finished attempt's allocated GPU-seconds to the monthly ledger (split by month)."""
    if started is None or finished is None or finished <= started:
        return
    run = attempt.run
    for month, seconds in split_by_month(started, finished):
        row, _ = TenantMonthUsage.objects.get_or_create(
            tenant_id=run.tenant_id, flavor_id=run.flavor_id, month=month
        )
        TenantMonthUsage.objects.filter(pk=row.pk).update(
            gpu_seconds=F("gpu_seconds") + seconds * run.gpus
        )


def usage_credit_attempt(*, attempt: Attempt, gpu_seconds_by_month: Mapping[date, int]) -> None:
    """Take credited GPU-seconds of ``attempt`` off its tenant's ledger, per month (the first
    day); a negative number puts back a credit taken before (a cause or policy changed).
    The caller passes only the change since its last call, so nothing is credited twice."""
    run = attempt.run
    for month, seconds in sorted(gpu_seconds_by_month.items()):
        if not seconds:
            continue
        row, _ = TenantMonthUsage.objects.get_or_create(
            tenant_id=run.tenant_id, flavor_id=run.flavor_id, month=month
        )
        TenantMonthUsage.objects.filter(pk=row.pk).update(gpu_seconds=F("gpu_seconds") - seconds)


def fair_share_update(*, holding: Mapping[tuple[str, str], int], now) -> None:
    """Decay every tenant's usage by the time since the last update and add what it held
    meanwhile (``holding``: GPUs per tenant and flavor)."""
    half_life_s = settings.GANTRY_FAIR_SHARE_HALF_LIFE_H * 3600
    rows = {
        (row.tenant.slug, row.flavor.slug): row
        for row in FairShareUsage.objects.select_related("tenant", "flavor")
    }
    changed = []
    for key, row in rows.items():
        row.decayed_gpu_seconds = admission.fair_share_decayed(
            row.decayed_gpu_seconds,
            gpus_held=holding.get(key, 0),
            elapsed_s=max(0.0, (now - row.updated_at).total_seconds()),
            half_life_s=half_life_s,
        )
        row.updated_at = now
        changed.append(row)
    rows_update(
        FairShareUsage,
        ["decayed_gpu_seconds", "updated_at"],
        [(row.pk, row.decayed_gpu_seconds, row.updated_at) for row in changed],
    )
    missing = [key for key in holding if key not in rows]
    if missing:
        tenants = dict(
            Tenant.objects.filter(slug__in={t for t, _ in missing}).values_list("slug", "id")
        )
        flavors = dict(
            GpuFlavor.objects.filter(slug__in={f for _, f in missing}).values_list("slug", "id")
        )
        FairShareUsage.objects.bulk_create(
            [
                FairShareUsage(tenant_id=tenants[t], flavor_id=flavors[f], updated_at=now)
                for t, f in missing
            ],
            ignore_conflicts=True,
        )
