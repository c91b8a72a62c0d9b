"""Telemetry sources: dcgm-exporter scraped directly, and Prometheus read back through its
HTTP API (a real Prometheus, started once per session by tests/prometheus_support.py)."""

import dataclasses
import gzip
import json
import os
import subprocess
import sys
import time
import urllib.parse

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters.models import Cluster
from telemetry.collection import telemetry_source_build
from telemetry.exposition.parsing import (
    GPU_UTIL,
    HEALTH_CEILING,
    KEPT_METRICS,
    MAX_BODY_BYTES,
    PCIE_REPLAY,
    ExpositionParser,
    GpuSample,
    parse,
)
from telemetry.source_settings import SourceKind, SourceSettings, source_settings_parse
from telemetry.sources import (
    USER_AGENT,
    DcgmScrapeSource,
    FetchResult,
    PrometheusSource,
    Scrape,
    ScrapeFailure,
    SourceError,
    matrix_exposition,
    prometheus_queries,
)
from tests import REPOSITORY
from tests.prometheus_support import (
    HISTORY_SERIES,
    LIVE_EXPOSITION,
    FakeExporter,
    PrometheusWorld,
    Route,
    free_port,
    history_value,
)

pytest_plugins = ["tests.prometheus_support"]


@pytest.fixture(scope="module", autouse=True)
def _prometheus_starts_first(prometheus_launched):
    """Launch the session's Prometheus before the first test; the tests that read it come
    last, by when it has scraped the fake exporter for a while."""


AT = 1_700_000_000_000  # the fake clock, Unix ms
TOKEN = "prom-t0ken-Zq9xW2"  # what the token environment variable holds in the tests


def fixed_clock() -> int:
    return AT


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/metrics"


def sort_key(sample: GpuSample) -> tuple:
    return (sample.metric, sample.host, sample.gpu, sample.ts)


def stamped(samples: list[GpuSample], stamps: list[int]) -> list[GpuSample]:
    return sorted(
        (dataclasses.replace(sample, ts=ts) for ts in stamps for sample in samples), key=sort_key
    )


def parse_all(scrapes: list[Scrape]):
    parser = ExpositionParser()
    samples, non_finite, out_of_range, malformed = [], 0, 0, 0
    for scrape in scrapes:
        result = parser.parse(scrape.body, default_ts=scrape.at_ms)
        samples += result.samples
        non_finite += result.stats.non_finite
        out_of_range += result.stats.out_of_range
        malformed += result.stats.malformed
    return sorted(samples, key=sort_key), non_finite, out_of_range, malformed


# --- settings ------------------------------------------------------------------------------


def test_dcgm_settings_keep_targets_in_order_with_the_default_timeout():
    settings = source_settings_parse(
        {"source": "dcgm", "targets": ["http://10.0.0.5:9400/metrics", "https://n2:9400/m"]}
    )

    assert settings == SourceSettings(
        source=SourceKind.DCGM,
        targets=("http://10.0.0.5:9400/metrics", "https://n2:9400/m"),
        timeout_s=5.0,
    )


def test_prometheus_settings_with_every_key():
    settings = source_settings_parse(
        {
            "source": "prometheus",
            "url": "http://prom:9090/",
            "step_s": 30,
            "selector": '{job="dcgm",cluster=~"a|b"}',
            "timeout_s": 2.5,
            "token_env": "PROM_TOKEN",
        }
    )

    assert settings == SourceSettings(
        source=SourceKind.PROMETHEUS,
        url="http://prom:9090",
        step_s=30,
        selector='{job="dcgm",cluster=~"a|b"}',
        timeout_s=2.5,
        token_env="PROM_TOKEN",
    )


def test_prometheus_settings_defaults():
    settings = source_settings_parse({"source": "prometheus", "url": "https://prom.example.org"})

    assert settings == SourceSettings(
        source=SourceKind.PROMETHEUS,
        url="https://prom.example.org",
        step_s=15,
        selector="",
        timeout_s=10.0,
        token_env=None,
    )


def source_from_settings(settings: SourceSettings):
    """The source ``settings`` name for a Kubernetes cluster (one that is no simulator)."""
    cluster = Cluster(name="k8s-1", backend=Cluster.Backend.KUBERNETES)
    return telemetry_source_build(cluster=cluster, settings=settings)


