"""A fake dcgm-exporter and a real Prometheus for the telemetry source tests.

- ``FakeExporter``: a threaded HTTP server on a free 127.0.0.1 port serving, per path, what a
  test puts there (exposition text, an error status, a slow or endless answer), recording
  every request's headers.
- ``launch_prometheus`` / ``ready_prometheus``: Debian's ``prometheus`` (2.42) on a free
  127.0.0.1 port with its storage in a temporary directory, scraping fake exporters every
  second (``write_prometheus_config``). `make test`
  installs the package (scripts/test-services.sh); without it the tests fail, never skip.
- ``backfill``: history written into a data directory with ``promtool tsdb
  create-blocks-from openmetrics`` before Prometheus starts, for hours of data without waiting.

The session fixture ``prometheus`` is one Prometheus with the history below, scraping
``LIVE_EXPOSITION`` from a fake exporter, ready and with that scraped; it is launched by
``prometheus_launched`` (which a module can ask for early, so the ~6 s until the first
scrape overlap its other tests) and stopped at the end of the session.

Test modules load this file with ``pytest_plugins`` after importing from it, too late for
assertion rewriting: PYTEST_DONT_REWRITE says that is intended (it asserts nothing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

PROMETHEUS_BINARY = "/usr/bin/prometheus"
PROMTOOL_BINARY = "/usr/bin/promtool"
EXPOSITION_TYPE = "text/plain; version=0.0.4; charset=utf-8"
INSTALL_HINT = (
    "install Debian's prometheus (apt-get install --no-install-recommends prometheus; "
    "`make test` does it through scripts/test-services.sh)"
)

# What the live fake exporter serves: both spellings of the host label, Kubernetes pod
# labels, a Slurm job, escapes and non-ASCII text in label values, NaN and +Inf, a value out
# of range and a metric Gantry does not keep.
_H100 = 'modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="550.54.15"'
_POD0 = (
    f'gpu="0",UUID="GPU-11111111-2222-3333-4444-555555555550",device="nvidia0",{_H100},'
    'Hostname="gpu-node1",container="trainer",namespace="team-a",pod="train-abc-0"'
)
_SLURM1 = (
    f'gpu="1",UUID="GPU-11111111-2222-3333-4444-555555555551",device="nvidia1",{_H100},'
    'hostname="gpu-node2",container="",namespace="",pod="",hpc_job="4242"'
)
_ODD2 = (
    f'gpu="2",UUID="GPU-11111111-2222-3333-4444-555555555552",device="nvidia2",{_H100},'
    'Hostname="gpu-node1",container="tr\\"äiner ✓",namespace="team-b",'
    'pod="we\\\\ird\\npod"'
)
LIVE_EXPOSITION = (
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    f"DCGM_FI_DEV_GPU_UTIL{{{_POD0}}} 87\n"
    f"DCGM_FI_DEV_GPU_UTIL{{{_SLURM1}}} 12\n"
    f"DCGM_FI_DEV_GPU_UTIL{{{_ODD2}}} 250\n"
    "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n"
    f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_POD0}}} 0.8125\n"
    f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_SLURM1}}} 0.125\n"
    f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_ODD2}}} 0.5\n"
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    f"DCGM_FI_DEV_FB_USED{{{_POD0}}} 61234\n"
    f"DCGM_FI_DEV_FB_USED{{{_SLURM1}}} +Inf\n"
    "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
    f"DCGM_FI_DEV_POWER_USAGE{{{_POD0}}} 312.5\n"
    f"DCGM_FI_DEV_POWER_USAGE{{{_SLURM1}}} NaN\n"
    "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
    f"DCGM_FI_DEV_XID_ERRORS{{{_POD0}}} 0\n"
    f"DCGM_FI_DEV_XID_ERRORS{{{_SLURM1}}} 79\n"
    "# TYPE DCGM_FI_DEV_MEM_CLOCK gauge\n"
    f"DCGM_FI_DEV_MEM_CLOCK{{{_POD0}}} 1593\n"
    # A node-health counter under its DCGM 4.6 name (DCGM_FI_DEV_PCIE_REPLAY_COUNTER before).
    "# TYPE DCGM_FI_DEV_PCIE_REPLAY_TOTAL counter\n"
    f"DCGM_FI_DEV_PCIE_REPLAY_TOTAL{{{_SLURM1}}} 3\n"
).encode()
LIVE_SERIES = sum(not line.startswith(b"#") for line in LIVE_EXPOSITION.splitlines())

# Backfilled history: per-minute GPU_UTIL of two GPUs over four hours, ending half an hour
# before the session starts. Its series carry job="history" (no instance label).
HISTORY_HOURS = 4  # at a 1 s step, more than the 11,000 points Prometheus answers at once
HISTORY_SERIES = (
    ('gpu="0",UUID="GPU-h0",Hostname="hist-node",pod="hist-0",namespace="team-h"', 0),
    ('gpu="1",UUID="GPU-h1",hostname="hist-node",hpc_job="777"', 50),
)


def history_value(minute_ms: int, offset: int) -> int:
    """The GPU_UTIL of a history series at a minute: changes every minute, 0-100."""
    return (minute_ms // 60_000 + offset) % 101


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the fake exporter ---------------------------------------------------------------------


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": EXPOSITION_TYPE})
    delay_s: float = 0.0  # wait before answering
    chunked: bool = False  # Transfer-Encoding: chunked instead of Content-Length
    trickle_s: float = 0.0  # no length; send the body a byte at a time with this pause
    endless: bool = False  # no length; repeat the body until the client goes away
    content_length: int | None = None  # announce this length instead of the body's
    answer: Callable[[str], bytes] | None = None  # the body for a request path and query


@dataclass(frozen=True)
class SeenRequest:
    path: str
    headers: dict[str, str]


class FakeExporter:
    """Serves ``routes`` by path (query strings ignored); 404 for anything else."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[SeenRequest] = []
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _ExporterHandler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def url(self, path: str = "/metrics") -> str:
        return self.base + path

    def serve(self, path: str, route: Route) -> str:
        self.routes[path] = route
        return self.url(path)

    def stop(self) -> None:
        self.stopping.set()  # ends slow and endless answers
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class _ExporterHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        exporter: FakeExporter = self.server.owner  # type: ignore[attr-defined]
        exporter.requests.append(SeenRequest(self.path, dict(self.headers.items())))
        route = exporter.routes.get(urllib.parse.urlsplit(self.path).path)
        if route is None:
            route = Route(b"not found\n", 404, {"Content-Type": "text/plain"})
        if route.delay_s and exporter.stopping.wait(route.delay_s):
            return
        if route.answer is not None:
            route = dataclasses.replace(route, body=route.answer(self.path), answer=None)
        self.close_connection = True
        # The client may stop reading, as it should over the cap or past the deadline.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._answer(exporter, route)

    def _answer(self, exporter: FakeExporter, route: Route) -> None:
        self.send_response(route.status)
        for name, value in route.headers.items():
            self.send_header(name, value)
        self.send_header("Connection", "close")
        streamed = route.trickle_s or route.endless
        if route.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        elif not streamed:
            length = len(route.body) if route.content_length is None else route.content_length
            self.send_header("Content-Length", str(length))
        self.end_headers()
        if route.chunked:
            for start in range(0, len(route.body), 4096):
                piece = route.body[start : start + 4096]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif route.trickle_s:
            for byte in route.body:
                if exporter.stopping.wait(route.trickle_s):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
        elif route.endless:
            while not exporter.stopping.is_set():
                self.wfile.write(route.body)
        else:
            self.wfile.write(route.body)


