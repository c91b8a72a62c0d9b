"""Writes of finance: rate cards, and the DailyUsage rollup from attempt accounting (design
§8). Prices and splits are computed by the pure ``finance.costing``."""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from core.types import UserLike, signed_in
from finance import costing
from finance.access import rate_card_can_manage
from finance.models import DailyUsage, RateCard, UsageRollupState
from finance.selectors.rate_cards import platform_currency, rate_cards_for
from jobs.models import Attempt
from jobs.services.usage import usage_credit_attempt
from telemetry.accounting import CATEGORIES
from telemetry.models import CREDITED_CAUSES, AttemptAccounting
from tenants.models import GpuFlavor
from tenants.services.audit import audit_record

MAX_PRICE = Decimal("100000")  # per GPU-hour: a typo guard, far above any real price
_CURRENCY = re.compile(r"[A-Z]{3}")
# Accounting committed a little after the time it was computed at is still picked up: the
# rollup looks this far behind its watermark (rebuilding a day twice is harmless).
WATERMARK_LAG = timedelta(minutes=10)


def _places(price: Decimal) -> int:
    """Decimal places of a finite price."""
    exponent = price.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def rate_card_add(
    *,
    flavor: GpuFlavor,
    price_per_gpu_hour: object,
    currency: str,
    valid_from: date,
    actor: UserLike,
    credit_policy: str = RateCard.CreditPolicy.CREDIT,
) -> RateCard:
    """A new price for ``flavor`` from ``valid_from``: it ends the flavor's card before it,
    so the cards never overlap or leave a gap. Days already rolled up from ``valid_from``
    on are priced again. ``credit_policy``: whether platform and hardware failures are
    credited under it. Audited as "ratecard.add"."""
    if not rate_card_can_manage(user=actor):
        raise PermissionDenied("Only finance and platform admins manage rate cards.")
    errors: dict[str, list[str]] = {}
    try:
        price = Decimal(str(price_per_gpu_hour))
    except InvalidOperation:
        price = None
    if price is None or not price.is_finite():
        errors["price_per_gpu_hour"] = ["Enter a price such as 2.50."]
    elif price < 0:
        errors["price_per_gpu_hour"] = ["A price cannot be negative."]
    elif price > MAX_PRICE or _places(price) > 4:
        errors["price_per_gpu_hour"] = [f"Enter at most {MAX_PRICE:,} with up to 4 decimal places."]
    if credit_policy not in RateCard.CreditPolicy.values:
        errors["credit_policy"] = ["Choose credit or charge."]
    currency = (currency or "").strip().upper()
    existing_currency = platform_currency()
    if not _CURRENCY.fullmatch(currency):
        errors["currency"] = ["Enter a three-letter ISO 4217 code such as EUR."]
    elif existing_currency and currency != existing_currency:
        errors["currency"] = [
            f"Every rate card is in {existing_currency}: statements add up in one currency."
        ]
    with transaction.atomic():
        # One writer per flavor: the check below and the insert see the same cards.
        GpuFlavor.objects.select_for_update().get(pk=flavor.pk)
        latest = RateCard.objects.filter(flavor=flavor).order_by("-valid_from").first()
        if latest is not None and valid_from <= latest.valid_from:
            errors["valid_from"] = [
                f"The current card of {flavor.slug} starts on {latest.valid_from:%Y-%m-%d}; a "
                "new card must start after it (it then ends the current one)."
            ]
        if errors or price is None:  # an unparsable price is among the errors
            raise ValidationError(errors)
        if latest is not None:
            before = {"valid_to": None}
            latest.valid_to = valid_from
            latest.save(update_fields=["valid_to"])
            audit_record(
                actor=actor,
                action="ratecard.end",
                target=f"{flavor.slug}@{latest.valid_from:%Y-%m-%d}",
                before=before,
                after={"valid_to": f"{valid_from:%Y-%m-%d}"},
            )
        card = RateCard.objects.create(
            flavor=flavor,
            price_per_gpu_hour=price,
            currency=currency,
            valid_from=valid_from,
            credit_policy=credit_policy,
            created_by=signed_in(actor),
        )
        audit_record(
            actor=actor,
            action="ratecard.add",
            target=f"{flavor.slug}@{valid_from:%Y-%m-%d}",
            after={
                "price_per_gpu_hour": str(price),
                "currency": currency,
                "credit_policy": credit_policy,
            },
        )
        _rates_changed(valid_from)
    return card