def test_simulator_settings_parse_but_only_a_simulator_cluster_has_that_source():
    settings = source_settings_parse({"source": "simulator"})

    assert settings == SourceSettings(source=SourceKind.SIMULATOR)
    with pytest.raises(ValueError) as raised:
        source_from_settings(settings)
    assert str(raised.value) == (
        "the simulator telemetry source reads simulated jobs; cluster k8s-1 is a kubernetes cluster"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (["dcgm"], "telemetry settings must be a JSON object, not list"),
        ({}, 'telemetry settings need "source": one of dcgm, prometheus, simulator'),
        (
            {"source": "nvml"},
            "unknown telemetry source 'nvml': use one of dcgm, prometheus, simulator",
        ),
        (
            {"source": "simulator", "speedup": 3},
            "unknown key for the simulator source: speedup (allowed: source)",
        ),
        (
            {"source": "dcgm", "targets": ["http://a/metrics"], "url": "x", "step_s": 1},
            "unknown keys for the dcgm source: step_s, url (allowed: source, targets, timeout_s)",
        ),
        (
            {"source": "dcgm"},
            'the dcgm source needs "targets": a list of dcgm-exporter URLs like '
            "http://10.0.0.5:9400/metrics",
        ),
        (
            {"source": "dcgm", "targets": []},
            'the dcgm source needs "targets": a list of dcgm-exporter URLs like '
            "http://10.0.0.5:9400/metrics",
        ),
        (
            {"source": "dcgm", "targets": "http://a:9400/metrics"},
            'the dcgm source needs "targets": a list of dcgm-exporter URLs like '
            "http://10.0.0.5:9400/metrics",
        ),
        ({"source": "dcgm", "targets": [9400]}, "targets[0] must be a string URL"),
        (
            {"source": "dcgm", "targets": ["http://a:9400/metrics", "ftp://b/metrics"]},
            "targets[1] must be an http:// or https:// URL, not 'ftp://b/metrics'",
        ),
        (
            {"source": "dcgm", "targets": ["10.0.0.5:9400"]},
            "targets[0] must be an http:// or https:// URL, not '10.0.0.5:9400'",
        ),
        (
            {"source": "dcgm", "targets": ["http:///metrics"]},
            "targets[0] has no host: 'http:///metrics'",
        ),
        (
            {"source": "dcgm", "targets": ["http://a:94x0/metrics"]},
            "targets[0] has an invalid port: 'http://a:94x0/metrics'",
        ),
        (
            {"source": "dcgm", "targets": ["http://a:9400/met rics"]},
            "targets[0] must not contain spaces or control characters: 'http://a:9400/met rics'",
        ),
        (
            {"source": "dcgm", "targets": ["http://a:9400/metrics", "http://a:9400/metrics"]},
            "targets[1] repeats http://a:9400/metrics",
        ),
        (
            {"source": "dcgm", "targets": ["http://a/metrics"], "timeout_s": 0.05},
            "timeout_s must be a number of seconds from 0.1 to 120, not 0.05",
        ),
        (
            {"source": "dcgm", "targets": ["http://a/metrics"], "timeout_s": 121},
            "timeout_s must be a number of seconds from 0.1 to 120, not 121",
        ),
        (
            {"source": "dcgm", "targets": ["http://a/metrics"], "timeout_s": "5"},
            "timeout_s must be a number of seconds from 0.1 to 120, not '5'",
        ),
        (
            {"source": "dcgm", "targets": ["http://a/metrics"], "timeout_s": True},
            "timeout_s must be a number of seconds from 0.1 to 120, not True",
        ),
        (
            {"source": "prometheus"},
            'the prometheus source needs "url": the Prometheus server\'s base URL like '
            "http://prometheus:9090",
        ),
        (
            {"source": "prometheus", "url": "prom:9090"},
            "url must be an http:// or https:// URL, not 'prom:9090'",
        ),
        (
            {"source": "prometheus", "url": "http://prom:9090/?token=x"},
            "url must be the Prometheus base URL without a query or fragment, "
            "not 'http://prom:9090/?token=x'",
        ),
        (
            {"source": "prometheus", "url": "http://prom:9090", "step_s": 0},
            "step_s must be a whole number of seconds from 1 to 3600, not 0",
        ),
        (
            {"source": "prometheus", "url": "http://prom:9090", "step_s": 3601},
            "step_s must be a whole number of seconds from 1 to 3600, not 3601",
        ),
        (
            {"source": "prometheus", "url": "http://prom:9090", "step_s": 15.0},
            "step_s must be a whole number of seconds from 1 to 3600, not 15.0",
        ),
        (
            {"source": "prometheus", "url": "http://prom:9090", "selector": 'job="dcgm"'},
            'selector must be a label matcher in braces on one line, like {job="dcgm"}, '
            "not 'job=\"dcgm\"'",
        ),
        (
            {"source": "prometheus", "url": "http://prom:9090", "selector": '{job="a"}\n{x="b"}'},
            'selector must be a label matcher in braces on one line, like {job="dcgm"}, '
            'not \'{job="a"}\\n{x="b"}\'',
        ),
        (
            {"source": "prometheus", "url": "http://prom:9090", "token_env": "PROM-TOKEN"},
            "token_env must be the NAME of an environment variable (letters, digits and "
            "underscores, not starting with a digit), not 'PROM-TOKEN'",
        ),
    ],
)
def test_invalid_settings_are_refused_with_a_clear_message(raw, message):
    with pytest.raises(ValueError) as raised:
        source_settings_parse(raw)

    assert str(raised.value) == message


@pytest.mark.parametrize(
    "raw",
    [
        {"source": "prometheus", "url": "http://gantry:s3cr3t-pw@prom:9090"},
        {"source": "dcgm", "targets": ["http://gantry:s3cr3t-pw@10.0.0.5:9400/metrics"]},
        {"source": "dcgm", "targets": ["ftp://gantry:s3cr3t-pw@10.0.0.5:99x/m etrics"]},
    ],
)
def test_urls_with_credentials_are_refused_without_repeating_them(raw):
    with pytest.raises(ValueError) as raised:
        source_settings_parse(raw)

    where = "url" if "url" in raw else "targets[0]"
    assert str(raised.value) == (
        f"{where} contains credentials (user:password@); they are refused: "
        "a Prometheus token goes in the environment variable named by token_env"
    )
    assert "s3cr3t" not in str(raised.value)