# --- Prometheus ----------------------------------------------------------------------------


def _require(binary: str) -> None:
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} is missing: {INSTALL_HINT}", pytrace=False)


@dataclass
class PrometheusProcess:
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def log(self) -> str:
        try:
            return (self.workdir / "prometheus.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=5) as response:
            return json.load(response)

    def stop(self) -> None:
        """Stop the process (its working directory belongs to whoever made it)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait(timeout=10)


def backfill(openmetrics: str, data_dir: Path) -> None:
    """Write ``openmetrics`` (timestamps in seconds, ending in ``# EOF``) as TSDB blocks."""
    _require(PROMTOOL_BINARY)
    source = data_dir.parent / "history.om"
    source.write_text(openmetrics)
    done = subprocess.run(
        [PROMTOOL_BINARY, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.fail(f"promtool backfill failed:\n{done.stdout}\n{done.stderr}", pytrace=False)


def write_prometheus_config(workdir: Path, *, targets: list[str], job: str = "dcgm") -> None:
    """Scrape ``targets`` (host:port) every second, keeping the exporter's labels."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "honor_labels": True,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config, indent=2))  # JSON is YAML


def launch_prometheus(workdir: Path) -> PrometheusProcess:
    """Prometheus with ``workdir/prometheus.yml`` on a free 127.0.0.1 port, its storage in
    ``workdir/data`` (which may hold backfilled blocks); does not wait for it."""
    _require(PROMETHEUS_BINARY)
    port = free_port()
    with open(workdir / "prometheus.log", "wb") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS_BINARY,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                "--storage.tsdb.retention.time=1d",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return PrometheusProcess(f"http://127.0.0.1:{port}", process, workdir)


def ready_prometheus(prometheus: PrometheusProcess) -> PrometheusProcess:
    """``prometheus`` once it answers /-/ready, or a relaunched one if another process took
    its port first; fails the test with Prometheus' log otherwise."""
    for _ in range(3):
        if _wait_until_ready(prometheus):
            return prometheus
        log_tail = prometheus.log()
        prometheus.stop()
        if "address already in use" not in log_tail:
            break
        prometheus = launch_prometheus(prometheus.workdir)
    pytest.fail(f"Prometheus did not start:\n{log_tail}", pytrace=False)


def _wait_until_ready(prometheus: PrometheusProcess) -> bool:
    """True once /-/ready answers 200; False if the process died or 20 s passed."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if prometheus.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=1):
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def wait_for_series(
    prometheus: PrometheusProcess, selector: str, count: int, *, timeout_s: float = 20
) -> int:
    """Wait until ``selector`` has ``count`` series: being ready is not having scraped (the
    first scrape comes about 5 s after start). Returns when it was seen, in Unix ms."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        answer = prometheus.api("/api/v1/query", query=f"count({selector})")
        result = answer["data"]["result"]
        seen = int(result[0]["value"][1]) if result else 0
        if seen == count:
            return time.time_ns() // 1_000_000
        time.sleep(0.1)
    targets = prometheus.api("/api/v1/targets")["data"]["activeTargets"]
    health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
    pytest.fail(
        f"Prometheus did not get {count} series for {selector} within {timeout_s} s "
        f"(it has {seen}); targets: {health}\nits log:\n{prometheus.log()}",
        pytrace=False,
    )


def first_scrape_ms(prometheus: PrometheusProcess) -> int:
    """When Prometheus first scraped the live exporter, from the raw samples it stored."""
    answer = prometheus.api("/api/v1/query", query='DCGM_FI_DEV_GPU_UTIL{job="dcgm"}[1m]')
    stamps = [point[0] for series in answer["data"]["result"] for point in series["values"]]
    return round(min(stamps) * 1000)


# --- the session's Prometheus --------------------------------------------------------------


@dataclass(frozen=True)
class PrometheusWorld:
    url: str
    exporter: FakeExporter  # serves LIVE_EXPOSITION at /metrics
    live_since_ms: int  # the time of Prometheus' first scrape of LIVE_EXPOSITION
    history_start_ms: int  # first minute of the history (a minute boundary)
    history_end_ms: int  # last minute of the history


def history_openmetrics(start_ms: int, end_ms: int) -> str:
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for labels, offset in HISTORY_SERIES:
        for minute in range(start_ms, end_ms + 1, 60_000):
            value = history_value(minute, offset)
            lines.append(f'DCGM_FI_DEV_GPU_UTIL{{job="history",{labels}}} {value} {minute // 1000}')
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@dataclass
class LaunchedPrometheus:
    process: PrometheusProcess  # replaced if it had to be relaunched
    exporter: FakeExporter  # serves LIVE_EXPOSITION at /metrics
    history_start_ms: int
    history_end_ms: int


@pytest.fixture(scope="session")
def prometheus_launched() -> Iterator[LaunchedPrometheus]:
    """Prometheus with the history, scraping LIVE_EXPOSITION, not yet waited for: a module
    that asks for this early (an autouse fixture) lets the seconds until the first scrape
    pass while its other tests run."""
    exporter = FakeExporter()
    exporter.serve("/metrics", Route(LIVE_EXPOSITION))
    workdir = Path(tempfile.mkdtemp(prefix="gantry-prometheus-"))
    history_end = (time.time_ns() // 1_000_000) // 60_000 * 60_000 - 30 * 60_000
    history_start = history_end - HISTORY_HOURS * 3_600_000
    launched = None
    try:
        backfill(history_openmetrics(history_start, history_end), workdir / "data")
        write_prometheus_config(workdir, targets=[f"127.0.0.1:{exporter.port}"])
        launched = LaunchedPrometheus(
            launch_prometheus(workdir), exporter, history_start, history_end
        )
        yield launched
    finally:
        if launched is not None:
            launched.process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        exporter.stop()


@pytest.fixture(scope="session")
def prometheus(prometheus_launched: LaunchedPrometheus) -> PrometheusWorld:
    """The session's Prometheus, ready and with the live exporter scraped."""
    launched = prometheus_launched
    launched.process = process = ready_prometheus(launched.process)
    wait_for_series(process, '{job="dcgm",__name__=~"DCGM_.+"}', LIVE_SERIES)
    return PrometheusWorld(
        process.url,
        launched.exporter,
        first_scrape_ms(process),
        launched.history_start_ms,
        launched.history_end_ms,
    )


@pytest.fixture
def exporter() -> Iterator[FakeExporter]:
    server = FakeExporter()
    yield server
    server.stop()
