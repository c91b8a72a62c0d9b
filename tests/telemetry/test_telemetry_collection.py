"""The collector: raw bodies stored as fetched, rolled up per minute window under a
checkpoint, mapped to attempts by pod, Slurm job or host + GPU + time, unmapped samples
counted, raw bodies expired after the retention."""

from datetime import UTC, datetime, timedelta

import pytest

from clusters.backends.k8s_settings import parse_settings as parse_k8s_settings
from clusters.backends.slurm_settings import SlurmSettings
from clusters.models import Cluster, ClusterFlavor, SimulatedJob
from clusters.simulation import Workload
from core.schema import SchemaError
from jobs.models import Attempt, AttemptState
from telemetry import collection
from telemetry.exposition.parsing import GPU_UTIL, GR_ENGINE_ACTIVE, SM_ACTIVE, GpuSample, render
from telemetry.models import ClusterTelemetry, GpuMinute, RawScrape, UnmappedSamples
from telemetry.simulated import GAUGES_PER_SCRAPE, simulated_telemetry
from telemetry.sources import Scrape, SourceError
from tests.jobs.test_lifecycle import submit
from tests.prometheus_support import (
    HISTORY_SERIES,
    FakeExporter,
    PrometheusWorld,
    Route,
    history_value,
)

pytest_plugins = ["tests.prometheus_support"]

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
SCRAPE_MS = 15_000


class FixedSource:
    """A source that returns prepared bodies: the collector's side of the interface."""

    name = "fixed"

    def __init__(self, *scrapes: Scrape, error: str = "") -> None:
        self.scrapes = list(scrapes)
        self.error = error
        self.calls: list[tuple[int, int]] = []

    def fetch(self, *, start_ms: int, end_ms: int) -> list[Scrape]:
        self.calls.append((start_ms, end_ms))
        if self.error:
            raise SourceError(self.error)
        return self.scrapes


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def scrape(samples: list[GpuSample], *, origin: str = "dcgm:node-1") -> Scrape:
    return Scrape(body=render(samples).encode(), at_ms=max(s.ts for s in samples), origin=origin)


def series(metric: str, values: list[float], *, start_ms: int = T0_MS, **labels) -> list[GpuSample]:
    """One sample every 15 s from ``start_ms``."""
    base = {"host": "node-1", "gpu": "0", "uuid": "GPU-1"} | labels
    return [
        GpuSample(
            base["host"],
            base["gpu"],
            base["uuid"],
            metric,
            value,
            start_ms + i * SCRAPE_MS,
            base.get("pod", ""),
            base.get("namespace", ""),
            base.get("container", ""),
            base.get("hpc_job", ""),
        )
        for i, value in enumerate(values)
    ]


def make_cluster(world, backend: str, name: str) -> Cluster:
    cluster = Cluster.objects.create(name=name, backend=backend, settings={})
    ClusterFlavor.objects.create(
        cluster=cluster, flavor=world.a100, nodes=2, gpus_per_node=2, gpus=4
    )
    return cluster


def make_attempt(world, cluster: Cluster, **fields) -> Attempt:
    run = submit(world)
    values = {
        "run": run,
        "number": 1,
        "cluster": cluster,
        "state": AttemptState.RUNNING,
        "submitted_at": T0 - timedelta(minutes=1),
        "started_at": T0 - timedelta(seconds=30),
    } | fields
    return Attempt.objects.create(**values)


def minutes_of(attempt: Attempt) -> list[tuple]:
    return list(
        GpuMinute.objects.filter(attempt=attempt)
        .order_by("host", "gpu", "minute")
        .values_list("host", "gpu", "minute", "activity", "sm_active", "samples")
    )


def collect(cluster: Cluster, source: FixedSource, *, now: datetime) -> collection.RollupSummary:
    collection.telemetry_fetch(cluster=cluster, source=source, now=now)
    return collection.telemetry_roll_up(cluster=cluster)