def test_settings_build_their_sources():
    dcgm = source_from_settings(
        source_settings_parse(
            {"source": "dcgm", "targets": ["http://a:9400/metrics"], "timeout_s": 2}
        )
    )
    prometheus = source_from_settings(
        source_settings_parse(
            {
                "source": "prometheus",
                "url": "http://prom:9090",
                "step_s": 60,
                "selector": '{job="dcgm"}',
                "token_env": "PROM_TOKEN",
            }
        )
    )

    assert isinstance(dcgm, DcgmScrapeSource)
    assert (dcgm.name, dcgm.targets, dcgm.timeout_s) == ("dcgm", ["http://a:9400/metrics"], 2.0)
    assert isinstance(prometheus, PrometheusSource)
    assert (
        prometheus.name,
        prometheus.url,
        prometheus.step_s,
        prometheus.selector,
        prometheus.timeout_s,
        prometheus.token_env,
    ) == ("prometheus", "http://prom:9090", 60, '{job="dcgm"}', 10.0, "PROM_TOKEN")


def test_the_module_imports_without_django():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, telemetry.sources; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'jobs')))",
        ],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        timeout=60,
    )

    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")


# --- dcgm-exporter -------------------------------------------------------------------------

# One node's exporter: both host label spellings (older releases and master after d5e5f51),
# Kubernetes pod labels, a Slurm job, escapes in label values, NaN and +Inf.
NODE1 = (
    b"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
    b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a0",device="nvidia0",Hostname="node1",'
    b'container="trainer",namespace="team-a",pod="train-42-0-abcde"} 97\n'
    b'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-a1",device="nvidia1",hostname="node1",'
    b'container="",namespace="",pod="",hpc_job="1234"} 55\n'
    b'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-a2",Hostname="node1",'
    b'container="c\\"q\\\\b",namespace="team-b",pod="p\\nq"} 0.5\n'
    b'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a0",Hostname="node1"} NaN\n'
    b'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a0",Hostname="node1"} +Inf\n'
)
NODE2 = b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-b0",Hostname="node2"} 3 1699999990000\n'


def test_scrapes_return_the_exact_bodies_and_name_the_targets_that_failed(exporter):
    node1 = exporter.serve("/node1", Route(NODE1))
    node2 = exporter.serve("/node2", Route(NODE2, chunked=True))
    broken = exporter.serve("/broken", Route(b"boom\n", status=500))
    refused = closed_port_url()
    source = DcgmScrapeSource([node1, broken, refused, node2], clock=fixed_clock)

    result = source.fetch(start_ms=0, end_ms=1)

    assert isinstance(result, FetchResult)
    assert result == [Scrape(NODE1, AT, node1), Scrape(NODE2, AT, node2)]
    assert result.failures == [
        ScrapeFailure(broken, "HTTP 500 Internal Server Error"),
        ScrapeFailure(refused, "could not connect: Connection refused"),
    ]
    assert source.failures == result.failures
    assert str(result.failures[1]) == f"{refused}: could not connect: Connection refused"


def test_scraped_labels_reach_the_parser_intact(exporter):
    url = exporter.serve("/metrics", Route(NODE1))

    [scrape] = DcgmScrapeSource([url], clock=fixed_clock).fetch(start_ms=0, end_ms=1)
    result = parse(scrape.body, default_ts=scrape.at_ms)

    assert result.samples == [
        GpuSample(
            "node1", "0", "GPU-a0", GPU_UTIL, 97.0, AT, "train-42-0-abcde", "team-a", "trainer"
        ),
        GpuSample("node1", "1", "GPU-a1", GPU_UTIL, 55.0, AT, hpc_job="1234"),
        GpuSample(
            "node1",
            "2",
            "GPU-a2",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            0.5,
            AT,
            "p\nq",
            "team-b",
            'c"q\\b',
        ),
    ]
    assert result.stats.non_finite == 2


def test_scrape_requests_say_who_asks(exporter):
    url = exporter.serve("/metrics", Route(NODE2))

    DcgmScrapeSource([url]).fetch(start_ms=0, end_ms=1)

    [request] = exporter.requests
    assert request.headers["User-Agent"] == USER_AGENT == "gantry-telemetry"
    assert request.headers["Accept"].startswith("text/plain;version=0.0.4")
    assert "Authorization" not in request.headers


def test_a_body_at_the_cap_is_kept_and_one_byte_more_fails(exporter):
    at_cap = b"#" * 999 + b"\n"
    over = at_cap + b"\n"
    urls = [
        exporter.serve("/at-cap", Route(at_cap)),
        exporter.serve("/at-cap-chunked", Route(at_cap, chunked=True)),
        exporter.serve("/over", Route(over)),
        exporter.serve("/over-chunked", Route(over, chunked=True)),
    ]

    result = DcgmScrapeSource(urls, clock=fixed_clock, max_body_bytes=1000).fetch(
        start_ms=0, end_ms=1
    )

    assert result == [Scrape(at_cap, AT, urls[0]), Scrape(at_cap, AT, urls[1])]
    assert result.failures == [
        ScrapeFailure(
            urls[2],
            "exposition body is 1,001 bytes, over the 1,000-byte limit; "
            "scrape fewer fields or split the target",
        ),
        ScrapeFailure(
            urls[3],
            "exposition body is over the 1,000-byte limit (stopped reading); "
            "scrape fewer fields or split the target",
        ),
    ]


