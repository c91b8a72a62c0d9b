"""Real servers for the workspace tests and benchmarks: Jupyter Server as a workspace runs
it (its base URL, the attempt's token, on 127.0.0.1), the proxy on an event loop of its own
thread, a small recording HTTP/WebSocket server, and Gantry's launcher installed for a Slurm
cluster's jobs; what a server answers and whether it is gone. Each stops what it started."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from aiohttp import WSMsgType, web

from tests import REPOSITORY

JUPYTER_START_S = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def status_code(url: str, token: str | None = None) -> int:
    """The HTTP status a workspace server answers ``url`` with, given ``token`` or none."""
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def refuses(port: int, *, within: float = 30) -> bool:
    """Whether 127.0.0.1:``port`` refuses connections, within ``within`` seconds (a server
    being stopped may still answer for a moment)."""
    deadline = time.monotonic() + within
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def node_launcher(directory: Path) -> dict[str, str]:
    """Gantry's launcher installed as ``directory``/bin/gantry-workspace, as an operator
    installs it on a Slurm cluster's nodes (the test cluster's jobs are processes of this
    machine): the cluster settings that put it on the jobs' PATH and bind its server to the
    node's loopback address (the test cluster's NodeAddr, 127.0.0.1)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "gantry-workspace"
    launcher.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={REPOSITORY / 'sdk'}\n"
        f'exec {sys.executable} -m gantry_sdk.workspace "$@"\n'
    )
    launcher.chmod(0o755)
    directory.chmod(0o755)  # a job submitted as another user (slurmrest) runs it too
    return {"job_path": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "workspace_bind": "127.0.0.1"}


@contextlib.contextmanager
def jupyter_server(*, base_url: str, token: str, scratch: Path) -> Iterator[int]:
    """Jupyter Server on 127.0.0.1 under ``base_url`` accepting only ``token``: its port.
    Its files, config, data and runtime directories are under ``scratch``."""
    root = scratch / "root"
    for name in ("root", "config", "data", "runtime", "ipython"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    env = os.environ | {
        "JUPYTER_CONFIG_DIR": str(scratch / "config"),
        "JUPYTER_DATA_DIR": str(scratch / "data"),
        "JUPYTER_RUNTIME_DIR": str(scratch / "runtime"),
        "IPYTHONDIR": str(scratch / "ipython"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    port = free_port()
    log = (scratch / "jupyter.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "jupyter_server", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.base_url={base_url}", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            # This machine runs the tests as root; Jupyter refuses that unless told.
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_answering(f"http://127.0.0.1:{port}{base_url}api/status", token, process, scratch)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _wait_answering(url: str, token: str, process: subprocess.Popen, scratch: Path) -> None:
    deadline = time.monotonic() + JUPYTER_START_S
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((scratch / "jupyter.log").read_text()[-3000:])
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError),
            urllib.request.urlopen(request, timeout=2) as answer,
        ):
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"Jupyter Server did not answer {url} in {JUPYTER_START_S:g} s")


class LoopThread:
    """An asyncio event loop on a thread of its own, for servers the tests talk to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@contextlib.contextmanager
def served(app_factory: Callable[[], web.Application], port: int) -> Iterator[LoopThread]:
    """``app_factory()``'s application on 127.0.0.1:``port``, on a loop thread, until the end
    of the block (its cleanup runs then)."""
    loop_thread = LoopThread()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(app_factory(), access_log=None, shutdown_timeout=5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    runner = loop_thread.run(start())
    try:
        yield loop_thread
    finally:
        loop_thread.run(runner.cleanup())
        loop_thread.stop()


class RecordingServer:
    """An HTTP server that answers every request with what it received (method, path,
    headers, body size) as JSON, and echoes WebSocket messages at any path ending in /echo.
    ``requests`` lists what reached it."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.closes: list[int | None] = []  # each echo WebSocket's close code, as it ended

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        seen = {
            "method": request.method,
            "path": request.rel_url.raw_path,
            "query": request.rel_url.raw_query_string,
            "headers": [[name, value] for name, value in request.headers.items()],
        }
        self.requests.append(seen)
        if request.path.endswith("/echo") and request.headers.get("Upgrade", "") == "websocket":
            return await self.echo(request)
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
        return web.Response(
            text=json.dumps(seen | {"body_bytes": size}), content_type="application/json"
        )

    async def echo(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False, max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                if message.data.startswith("close "):
                    await ws.close(code=int(message.data.split()[1]), message=b"asked to")
                    break
                await ws.send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await ws.send_bytes(message.data)
        self.closes.append(ws.close_code)
        return ws


def launch_workspace(world, *, user=None, **fields):
    """A workspace launched through the service by ``user`` (alice by default) in tenant
    vision, project detection, on one a100-80gb GPU with the world's image; ``fields``
    set any other of its ``WorkspaceInput``."""
    from jobs.services.workspaces import WorkspaceInput, workspace_launch

    values = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "flavor": "a100-80gb",
        "gpus": 1,
    }
    return workspace_launch(
        user=user or world.researcher_a, data=WorkspaceInput(**(values | fields))
    )


def workspace_running(world, *, user, host: str, port: int):
    """A workspace of ``user`` in tenant vision, running: launched through the service,
    then its run, a running attempt and its server's address recorded as a backend would."""
    from django.utils import timezone

    from jobs.models import Attempt, AttemptState, Run, RunState, Workspace

    run = launch_workspace(world, user=user, name="debug-loader")
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        state=RunState.RUNNING, cluster=world.cluster, admitted_at=now, started_at=now
    )
    attempt = Attempt.objects.create(
        run=run, number=1, cluster=world.cluster, state=AttemptState.RUNNING, started_at=now
    )
    Workspace.objects.filter(run=run).update(attempt=attempt, host=host, port=port, ready_at=now)
    run.refresh_from_db()
    return run


