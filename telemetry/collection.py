"""The GPU-metrics collector of one cluster: fetch, store raw, roll up, forget.

1. ``telemetry_fetch`` reads the cluster's source (``SOURCES``: a DCGM exporter, a
   Prometheus server, or the simulator's jobs) for the interval since the last read and
   stores every body it gets as a ``RawScrape``; the read position advances in the same
   transaction.
2. ``telemetry_roll_up`` turns raw samples into ``GpuMinute`` rows one window of whole
   minutes at a time: it parses the window's raw bodies, maps samples to attempts (pod,
   Slurm job, else host + GPU + time), replaces the window's rows and counts the unmapped
   samples, then advances the cluster's checkpoint, all in one transaction. A crash repeats
   the window; rolling a window up again gives the same rows. The node exporter's
   InfiniBand counters in the same bodies become the window's ``NodeLinkMinute`` rows (per
   node, not per attempt; ``telemetry.exposition.node_links``).
3. ``raw_scrapes_expire`` deletes raw bodies past ``GANTRY_TELEMETRY_RAW_RETENTION_H``
   once they are rolled up.
"""

import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min, Q
from django.utils import timezone
from psycopg import sql

from clusters.backends import k8s_manifest, k8s_settings
from clusters.backends.base import TELEMETRY_SETTINGS_KEY
from clusters.health import Signal
from clusters.models import Cluster, ClusterFlavor
from clusters.services.health import node_signals_record
from core import metrics
from core.schema import SchemaError
from jobs.models import Attempt
from telemetry.exposition.health_signals import health_signals
from telemetry.exposition.ingestor import Ingestor
from telemetry.exposition.mapping import (
    Allocation,
    HostAllocation,
    KubernetesJobAllocation,
    SlurmAllocation,
)
from telemetry.exposition.node_links import (
    MARKER,
    MAX_GAP_MS,
    LinkParser,
    NodeLinkRollup,
    NodeLinkRollups,
    scrape_host,
)
from telemetry.exposition.parsing import (
    HEALTH_CEILING,
    KEPT_METRICS,
    VALUE_CEILING,
    ExpositionParser,
    GpuSample,
)
from telemetry.exposition.rollups import MinuteRollup
from telemetry.models import (
    ClusterTelemetry,
    GpuMinute,
    NodeLinkMinute,
    RawScrape,
    UnmappedSamples,
)
from telemetry.simulator_source import SimulatorSource, simulated_allocations
from telemetry.source_settings import SourceKind, SourceSettings, source_settings_parse
from telemetry.sources import (
    DcgmScrapeSource,
    PrometheusSource,
    Scrape,
    SourceError,
    TelemetrySource,
)

logger = logging.getLogger(__name__)

MINUTE = timedelta(minutes=1)
# A first read looks this far back, unless the source says otherwise (``first_lookback``).
FIRST_FETCH_LOOKBACK = timedelta(minutes=10)
# Minutes rolled up per transaction: bounded work, and a crash repeats at most this much.
WINDOW_MINUTES = 60
# Samples may name an attempt's pod or Slurm job a little after the attempt was seen to end
# (the exporter's scrape lag, pod teardown): labelled samples still map for this long.
LABEL_SLACK = timedelta(minutes=5)
UNMAPPED_SOURCE_MAX = 200


@dataclass(frozen=True, slots=True)
class FetchSummary:
    scrapes: int
    samples: int
    rejected: int
    errors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RollupSummary:
    windows: int
    minutes: int  # GpuMinute rows written
    mapped: int  # samples
    unmapped: int
    duplicates: int


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _minute_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


# --- sources ------------------------------------------------------------------------------

SourceFactory = Callable[[Cluster, SourceSettings], TelemetrySource]
# Every telemetry source, by the kind the cluster's settings name. The simulator's reads the
# cluster's simulated jobs; the others need only their settings.
SOURCES: dict[SourceKind, SourceFactory] = {
    SourceKind.DCGM: lambda _cluster, settings: DcgmScrapeSource(
        list(settings.targets), timeout_s=settings.timeout_s
    ),
    SourceKind.PROMETHEUS: lambda _cluster, settings: PrometheusSource(
        settings.url,
        step_s=settings.step_s,
        selector=settings.selector,
        node_selector=settings.node_selector,
        timeout_s=settings.timeout_s,
        token_env=settings.token_env,
    ),
    SourceKind.SIMULATOR: lambda cluster, _settings: SimulatorSource(cluster),
}
# The telemetry settings of a cluster whose settings name none: a simulator's jobs exist
# only in the database, so its source is implied; other clusters have none.
IMPLIED_SETTINGS: dict[str, dict[str, str]] = {
    Cluster.Backend.SIMULATOR: {"source": SourceKind.SIMULATOR.value}
}


