"""Goodput of a tenant per day or week, per user and per project.

An attempt counts on the day it finished: only then is its accounting final (the lost time
depends on how it ended and on the next attempt), so a past day's numbers do not move while
later attempts run. A long attempt therefore lands whole on its last day."""

from datetime import date, datetime, timedelta

from django.db.models import DateField, QuerySet, TextChoices
from django.db.models.functions import TruncDay, TruncWeek
from django.utils import timezone

from telemetry.models import AttemptAccounting
from telemetry.selectors.gpu_seconds import ACCOUNTING_SUMS, GpuSeconds
from tenants.models import Tenant


class GoodputPeriod(TextChoices):
    DAY = "day", "Per day"
    WEEK = "week", "Per week"


_PERIOD_TRUNC = {GoodputPeriod.DAY: TruncDay, GoodputPeriod.WEEK: TruncWeek}


def _accounting_finished(
    *, tenant: Tenant, since: datetime, until: datetime
) -> QuerySet[AttemptAccounting]:
    return AttemptAccounting.objects.filter(
        attempt__run__tenant=tenant,
        attempt__finished_at__gte=since,
        attempt__finished_at__lt=until,
    )


def period_starts(*, first: date, last: date, period: GoodputPeriod) -> list[date]:
    """The first day of every day or week (Monday) from ``first`` through ``last``."""
    start = first - timedelta(days=first.weekday()) if period == GoodputPeriod.WEEK else first
    step = timedelta(weeks=1) if period == GoodputPeriod.WEEK else timedelta(days=1)
    starts = []
    while start <= last:
        starts.append(start)
        start += step
    return starts


def goodput_by_period(
    *, tenant: Tenant, since: datetime, until: datetime, period: GoodputPeriod
) -> list[tuple[date, GpuSeconds]]:
    """The tenant's accounting per day or week (in the current time zone) of the attempts
    that finished in [since, until); every day or week of the range is listed, empty ones
    as zeros. One query."""
    rows = (
        _accounting_finished(tenant=tenant, since=since, until=until)
        .annotate(bucket=_PERIOD_TRUNC[period]("attempt__finished_at", output_field=DateField()))
        .values("bucket")
        .annotate(**ACCOUNTING_SUMS)
        .order_by("bucket")
    )
    found = {row["bucket"]: GpuSeconds.from_sums(row) for row in rows}
    first = timezone.localtime(since).date()
    last = timezone.localtime(until - timedelta(microseconds=1)).date()
    return [
        (start, found.get(start, GpuSeconds()))
        for start in period_starts(first=first, last=last, period=period)
    ]


def goodput_by_user(
    *, tenant: Tenant, since: datetime, until: datetime
) -> list[tuple[str, GpuSeconds]]:
    """(username, accounting) per user who submitted the runs, most allocated first."""
    rows = (
        _accounting_finished(tenant=tenant, since=since, until=until)
        .values("attempt__run__submitted_by_id", "attempt__run__submitted_by__username")
        .annotate(**ACCOUNTING_SUMS)
        # The plugin does not see annotations passed as **kwargs (ACCOUNTING_SUMS).
        .order_by("-allocated", "attempt__run__submitted_by__username")  # type: ignore[misc]
    )
    return [
        (row["attempt__run__submitted_by__username"], GpuSeconds.from_sums(row)) for row in rows
    ]


def goodput_by_project(
    *, tenant: Tenant, since: datetime, until: datetime
) -> list[tuple[str, str, GpuSeconds]]:
    """(project slug, name, accounting) per project of the runs' experiments, most
    allocated first."""
    rows = (
        _accounting_finished(tenant=tenant, since=since, until=until)
        .values(
            "attempt__run__experiment__project_id",
            "attempt__run__experiment__project__slug",
            "attempt__run__experiment__project__name",
        )
        .annotate(**ACCOUNTING_SUMS)
        # The plugin does not see annotations passed as **kwargs (ACCOUNTING_SUMS).
        .order_by("-allocated", "attempt__run__experiment__project__slug")  # type: ignore[misc]
    )
    return [
        (
            row["attempt__run__experiment__project__slug"],
            row["attempt__run__experiment__project__name"],
            GpuSeconds.from_sums(row),
        )
        for row in rows
    ]