def test_the_default_cap_is_the_parsers(exporter):
    line = b"# padding to the limit\n"
    at_cap = line * (MAX_BODY_BYTES // len(line)) + b"#" * (MAX_BODY_BYTES % len(line))
    assert len(at_cap) == MAX_BODY_BYTES
    kept = exporter.serve("/at-cap", Route(at_cap, chunked=True))
    over = exporter.serve("/over", Route(at_cap + b"\n", chunked=True))

    result = DcgmScrapeSource([kept, over]).fetch(start_ms=0, end_ms=1)

    assert [scrape.body == at_cap for scrape in result] == [True]
    assert [failure.origin for failure in result.failures] == [over]


def test_an_endless_body_is_cut_one_byte_past_the_cap(exporter):
    url = exporter.serve("/endless", Route(b"x" * 4096, endless=True))
    started = time.monotonic()

    with pytest.raises(SourceError) as raised:
        DcgmScrapeSource([url], timeout_s=10).fetch(start_ms=0, end_ms=1)

    assert time.monotonic() - started < 5
    assert str(raised.value) == (
        f"no DCGM target answered: {url}: exposition body is over the 8,388,608-byte limit "
        "(stopped reading); scrape fewer fields or split the target"
    )


def test_the_cap_applies_to_the_decompressed_body(exporter):
    plain = NODE1 * 3
    bomb = b"\n" * 100_000
    small = exporter.serve(
        "/gzip", Route(gzip.compress(plain), headers={"Content-Encoding": "gzip"})
    )
    large = exporter.serve(
        "/bomb", Route(gzip.compress(bomb), headers={"Content-Encoding": "gzip"})
    )

    result = DcgmScrapeSource([small, large], clock=fixed_clock, max_body_bytes=50_000).fetch(
        start_ms=0, end_ms=1
    )

    assert result == [Scrape(plain, AT, small)]
    assert [failure.origin for failure in result.failures] == [large]
    assert "over the 50,000-byte limit" in result.failures[0].reason


def test_a_slow_target_times_out_while_the_others_answer(exporter):
    slow = exporter.serve("/slow", Route(NODE2, delay_s=5))
    fast = exporter.serve("/fast", Route(NODE2))
    started = time.monotonic()

    result = DcgmScrapeSource([slow, fast], timeout_s=0.3, clock=fixed_clock).fetch(
        start_ms=0, end_ms=1
    )

    assert time.monotonic() - started < 2
    assert result == [Scrape(NODE2, AT, fast)]
    assert result.failures == [ScrapeFailure(slow, "no answer within 0.3 s")]


def test_a_trickling_body_is_abandoned_at_the_deadline(exporter):
    url = exporter.serve("/trickle", Route(NODE1, trickle_s=0.05))
    started = time.monotonic()

    with pytest.raises(SourceError) as raised:
        DcgmScrapeSource([url], timeout_s=0.5).fetch(start_ms=0, end_ms=1)

    assert time.monotonic() - started < 2
    assert raised.value.failures == [ScrapeFailure(url, "the answer did not arrive within 0.5 s")]


def test_a_body_shorter_than_announced_fails_its_target(exporter):
    url = exporter.serve("/short", Route(NODE2, content_length=len(NODE2) + 100))

    result = DcgmScrapeSource([url, exporter.serve("/ok", Route(NODE2))]).fetch(
        start_ms=0, end_ms=1
    )

    assert len(result) == 1
    assert [failure.origin for failure in result.failures] == [url]
    assert result.failures[0].reason.startswith("the connection broke: IncompleteRead")


def test_redirects_are_not_followed(exporter):
    url = exporter.serve(
        "/moved", Route(status=302, headers={"Location": exporter.url("/metrics")})
    )
    exporter.serve("/metrics", Route(NODE2))

    with pytest.raises(SourceError) as raised:
        DcgmScrapeSource([url]).fetch(start_ms=0, end_ms=1)

    assert raised.value.failures == [
        ScrapeFailure(url, "HTTP 302 Found (redirects are not followed: use the final URL)")
    ]
    assert [request.path for request in exporter.requests] == ["/moved"]


def test_when_no_target_answers_the_fetch_fails_naming_each(exporter):
    urls = [exporter.serve(f"/down{i}", Route(status=503)) for i in range(7)]

    with pytest.raises(SourceError) as raised:
        DcgmScrapeSource(urls).fetch(start_ms=0, end_ms=1)

    shown = "; ".join(f"{url}: HTTP 503 Service Unavailable" for url in urls[:5])
    assert str(raised.value) == f"no DCGM target answered: {shown}; and 2 more"
    assert len(raised.value.failures) == 7


def test_origins_and_messages_leave_the_query_string_out(exporter):
    exporter.serve("/metrics", Route(status=500))
    url = exporter.url("/metrics?auth=s3cr3t-query")

    with pytest.raises(SourceError) as raised:
        DcgmScrapeSource([url]).fetch(start_ms=0, end_ms=1)

    assert raised.value.failures == [
        ScrapeFailure(exporter.url("/metrics"), "HTTP 500 Internal Server Error")
    ]
    assert exporter.requests[0].path == "/metrics?auth=s3cr3t-query"
    assert "s3cr3t" not in str(raised.value) + repr(DcgmScrapeSource([url]))


def test_a_dcgm_source_refuses_urls_with_credentials():
    with pytest.raises(ValueError) as raised:
        DcgmScrapeSource(["http://u:s3cr3t@10.0.0.5:9400/metrics"])

    assert "s3cr3t" not in str(raised.value)
    assert str(raised.value).startswith("target 0 contains credentials")


@pytest.fixture(scope="module")
def shared_exporter():
    server = FakeExporter()
    yield server
    server.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=2048))