def telemetry_source_for(cluster: Cluster) -> TelemetrySource | None:
    """The cluster's source, or None when it has none. Raises ValueError for settings that
    do not parse or name a source the cluster cannot have."""
    raw = cluster.settings.get(TELEMETRY_SETTINGS_KEY, IMPLIED_SETTINGS.get(cluster.backend))
    if raw is None:
        return None
    return telemetry_source_build(cluster=cluster, settings=source_settings_parse(raw))


def telemetry_source_build(*, cluster: Cluster, settings: SourceSettings) -> TelemetrySource:
    """The source ``settings`` name, reading for ``cluster``. Raises ValueError when the
    cluster cannot have it (the simulator's, on a cluster that is no simulator)."""
    return SOURCES[settings.source](cluster, settings)


# --- fetch --------------------------------------------------------------------------------


def _state_locked(cluster: Cluster) -> ClusterTelemetry:
    """The cluster's collector row, locked until the transaction ends: one collector per
    cluster at a time."""
    ClusterTelemetry.objects.get_or_create(cluster=cluster)
    return ClusterTelemetry.objects.select_for_update().get(cluster=cluster)


# What a fetch's parser keeps: the rollups' gauges and the node-health fields, in one pass.
FETCH_CEILING = {**HEALTH_CEILING, **VALUE_CEILING}


def raw_scrape_build(
    *,
    cluster: Cluster,
    scrape: Scrape,
    parser: ExpositionParser,
    health_out: list[GpuSample] | None = None,
    link_parser: LinkParser | None = None,
) -> RawScrape:
    """The row that keeps one body; parsing it here counts what it holds and bounds its
    samples' timestamps, so a rollup window reads only the bodies that overlap it. With a
    ``FETCH_CEILING`` parser, the body's node-health samples go to ``health_out``; the row
    counts and bounds the rollups' gauges and the InfiniBand counters, not the health
    fields."""
    result = parser.parse(scrape.body, default_ts=scrape.at_ms)
    kept = [sample for sample in result.samples if sample.metric in KEPT_METRICS]
    if health_out is not None:
        health_out += (sample for sample in result.samples if sample.metric in HEALTH_CEILING)
    links, link_stats = (link_parser or LinkParser()).parse(
        scrape.body, default_ts=scrape.at_ms, default_host=scrape_host(scrape.origin)
    )
    stamps = [sample.ts for sample in kept] + [sample.ts for sample in links]
    stats = result.stats
    return RawScrape(
        cluster=cluster,
        origin=scrape.origin[:300],
        fetched_at=_moment(scrape.at_ms),
        first_sample_at=_moment(min(stamps)) if stamps else None,
        last_sample_at=_moment(max(stamps)) if stamps else None,
        body=zlib.compress(scrape.body, 1),
        size=len(scrape.body),
        samples=len(stamps),
        rejected=stats.malformed + stats.non_finite + stats.out_of_range + link_stats.rejected,
    )


def telemetry_fetch(*, cluster: Cluster, source=None, now: datetime | None = None) -> FetchSummary:
    """Read the cluster's source from where the last read stopped up to ``now`` and keep
    what it returned. A source error is recorded on the cluster's collector row and read
    again next time: the read position does not move past data that was not read."""
    now = now or timezone.now()
    try:
        source = source or telemetry_source_for(cluster)
    except ValueError as exc:
        _record_error(cluster, f"telemetry settings: {exc}", now)
        return FetchSummary(0, 0, 0, (str(exc),))
    if source is None:
        return FetchSummary(0, 0, 0, ())
    parser = ExpositionParser(FETCH_CEILING)
    link_parser = LinkParser()
    health_samples: list[GpuSample] = []
    with transaction.atomic():
        state = _state_locked(cluster)
        # A source may look further back on its first read (the simulator: its jobs' day).
        lookback = getattr(source, "first_lookback", FIRST_FETCH_LOOKBACK)
        since = state.fetched_until or now - lookback
        if since >= now:
            return FetchSummary(0, 0, 0, ())
        try:
            scrapes = source.fetch(start_ms=_ms(since), end_ms=_ms(now))
        except SourceError as exc:
            state.last_error, state.last_error_at = str(exc), now
            state.save(update_fields=["last_error", "last_error_at", "updated_at"])
            return FetchSummary(0, 0, 0, (str(exc),))
        errors = tuple(str(failure) for failure in getattr(scrapes, "failures", ()))
        rows = [
            raw_scrape_build(
                cluster=cluster,
                scrape=scrape,
                parser=parser,
                health_out=health_samples,
                link_parser=link_parser,
            )
            for scrape in scrapes
        ]
        RawScrape.objects.bulk_create(rows)
        errors += _health_update(cluster=cluster, state=state, samples=health_samples, now=now)
        state.fetched_until = now
        state.last_error = "; ".join(errors)[:2000]
        state.last_error_at = now if errors else state.last_error_at
        state.save(
            update_fields=[
                "fetched_until",
                "last_error",
                "last_error_at",
                "health_state",
                "updated_at",
            ]
        )
    summary = FetchSummary(
        scrapes=len(rows),
        samples=sum(row.samples for row in rows),
        rejected=sum(row.rejected for row in rows),
        errors=errors,
    )
    metrics.telemetry_samples_recorded(cluster=cluster.name, ingested=summary.samples)
    return summary


