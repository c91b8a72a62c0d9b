"""A real Jupyter Server for the workspace tests, as a workspace's launcher starts it: on
127.0.0.1, under the workspace's base path, accepting only the attempt's secret."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import requests
import websocket
from django.utils import timezone

from jobs.models import Attempt, AttemptState, Run, RunState, Workspace
from jobs.services.workspaces import (
    WorkspaceInput,
    workspace_base_path,
    workspace_launch,
    workspace_server_token,
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class JupyterServer:
    process: subprocess.Popen
    port: int
    base_path: str
    token: str
    root: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.base_path}"

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}"}
        return requests.request(method, f"{self.url}{path}", headers=headers, timeout=10, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def jupyter_server_start(*, root: Path, base_path: str, token: str) -> JupyterServer:
    """Start ``jupyter server`` and wait until it answers with the token."""
    port = free_port()
    env = {
        **os.environ,
        "JUPYTER_TOKEN": token,
        "JUPYTER_CONFIG_DIR": str(root / ".jupyter"),
        "JUPYTER_DATA_DIR": str(root / ".jupyter-data"),
        "JUPYTER_RUNTIME_DIR": str(root / ".jupyter-runtime"),
        "IPYTHONDIR": str(root / ".ipython"),
    }
    (root / "files").mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            sys.executable, "-m", "jupyter", "server", "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.base_url={base_path}", f"--ServerApp.root_dir={root / 'files'}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    server = JupyterServer(process, port, base_path, token, root)
    deadline = time.monotonic() + 60
    while True:
        try:
            if server.api("GET", "api/status").status_code == 200:
                return server
        except requests.ConnectionError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"jupyter server did not come up (exit {process.poll()})")
        time.sleep(0.2)


def running_workspace(world, *, port: int, hours: int = 4) -> Run:
    """A workspace whose first attempt runs on sim-1 and whose server answers on ``port``."""
    data = WorkspaceInput(
        tenant="vision",
        project="detection",
        image=world.image.reference,
        flavor="a100-80gb",
        gpus=1,
        name="notebook",
        hours=hours,
    )
    run = workspace_launch(user=world.researcher_a, data=data)
    now = timezone.now()
    attempt = Attempt.objects.create(
        run=run,
        number=1,
        cluster=world.cluster,
        state=AttemptState.RUNNING,
        submitted_at=now - timedelta(minutes=1),
        started_at=now - timedelta(minutes=1),
        node_list=["a100-01"],
    )
    Run.objects.filter(pk=run.pk).update(
        state=RunState.RUNNING, cluster=world.cluster, started_at=attempt.started_at
    )
    Workspace.objects.filter(run=run).update(
        attempt=attempt, host="127.0.0.1", port=port, ready_at=now
    )
    run.refresh_from_db()
    return run


def kernel_execute(server: JupyterServer, kernel_id: str, code: str, *, wait: bool) -> list[str]:
    """Send ``code`` to the kernel over its WebSocket (as JupyterLab does); with ``wait``,
    the text it printed once it is idle again, else nothing (it keeps running)."""
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{server.port}{server.base_path}api/kernels/{kernel_id}/channels",
        header=[f"Authorization: token {server.token}"],
        timeout=30,
    )
    msg_id = uuid.uuid4().hex
    ws.send(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "username": "test",
                    "session": uuid.uuid4().hex,
                    "msg_type": "execute_request",
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "content": {"code": code, "silent": False, "store_history": False},
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
            if kind == "status" and message["content"]["execution_state"] == "busy" and not wait:
                return printed
            if kind == "status" and message["content"]["execution_state"] == "idle":
                return printed
    finally:
        ws.close()


def server_for(run: Run, root: Path) -> JupyterServer:
    """Start the server the run's current attempt would run, and point its workspace at it."""
    attempt = run.attempts.order_by("-number").first()
    assert attempt is not None
    server = jupyter_server_start(
        root=root, base_path=workspace_base_path(run.pk), token=workspace_server_token(attempt.pk)
    )
    Workspace.objects.filter(run=run).update(port=server.port)
    return server