def rate_card_credit_policy_set(*, card: RateCard, credit_policy: str, actor: UserLike) -> RateCard:
    """Whether platform and hardware failures are credited (``credit``) or charged
    (``charge``) under ``card``. The card's days already rolled up are priced again, and
    the budget ledger follows. Its price is never edited (a correction is a new card); the
    policy may be, as it decides who pays for a failure, not what GPU time costs. Audited as
    "ratecard.credit_policy"."""
    if not rate_card_can_manage(user=actor):
        raise PermissionDenied("Only finance and platform admins manage rate cards.")
    if credit_policy not in RateCard.CreditPolicy.values:
        raise ValidationError({"credit_policy": ["Choose credit or charge."]})
    with transaction.atomic():
        card = RateCard.objects.select_for_update().select_related("flavor").get(pk=card.pk)
        before = card.credit_policy
        if before == credit_policy:
            return card
        card.credit_policy = credit_policy
        card.save(update_fields=["credit_policy"])
        audit_record(
            actor=actor,
            action="ratecard.credit_policy",
            target=f"{card.flavor.slug}@{card.valid_from:%Y-%m-%d}",
            before={"credit_policy": before},
            after={"credit_policy": credit_policy},
        )
        _rates_changed(card.valid_from)
    return card


def _state_locked() -> UsageRollupState:
    UsageRollupState.objects.get_or_create(pk=1)
    return UsageRollupState.objects.select_for_update().get(pk=1)


def _rates_changed(valid_from: date) -> None:
    state = _state_locked()
    if state.rates_changed_from is None or valid_from < state.rates_changed_from:
        state.rates_changed_from = valid_from
        state.save(update_fields=["rates_changed_from", "updated_at"])


# --- DailyUsage --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RollupSummary:
    days: int
    rows: int
    accounted_until: datetime | None


def _days(start: datetime, end: datetime) -> list[date]:
    first, last = start.date(), end.date()
    if end > start and end == costing.midnight(last):
        last -= timedelta(days=1)  # ends at midnight: nothing of that day
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


# The columns DailyUsage adds up per row: the categories, then one per credited cause.
_CREDIT_COLUMNS = {cause.value: f"credited_{cause.value}_gpu_s" for cause in CREDITED_CAUSES}
_SUMS = (*(f"{name}_gpu_s" for name in CATEGORIES), *_CREDIT_COLUMNS.values())