def node_signals_send(*, cluster: Cluster, signals: list[Signal], now: datetime) -> None:
    """Hand DCGM's signals to node health: the one place telemetry calls it (the seam the
    tests replace)."""
    node_signals_record(cluster=cluster, signals=signals, now=now)


def _health_update(
    *, cluster: Cluster, state: ClusterTelemetry, samples: list[GpuSample], now: datetime
) -> tuple[str, ...]:
    """Turn the fetched bodies' health samples into signals, send them, and keep each
    series' last value on ``state`` (saved by the caller). Only faults are sent: a fetch
    that read nothing (a silent source) sends nothing, as stale is neither healthy nor
    faulty; the collector row's ``fetched_until`` and ``last_error`` say it is stale.
    Returns sentences for ``last_error``. If sending fails, the state stays where it was,
    so the next fetch sees the same growth again; the fetch itself is kept."""
    if not samples:
        return ()
    batch = health_signals(samples, state.health_state, now_ms=_ms(now))
    errors: tuple[str, ...] = ()
    if batch.future:
        errors += (
            f"node health: {batch.future} DCGM samples stamped up to "
            f"{batch.latest_future_ms / 1000:.0f} s after Gantry's clock were refused "
            "(is the source's clock ahead?)",
        )
    if batch.signals:
        try:
            with transaction.atomic():
                node_signals_send(cluster=cluster, signals=batch.signals, now=now)
        except Exception as exc:  # node health must never stop the metrics being kept
            logger.exception("node health signals of cluster %s not recorded", cluster.name)
            return (*errors, f"node health: signals not recorded: {exc}")
    state.health_state = batch.state
    return errors


def _record_error(cluster: Cluster, message: str, now: datetime) -> None:
    ClusterTelemetry.objects.update_or_create(
        cluster=cluster, defaults={"last_error": message[:2000], "last_error_at": now}
    )


# --- mapping ------------------------------------------------------------------------------


def _k8s_namespace_prefix(cluster: Cluster) -> str:
    try:
        return k8s_settings.parse_settings(cluster.settings).namespace_prefix
    except SchemaError:
        default = k8s_settings.K8sSettings.__dataclass_fields__["namespace_prefix"].default
        assert isinstance(default, str)
        return default


def attempt_allocations(*, cluster: Cluster, start: datetime, end: datetime) -> list[Allocation]:
    """What each attempt of a Kubernetes or Slurm ``cluster`` held during [start, end), from
    its own row: its Kubernetes Job's pods, its Slurm job id, and the GPUs of its hosts
    over its lifetime when it held whole nodes (a partial node's GPU indices are not known;
    samples of such GPUs without labels stay unmapped, and counted)."""
    allocations: list[Allocation] = []
    attempts = (
        Attempt.objects.filter(cluster=cluster, submitted_at__lt=end)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start - LABEL_SLACK))
        .select_related("run__tenant", "run__experiment")
    )
    node_gpus = dict(
        ClusterFlavor.objects.filter(cluster=cluster).values_list("flavor_id", "gpus_per_node")
    )
    prefix = _k8s_namespace_prefix(cluster) if cluster.backend == Cluster.Backend.KUBERNETES else ""
    for attempt in attempts:
        run = attempt.run
        if cluster.backend == Cluster.Backend.KUBERNETES:
            allocations.append(
                KubernetesJobAllocation(
                    namespace=k8s_manifest.namespace_for(run.tenant.slug, prefix=prefix),
                    job=k8s_manifest.job_name(attempt.name),
                    attempt_id=attempt.pk,
                )
            )
        elif cluster.backend == Cluster.Backend.SLURM and attempt.backend_job_id:
            allocations.append(SlurmAllocation(attempt.backend_job_id, attempt.pk))
        per_node = node_gpus.get(run.flavor_id)
        if attempt.started_at and attempt.node_list and run.experiment.gpus_per_node == per_node:
            finished = _ms(attempt.finished_at) if attempt.finished_at else None
            allocations += [
                HostAllocation(host, str(gpu), _ms(attempt.started_at), finished, attempt.pk)
                for host in attempt.node_list
                for gpu in range(per_node)
            ]
    return allocations