def session_cookie(user) -> str:
    """A fresh portal session of ``user`` (as after logging in): its cookie's value."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


@contextlib.contextmanager
def proxy_serving(*, host: str = "127.0.0.1", **overrides) -> Iterator[str]:
    """The workspace proxy of Django's settings on 127.0.0.1 (a free port; its public origin
    is that port on ``host``, the name a browser reaches the portal by, so that it sends
    the portal's cookie), with ``overrides`` of its config (and ``activity_every_s`` and
    ``on_loop_sessions`` of its gate): its base URL."""
    import dataclasses

    from portal.workspace_proxy.gate import DjangoGate
    from portal.workspace_proxy.server import proxy_app, proxy_config

    port = free_port()
    base = f"http://{host}:{port}"
    gate_options = {
        k: overrides.pop(k) for k in ["activity_every_s", "on_loop_sessions"] if k in overrides
    }
    config = dataclasses.replace(proxy_config(), public_origin=base, **overrides)
    with served(lambda: proxy_app(config, DjangoGate(**gate_options)), port):
        yield base


def jupyter_api(run, port: int, method: str, path: str, **kwargs):
    """A request to the workspace server of ``run``'s current attempt, with its secret, as
    Gantry's own calls are made (not through the proxy)."""
    import requests

    from jobs.services.workspaces import workspace_base_path, workspace_server_token

    attempt = run.attempts.order_by("-number").first()
    return requests.request(
        method,
        f"http://127.0.0.1:{port}{workspace_base_path(run.pk)}{path}",
        headers={"Authorization": f"token {workspace_server_token(attempt.pk)}"},
        timeout=10,
        **kwargs,
    )


def kernel_execute(run, port: int, kernel_id: str, code: str, *, wait: bool) -> list[str]:
    """Send ``code`` to a kernel of ``run``'s server over its WebSocket (as JupyterLab
    does); with ``wait``, the text it printed once it is idle again, else nothing (it keeps
    running, busy)."""
    import uuid

    import websocket

    from jobs.services.workspaces import workspace_base_path, workspace_server_token

    attempt = run.attempts.order_by("-number").first()
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}{workspace_base_path(run.pk)}api/kernels/{kernel_id}/channels",
        header=[f"Authorization: token {workspace_server_token(attempt.pk)}"],
        timeout=30,
    )
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "username": "test",
        "session": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "version": "5.3",
    }
    content = {"code": code, "silent": False, "store_history": False}
    ws.send(
        json.dumps(
            {
                "header": header,
                "parent_header": {},
                "metadata": {},
                "content": content,
                "channel": "shell",
            }
        )
    )
    printed: list[str] = []
    try:
        while True:
            message = json.loads(ws.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = message["header"]["msg_type"]
            if kind == "stream":
                printed.append(message["content"]["text"])
            if kind == "status":
                state = message["content"]["execution_state"]
                if (state == "busy" and not wait) or state == "idle":
                    return printed
    finally:
        ws.close()


def run_coroutine(coroutine):
    """``asyncio.run`` on a thread of its own: the test's thread may already run an event
    loop (Playwright's sync API keeps one there once a browser test ran in this process)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