def test_any_bytes_from_an_exporter_are_passed_on_as_they_are(shared_exporter, body):
    url = shared_exporter.serve("/fuzz", Route(body))

    [scrape] = DcgmScrapeSource([url], clock=fixed_clock).fetch(start_ms=0, end_ms=1)

    assert scrape == Scrape(body, AT, url)
    stats = parse(scrape.body, default_ts=AT).stats
    assert stats.accounted() == stats.lines


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=st.text(max_size=40), namespace=st.text(max_size=20), host=st.text(max_size=20))
def test_any_label_text_from_an_exporter_reaches_the_parser(shared_exporter, pod, namespace, host):
    line = (
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-f",hostname="{_label(host)}",'
        f'namespace="{_label(namespace)}",pod="{_label(pod)}"}} 42\n'
    )
    url = shared_exporter.serve("/labels", Route(line.encode()))

    [scrape] = DcgmScrapeSource([url], clock=fixed_clock).fetch(start_ms=0, end_ms=1)

    assert parse(scrape.body, default_ts=AT).samples == [
        GpuSample(host, "0", "GPU-f", GPU_UTIL, 42.0, AT, pod, namespace)
    ]


# --- Prometheus: range queries, conversion -------------------------------------------------


def test_a_matrix_becomes_exposition_with_every_label_and_the_value_text():
    matrix = [
        {
            "metric": {"__name__": "DCGM_FI_DEV_POWER_USAGE", "gpu": "0", "hostname": 'n"1\\\n'},
            "values": [[1700000000, "NaN"], [1700000015.5, "+Inf"], [1700000030, "1e+06"]],
        },
        {
            "metric": {"gpu": "1", "Hostname": "n2", "hpc_job": "9", "dotted.name": "x"},
            "values": [],
        },
        {"metric": {"gpu": "2", "Hostname": "n2"}, "values": [[1700000045, "-0.5"]]},
    ]

    bodies = matrix_exposition("DCGM_FI_DEV_POWER_USAGE", matrix)

    assert bodies == [
        b"# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        b'DCGM_FI_DEV_POWER_USAGE{gpu="0",hostname="n\\"1\\\\\\n"} NaN 1700000000000\n'
        b'DCGM_FI_DEV_POWER_USAGE{gpu="0",hostname="n\\"1\\\\\\n"} +Inf 1700000015500\n'
        b'DCGM_FI_DEV_POWER_USAGE{gpu="0",hostname="n\\"1\\\\\\n"} 1e+06 1700000030000\n'
        b'DCGM_FI_DEV_POWER_USAGE{gpu="2",Hostname="n2"} -0.5 1700000045000\n'
    ]
    stats = parse(bodies[0], default_ts=0).stats
    assert (stats.samples, stats.non_finite, stats.out_of_range) == (1, 2, 1)


def test_a_large_matrix_is_cut_into_bodies_at_line_ends():
    matrix = [
        {"metric": {"gpu": str(g)}, "values": [[t, "1"] for t in range(100)]} for g in range(3)
    ]

    bodies = matrix_exposition(GPU_UTIL, matrix, max_body_bytes=2000)

    assert all(len(body) <= 2000 and body.endswith(b"\n") for body in bodies)
    assert all(body.startswith(b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n") for body in bodies)
    samples = [s for body in bodies for s in parse(body, default_ts=0).samples]
    assert sorted((s.gpu, s.ts) for s in samples) == [
        (str(g), t * 1000) for g in range(3) for t in range(100)
    ]


_VALUES = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "0", "1", "100"]),
    st.floats(min_value=0, max_value=1, allow_nan=False).map(repr),
)


@settings(max_examples=100, deadline=None)
@given(
    labels=st.dictionaries(
        st.sampled_from(
            ["Hostname", "hostname", "pod", "namespace", "container", "hpc_job", "UUID"]
        ),
        st.text(max_size=30),
    ),
    values=st.lists(_VALUES, min_size=1, max_size=5),
    cap=st.integers(min_value=1024, max_value=4096),
)
def test_any_label_text_from_prometheus_survives_the_conversion(labels, values, cap):
    matrix = [
        {
            "metric": {"gpu": "3", **labels},
            "values": [[1700000000 + i, v] for i, v in enumerate(values)],
        }
    ]

    bodies = matrix_exposition("DCGM_FI_DEV_FB_USED", matrix, max_body_bytes=cap)

    parser = ExpositionParser()
    results = [parser.parse(body, default_ts=0) for body in bodies]
    samples = [sample for result in results for sample in result.samples]
    finite = [i for i, v in enumerate(values) if v not in ("NaN", "+Inf", "-Inf")]
    host = labels.get("Hostname", labels.get("hostname", ""))
    assert [
        (s.host, s.pod, s.namespace, s.container, s.hpc_job, s.uuid, s.ts) for s in samples
    ] == [
        (
            host,
            labels.get("pod", ""),
            labels.get("namespace", ""),
            labels.get("container", ""),
            labels.get("hpc_job", ""),
            labels.get("UUID", ""),
            1_700_000_000_000 + i * 1000,
        )
        for i in finite
    ]
    assert sum(r.stats.non_finite for r in results) == len(values) - len(finite)
    assert sum(r.stats.malformed for r in results) == 0