AllocationRules = Callable[..., list[Allocation]]
# Where each backend's attempts are found in the samples: the attempts' own rows, or, for
# the simulator, its jobs, which know the GPU indices of a partial node too.
ALLOCATIONS: dict[str, AllocationRules] = {
    Cluster.Backend.KUBERNETES: attempt_allocations,
    Cluster.Backend.SLURM: attempt_allocations,
    Cluster.Backend.SIMULATOR: simulated_allocations,
}


def allocations_for(*, cluster: Cluster, start: datetime, end: datetime) -> list[Allocation]:
    """What each attempt of ``cluster`` held during [start, end), as mapping rules
    (``telemetry.exposition.mapping.AllocationIndex``), by its backend's rules (``ALLOCATIONS``)."""
    return ALLOCATIONS[cluster.backend](cluster=cluster, start=start, end=end)


# --- rollup -------------------------------------------------------------------------------

GPU_MINUTE_COLUMNS = (
    "attempt_id", "host", "gpu", "minute", "activity", "sm_active", "tensor_active",
    "dram_active", "fb_used", "power", "xid", "samples", "sm_clock_mhz", "max_sm_clock_mhz",
    "nvlink_bytes_s", "updated_at",
)  # fmt: skip


def gpu_minutes_replace(
    *, cluster: Cluster, start: datetime, end: datetime, rows: list[MinuteRollup]
) -> None:
    """Make ``rows`` the cluster's GPU minutes of [start, end). On PostgreSQL the rows go
    in with COPY: a window of a large cluster is tens of thousands of rows, every minute."""
    now = timezone.now()
    GpuMinute.objects.filter(attempt__cluster=cluster, minute__gte=start, minute__lt=end).delete()
    values = (
        (
            row.attempt_id, row.host, row.gpu, datetime.fromtimestamp(row.minute, tz=UTC),
            row.activity, row.sm_active, row.tensor_active, row.dram_active, row.fb_used,
            row.power, row.xid, row.samples, row.sm_clock_mhz, row.max_sm_clock_mhz,
            row.nvlink_bytes_s, now,
        )
        for row in rows
    )  # fmt: skip
    if connection.vendor != "postgresql":
        fields = GPU_MINUTE_COLUMNS
        GpuMinute.objects.bulk_create(
            [GpuMinute(**dict(zip(fields, row, strict=True))) for row in values], batch_size=2000
        )
        return
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(GpuMinute._meta.db_table),
        sql.SQL(", ").join(map(sql.Identifier, GPU_MINUTE_COLUMNS)),
    )
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        for row in values:
            copy.write_row(row)


def node_link_minutes_replace(
    *, cluster: Cluster, start: datetime, end: datetime, rows: list[NodeLinkRollup]
) -> None:
    """Make ``rows`` the cluster's node link minutes of [start, end)."""
    NodeLinkMinute.objects.filter(cluster=cluster, minute__gte=start, minute__lt=end).delete()
    NodeLinkMinute.objects.bulk_create(
        [
            NodeLinkMinute(
                cluster=cluster,
                host=row.host[:255],
                minute=datetime.fromtimestamp(row.minute, tz=UTC),
                ib_bytes_s=row.ib_bytes_s,
                ib_errors=row.ib_errors,
                ports=row.ports,
                samples=row.samples,
            )
            for row in rows
        ],
        batch_size=2000,
    )


# How far before a window the InfiniBand counters are read: a rate needs the sample before.
LINK_LOOKBACK = timedelta(milliseconds=MAX_GAP_MS)


