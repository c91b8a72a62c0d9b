"""The DCGM and node exporter evidence of one attempt (issue 36, point 3): each GPU's SM
clock against its maximum, each GPU's NVLink traffic, and each of its nodes' InfiniBand
traffic and error growth, over the attempt's life or a part of it (``since``, ``until``).
As plain data of ``telemetry.links``. A fixed number of queries, each grouped in SQL,
whatever the attempt's GPU count: one row per GPU or node comes back, never per minute."""

from datetime import UTC, datetime

from django.db.models import Avg, Count, Max, Q, Sum

from jobs.models import Attempt
from telemetry.links import GpuClock, GpuLink, HostLink, LinkEvidence
from telemetry.models import GpuMinute, NodeLinkMinute


def _minutes(attempt_id: int, since: datetime | None, until: datetime | None):
    rows = GpuMinute.objects.filter(attempt_id=attempt_id)
    if since is not None:
        rows = rows.filter(minute__gte=_minute_floor(since))
    if until is not None:
        rows = rows.filter(minute__lt=until)
    return rows.values("host", "gpu").order_by("host", "gpu")


def _minute_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


def attempt_clock_evidence(
    *, attempt_id: int, since: datetime | None = None, until: datetime | None = None
) -> list[GpuClock]:
    """Each GPU of the attempt that has minutes (in [since, until) when given): its mean SM
    clock, its maximum SM clock, and how many minutes had a clock, by host and GPU. One
    query."""
    rows = _minutes(attempt_id, since, until).annotate(
        sm=Avg("sm_clock_mhz"), top=Max("max_sm_clock_mhz"), minutes=Count("sm_clock_mhz")
    )
    return [
        GpuClock(row["host"], row["gpu"], row["sm"], row["top"], row["minutes"]) for row in rows
    ]


def attempt_link_evidence(
    *, attempt_id: int, since: datetime | None = None, until: datetime | None = None
) -> LinkEvidence:
    """The attempt's NVLink traffic per GPU and InfiniBand traffic and errors per node, over
    its life (from its start's minute to its end, or now) within [since, until) when given.
    Every node of the attempt's node list is there, with ``minutes=0`` when the node
    exporter said nothing of it (the signal is missing); a node's links carry whatever else
    ran on it too. Three queries."""
    attempt = Attempt.objects.values("cluster_id", "node_list", "started_at", "finished_at").get(
        pk=attempt_id
    )
    gpus = _minutes(attempt_id, since, until).annotate(
        nvlink=Avg("nvlink_bytes_s"), minutes=Count("nvlink_bytes_s")
    )
    hosts = sorted(set(attempt["node_list"] or ()))
    starts = [moment for moment in (attempt["started_at"], since) if moment is not None]
    ends = [moment for moment in (attempt["finished_at"], until) if moment is not None]
    found: dict[str, HostLink] = {}
    if hosts and attempt["started_at"] is not None:
        span = Q(minute__gte=_minute_floor(max(starts)))
        if ends:
            span &= Q(minute__lt=min(ends))
        rows = (
            NodeLinkMinute.objects.filter(span, cluster_id=attempt["cluster_id"], host__among=hosts)
            .values("host")
            .annotate(traffic=Avg("ib_bytes_s"), errors=Sum("ib_errors"), minutes=Count("id"))
            .order_by("host")
        )
        found = {
            row["host"]: HostLink(row["host"], row["traffic"], row["errors"], row["minutes"])
            for row in rows
        }
    return LinkEvidence(
        gpus=tuple(GpuLink(row["host"], row["gpu"], row["nvlink"], row["minutes"]) for row in gpus),
        hosts=tuple(found.get(host, HostLink(host, None, 0, 0)) for host in hosts),
    )