def test_kubernetes_pods_map_by_job_and_foreign_pods_are_counted(world):
    cluster = make_cluster(world, Cluster.Backend.KUBERNETES, "k8s-1")
    attempt = make_attempt(world, cluster)
    pod = {"pod": f"gantry-a{attempt.pk}-0-x7k2q", "namespace": "gantry-vision"}
    samples = (
        series(GR_ENGINE_ACTIVE, [0.5, 0.75, 1.0, 0.75, 0.25, 0.75], **pod)
        + series(GR_ENGINE_ACTIVE, [0.125] * 6, gpu="1", **pod)
        + series(GPU_UTIL, [50.0] * 6, gpu="2", pod="jupyter-xyz", namespace="team-b")
        + series(GR_ENGINE_ACTIVE, [0.5] * 2, pod=pod["pod"], namespace="other")
    )
    source = FixedSource(scrape(samples))
    now = T0 + timedelta(minutes=2, seconds=5)

    summary = collect(cluster, source, now=now)

    assert minutes_of(attempt) == [
        ("node-1", "0", T0, 0.75, None, 4),
        ("node-1", "0", T0 + timedelta(minutes=1), 0.5, None, 2),
        ("node-1", "1", T0, 0.125, None, 4),
        ("node-1", "1", T0 + timedelta(minutes=1), 0.125, None, 2),
    ]
    assert list(
        UnmappedSamples.objects.order_by("minute").values_list("minute", "source", "count")
    ) == [
        (T0, "k8s-1 dcgm:node-1", 6),
        (T0 + timedelta(minutes=1), "k8s-1 dcgm:node-1", 2),
    ]
    assert (summary.windows, summary.minutes, summary.mapped, summary.unmapped) == (1, 4, 12, 8)
    state = ClusterTelemetry.objects.get(cluster=cluster)
    assert state.rolled_up_until == T0 + timedelta(minutes=2)
    # A first read looks back ten minutes.
    assert source.calls == [(ms(now - timedelta(minutes=10)), ms(now))]


def test_slurm_jobs_map_by_hpc_job_and_whole_nodes_by_host_gpu_and_time(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    labelled = make_attempt(world, cluster, backend_job_id="4242")
    whole_node = make_attempt(
        world,
        cluster,
        backend_job_id="4243",
        node_list=["node-2"],
        started_at=T0 + timedelta(seconds=30),
        finished_at=T0 + timedelta(seconds=75),
        state=AttemptState.SUCCEEDED,
    )
    samples = (
        series(SM_ACTIVE, [0.5, 0.25], hpc_job="4242", host="node-9")
        + series(GR_ENGINE_ACTIVE, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], host="node-2", gpu="1")
        + series(GR_ENGINE_ACTIVE, [0.3], host="node-2", gpu="2")  # no such GPU index held
        + series(GR_ENGINE_ACTIVE, [0.3], hpc_job="999")
    )

    collect(cluster, FixedSource(scrape(samples)), now=T0 + timedelta(minutes=5))

    assert minutes_of(labelled) == [("node-9", "0", T0, None, 0.375, 2)]
    # Held from 12:00:30 to 12:01:15: the samples at :30 and :45, then 12:01:00 only.
    assert minutes_of(whole_node) == [
        ("node-2", "1", T0, 0.5, None, 2),
        ("node-2", "1", T0 + timedelta(minutes=1), 0.8, None, 1),
    ]
    assert sum(UnmappedSamples.objects.values_list("count", flat=True)) == 2 + 1 + 1 + 1