def _rollup_window(*, cluster: Cluster, start: datetime, end: datetime) -> RollupSummary:
    """Replace the GpuMinute, NodeLinkMinute and UnmappedSamples rows of ``cluster`` for the
    minutes of [start, end) by what its raw samples say. Runs inside the caller's
    transaction."""
    ingestor = Ingestor(
        allocations_for(cluster=cluster, start=start, end=end),
        start_ms=_ms(start),
        end_ms=_ms(end),
    )
    links = NodeLinkRollups(start_ms=_ms(start), end_ms=_ms(end))
    link_parser = LinkParser()
    scrapes = RawScrape.objects.filter(
        cluster=cluster, first_sample_at__lt=end, last_sample_at__gte=start - LINK_LOOKBACK
    ).order_by("fetched_at", "pk")
    columns = ("origin", "fetched_at", "last_sample_at", "body")
    for origin, fetched_at, last_sample_at, body in scrapes.values_list(*columns).iterator():
        text = zlib.decompress(body)
        if last_sample_at >= start:  # earlier bodies only hold the counters' baselines
            ingestor.feed(text, default_ts=_ms(fetched_at), origin=origin)
        if MARKER in text:
            samples, _ = link_parser.parse(
                text, default_ts=_ms(fetched_at), default_host=scrape_host(origin)
            )
            links.add(samples)
    unmapped = ingestor.unmapped
    rows = ingestor.rows()
    gpu_minutes_replace(cluster=cluster, start=start, end=end, rows=rows)
    node_link_minutes_replace(cluster=cluster, start=start, end=end, rows=links.rows())
    prefix = f"{cluster.name} "
    UnmappedSamples.objects.filter(
        source__startswith=prefix, minute__gte=start, minute__lt=end
    ).delete()
    UnmappedSamples.objects.bulk_create(
        [
            UnmappedSamples(
                minute=datetime.fromtimestamp(minute, tz=UTC),
                source=(prefix + origin)[:UNMAPPED_SOURCE_MAX],
                count=count,
            )
            for (minute, origin), count in sorted(unmapped.items())
        ]
    )
    return RollupSummary(
        windows=1,
        minutes=len(rows),
        mapped=ingestor.rollups.stats.samples,
        unmapped=sum(unmapped.values()),
        duplicates=ingestor.rollups.stats.duplicates,
    )


def telemetry_roll_up(*, cluster: Cluster, max_windows: int = 24) -> RollupSummary:
    """Roll up the cluster's raw samples, oldest window first, up to the last whole minute
    its source has been read to. Each window commits with the checkpoint that covers it."""
    windows: list[RollupSummary] = []
    for _ in range(max_windows):
        with transaction.atomic():
            state = _state_locked(cluster)
            if state.fetched_until is None:
                break
            end_of_data = _minute_floor(state.fetched_until)
            start = state.rolled_up_until
            if start is None:
                first = RawScrape.objects.filter(cluster=cluster).aggregate(
                    first=Min("first_sample_at")
                )["first"]
                if first is None:
                    break
                start = _minute_floor(first)
            if start >= end_of_data:
                break
            end = min(start + WINDOW_MINUTES * MINUTE, end_of_data)
            windows.append(_rollup_window(cluster=cluster, start=start, end=end))
            state.rolled_up_until = end
            state.save(update_fields=["rolled_up_until", "updated_at"])
        metrics.telemetry_samples_recorded(cluster=cluster.name, unmapped=windows[-1].unmapped)
    return RollupSummary(
        windows=len(windows),
        minutes=sum(window.minutes for window in windows),
        mapped=sum(window.mapped for window in windows),
        unmapped=sum(window.unmapped for window in windows),
        duplicates=sum(window.duplicates for window in windows),
    )


def raw_scrapes_expire(*, cluster: Cluster, now: datetime | None = None) -> int:
    """Delete the cluster's raw bodies older than the retention that are rolled up (or hold
    no samples). Returns how many were deleted."""
    now = now or timezone.now()
    cutoff = now - timedelta(hours=settings.GANTRY_TELEMETRY_RAW_RETENTION_H)
    rolled_up_until = (
        ClusterTelemetry.objects.filter(cluster=cluster)
        .values_list("rolled_up_until", flat=True)
        .first()
    )
    settled = Q(last_sample_at__isnull=True)
    if rolled_up_until is not None:
        settled |= Q(last_sample_at__lt=rolled_up_until)
    deleted, _ = (
        RawScrape.objects.filter(cluster=cluster, fetched_at__lt=cutoff).filter(settled).delete()
    )
    return deleted


def telemetry_collect(*, cluster: Cluster, now: datetime | None = None) -> RollupSummary:
    """Fetch, roll up and expire for one cluster: what the beat task runs."""
    now = now or timezone.now()
    fetched = telemetry_fetch(cluster=cluster, now=now)
    for error in fetched.errors:
        logger.warning("telemetry of cluster %s: %s", cluster.name, error)
    summary = telemetry_roll_up(cluster=cluster)
    raw_scrapes_expire(cluster=cluster, now=now)
    return summary
