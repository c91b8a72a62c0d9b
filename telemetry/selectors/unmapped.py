"""Unmapped samples (platform admins): GPU use outside Gantry, or a mapping gap."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Max, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from telemetry.models import UnmappedSamples


@dataclass(frozen=True, slots=True)
class UnmappedTotal:
    source: str
    last_day: int
    last_week: int
    last_seen: datetime


def unmapped_totals_by_source(*, now: datetime) -> list[UnmappedTotal]:
    """Per source, the unmapped samples of the last 24 hours and 7 days, most first."""
    day_ago, week_ago = now - timedelta(days=1), now - timedelta(days=7)
    rows = (
        UnmappedSamples.objects.filter(minute__gte=week_ago, minute__lte=now)
        .values("source")
        .annotate(
            last_week=Sum("count"),
            last_day=Coalesce(Sum("count", filter=Q(minute__gte=day_ago)), 0),
            last_seen=Max("minute"),
        )
        .order_by("-last_week", "source")
    )
    return [UnmappedTotal(**row) for row in rows]


def unmapped_samples_recent() -> QuerySet[UnmappedSamples]:
    return UnmappedSamples.objects.order_by("-minute", "source")
