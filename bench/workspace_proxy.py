"""The workspace proxy's added latency (issue 37, point 7: goal ≤ 2 ms p95 added).

A real Jupyter Server on 127.0.0.1 (base URL /w/<run id>/, the attempt's token) and a small
aiohttp WebSocket echo server, each recorded as a running workspace of one person in this
benchmark's own database (``<name>_workspace_proxy``, emptied first). The proxy runs as it
does in production, its own process (``python -m portal.workspace_proxy``) on that database.
One client, one request at a time on a kept-alive connection, alternating direct and
through the proxy so both see the same machine:
- HTTP: ``GET /w/<id>/api/status``, direct with the token (what the proxy sends) vs through
  the proxy with the person's session cookie (every request reads its session; what it may
  open is kept for a second);
- WebSocket: a 100-byte text message echoed, direct vs through the proxy (one connection
  each, opened once);
- the gate's lookup alone, in process: whole (session, user, workspace), and as a request
  within the second makes it (the session only).
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.client import HTTPConnection
from importlib import import_module
from pathlib import Path

import websocket  # websocket-client: a plain blocking client, the same for both paths
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from bench.report import Section, quick
from jobs.services.workspaces import workspace_base_path, workspace_server_token
from portal.workspace_proxy import gate
from tests.workspace_support import (
    RecordingServer,
    free_port,
    jupyter_server,
    served,
    session_cookie,
    workspace_running,
)

WARM_UP = 50
GOAL_MS = 2.0
PAYLOAD = "x" * 100


def requests_per_path() -> int:
    return 200 if quick() else 2000


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[94]


def seed():
    """A world just big enough for two running workspaces of one person."""
    from clusters.models import Cluster
    from clusters.services import cluster_refresh_inventory
    from images.models import Image
    from tenants.models import GpuFlavor, Membership, Project, Quota, Tenant

    call_command("flush", interactive=False, verbosity=0)
    flavor = GpuFlavor.objects.create(slug="a100-80gb", name="NVIDIA A100 80GB", memory_gb=80)
    cluster = Cluster.objects.create(
        name="sim-1",
        backend=Cluster.Backend.SIMULATOR,
        settings={"speedup": 1, "pools": [{"flavor": "a100-80gb", "nodes": 2, "gpus_per_node": 8}]},
    )
    cluster_refresh_inventory(cluster=cluster)
    tenant = Tenant.objects.create(slug="vision", name="Vision Lab")
    Project.objects.create(tenant=tenant, slug="detection", name="Detection")
    Quota.objects.create(tenant=tenant, flavor=flavor, guaranteed_gpus=16)
    image = Image.objects.create(
        repository="registry.example.org/ml/pytorch",
        digest="sha256:" + "a" * 64,
        tag="2.4",
        status=Image.Status.APPROVED,
    )
    user = get_user_model().objects.create_user(username="alice")
    Membership.objects.create(user=user, tenant=tenant, role="researcher")

    class World:
        pass

    world = World()
    world.image, world.cluster = image, cluster  # what workspace_running reads
    return world, user


def timed_pairs(direct: Callable[[], None], proxied: Callable[[], None], count: int):
    for _ in range(WARM_UP):
        direct()
        proxied()
    direct_s: list[float] = []
    proxied_s: list[float] = []
    for _ in range(count):
        for call, samples in ((direct, direct_s), (proxied, proxied_s)):
            started = time.perf_counter()
            call()
            samples.append(time.perf_counter() - started)
    return direct_s, proxied_s


def http_getter(port: int, path: str, headers: dict[str, str]) -> Callable[[], None]:
    connection = HTTPConnection("127.0.0.1", port, timeout=30)

    def get() -> None:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, answer.status

    return get


OPEN: list[websocket.WebSocket] = []  # closed by run() once measured


def ws_echoer(url: str, origin: str, cookie: str | None) -> Callable[[], None]:
    connection = websocket.create_connection(url, origin=origin, cookie=cookie, timeout=30)
    OPEN.append(connection)

    def echo() -> None:
        connection.send(PAYLOAD)
        assert connection.recv() == PAYLOAD

    return echo


class ProxyProcess:
    def __init__(self, port: int) -> None:
        env = os.environ | {"GANTRY_WORKSPACE_URL": f"http://127.0.0.1:{port}"}
        self.process = subprocess.Popen(  # noqa: S603 (our own fixed command)
            [sys.executable, "-m", "portal.workspace_proxy", "--port", str(port)],
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            except urllib.error.HTTPError:
                return  # its 404: it answers
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the workspace proxy did not start")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def ms_pair(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.2f} / {p95(samples) * 1000:.2f} ms"


def row(name: str, direct: list[float], proxied: list[float]) -> list[str]:
    direct_50, direct_95 = statistics.median(direct) * 1000, p95(direct) * 1000
    proxied_50, proxied_95 = statistics.median(proxied) * 1000, p95(proxied) * 1000
    return [
        name,
        f"{len(direct):,}",
        f"{direct_50:.2f} / {direct_95:.2f} ms",
        f"{proxied_50:.2f} / {proxied_95:.2f} ms",
        f"{proxied_50 - direct_50:+.2f} / {proxied_95 - direct_95:+.2f} ms",
        f"{proxied_95 / direct_95:.1f}×",
        "yes" if proxied_95 - direct_95 <= GOAL_MS else "no",
    ]


def lookup_times(cookie: str, run_id: int, count: int) -> tuple[list[float], list[float]]:
    """The gate's lookup in process (no thread hop): whole (session, user, workspace) and
    as each request within DECISION_TTL_S of the first makes it (the session only)."""
    engine = import_module(settings.SESSION_ENGINE)
    whole, per_request = [], []
    decisions = gate.SessionDecisions()
    for _ in range(count):
        started = time.perf_counter()
        assert gate.session_workspace_target(engine.SessionStore(cookie), run_id) is not None
        whole.append(time.perf_counter() - started)
        decisions.target(cookie, run_id)
        started = time.perf_counter()
        assert decisions.target(cookie, run_id) is not None
        per_request.append(time.perf_counter() - started)
    return whole, per_request


def run() -> list[Section]:
    world, user = seed()
    count = requests_per_path()
    echo_server, echo_port = RecordingServer(), free_port()
    with tempfile.TemporaryDirectory(prefix="bench-jupyter-") as scratch:
        # Jupyter's run and attempt are the first of the flushed database: its base URL and
        # token are known before it starts.
        jupyter_run = workspace_running(world, user=user, host="127.0.0.1", port=1)
        attempt_id = jupyter_run.workspace.attempt_id
        base = workspace_base_path(jupyter_run.pk)
        token = workspace_server_token(attempt_id)
        with (
            jupyter_server(base_url=base, token=token, scratch=Path(scratch)) as jupyter_port,
            served(echo_server.app, echo_port),
        ):
            type(jupyter_run.workspace).objects.filter(run=jupyter_run).update(port=jupyter_port)
            echo_run = workspace_running(world, user=user, host="127.0.0.1", port=echo_port)
            cookie = session_cookie(user)
            proxy_port = free_port()
            proxy = ProxyProcess(proxy_port)
            try:
                jar = f"{settings.SESSION_COOKIE_NAME}={cookie}"
                origin = f"http://127.0.0.1:{proxy_port}"
                http = timed_pairs(
                    http_getter(
                        jupyter_port,
                        f"{base}api/status",
                        {"Authorization": f"token {token}"},
                    ),
                    http_getter(proxy_port, f"{base}api/status", {"Cookie": jar}),
                    count,
                )
                echo_path = f"{workspace_base_path(echo_run.pk)}echo"
                ws = timed_pairs(
                    ws_echoer(
                        f"ws://127.0.0.1:{echo_port}{echo_path}",
                        f"http://127.0.0.1:{echo_port}",
                        None,
                    ),
                    ws_echoer(f"ws://127.0.0.1:{proxy_port}{echo_path}", origin, jar),
                    count,
                )
            finally:
                for connection in OPEN:
                    connection.close()
                OPEN.clear()
                proxy.stop()
            whole, per_request = lookup_times(cookie, jupyter_run.pk, count)
    return [
        Section(
            title="Workspace proxy: added latency (issue 37, point 7)",
            intro=(
                "One client, one request at a time on a kept-alive connection, alternating "
                "direct to the server and through the workspace proxy (`python -m "
                "portal.workspace_proxy`, its own process, on PostgreSQL), after "
                f"{WARM_UP} of each to warm up. HTTP: `GET /w/<id>/api/status` of a real "
                "Jupyter Server (direct with its token; proxied with the owner's session "
                "cookie: every request reads its session row, as Django's database session "
                "engine does; its user's check and the workspace's address are kept for "
                f"{gate.DECISION_TTL_S:g} s). WebSocket: a 100-byte text message echoed by "
                "an aiohttp server, one connection each. Goal: at most "
                f"{GOAL_MS:g} ms added at p95."
            ),
            columns=[
                "path",
                "requests",
                "direct p50 / p95",
                "proxied p50 / p95",
                "added p50 / p95",
                "p95 ratio",
                f"≤ {GOAL_MS:g} ms added",
            ],
            rows=[
                row("HTTP GET api/status", *http),
                row("WebSocket echo", *ws),
            ],
            notes=[
                "The gate's lookup alone, in process, no thread hop, p50 / p95 over "
                f"{count:,}: whole (session, user, workspace: 3 queries) "
                f"{ms_pair(whole)}; as a request makes it within "
                f"{gate.DECISION_TTL_S:g} s of the whole one (the session row read with "
                f"the database session engine's query: 1 query) {ms_pair(per_request)}.",
            ],
        )
    ]
