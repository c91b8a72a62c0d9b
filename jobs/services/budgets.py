"""Budget alerts: tell a tenant's members when it has used 80 % and 100 % of a monthly
GPU-hour budget, in the portal and by e-mail, once per threshold and month.
"""

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime

from django.conf import settings
from django.core.mail import send_mass_mail
from django.db import IntegrityError, transaction
from django.urls import reverse

from jobs.calendar import month_start
from jobs.models import BudgetAlert
from jobs.selectors.queue import gpu_hours_this_month
from tenants.models import Membership, Notification, Quota

logger = logging.getLogger(__name__)

THRESHOLDS = (BudgetAlert.Threshold.SPENT, BudgetAlert.Threshold.WARNING)  # highest first
NOTIFICATION_KIND = {
    BudgetAlert.Threshold.WARNING: Notification.Kind.BUDGET_80,
    BudgetAlert.Threshold.SPENT: Notification.Kind.BUDGET_100,
}
# Keyed by the threshold and the quota's budget mode, as stored (a plain string).
CONSEQUENCE: dict[tuple[int, str], str] = {
    (BudgetAlert.Threshold.WARNING, Quota.BudgetMode.HARD): (
        "Hard budget: new runs will wait when it is spent."
    ),
    (BudgetAlert.Threshold.WARNING, Quota.BudgetMode.SOFT): (
        "Soft budget: runs will still start when it is spent, flagged as over budget."
    ),
    (BudgetAlert.Threshold.SPENT, Quota.BudgetMode.HARD): (
        "Hard budget: new runs wait until the budget is raised or the month ends."
    ),
    (BudgetAlert.Threshold.SPENT, Quota.BudgetMode.SOFT): (
        "Soft budget: new runs still start, flagged as over budget."
    ),
}


@dataclass(frozen=True)
class Crossing:
    """A threshold a tenant has reached on a flavor this month, worded for people."""

    quota: Quota
    threshold: BudgetAlert.Threshold
    used_gpu_hours: float
    budget_gpu_hours: int  # the quota's monthly budget, set (only those are checked)
    month: date

    @property
    def percent(self) -> int:
        """Rounded down, so no message claims a threshold the usage has not reached."""
        return math.floor(
            _percent(used_gpu_hours=self.used_gpu_hours, budget_gpu_hours=self.budget_gpu_hours)
        )

    @property
    def month_name(self) -> str:
        return f"{self.month:%B %Y}"

    @property
    def subject(self) -> str:
        tenant, flavor = self.quota.tenant.slug, self.quota.flavor.slug
        if self.threshold == BudgetAlert.Threshold.SPENT:
            return f"[Gantry] {tenant} has spent its {flavor} GPU-hour budget for {self.month_name}"
        return (
            f"[Gantry] {tenant} has used {self.percent} % of its {flavor} budget for "
            f"{self.month_name}"
        )

    @property
    def message(self) -> str:
        quota = self.quota
        return (
            f"Tenant {quota.tenant.slug} has used {self.percent} % of its "
            f"{quota.monthly_gpu_hour_budget:,} {quota.flavor.slug} GPU-hour budget for "
            f"{self.month_name} ({self.used_gpu_hours:,.1f} GPU-hours). "
            f"{CONSEQUENCE[(self.threshold, quota.budget_mode)]}"
        )


def _percent(*, used_gpu_hours: float, budget_gpu_hours: int) -> float:
    # Rounded to a millionth: 8.2 GPU-hours summed from seconds is 8.19999…, which is 82 %.
    return round(used_gpu_hours * 100 / budget_gpu_hours, 6)


def budget_crossed(*, used_gpu_hours: float, budget_gpu_hours: int) -> BudgetAlert.Threshold | None:
    """The highest threshold the usage has reached, or None below 80 %."""
    percent = _percent(used_gpu_hours=used_gpu_hours, budget_gpu_hours=budget_gpu_hours)
    for threshold in THRESHOLDS:
        if percent >= threshold:
            return threshold
    return None


