"""Clocks and links collected and read back (issue 36, point 3): DCGM's SM clock, maximum
SM clock and NVLink traffic per GPU-minute; the node exporter's InfiniBand counters per
node-minute, scraped directly or read back from Prometheus; and what one attempt's GPUs
and nodes showed (``telemetry.selectors.evidence``), in a fixed number of queries."""

import json
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest

from clusters.models import Cluster
from jobs.models import AttemptState
from telemetry import collection
from telemetry.exposition.node_links import (
    IB_LINK_ERROR_RECOVERIES,
    IB_RECEIVED,
    IB_SYMBOL_ERRORS,
    IB_TRANSMITTED,
    LINK_METRICS,
    LinkSample,
    render_link_samples,
)
from telemetry.exposition.parsing import MAX_SM_CLOCK, NVLINK_RX, NVLINK_TX, SM_CLOCK
from telemetry.links import GpuClock, GpuLink, HostLink, LinkEvidence, low_traffic
from telemetry.models import GpuMinute, NodeLinkMinute, RawScrape
from telemetry.selectors.evidence import attempt_clock_evidence, attempt_link_evidence
from telemetry.source_settings import source_settings_parse
from telemetry.sources import PrometheusSource, Scrape, prometheus_queries
from tests.prometheus_support import FakeExporter, Route
from tests.telemetry.test_telemetry_collection import (
    T0,
    T0_MS,
    FixedSource,
    collect,
    make_attempt,
    make_cluster,
    scrape,
    series,
)

pytest_plugins = ["tests.prometheus_support"]
GB = 1_000_000_000


def node_exporter_body(host_label: str, samples: list[LinkSample]) -> bytes:
    """What a node exporter serves: its series carry no host label."""
    text = render_link_samples(samples)
    return text.replace(f'instance="{host_label}:9100",', "").encode()


def ib(metric, values, *, host="gpu-07", device="mlx5_0", start_ms=T0_MS, every_ms=15_000):
    return [
        LinkSample(host, device, "1", metric, float(value), start_ms + i * every_ms)
        for i, value in enumerate(values)
    ]


def link_rows(cluster: Cluster) -> list[tuple]:
    return list(
        NodeLinkMinute.objects.filter(cluster=cluster)
        .order_by("host", "minute")
        .values_list("host", "minute", "ib_bytes_s", "ib_errors", "ports", "samples")
    )


