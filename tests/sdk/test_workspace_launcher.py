"""``gantry-workspace`` (sdk/gantry_sdk/workspace.py) run as the job runs it, against a
real JupyterLab and a stand-in for the portal's endpoint on 127.0.0.1: what it refuses to
start, what it reports, and that a refused report stops the server."""

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests import REPOSITORY

SDK_DIR = REPOSITORY / "sdk"
SECRET = "s" * 64
ATTEMPT_TOKEN = "gat_5.attempt-secret"


class Portal:
    """Answers the launcher's report with ``status`` and records what it received."""

    def __init__(self, status: int):
        self.received: list[tuple[str, str, dict]] = []
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                portal.received.append((self.path, self.headers["Authorization"], body))
                answer = json.dumps({"detail": "Run 5 is not a workspace."}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def portal_refusing():
    portal = Portal(409)
    yield portal
    portal.close()


def launch(args: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": str(cwd), "PYTHONPATH": str(SDK_DIR)}
    return subprocess.run(
        [sys.executable, "-m", "gantry_sdk.workspace", *args],
        env=base | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def job_env(api_url: str, **overrides) -> dict[str, str]:
    return {
        "GANTRY_API_URL": api_url,
        "GANTRY_ATTEMPT_TOKEN": ATTEMPT_TOKEN,
        "GANTRY_WORKSPACE_TOKEN": SECRET,
        "GANTRY_WORKSPACE_BASE_URL": "/w/5/",
        "GANTRY_WORKSPACE_BIND": "127.0.0.1",
        **overrides,
    }


def test_a_job_without_gantrys_variables_or_with_vscode_does_not_start(tmp_path):
    done = launch(["jupyter"], {}, tmp_path)
    assert (done.returncode, done.stderr) == (
        2,
        "gantry-workspace: not set: GANTRY_API_URL, GANTRY_ATTEMPT_TOKEN, "
        "GANTRY_WORKSPACE_TOKEN, GANTRY_WORKSPACE_BASE_URL (Gantry's backend sets them)\n",
    )
    done = launch(["vscode"], job_env("http://127.0.0.1:9/api/v1"), tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(
        "gantry-workspace: VS Code workspaces (code-server) are not available: code-server "
        "needs Node 24"
    )
    done = launch(
        ["jupyter"], job_env("http://127.0.0.1:9/api/v1", GANTRY_WORKSPACE_PORT="80"), tmp_path
    )
    assert (done.returncode, done.stderr) == (
        2,
        "gantry-workspace: GANTRY_WORKSPACE_PORT '80' is not a port from 1024 to 65535\n",
    )


def test_a_port_that_is_taken_is_an_error_not_another_port(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = job_env("http://127.0.0.1:9/api/v1", GANTRY_WORKSPACE_PORT=str(port))
        done = launch(["jupyter"], env, tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "gantry-workspace: the server exited with status 1 before it answered"
    )


def test_it_reports_the_port_only_and_stops_the_server_when_gantry_refuses(
    tmp_path, portal_refusing
):
    env = job_env(portal_refusing.url, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    done = launch(["jupyter"], env, tmp_path)
    assert done.returncode == 2
    ((path, authorization, body),) = portal_refusing.received
    assert (path, authorization, list(body)) == (
        "/api/v1/attempts/workspace/",
        f"Attempt {ATTEMPT_TOKEN}",
        ["port"],
    )
    port = body["port"]
    assert 1024 <= port <= 65535
    said = [line for line in done.stderr.splitlines() if line.startswith("gantry-workspace:")]
    assert said == [
        f"gantry-workspace: starting jupyter on 127.0.0.1:{port}/w/5/",
        'gantry-workspace: Gantry did not take the address: HTTP 409: {"detail": "Run 5 is '
        'not a workspace."}',
    ]
    assert SECRET not in done.stderr + done.stdout
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_named_home_is_created_private_and_is_where_the_server_keeps_its_files(
    tmp_path, portal_refusing
):
    home = tmp_path / "workspaces" / "5"
    env = job_env(
        portal_refusing.url,
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        GANTRY_WORKSPACE_HOME=str(home),
    )
    done = launch(["jupyter"], env, tmp_path)
    assert done.returncode == 2  # Gantry refused the address: the server was stopped
    assert (home.is_dir(), home.stat().st_mode & 0o777) == (True, 0o700)
    assert f"Serving notebooks from local directory: {home}" in done.stderr