def daily_usage_rebuild(*, days: Iterable[date]) -> int:
    """Replace the DailyUsage rows of ``days`` by what the accounting of every attempt
    with GPU time on them says, and bring the budget ledger's credit of those attempts up
    to date (``_budget_credits_sync``). Returns the number of rows written."""
    days = sorted(set(days))
    if not days:
        return 0
    wanted = set(days)
    lo, hi = costing.midnight(days[0]), costing.midnight(days[-1] + timedelta(days=1))
    fields = (
        "attempt__started_at", "attempt__finished_at", "attempt__cluster_id",
        "attempt__run__tenant_id", "attempt__run__experiment__project_id",
        "attempt__run__submitted_by_id", "attempt__run__flavor_id",
        "pk", "cause_class", "credited_gpu_s", "budget_credited",
        *(f"{name}_gpu_s" for name in CATEGORIES),
    )  # fmt: skip
    accounts = (
        AttemptAccounting.objects.filter(attempt__started_at__lt=hi, attempt__finished_at__gte=lo)
        .order_by("pk")
        .values_list(*fields)
    )
    rates = rate_cards_for(GpuFlavor.objects.values_list("pk", flat=True))
    totals: dict[tuple, list[int]] = {}
    cards: dict[tuple, int | None] = {}
    budget_changes: dict[int, dict[str, int]] = {}
    for (
        started, finished, cluster, tenant, project, user, flavor,
        account, cause, credited, budget_credited, *seconds,
    ) in accounts.iterator(chunk_size=5000):  # fmt: skip
        shares = costing.split_attempt(
            start=started,
            end=finished,
            gpu_seconds=dict(zip(CATEGORIES, seconds, strict=True)),
            rates=rates.get(flavor, ()),
        )
        # The accounting says whether credit is due (its cause, its outcome); each share's
        # rate card says whether it is given.
        due = credited > 0 and cause in _CREDIT_COLUMNS
        by_month: dict[str, int] = {}
        counted: set[tuple] = set()
        for share in shares:
            credit = share.credited_gpu_s(credit_due=due)
            if credit:
                month = f"{share.day.replace(day=1):%Y-%m-%d}"
                by_month[month] = by_month.get(month, 0) + credit
            if share.day not in wanted:
                continue
            key = (share.day, tenant, project, user, flavor, cluster)
            card = share.rate.card_id if share.rate is not None else None
            # Cards start at 00:00 UTC: a flavor's day has one card or none.
            if cards.setdefault(key, card) != card:
                raise AssertionError(f"two rate cards on one day: {key}")
            row = totals.setdefault(key, [0] * (len(_SUMS) + 2))
            for position, name in enumerate(CATEGORIES):
                row[position] += share.gpu_seconds[name]
            if credit:
                row[len(CATEGORIES) + CREDITED_CAUSES.index(cause)] += credit
            row[-2] += share.unpriced_gpu_s
            if key not in counted:
                row[-1] += 1
                counted.add(key)
        if by_month != budget_credited:
            budget_changes[account] = by_month
    rows = []
    for (day, tenant, project, user, flavor, cluster), values in sorted(totals.items()):
        sums = dict(zip(_SUMS, values[: len(_SUMS)], strict=True))
        rows.append(
            DailyUsage(
                date=day,
                tenant_id=tenant,
                project_id=project,
                user_id=user,
                flavor_id=flavor,
                cluster_id=cluster,
                attempts=values[-1],
                allocated_gpu_s=sum(sums[f"{name}_gpu_s"] for name in CATEGORIES),
                **sums,
                unpriced_gpu_s=values[-2],
                rate_card_id=cards[(day, tenant, project, user, flavor, cluster)],
            )
        )
    with transaction.atomic():
        DailyUsage.objects.filter(date__among=list(days)).delete()
        DailyUsage.objects.bulk_create(rows, batch_size=2000)
        _budget_credits_sync(budget_changes)
    return len(rows)


def _budget_credits_sync(changes: dict[int, dict[str, int]]) -> None:
    """Take each changed attempt's credit (per month) off its tenant's budget ledger, less
    what was taken before: the accounting row keeps what was taken, under a row lock, so a
    rebuild repeated or racing another never credits twice."""
    for account in (
        AttemptAccounting.objects.select_for_update(of=("self",))
        .select_related("attempt__run")
        .filter(pk__in=list(changes))
        .order_by("pk")
    ):
        wanted, before = changes[account.pk], account.budget_credited or {}
        delta = {
            date.fromisoformat(month): wanted.get(month, 0) - before.get(month, 0)
            for month in wanted.keys() | before.keys()
        }
        if any(delta.values()):
            usage_credit_attempt(attempt=account.attempt, gpu_seconds_by_month=delta)
        account.budget_credited = wanted
        account.save(update_fields=["budget_credited"])


def daily_usage_update(*, now: datetime | None = None) -> RollupSummary:
    """Bring DailyUsage up to date: rebuild the days of attempts whose accounting was
    computed since the last run, and every day from a changed rate card's start on."""
    now = now or timezone.now()
    with transaction.atomic():
        state = _state_locked()
        since = state.accounted_until
        changed = AttemptAccounting.objects.all()
        if since is not None:
            changed = changed.filter(computed_at__gt=since - WATERMARK_LAG)
        newest = changed.aggregate(newest=Max("computed_at"))["newest"]
        days: set[date] = set()
        for start, end in Attempt.objects.filter(
            accounting__in=changed, started_at__isnull=False, finished_at__isnull=False
        ).values_list("started_at", "finished_at"):
            if start is not None and end is not None:  # filtered so; said for the checker
                days.update(_days(start, end))
        if state.rates_changed_from is not None:
            first = state.rates_changed_from
            days.update(first + timedelta(days=n) for n in range((now.date() - first).days + 1))
        rows = daily_usage_rebuild(days=days)
        state.accounted_until = max(filter(None, (since, newest)), default=None)
        state.rates_changed_from = None
        state.save(update_fields=["accounted_until", "rates_changed_from", "updated_at"])
    return RollupSummary(days=len(days), rows=rows, accounted_until=state.accounted_until)
