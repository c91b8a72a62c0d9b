"""The links of every attempt of a run, for the troubleshooting tree: each node's
InfiniBand traffic and error growth (node exporter, ``NodeLinkMinute``) and each node's
NVLink error signals (DCGM, node-health events) over each attempt's span. One grouped query
each, whatever the number of attempts, nodes or minutes: every row is labelled with its
attempt in SQL (the attempts of one run do not overlap in time)."""

from collections.abc import Sequence
from datetime import datetime

from django.db.models import BigIntegerField, Case, Count, Q, Sum, Value, When

from clusters.health import SignalClass
from clusters.models import NodeHealthEvent
from jobs.models import Attempt
from telemetry.models import NodeLinkMinute
from telemetry.verdicts import LinkUse

NVLINK_SIGNALS = (SignalClass.NVLINK.value, SignalClass.NVLINK_ERRORS.value)


def _nodes(attempt: Attempt) -> list[str]:
    return list(attempt.node_list or attempt.placement or [])


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def _labelled(
    attempts: Sequence[Attempt], now: datetime, *, node: str, at: str, start_minute: bool
) -> Case | None:
    """``attempt id`` of the attempt whose cluster, nodes and span a row falls in."""
    whens = []
    for attempt in attempts:
        nodes = _nodes(attempt)
        if attempt.started_at is None or not nodes:
            continue
        start = _minute(attempt.started_at) if start_minute else attempt.started_at
        span = Q(
            cluster_id=attempt.cluster_id,
            **{f"{node}__in": nodes, f"{at}__gte": start, f"{at}__lt": attempt.finished_at or now},
        )
        whens.append(When(span, then=Value(attempt.pk, output_field=BigIntegerField())))
    if not whens:
        return None
    return Case(*whens, default=None, output_field=BigIntegerField())


def infiniband_by_attempt(
    *, attempts: Sequence[Attempt], now: datetime
) -> dict[int, tuple[LinkUse, ...]]:
    """Per attempt with node exporter minutes on its nodes: each node's mean InfiniBand
    traffic and error growth. An attempt missing here has no such signal."""
    label = _labelled(attempts, now, node="host", at="minute", start_minute=True)
    if label is None:
        return {}
    rows = (
        NodeLinkMinute.objects.annotate(of=label)
        .filter(of__isnull=False)
        .values("of", "host")
        .annotate(traffic=Sum("ib_bytes_s"), counted=Count("ib_bytes_s"), errors=Sum("ib_errors"))
        .order_by("of", "host")
    )
    found: dict[int, list[LinkUse]] = {}
    for row in rows:
        mean = row["traffic"] / row["counted"] if row["counted"] else None
        found.setdefault(row["of"], []).append(
            LinkUse(row["host"], errors=row["errors"] or 0, bytes_s=mean)
        )
    return {attempt_id: tuple(uses) for attempt_id, uses in found.items()}


def nvlink_errors_by_attempt(
    *, attempts: Sequence[Attempt], now: datetime
) -> dict[int, dict[str, int]]:
    """Per attempt, its nodes' NVLink error signals (counter growth, or a fatal NVLink XID)
    observed during it: node → how many."""
    label = _labelled(attempts, now, node="node", at="observed_at", start_minute=False)
    if label is None:
        return {}
    rows = (
        NodeHealthEvent.objects.filter(signal__in=NVLINK_SIGNALS)
        .annotate(of=label)
        .filter(of__isnull=False)
        .values("of", "node")
        .annotate(errors=Sum("count"))
        .order_by("of", "node")
    )
    found: dict[int, dict[str, int]] = {}
    for row in rows:
        found.setdefault(row["of"], {})[row["node"]] = row["errors"]
    return found