def test_a_window_rolled_up_again_gives_the_same_rows_and_resent_samples_count_once(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    attempt = make_attempt(world, cluster, backend_job_id="7")
    samples = series(GR_ENGINE_ACTIVE, [0.25, 0.5, 0.75, 1.0, 0.5], hpc_job="7")
    # The same samples arrive twice (an overlapping Prometheus read), plus a foreign job.
    source = FixedSource(
        scrape(samples), scrape(samples), scrape(series(GPU_UTIL, [1.0], hpc_job="8"))
    )
    summary = collect(cluster, source, now=T0 + timedelta(minutes=3))
    first = minutes_of(attempt)
    unmapped = list(UnmappedSamples.objects.values_list("minute", "source", "count"))

    ClusterTelemetry.objects.filter(cluster=cluster).update(rolled_up_until=None)
    again = collection.telemetry_roll_up(cluster=cluster)

    assert first == [
        ("node-1", "0", T0, 0.625, None, 4),
        ("node-1", "0", T0 + timedelta(minutes=1), 0.5, None, 1),
    ]
    assert (summary.mapped, summary.duplicates) == (5, 5)
    assert minutes_of(attempt) == first
    assert list(UnmappedSamples.objects.values_list("minute", "source", "count")) == unmapped
    assert unmapped == [(T0, "slurm-1 dcgm:node-1", 1)]
    assert (again.mapped, again.duplicates) == (summary.mapped, summary.duplicates)


def test_a_crash_inside_a_window_leaves_no_rows_and_the_window_is_repeated(world, monkeypatch):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    attempt = make_attempt(world, cluster, backend_job_id="7")
    collection.telemetry_fetch(
        cluster=cluster,
        source=FixedSource(scrape(series(GR_ENGINE_ACTIVE, [0.5] * 8, hpc_job="7"))),
        now=T0 + timedelta(minutes=4),
    )

    def crash(*args, **kwargs):
        raise RuntimeError("worker killed")

    with monkeypatch.context() as patch:
        patch.setattr(UnmappedSamples.objects, "bulk_create", crash)
        with pytest.raises(RuntimeError):
            collection.telemetry_roll_up(cluster=cluster)

    assert GpuMinute.objects.count() == 0
    assert ClusterTelemetry.objects.get(cluster=cluster).rolled_up_until is None
    collection.telemetry_roll_up(cluster=cluster)
    assert [row[2:] for row in minutes_of(attempt)] == [
        (T0, 0.5, None, 4),
        (T0 + timedelta(minutes=1), 0.5, None, 4),
    ]


def test_the_minute_still_being_read_is_not_rolled_up(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    attempt = make_attempt(world, cluster, backend_job_id="7")
    early = series(GR_ENGINE_ACTIVE, [0.5, 0.5, 0.5, 0.5, 0.5], hpc_job="7")  # 12:00:00-12:01:00
    collect(cluster, FixedSource(scrape(early)), now=T0 + timedelta(minutes=1, seconds=5))
    assert [row[2] for row in minutes_of(attempt)] == [T0]

    late = series(GR_ENGINE_ACTIVE, [1.0, 1.0, 1.0], start_ms=T0_MS + 75_000, hpc_job="7")
    collect(cluster, FixedSource(scrape(late)), now=T0 + timedelta(minutes=2, seconds=5))

    assert [row[2:] for row in minutes_of(attempt)] == [
        (T0, 0.5, None, 4),
        (T0 + timedelta(minutes=1), 0.875, None, 4),
    ]


def test_a_source_error_is_recorded_and_the_interval_is_read_again(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    now = T0 + timedelta(minutes=1)

    summary = collection.telemetry_fetch(
        cluster=cluster, source=FixedSource(error="prometheus: connection refused"), now=now
    )

    state = ClusterTelemetry.objects.get(cluster=cluster)
    assert summary.errors == ("prometheus: connection refused",)
    assert (state.fetched_until, state.last_error, state.last_error_at) == (
        None,
        "prometheus: connection refused",
        now,
    )
    source = FixedSource()
    collection.telemetry_fetch(cluster=cluster, source=source, now=now + timedelta(seconds=30))
    assert source.calls == [
        (ms(now - timedelta(minutes=9, seconds=30)), ms(now + timedelta(seconds=30)))
    ]


def test_malformed_lines_are_counted_on_the_raw_body_and_never_reach_a_minute(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    attempt = make_attempt(world, cluster, backend_job_id="7")
    good = render(series(GR_ENGINE_ACTIVE, [0.5], hpc_job="7")).encode()
    body = (
        good
        + b'DCGM_FI_PROF_GR_ENGINE_ACTIVE{hpc_job="7" 0.9\n'  # no closing brace
        + b'DCGM_FI_PROF_GR_ENGINE_ACTIVE{hpc_job="7"} NaN\n'
    )

    collect(
        cluster,
        FixedSource(Scrape(body=body, at_ms=T0_MS, origin="dcgm:node-1")),
        now=T0 + timedelta(minutes=2),
    )

    raw = RawScrape.objects.get()
    assert (raw.samples, raw.rejected, raw.size) == (1, 2, len(body))
    assert [row[2:] for row in minutes_of(attempt)] == [(T0, 0.5, None, 1)]


def test_raw_bodies_expire_after_the_retention_once_rolled_up(world, settings):
    settings.GANTRY_TELEMETRY_RAW_RETENTION_H = 1
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    make_attempt(world, cluster, backend_job_id="7")
    collect(
        cluster,
        FixedSource(scrape(series(GR_ENGINE_ACTIVE, [0.5] * 6, hpc_job="7"))),
        now=T0 + timedelta(minutes=1, seconds=10),
    )  # 12:00 is rolled up, 12:01 is not yet
    assert RawScrape.objects.count() == 1

    assert collection.raw_scrapes_expire(cluster=cluster, now=T0 + timedelta(minutes=59)) == 0
    assert collection.raw_scrapes_expire(cluster=cluster, now=T0 + timedelta(hours=3)) == 0

    collection.telemetry_fetch(cluster=cluster, source=FixedSource(), now=T0 + timedelta(hours=2))
    collection.telemetry_roll_up(cluster=cluster)
    assert collection.raw_scrapes_expire(cluster=cluster, now=T0 + timedelta(hours=3)) == 1
    assert GpuMinute.objects.count() == 2  # the minutes stay


def test_simulator_metrics_go_through_exposition_text_and_the_raw_store(world):
    from tests.telemetry.test_telemetry_ingest import simulate

    (attempt,) = simulate(world, "compute-bound")

    raw = RawScrape.objects.get(cluster=world.cluster)
    assert raw.origin == "simulator:sim-1"
    assert bytes(raw.body)[:2] == b"\x78\x01"  # zlib, fastest level
    job = SimulatedJob.objects.get()
    expected = simulated_telemetry(
        Workload(**job.profile["workload"]),
        started_at=job.started_at,
        until=job.finished_at,
        finished=True,
        speedup=1,
        gpus=[(node, str(gpu)) for node, gpus in job.allocation.items() for gpu in gpus],
        max_clock_mhz=1410.0,
    ).minutes
    # Seven gauges per scrape; the same means the simulator computed.
    assert GAUGES_PER_SCRAPE == 7
    rows = GpuMinute.objects.filter(attempt=attempt).order_by("host", "gpu", "minute")
    assert [
        (row.host, row.gpu, row.minute, row.samples, row.activity, row.sm_clock_mhz,
         row.max_sm_clock_mhz, row.nvlink_bytes_s)
        for row in rows
    ] == [
        (m.host, m.gpu, m.minute, 7 * m.samples, pytest.approx(m.activity, abs=1e-12), 1410.0,
         1410.0, pytest.approx(m.nvlink_bytes_s, rel=1e-12))
        for m in sorted(expected, key=lambda m: (m.host, m.gpu, m.minute))
    ]  # fmt: skip
    assert {m.nvlink_bytes_s for m in expected} >= {100e9}  # two GPUs: NVLink while working


# --- end to end: real HTTP sources configured on the cluster -----------------------------


def test_a_cluster_reads_dcgm_exporters_named_in_its_settings(world, exporter: FakeExporter):
    cluster = make_cluster(world, Cluster.Backend.KUBERNETES, "k8s-1")
    attempt = make_attempt(world, cluster)
    pod = {"pod": f"gantry-a{attempt.pk}-0-x7k2q", "namespace": "gantry-vision"}
    body = render(series(GR_ENGINE_ACTIVE, [0.75, 0.25], **pod)).encode()
    good = exporter.serve("/metrics", Route(body=body))
    cluster.settings = {"telemetry": {"source": "dcgm", "targets": [good, exporter.url("/gone")]}}
    cluster.save()

    collection.telemetry_collect(cluster=cluster, now=T0 + timedelta(minutes=1))

    state = ClusterTelemetry.objects.get(cluster=cluster)
    assert state.last_error == f"{exporter.url('/gone')}: HTTP 404 Not Found"
    assert list(RawScrape.objects.values_list("origin", "size")) == [(good, len(body))]
    assert [row[2:] for row in minutes_of(attempt)] == [(T0, 0.5, None, 2)]


def test_a_cluster_reads_its_gpu_minutes_back_from_prometheus(world, prometheus: PrometheusWorld):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    start = datetime.fromtimestamp(prometheus.history_start_ms / 1000, tz=UTC)
    attempt = make_attempt(
        world, cluster, backend_job_id="777", submitted_at=start, started_at=start
    )
    cluster.settings = {
        "telemetry": {
            "source": "prometheus",
            "url": prometheus.url,
            "step_s": 60,
            "selector": '{job="history"}',
        }
    }
    cluster.save()
    ClusterTelemetry.objects.create(cluster=cluster, fetched_until=start)

    collection.telemetry_collect(cluster=cluster, now=start + timedelta(minutes=30))

    minutes = [start + timedelta(minutes=n) for n in range(30)]
    offset = HISTORY_SERIES[1][1]  # the series with hpc_job="777"
    assert [row[2:] for row in minutes_of(attempt)] == [
        (minute, history_value(ms(minute), offset) / 100, None, 1) for minute in minutes
    ]
    # The other history series is a pod no Gantry attempt owns.
    assert list(UnmappedSamples.objects.values_list("count", flat=True)) == [1] * 30
    state = ClusterTelemetry.objects.get(cluster=cluster)
    assert (state.rolled_up_until, state.last_error) == (minutes[-1] + timedelta(minutes=1), "")


def test_backends_leave_the_telemetry_settings_to_the_collector():
    telemetry = {"source": "prometheus", "url": "http://prometheus:9090"}
    k8s = parse_k8s_settings({"url": "https://k8s:6443", "token_env": "T", "telemetry": telemetry})
    slurm = SlurmSettings.parse(
        {
            "rest_url": "http://slurm:6820",
            "rest_user": "gantry",
            "rest_token_env": "T",
            "job_dir": "/shared/jobs",
            "flavors": {"a100-80gb": "a100"},
            "telemetry": telemetry,
        }
    )

    assert (k8s.url, slurm.job_dir) == ("https://k8s:6443", "/shared/jobs")
    with pytest.raises(SchemaError, match="unknown key"):
        parse_k8s_settings({"url": "https://k8s:6443", "telemetri": telemetry})