# --- Prometheus: a stub API ----------------------------------------------------------------

EMPTY_MATRIX = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}})


def stub_prometheus(exporter: FakeExporter, route: Route) -> str:
    exporter.serve("/api/v1/query_range", route)
    return exporter.base


def json_route(payload, status: int = 200) -> Route:
    body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
    return Route(body, status, {"Content-Type": "application/json"})


def test_the_token_from_token_env_is_sent_as_a_bearer_token_and_nowhere_else(exporter, monkeypatch):
    monkeypatch.setenv("GANTRY_TEST_PROM_TOKEN", TOKEN)
    url = stub_prometheus(exporter, json_route(EMPTY_MATRIX))
    settings = source_settings_parse(
        {"source": "prometheus", "url": url, "step_s": 60, "token_env": "GANTRY_TEST_PROM_TOKEN"}
    )
    source = source_from_settings(settings)

    assert source.fetch(start_ms=0, end_ms=60_000) == []

    assert len(exporter.requests) == len(prometheus_queries("")) == 33
    assert {r.headers["Authorization"] for r in exporter.requests} == {f"Bearer {TOKEN}"}
    assert {r.headers["User-Agent"] for r in exporter.requests} == {"gantry-telemetry"}
    error = {"status": "error", "errorType": "unavailable", "error": "too busy"}
    exporter.serve("/api/v1/query_range", json_route(error, status=503))
    with pytest.raises(SourceError) as raised:
        source.fetch(start_ms=0, end_ms=60_000)
    assert str(raised.value) == (
        f"Prometheus at {url} refused the query: unavailable: too busy "
        "(query DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)"
    )
    shown = [str(raised.value), repr(raised.value), repr(source), repr(settings), str(settings)]
    assert not [text for text in shown if TOKEN in text]


def test_a_token_given_directly_stays_out_of_the_repr(exporter):
    url = stub_prometheus(exporter, json_route(EMPTY_MATRIX))
    source = PrometheusSource(url, step_s=60, bearer_token=TOKEN)

    source.fetch(start_ms=0, end_ms=60_000)

    assert exporter.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in repr(source)


def test_a_missing_token_variable_fails_the_fetch_before_any_request(exporter, monkeypatch):
    monkeypatch.delenv("GANTRY_TEST_PROM_TOKEN", raising=False)
    url = stub_prometheus(exporter, json_route(EMPTY_MATRIX))
    source = PrometheusSource(url, step_s=60, token_env="GANTRY_TEST_PROM_TOKEN")

    with pytest.raises(SourceError) as raised:
        source.fetch(start_ms=0, end_ms=60_000)

    assert str(raised.value) == (
        "the environment variable GANTRY_TEST_PROM_TOKEN that holds the token for "
        f"Prometheus at {url} is not set on this host"
    )
    assert exporter.requests == []


def test_an_interval_without_a_grid_point_asks_nothing(exporter):
    url = stub_prometheus(exporter, json_route(EMPTY_MATRIX))

    assert PrometheusSource(url, step_s=60).fetch(start_ms=60_001, end_ms=120_000) == []
    assert exporter.requests == []


@pytest.mark.parametrize(
    ("route", "problem"),
    [
        (Route(b"unauthorized\n", 401), "answered HTTP 401 Unauthorized"),
        (Route(b"<html>gateway</html>", 502), "answered HTTP 502 Bad Gateway"),
        (json_route("<html>ok</html>"), "sent an answer that is not a JSON object"),
        (json_route([1, 2]), "sent an answer that is not a JSON object"),
        (
            json_route({"status": "success"}),
            'sent an answer without "status": "success" and "data"',
        ),
        (
            json_route({"status": "success", "data": {"resultType": "vector", "result": []}}),
            "sent a 'vector' instead of a matrix",
        ),
        (
            json_route(
                {
                    "status": "success",
                    "data": {
                        "resultType": "matrix",
                        "result": [{"metric": {}, "values": [[1, "1 2"]]}],
                    },
                }
            ),
            "sent an unexpected answer: a point's value is not a number: '1 2'",
        ),
        (
            json_route(
                {
                    "status": "success",
                    "data": {
                        "resultType": "matrix",
                        "result": [{"metric": {"gpu": 0}, "values": []}],
                    },
                }
            ),
            "sent an unexpected answer: label 'gpu' is not a string",
        ),
    ],
)
def test_bad_answers_fail_the_fetch_with_what_was_wrong(exporter, route, problem):
    url = stub_prometheus(exporter, route)

    with pytest.raises(SourceError) as raised:
        PrometheusSource(url, step_s=60).fetch(start_ms=0, end_ms=60_000)

    assert (
        str(raised.value) == f"Prometheus at {url} {problem} (query {prometheus_queries('')[0][1]})"
    )


def asked(exporter: FakeExporter) -> list[tuple[str, str, str, str]]:
    """(query, start, end, step) of every range query the stub was asked, in order."""
    asked = []
    for request in exporter.requests:
        params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.path).query))
        asked.append((params["query"], params["start"], params["end"], params["step"]))
    return asked