def budget_alerts_check(*, now: datetime) -> int:
    """Notify the members of every tenant whose usage reached a budget threshold this month
    that has not been notified yet; returns how many alerts fired.

    Only the highest threshold reached is notified: usage that jumps past 100 % between two
    checks gets the "spent" alert, never a stale 80 % one after it. Zero budgets are skipped
    (admission already explains them on every waiting run). Idempotent, and safe when two
    checks race: the BudgetAlert unique constraint lets exactly one of them notify.
    """
    month = month_start(now).date()
    quotas = list(
        Quota.objects.filter(monthly_gpu_hour_budget__gt=0, tenant__active=True).select_related(
            "tenant", "flavor"
        )
    )
    if not quotas:
        return 0
    used = gpu_hours_this_month(now=now)
    notified: dict[tuple[int, int], int] = defaultdict(int)
    for tenant_id, flavor_id, reached in BudgetAlert.objects.filter(month=month).values_list(
        "tenant_id", "flavor_id", "threshold"
    ):
        key = (tenant_id, flavor_id)
        notified[key] = max(notified[key], reached)
    crossings = []
    for quota in quotas:
        budget = quota.monthly_gpu_hour_budget
        assert budget is not None  # filtered on monthly_gpu_hour_budget__gt=0
        hours = used.get((quota.tenant.slug, quota.flavor.slug), 0.0)
        threshold = budget_crossed(used_gpu_hours=hours, budget_gpu_hours=budget)
        if threshold is not None and threshold > notified[(quota.tenant_id, quota.flavor_id)]:
            crossings.append(
                Crossing(
                    quota=quota,
                    threshold=threshold,
                    used_gpu_hours=hours,
                    budget_gpu_hours=budget,
                    month=month,
                )
            )
    if not crossings:
        return 0
    members = _members_by_tenant(tenant_ids={c.quota.tenant_id for c in crossings})
    return sum(
        _alert_fire(crossing=c, recipients=members.get(c.quota.tenant_id, []), now=now)
        for c in crossings
    )


def _members_by_tenant(*, tenant_ids: set[int]) -> dict[int, list]:
    members: dict[int, list] = defaultdict(list)
    for membership in (
        Membership.objects.filter(
            tenant_id__in=tenant_ids,
            role__in=(Membership.Role.TENANT_ADMIN, Membership.Role.RESEARCHER),
            user__is_active=True,
        )
        .select_related("user")
        .order_by("user__username")
    ):
        members[membership.tenant_id].append(membership.user)
    return members


def _alert_fire(*, crossing: Crossing, recipients: list, now: datetime) -> int:
    quota = crossing.quota
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(
                tenant=quota.tenant,
                flavor=quota.flavor,
                month=crossing.month,
                threshold=crossing.threshold,
                budget_gpu_hours=crossing.budget_gpu_hours,
                used_gpu_hours=crossing.used_gpu_hours,
                sent_at=now,
            )
            Notification.objects.bulk_create(
                Notification(
                    user=user,
                    tenant=quota.tenant,
                    kind=NOTIFICATION_KIND[crossing.threshold],
                    message=crossing.message,
                    created_at=now,
                )
                for user in recipients
            )
            mails = [
                (crossing.subject, _mail_body(crossing), settings.DEFAULT_FROM_EMAIL, [user.email])
                for user in recipients
                if user.email
            ]
            if mails:
                # After commit: a rolled-back check sends nothing. Robust: a mail server that
                # is down is logged and does not undo the in-app notifications.
                transaction.on_commit(lambda: send_mass_mail(mails), robust=True)
    except IntegrityError:
        return 0  # another check notified this threshold first
    logger.info(
        "budget alert: %s %s %d %% of %d GPU-hours in %s, %d notified",
        quota.tenant.slug,
        quota.flavor.slug,
        crossing.percent,
        quota.monthly_gpu_hour_budget,
        f"{crossing.month:%Y-%m}",
        len(recipients),
    )
    return 1


def _mail_body(crossing: Crossing) -> str:
    tenant = crossing.quota.tenant
    return (
        f"{crossing.message}\n\n"
        f"You receive this as a member of tenant {tenant.slug} ({tenant.name}). "
        "The portal lists it under Notifications: "
        f"{settings.GANTRY_PUBLIC_URL}{reverse('notifications:list')}\n"
    )
