"""Applying a what-if report's proposal: its quotas set through the quota service, as the
quota form sets them, with the same checks, confirmation and audit.

All or nothing: every quota is set in one transaction, and any refusal (a tenant or flavor
deleted since, a value the quota form refuses, an overcommit not confirmed) rolls every one
back. The parts of a proposal Gantry cannot set (nodes, which are hardware; the preemption
and starvation settings, which are the deployment's) are listed on the page, not applied.
"""

from django.core.exceptions import ValidationError
from django.db import transaction

from core.types import UserLike
from jobs.services.capacity import QuotaChange, quota_update_checked
from policy.models import ReplayReport
from policy.selectors import apply_plan
from tenants.models import Quota
from tenants.services.audit import audit_record


@transaction.atomic
def replay_report_apply(
    *, report: ReplayReport, actor: UserLike, confirm_overcommit: bool = False
) -> list[QuotaChange]:
    """Set the quotas ``report`` proposes (those that differ from today's), each audited as
    "quota.update" (and "quota.overcommit" where confirmed), and the whole as
    "replay.apply". ValidationError, nothing changed, when the report has no proposal to
    apply, names a tenant or flavor that is gone, or a quota is refused; an overcommit needs
    ``confirm_overcommit`` (as on the quota form)."""
    plan = apply_plan(report=report)
    if plan.errors:
        raise ValidationError({"__all__": list(plan.errors)})
    if not plan.changes:
        raise ValidationError(
            {"__all__": ["Today's quotas are already what the report proposes: nothing to apply."]}
        )
    changes = []
    for line in plan.changes:
        proposed = line.proposed
        try:
            changes.append(
                quota_update_checked(
                    tenant=line.tenant,
                    flavor=line.flavor,
                    guaranteed_gpus=proposed.guaranteed,
                    borrow_limit_gpus=proposed.borrow_limit,
                    max_gpus_per_run=proposed.max_gpus_per_run,
                    monthly_gpu_hour_budget=line.budget,
                    budget_mode=Quota.BudgetMode.HARD
                    if proposed.budget_hard
                    else Quota.BudgetMode.SOFT,
                    fair_share_weight=proposed.weight,
                    actor=actor,
                    confirm_overcommit=confirm_overcommit,
                )
            )
        except ValidationError as exc:
            where = f"{line.tenant.slug} {line.flavor.slug}"
            if hasattr(exc, "error_dict") and set(exc.error_dict) == {"confirm_overcommit"}:
                raise ValidationError(
                    {"confirm_overcommit": [f"{where}: {m}" for m in exc.messages]}
                ) from None
            raise ValidationError({"__all__": [f"{where}: {m}" for m in exc.messages]}) from None
    audit_record(
        actor=actor,
        action="replay.apply",
        target=f"replay {report.pk}",
        after={"quotas": [f"{line.tenant.slug}:{line.flavor.slug}" for line in plan.changes]},
    )
    return changes