def one_series_answer(path: str) -> bytes:
    """What Prometheus answers for one series: a point per step of the asked window."""
    params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))
    start, end, step = (float(params[key]) for key in ("start", "end", "step"))
    values = [[start + i * step, "1"] for i in range(round((end - start) / step) + 1)]
    result = [{"metric": {"gpu": "0", "Hostname": "n1"}, "values": values}]
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}
    ).encode()


def test_each_metric_is_read_on_the_absolute_step_grid_in_windows_of_max_points(exporter):
    url = stub_prometheus(
        exporter, Route(headers={"Content-Type": "application/json"}, answer=one_series_answer)
    )

    scrapes = PrometheusSource(url, step_s=15, max_points=4, selector='{job="dcgm"}').fetch(
        start_ms=1_000, end_ms=120_001
    )

    assert asked(exporter) == [
        (query, start, end, "15")
        for _, query in prometheus_queries('{job="dcgm"}')
        for start, end in (("15.000", "60.000"), ("75.000", "120.000"))
    ]
    assert prometheus_queries('{job="dcgm"}')[:3] == [
        (
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{job="dcgm"} or '
            'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{job="dcgm"}',
        ),
        (
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{job="dcgm"} or '
            'DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL{job="dcgm"}',
        ),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 'DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{job="dcgm"}'),
    ]
    samples, *_ = parse_all(scrapes)
    assert [(s.metric, s.ts) for s in samples] == sorted(
        (metric, ts) for metric in KEPT_METRICS for ts in range(15_000, 120_001, 15_000)
    )


def test_windows_stay_within_prometheus_point_limit(exporter):
    url = stub_prometheus(exporter, json_route(EMPTY_MATRIX))

    PrometheusSource(url, step_s=1).fetch(start_ms=0, end_ms=11_000_001)

    assert {(start, end) for _, start, end, _ in asked(exporter)} == {
        ("0.000", "10999.000"),
        ("11000.000", "11000.000"),
    }
    assert len(exporter.requests) == 2 * len(prometheus_queries(""))


def test_an_answer_over_the_cap_is_asked_again_for_half_the_window_and_later_ones_stay_small(
    exporter,
):
    url = stub_prometheus(
        exporter, Route(headers={"Content-Type": "application/json"}, answer=one_series_answer)
    )
    two_points = one_series_answer("/?start=1005.000&end=1020.000&step=15")
    four_points = one_series_answer("/?start=1005.000&end=1050.000&step=15")
    cap = len(two_points) + 3
    assert cap < len(four_points)
    source = PrometheusSource(url, step_s=15, max_response_bytes=cap)

    scrapes = source.fetch(start_ms=1_000_001, end_ms=1_110_001)  # 1005 s to 1110 s

    pairs = ((1005, 1020), (1035, 1050), (1065, 1080), (1095, 1110))
    first, *others = [query for _, query in prometheus_queries("")]
    assert [(q, start, end) for q, start, end, _ in asked(exporter)] == [
        (first, "1005.000", "1110.000"),
        (first, "1005.000", "1050.000"),
        *[(first, f"{a}.000", f"{b}.000") for a, b in pairs],
        *[(metric, f"{a}.000", f"{b}.000") for metric in others for a, b in pairs],
    ]
    samples, *_ = parse_all(scrapes)
    assert len(samples) == 8 * len(KEPT_METRICS)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    answer=st.one_of(
        st.binary(max_size=200),
        _JSON.map(lambda v: json.dumps(v).encode()),
        _JSON.map(
            lambda v: json.dumps(
                {"status": "success", "data": {"resultType": "matrix", "result": v}}
            ).encode()
        ),
        _JSON.map(
            lambda v: json.dumps(
                {
                    "status": "success",
                    "data": {"resultType": "matrix", "result": [{"metric": {}, "values": v}]},
                }
            ).encode()
        ),
    )
)
def test_any_answer_from_prometheus_is_data_or_a_source_error(shared_exporter, answer):
    url = stub_prometheus(shared_exporter, Route(answer, headers={}))
    source = PrometheusSource(url, step_s=60)

    try:
        scrapes = source.fetch(start_ms=0, end_ms=60_000)
    except SourceError:
        return
    for scrape in scrapes:
        stats = parse(scrape.body, default_ts=0).stats
        assert stats.accounted() == stats.lines


# --- Prometheus: the real server -----------------------------------------------------------


def wait_until(ms: int) -> None:
    while time.time_ns() // 1_000_000 < ms:
        time.sleep(0.05)


def test_history_comes_back_minute_by_minute(prometheus: PrometheusWorld):
    source = PrometheusSource(prometheus.url, step_s=60, selector='{job="history"}')

    scrapes = source.fetch(
        start_ms=prometheus.history_start_ms, end_ms=prometheus.history_end_ms + 1
    )

    samples, *_ = parse_all(scrapes)
    minutes = range(prometheus.history_start_ms, prometheus.history_end_ms + 1, 60_000)
    expected = [
        (("hist-node", "0", "GPU-h0", "hist-0", "team-h", ""), HISTORY_SERIES[0][1]),
        (("hist-node", "1", "GPU-h1", "", "", "777"), HISTORY_SERIES[1][1]),
    ]
    assert samples == sorted(
        (
            GpuSample(
                host,
                gpu,
                uuid,
                GPU_UTIL,
                float(history_value(minute, offset)),
                minute,
                pod,
                namespace,
                hpc_job=hpc_job,
            )
            for (host, gpu, uuid, pod, namespace, hpc_job), offset in expected
            for minute in minutes
        ),
        key=sort_key,
    )


