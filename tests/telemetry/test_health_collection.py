"""The collector hands DCGM's health signals to node health after each fetch, keeping each
series' last value on the cluster's collector row between fetches."""

from datetime import timedelta

import pytest

from clusters.health import Signal, SignalClass, Source
from clusters.models import Cluster
from telemetry import collection
from telemetry.exposition.parsing import ECC_DBE_VOL, XID_ERRORS, GpuSample, render
from telemetry.models import ClusterTelemetry, GpuMinute, RawScrape
from telemetry.sources import Scrape
from tests.telemetry.test_telemetry_collection import (
    T0,
    FixedSource,
    make_attempt,
    make_cluster,
    ms,
)

NOW = T0 + timedelta(minutes=1)


def body(*samples: GpuSample) -> Scrape:
    return Scrape(body=render(samples).encode(), at_ms=ms(NOW), origin="dcgm:gpu-node2")


def sample(metric: str, value: float, ts_ms: int, gpu: str = "0") -> GpuSample:
    return GpuSample("gpu-node2", gpu, f"GPU-{gpu}", metric, value, ts_ms)


@pytest.fixture
def sent(monkeypatch):
    calls: list[tuple[str, list[Signal], object]] = []

    def record(*, cluster, signals, now):
        calls.append((cluster.name, list(signals), now))

    monkeypatch.setattr(collection, "node_signals_send", record)
    return calls


def test_faults_are_sent_once_and_growth_across_two_fetches_is_seen(world, sent):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    t = ms(T0)
    first = FixedSource(
        body(
            sample(XID_ERRORS, 79, t, gpu="1"),
            sample(XID_ERRORS, 79, t + 1000, gpu="1"),
            sample(ECC_DBE_VOL, 0, t),
        )
    )
    collection.telemetry_fetch(cluster=cluster, source=first, now=NOW)
    second = FixedSource(
        body(sample(XID_ERRORS, 79, t + 60_000, gpu="1"), sample(ECC_DBE_VOL, 1, t + 60_000))
    )
    later = NOW + timedelta(minutes=1)
    collection.telemetry_fetch(cluster=cluster, source=second, now=later)

    assert sent == [
        (
            "slurm-1",
            [
                Signal(
                    "gpu-node2",
                    SignalClass.GPU_LOST,
                    Source.DCGM,
                    t / 1000,
                    "1",
                    "79",
                    "XID 79 GPU has fallen off the bus",
                )
            ],
            NOW,
        ),
        (
            "slurm-1",
            [
                Signal(
                    "gpu-node2",
                    SignalClass.ECC_UNCORRECTABLE,
                    Source.DCGM,
                    (t + 60_000) / 1000,
                    "0",
                    ECC_DBE_VOL,
                    "double-bit ECC errors (volatile) grew from 0 to 1",
                )
            ],
            later,
        ),
    ]
    state = ClusterTelemetry.objects.get(cluster=cluster)
    assert state.health_state == {
        f"gpu-node2\t1\t{XID_ERRORS}": [79, t + 60_000],
        f"gpu-node2\t0\t{ECC_DBE_VOL}": [1.0, t + 60_000],
    }
    assert state.last_error == ""


def test_a_silent_source_sends_nothing_and_stays_stale(world, sent):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    ClusterTelemetry.objects.create(
        cluster=cluster,
        fetched_until=T0,
        health_state={f"gpu-node2\t0\t{ECC_DBE_VOL}": [0.0, ms(T0)]},
    )

    summary = collection.telemetry_fetch(cluster=cluster, source=FixedSource(), now=NOW)

    assert sent == []
    state = ClusterTelemetry.objects.get(cluster=cluster)
    assert (summary.scrapes, state.fetched_until, state.health_state) == (
        0,
        NOW,
        {f"gpu-node2\t0\t{ECC_DBE_VOL}": [0.0, ms(T0)]},
    )


def test_samples_from_a_clock_ahead_are_refused_and_said_so(world, sent):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    ahead = ms(NOW) + 600_000

    summary = collection.telemetry_fetch(
        cluster=cluster, source=FixedSource(body(sample(XID_ERRORS, 79, ahead))), now=NOW
    )

    assert sent == []
    message = (
        "node health: 1 DCGM samples stamped up to 600 s after Gantry's clock were refused "
        "(is the source's clock ahead?)"
    )
    assert summary.errors == (message,)
    state = ClusterTelemetry.objects.get(cluster=cluster)
    assert (state.last_error, state.last_error_at, state.health_state) == (message, NOW, {})


def test_when_node_health_fails_the_metrics_are_kept_and_the_fault_is_sent_again(
    world, monkeypatch
):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    attempt = make_attempt(world, cluster, backend_job_id="4711")
    t = ms(T0)
    xid = GpuSample("gpu-node2", "0", "GPU-0", XID_ERRORS, 48, t, hpc_job="4711")
    calls = []

    def refuse(*, cluster, signals, now):
        calls.append([s.code for s in signals])
        raise RuntimeError("database of node health unavailable")

    monkeypatch.setattr(collection, "node_signals_send", refuse)
    summary = collection.telemetry_fetch(cluster=cluster, source=FixedSource(body(xid)), now=NOW)
    collection.telemetry_roll_up(cluster=cluster)

    assert summary.errors == (
        "node health: signals not recorded: database of node health unavailable",
    )
    assert RawScrape.objects.filter(cluster=cluster).count() == 1
    assert list(GpuMinute.objects.filter(attempt=attempt).values_list("xid", "samples")) == [
        (48, 1)
    ]
    assert ClusterTelemetry.objects.get(cluster=cluster).health_state == {}
    resent = GpuSample("gpu-node2", "0", "GPU-0", XID_ERRORS, 48, t + 60_000, hpc_job="4711")
    collection.telemetry_fetch(
        cluster=cluster, source=FixedSource(body(resent)), now=NOW + timedelta(minutes=1)
    )
    assert calls == [["48"], ["48"]]


def test_the_fetch_records_through_node_health(world):
    """No stand-in: the signal reaches clusters.services.health, which records it (a node
    this cluster's inventory does not have: recorded, no action)."""
    from clusters.models import NodeHealthEvent

    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")

    summary = collection.telemetry_fetch(
        cluster=cluster,
        source=FixedSource(body(sample(XID_ERRORS, 79, ms(T0)))),
        now=NOW,
    )

    assert (summary.scrapes, summary.errors) == (1, ())
    [event] = NodeHealthEvent.objects.filter(cluster=cluster)
    assert (event.source, event.signal, event.code, event.action) == (
        "dcgm",
        "gpu_lost",
        "79",
        "observe",
    )