def test_sm_clocks_and_nvlink_traffic_roll_up_per_gpu_minute(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    attempt = make_attempt(world, cluster, backend_job_id="4242")
    job = {"hpc_job": "4242"}
    samples = (
        series(SM_CLOCK, [1410, 1410, 1200, 1200, 1305], **job)
        + series(MAX_SM_CLOCK, [1410, 1410, 1410, 1410, 1410], **job)
        + series(NVLINK_TX, [40 * GB, 60 * GB, 50 * GB, 50 * GB, 10 * GB], **job)
        + series(NVLINK_RX, [20 * GB, 20 * GB, 20 * GB, 20 * GB], **job)
        + series(SM_CLOCK, [990, 990], gpu="1", **job)
    )

    collect(cluster, FixedSource(scrape(samples)), now=T0 + timedelta(minutes=3))

    assert list(
        GpuMinute.objects.filter(attempt=attempt)
        .order_by("gpu", "minute")
        .values_list("gpu", "minute", "sm_clock_mhz", "max_sm_clock_mhz", "nvlink_bytes_s")
    ) == [
        ("0", T0, 1305.0, 1410.0, 70 * GB),
        # Received reached no sample in this minute: no sum of a half.
        ("0", T0 + timedelta(minutes=1), 1305.0, 1410.0, None),
        ("1", T0, 990.0, None, None),
    ]


def test_node_exporter_counters_scraped_directly_become_node_link_minutes(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    counters = (
        ib(IB_TRANSMITTED, [0, 15 * GB, 30 * GB, 45 * GB, 60 * GB])
        + ib(IB_RECEIVED, [0, 15 * GB, 30 * GB, 45 * GB, 60 * GB])
        + ib(IB_TRANSMITTED, [0, 30 * GB, 60 * GB, 90 * GB, 120 * GB], device="mlx5_1")
        + ib(IB_SYMBOL_ERRORS, [7, 7, 9, 9, 12])
        + ib(IB_LINK_ERROR_RECOVERIES, [1, 1, 1, 2, 2])
    )
    body = node_exporter_body("gpu-07", counters)
    source = FixedSource(
        Scrape(body=body, at_ms=T0_MS + 60_000, origin="http://gpu-07:9100/metrics"),
        Scrape(body=b"node_infiniband_link_downed_total 1\n", at_ms=T0_MS, origin="prometheus:x"),
    )

    collect(cluster, source, now=T0 + timedelta(minutes=2))

    assert link_rows(cluster) == [
        ("gpu-07", T0, 4 * GB, 3, 2, 20),
        ("gpu-07", T0 + timedelta(minutes=1), 4 * GB, 3, 2, 5),
    ]
    assert list(RawScrape.objects.order_by("pk").values_list("samples", "rejected")) == [
        (25, 0),
        (0, 0),  # no instance, no host label, no scraped host: no node to name
    ]


def test_a_rate_at_the_start_of_a_window_takes_the_sample_before_it(world):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    first = ib(IB_TRANSMITTED, [0, 600, 1_200, 1_800], host="gpu-07")
    second = ib(IB_TRANSMITTED, [2_400, 3_000], host="gpu-07", start_ms=T0_MS + 60_000)
    origin = "prometheus:http://prometheus:9090"

    def fetched(samples):
        return Scrape(render_link_samples(samples).encode(), samples[-1].ts, origin)

    collect(cluster, FixedSource(fetched(first)), now=T0 + timedelta(minutes=1))
    collect(cluster, FixedSource(fetched(second)), now=T0 + timedelta(minutes=2))

    assert link_rows(cluster) == [
        ("gpu-07", T0, 40.0, 0, 1, 4),
        ("gpu-07", T0 + timedelta(minutes=1), 40.0, 0, 1, 2),
    ]


def test_prometheus_is_asked_for_the_counters_with_the_node_selector(world):
    settings = source_settings_parse(
        {
            "source": "prometheus",
            "url": "http://prometheus:9090",
            "selector": '{job="dcgm"}',
            "node_selector": '{job="node",cluster="a"}',
        }
    )
    source = collection.telemetry_source_build(cluster=world.cluster, settings=settings)

    assert isinstance(source, PrometheusSource)
    assert source.node_selector == '{job="node",cluster="a"}'
    queries = dict(prometheus_queries('{job="dcgm"}', '{job="node",cluster="a"}'))
    assert queries[SM_CLOCK] == 'DCGM_FI_DEV_SM_CLOCK{job="dcgm"}'
    assert queries[IB_RECEIVED] == (
        'node_infiniband_port_data_received_bytes_total{job="node",cluster="a"}'
    )
    # Without a node selector, the counters take the selector, as every query does.
    assert dict(prometheus_queries('{cluster="a"}'))[IB_SYMBOL_ERRORS] == (
        'node_infiniband_symbol_error_total{cluster="a"}'
    )


@pytest.mark.parametrize("value", ['job="node"', '{job="node"}\n', 7])
def test_a_node_selector_that_is_no_label_matcher_is_refused(value):
    with pytest.raises(ValueError, match="node_selector must be a label matcher in braces"):
        source_settings_parse(
            {"source": "prometheus", "url": "http://p:9090", "node_selector": value}
        )


def test_the_counters_read_back_from_prometheus_become_node_link_minutes(
    world, exporter: FakeExporter
):
    """A stub Prometheus answers each counter's query with one node's series, labelled as
    Prometheus labels a node exporter's (``instance``, ``job``)."""
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    growth = {IB_TRANSMITTED: 6_000, IB_RECEIVED: 12_000, IB_SYMBOL_ERRORS: 2}
    asked: list[str] = []

    def answer(path: str) -> bytes:
        promql = parse_qs(urlsplit(path).query)["query"][0]
        asked.append(promql)
        metric = promql.split("{")[0]
        step = growth.get(metric, 0) if metric in LINK_METRICS else None
        series = []
        if step is not None:
            labels = {"__name__": metric, "device": "mlx5_0", "port": "1"}
            labels |= {"instance": "gpu-07:9100", "job": "node"}
            values = [[T0_MS / 1000 + 60 * i, str(100 + step * i)] for i in range(3)]
            series.append({"metric": labels, "values": values})
        data = {"resultType": "matrix", "result": series}
        return json.dumps({"status": "success", "data": data}).encode()

    json_type = {"Content-Type": "application/json"}
    exporter.serve("/api/v1/query_range", Route(headers=json_type, answer=answer))
    cluster.settings = {
        "telemetry": {
            "source": "prometheus",
            "url": exporter.base,
            "step_s": 60,
            "node_selector": '{job="node"}',
        }
    }
    cluster.save()
    collection.ClusterTelemetry.objects.create(cluster=cluster, fetched_until=T0)

    collection.telemetry_collect(cluster=cluster, now=T0 + timedelta(minutes=3))

    assert 'node_infiniband_port_data_transmitted_bytes_total{job="node"}' in asked
    assert link_rows(cluster) == [
        ("gpu-07", T0, None, 0, 0, 6),
        ("gpu-07", T0 + timedelta(minutes=1), 300.0, 2, 1, 6),
        ("gpu-07", T0 + timedelta(minutes=2), 300.0, 2, 1, 6),
    ]


# --- what one attempt showed ---------------------------------------------------------------


def gpu_minute(attempt, host, gpu, minute, *, sm=None, top=None, nvlink=None):
    return GpuMinute(
        attempt=attempt,
        host=host,
        gpu=gpu,
        minute=minute,
        sm_clock_mhz=sm,
        max_sm_clock_mhz=top,
        nvlink_bytes_s=nvlink,
        samples=4,
    )


@pytest.fixture
def gang(world):
    """A finished attempt on three nodes from 12:00:30 to 12:03:10: two with 2 GPUs of
    minutes each and node exporter minutes, one the node exporter never named."""
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    attempt = make_attempt(
        world,
        cluster,
        node_list=["gpu-08", "gpu-07", "gpu-09"],
        started_at=T0 + timedelta(seconds=30),
        finished_at=T0 + timedelta(minutes=3, seconds=10),
        state=AttemptState.SUCCEEDED,
    )
    minutes = [T0 + timedelta(minutes=n) for n in range(4)]
    GpuMinute.objects.bulk_create(
        [
            gpu_minute(attempt, host, gpu, minute, sm=sm, top=1410.0, nvlink=nvlink)
            for minute in minutes
            for host, gpu, sm, nvlink in (
                ("gpu-07", "0", 1410.0, 80 * GB),
                ("gpu-07", "1", 940.0 if minute > T0 else 1410.0, 20 * GB),
                ("gpu-08", "0", 1400.0, 90 * GB),
                ("gpu-08", "1", None, None),
            )
        ]
    )
    NodeLinkMinute.objects.bulk_create(
        [
            NodeLinkMinute(
                cluster=cluster,
                host=host,
                minute=T0 + timedelta(minutes=n),
                ib_bytes_s=rate,
                ib_errors=errors,
                ports=8,
                samples=24,
            )
            for n in range(-1, 5)  # a minute before the attempt and one after it
            for host, rate, errors in (("gpu-07", 40e9 + n * 1e9, 3), ("gpu-08", 9e9, 0))
        ]
    )
    return attempt


def test_each_gpus_sm_clock_is_its_minutes_mean_beside_its_maximum(gang, django_assert_num_queries):
    with django_assert_num_queries(1):
        clocks = attempt_clock_evidence(attempt_id=gang.pk)

    assert clocks == [
        GpuClock("gpu-07", "0", 1410.0, 1410.0, 4),
        GpuClock("gpu-07", "1", 1057.5, 1410.0, 4),
        GpuClock("gpu-08", "0", 1400.0, 1410.0, 4),
        GpuClock("gpu-08", "1", None, 1410.0, 0),
    ]
    assert [clock.share for clock in clocks] == [1.0, 0.75, pytest.approx(0.99291, abs=1e-5), None]
    since = attempt_clock_evidence(attempt_id=gang.pk, since=T0 + timedelta(seconds=90))
    assert since[1] == GpuClock("gpu-07", "1", 940.0, 1410.0, 3)
    until = attempt_clock_evidence(attempt_id=gang.pk, until=T0 + timedelta(minutes=1))
    assert until[1] == GpuClock("gpu-07", "1", 1410.0, 1410.0, 1)


def test_links_are_read_over_the_attempts_life_for_each_of_its_nodes(
    gang, django_assert_num_queries
):
    with django_assert_num_queries(3):
        links = attempt_link_evidence(attempt_id=gang.pk)

    # Minutes 12:00 to 12:03: from the start's minute up to the end.
    assert links == LinkEvidence(
        gpus=(
            GpuLink("gpu-07", "0", 80 * GB, 4),
            GpuLink("gpu-07", "1", 20 * GB, 4),
            GpuLink("gpu-08", "0", 90 * GB, 4),
            GpuLink("gpu-08", "1", None, 0),
        ),
        hosts=(
            HostLink("gpu-07", 41.5e9, 12, 4),
            HostLink("gpu-08", 9e9, 0, 4),
            HostLink("gpu-09", None, 0, 0),  # the node exporter said nothing of it
        ),
    )
    assert links.low_nvlink() == [GpuLink("gpu-07", "1", 20 * GB, 4)]
    assert links.low_infiniband() == [HostLink("gpu-08", 9e9, 0, 4)]
    assert links.erring_hosts() == [HostLink("gpu-07", 41.5e9, 12, 4)]
    window = attempt_link_evidence(
        attempt_id=gang.pk, since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=9)
    )
    assert window.hosts[0] == HostLink("gpu-07", 42.5e9, 6, 2)


def test_a_running_attempt_is_read_up_to_now_and_one_not_started_has_no_node_minutes(
    world, gang, django_assert_num_queries
):
    gang.finished_at = None
    gang.state = AttemptState.RUNNING
    gang.save(update_fields=["finished_at", "state"])
    waiting = make_attempt(
        world, gang.cluster, node_list=["gpu-07"], started_at=None, state=AttemptState.PENDING
    )

    running = attempt_link_evidence(attempt_id=gang.pk)
    with django_assert_num_queries(2):
        pending = attempt_link_evidence(attempt_id=waiting.pk)

    assert running.hosts[0] == HostLink("gpu-07", 42e9, 15, 5)
    assert pending == LinkEvidence(gpus=(), hosts=(HostLink("gpu-07", None, 0, 0),))


def test_the_links_of_a_large_gang_take_the_same_three_queries(world, django_assert_num_queries):
    cluster = make_cluster(world, Cluster.Backend.SLURM, "slurm-1")
    hosts = [f"gpu-{n:03d}" for n in range(128)]
    attempt = make_attempt(world, cluster, node_list=hosts)
    GpuMinute.objects.bulk_create(
        [gpu_minute(attempt, host, str(g), T0, nvlink=1e9) for host in hosts for g in range(8)]
    )
    NodeLinkMinute.objects.bulk_create(
        [NodeLinkMinute(cluster=cluster, host=host, minute=T0, ib_bytes_s=1e9) for host in hosts]
    )

    with django_assert_num_queries(3):
        links = attempt_link_evidence(attempt_id=attempt.pk)

    assert (len(links.gpus), len(links.hosts)) == (1024, 128)
    assert links.low_infiniband() == links.low_nvlink() == links.erring_hosts() == []
    with django_assert_num_queries(1):
        assert len(attempt_clock_evidence(attempt_id=attempt.pk)) == 1024


@pytest.mark.parametrize(
    ("rates", "low"),
    [
        ([10.0], []),  # alone: nothing to compare with
        ([10.0, 4.9], [4.9]),
        ([10.0, 5.0], []),  # exactly half is not below half
        ([0.0, 0.0, 3.0], [0.0, 0.0]),  # the others' median is 1.5 for each 0
        ([0.0, 0.0], []),  # a median of 0: no rate is below half of it
        ([None, 8.0, 1.0, None], [1.0]),  # no rate: neither counts nor compares
        ([4.0, 4.0, 4.0, 1.0, 1.9, 4.0], [1.0, 1.9]),
    ],
)
def test_traffic_is_low_below_half_the_median_of_the_gangs_others(rates, low):
    assert low_traffic(rates, lambda rate: rate) == low