def test_long_intervals_are_read_in_windows_prometheus_accepts(prometheus: PrometheusWorld):
    start, end = prometheus.history_start_ms, prometheus.history_end_ms + 1
    whole = requests.get(
        f"{prometheus.url}/api/v1/query_range",
        params={
            "query": 'DCGM_FI_DEV_GPU_UTIL{job="history"}',
            "start": str(start // 1000),
            "end": str(end // 1000),
            "step": "1",
        },
        timeout=10,
    )
    assert whole.status_code == 400
    assert "exceeded maximum resolution of 11,000 points" in whole.json()["error"]

    scrapes = PrometheusSource(prometheus.url, step_s=1, selector='{job="history"}').fetch(
        start_ms=start, end_ms=end
    )
    small_windows = PrometheusSource(
        prometheus.url, step_s=1, selector='{job="history"}', max_points=997
    ).fetch(start_ms=start, end_ms=end)

    samples, *_ = parse_all(scrapes)
    assert len(samples) == 2 * (end - start) // 1000 + 2  # 4 h + 1 s of points, 2 series
    offsets = {"0": HISTORY_SERIES[0][1], "1": HISTORY_SERIES[1][1]}
    assert all(s.value == history_value(s.ts // 60_000 * 60_000, offsets[s.gpu]) for s in samples)
    assert parse_all(small_windows)[0] == samples


def test_answers_over_the_size_cap_are_asked_again_in_halves(prometheus: PrometheusWorld):
    start, end = prometheus.history_start_ms, prometheus.history_end_ms + 1
    source = PrometheusSource(prometheus.url, step_s=60, selector='{job="history"}')
    capped = PrometheusSource(
        prometheus.url, step_s=60, selector='{job="history"}', max_response_bytes=5000
    )
    tiny = PrometheusSource(
        prometheus.url, step_s=60, selector='{job="history"}', max_response_bytes=100
    )

    assert parse_all(capped.fetch(start_ms=start, end_ms=end)) == parse_all(
        source.fetch(start_ms=start, end_ms=end)
    )
    with pytest.raises(SourceError) as raised:
        tiny.fetch(start_ms=start, end_ms=end)
    assert str(raised.value) == (
        f"Prometheus at {prometheus.url}: the answer to "
        'DCGM_FI_DEV_GPU_UTIL{job="history"} for a single step is over the 100-byte limit; '
        "narrow the selector"
    )


def test_prometheus_refusing_the_selector_is_a_source_error(prometheus: PrometheusWorld):
    source = PrometheusSource(prometheus.url, step_s=1, selector='{job=~"("}')

    with pytest.raises(SourceError) as raised:
        source.fetch(start_ms=prometheus.history_start_ms, end_ms=prometheus.history_end_ms)

    message = str(raised.value)
    assert message.startswith(f"Prometheus at {prometheus.url} refused the query: bad_data: ")
    assert "error parsing regexp: missing closing )" in message
    assert message.endswith(
        '(query DCGM_FI_DEV_CLOCKS_EVENT_REASONS{job=~"("} or '
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{job=~"("})'
    )


def test_an_unreachable_prometheus_is_a_source_error():
    url = f"http://127.0.0.1:{free_port()}"

    with pytest.raises(SourceError) as raised:
        PrometheusSource(url, step_s=1).fetch(start_ms=0, end_ms=1000)

    assert str(raised.value) == f"Prometheus at {url}: could not connect: Connection refused"


def test_prometheus_gives_back_what_the_exporter_served_on_the_step_grid(
    prometheus: PrometheusWorld,
):
    # Last in the module: the other tests ran while Prometheus gathered data.
    start = -(-prometheus.live_since_ms // 1000) * 1000  # every grid point after a scrape
    end = start + 3000
    wait_until(end)
    source = PrometheusSource(prometheus.url, step_s=1, selector='{job="dcgm"}', clock=fixed_clock)

    scrapes = source.fetch(start_ms=start, end_ms=end)

    assert {(s.origin, s.at_ms) for s in scrapes} == {(f"prometheus:{prometheus.url}", AT)}
    served = parse(LIVE_EXPOSITION, default_ts=0)
    samples, non_finite, out_of_range, malformed = parse_all(scrapes)
    grid = [start, start + 1000, start + 2000]
    assert samples == stamped(served.samples, grid)
    assert (non_finite, out_of_range, malformed) == (
        served.stats.non_finite * 3,
        served.stats.out_of_range * 3,
        0,
    )
    text = b"".join(s.body for s in scrapes)
    assert b'Hostname="gpu-node1"' in text
    assert b'hostname="gpu-node2"' in text
    assert b"DCGM_FI_DEV_MEM_CLOCK" not in text  # not a metric Gantry keeps: not asked for
    # A health field stored under its DCGM 4.6 name comes back under the exporter's name.
    health = ExpositionParser(HEALTH_CEILING)
    replays = [
        (s.host, s.gpu, s.metric, s.value, s.ts)
        for scrape in scrapes
        for s in health.parse(scrape.body, default_ts=0).samples
        if s.metric == PCIE_REPLAY
    ]
    assert replays == [("gpu-node2", "1", PCIE_REPLAY, 3.0, ts) for ts in grid]
    assert b"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in text
