"""Reads behind the reliability figures (``telemetry.kpis.reliability`` does the arithmetic):
ETTR of a run, of tenants and of the platform; failures per month by cause class; GPU-hours
lost and credited by cause. Each is one query, whatever the number of runs or attempts.
Scoping is the caller's: a run or tenant the user may see, platform figures for platform
admins only."""

from dataclasses import dataclass
from datetime import date, datetime, time

from django.db.models import Count, Min, Q, Sum
from django.db.models.functions import TruncMonth
from django.utils import timezone

from jobs.models import Attempt, CauseClass, Run
from telemetry.kpis import reliability
from telemetry.kpis.metrics import Ratio
from telemetry.models import CREDITED_CAUSES, AttemptAccounting
from telemetry.selectors.gpu_seconds import SECONDS_PER_HOUR

CAUSES = tuple(CauseClass.values)
# Attempts whose end Gantry credits: the ones a node-health page counts against a node.
HARDWARE_OR_PLATFORM = Q(cause_class__in=sorted(CREDITED_CAUSES))


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def run_ettr(*, run: Run, now: datetime) -> Ratio | None:
    """The run's ETTR (docs/node-health.md, "Figures and pages"); None before its first
    admission."""
    row = Attempt.objects.filter(run=run).aggregate(
        first=Min("created_at"), effective=Sum("accounting__effective_gpu_s")
    )
    if row["first"] is None:
        return None
    wall = reliability.wall_seconds(
        first_admission=row["first"].timestamp(),
        end=None if run.finished_at is None else run.finished_at.timestamp(),
        now=now.timestamp(),
    )
    return reliability.ettr(effective_gpu_s=row["effective"] or 0, gpus=run.gpus, wall_s=wall)


def ettr_by_tenant(
    *, since: datetime, until: datetime, tenant_id: int | None = None
) -> dict[str, Ratio]:
    """ETTR of the runs that ended in [since, until), per tenant slug (GPU-weighted sums,
    ``telemetry.kpis.reliability``); only ``tenant_id``'s when given. Sum them for the
    platform's."""
    runs = Run.objects.filter(finished_at__gte=since, finished_at__lt=until, attempts__isnull=False)
    if tenant_id is not None:
        runs = runs.filter(tenant_id=tenant_id)
    rows = (
        runs.values_list("tenant__slug", "gpus", "finished_at")
        .annotate(
            first=Min("attempts__created_at"),
            effective=Sum("attempts__accounting__effective_gpu_s"),
        )
        .order_by()
    )
    found: dict[str, Ratio] = {}
    for slug, gpus, finished, first, effective in rows:
        wall = reliability.wall_seconds(
            first_admission=first.timestamp(), end=finished.timestamp(), now=finished.timestamp()
        )
        ratio = reliability.ettr(effective_gpu_s=effective or 0, gpus=gpus, wall_s=wall)
        found[slug] = found.get(slug, Ratio()) + ratio
    return dict(sorted(found.items()))


def month_window(*, today: date, months: int) -> tuple[datetime, datetime, list[str]]:
    """[since, until) of the last ``months`` calendar months ending with ``today``'s, in
    the current time zone, and their labels ("YYYY-MM")."""
    year, month = today.year, today.month
    for _ in range(months - 1):
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    labels = reliability.months_between((year, month), (today.year, today.month))
    next_year, next_month = (
        (today.year + 1, 1) if today.month == 12 else (today.year, today.month + 1)
    )
    return day_start(date(year, month, 1)), day_start(date(next_year, next_month, 1)), labels


def failures_by_month(*, today: date, months: int) -> list[tuple[str, list[int]]]:
    """Attempts that ended with a cause class in the last ``months`` calendar months, per
    month (the current time zone's) and cause class (columns in ``CAUSES`` order)."""
    since, until, labels = month_window(today=today, months=months)
    rows = (
        Attempt.objects.filter(finished_at__gte=since, finished_at__lt=until)
        .exclude(cause_class="")
        .annotate(month=TruncMonth("finished_at"))
        .values_list("month", "cause_class")
        .annotate(attempts=Count("pk"))
        .order_by()
    )
    counts = [(f"{month:%Y-%m}", cause, n) for month, cause, n in rows]
    return reliability.month_table(counts, months=labels, causes=CAUSES)


@dataclass(frozen=True, slots=True)
class CauseHours:
    cause: str
    attempts: int
    lost_gpu_s: int
    credited_gpu_s: int

    @property
    def lost_gpu_hours(self) -> float:
        return self.lost_gpu_s / SECONDS_PER_HOUR

    @property
    def credited_gpu_hours(self) -> float:
        return self.credited_gpu_s / SECONDS_PER_HOUR


def lost_and_credited_by_cause(*, since: datetime, until: datetime) -> list[CauseHours]:
    """GPU-seconds lost and credited of the attempts that ended in [since, until), per cause
    class (``CAUSES`` order): finance's credit as stored on each attempt's accounting
    (``AttemptAccounting.credited_gpu_s``), under the cause class it was computed with (the
    row's ``cause_class``), so lost and credited always describe the same attempts. An
    attempt whose cause is stored after its accounting counts once it is accounted again
    (within a minute, ``telemetry.tasks.accounting_compute_pending``)."""
    rows = AttemptAccounting.objects.filter(
        attempt__finished_at__gte=since, attempt__finished_at__lt=until
    ).exclude(cause_class="")
    sums = {
        cause: (attempts, lost or 0, credited or 0)
        for cause, attempts, lost, credited in rows.values_list("cause_class")
        .annotate(attempts=Count("pk"), lost=Sum("lost_gpu_s"), credited=Sum("credited_gpu_s"))
        .order_by()
    }
    return [CauseHours(cause, *sums.get(cause, (0, 0, 0))) for cause in CAUSES]
