"""``gantry-workspace``: what a workspace's job runs on its node (docs/workspaces.md,
"Backends").

It starts the workspace's server on a free port of the node, with the secret only Gantry's
proxy sends as the one the server accepts, waits until the server answers, and reports the
port to Gantry with the attempt's token (JupyterHub batchspawner's pattern). It never
reports a host: Gantry asks the cluster where the job runs. Then it waits for the server and
exits with its status; SIGTERM, SIGINT and SIGHUP are passed on to the server.

Environment, set by Gantry's backend: ``GANTRY_API_URL``, ``GANTRY_ATTEMPT_TOKEN``,
``GANTRY_WORKSPACE_TOKEN``, ``GANTRY_WORKSPACE_BASE_URL``; ``GANTRY_WORKSPACE_BIND`` (the
address to listen on, default 0.0.0.0), ``GANTRY_WORKSPACE_PORT`` (a port the backend fixes,
Kubernetes; default a free one) and ``GANTRY_WORKSPACE_START_TIMEOUT_S`` (default 240).

Exit status: the server's; 2 for a wrong environment, a server this node cannot run or a
refused report; 3 when the server never answered.

Standard library only, like the rest of the SDK; the server itself (JupyterLab) must be
installed where the job runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SERVERS = ("jupyter", "vscode")
REPORT_PATH = "/attempts/workspace/"
DEFAULT_START_TIMEOUT_S = 240.0
# A port picked free can be taken by another process before the server binds it: the
# server then exits at once (port_retries=0) and another free port is tried.
BIND_TRIES = 3
REPORT_GIVE_UP_S = 120.0
EXIT_SETUP = 2
EXIT_NEVER_ANSWERED = 3
REQUIRED_ENV = (
    "GANTRY_API_URL",
    "GANTRY_ATTEMPT_TOKEN",
    "GANTRY_WORKSPACE_TOKEN",
    "GANTRY_WORKSPACE_BASE_URL",
)
CODE_SERVER_MISSING = (
    "VS Code workspaces (code-server) are not available: code-server needs Node 24, and "
    "it runs under a path-stripping proxy with a password login, not under Gantry's "
    "base URL with a token (docs/workspaces.md)"
)


class SetupError(Exception):
    """The job cannot run a workspace here: a wrong environment or a missing server."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the token's header to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def say(message: str) -> None:
    print(f"gantry-workspace: {message}", file=sys.stderr, flush=True)


def free_port(host: str) -> int:
    """A port nothing listens on now at ``host`` (the kernel's choice)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def connect_host(bind: str) -> str:
    """Where this process reaches a server listening on ``bind``."""
    if bind in ("0.0.0.0", ""):  # noqa: S104 (a comparison, not a bind)
        return "127.0.0.1"
    if bind == "::":
        return "::1"
    return bind


def server_command(server: str, *, bind: str, port: int, base_url: str, root: str) -> list[str]:
    """The server's command line. The secret is not on it (``ps`` shows command lines): it
    reaches Jupyter as JUPYTER_TOKEN in the environment."""
    if server != "jupyter":
        raise SetupError(CODE_SERVER_MISSING)
    if importlib.util.find_spec("jupyterlab") is not None:
        program = [sys.executable, "-m", "jupyterlab"]
    elif shutil.which("jupyter"):
        program = [str(shutil.which("jupyter")), "lab"]
    else:
        raise SetupError("JupyterLab is not installed where the job runs (pip install jupyterlab)")
    command = [
        *program,
        "--no-browser",
        f"--ServerApp.ip={bind}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={base_url}",
        # Gantry's proxy reaches it by the node's address: its Host is not a local name. The
        # token still guards it; only the proxy has it.
        "--ServerApp.allow_remote_access=True",
        f"--ServerApp.root_dir={root}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    return command


def server_environment(environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: the job's, with the secret as JUPYTER_TOKEN only."""
    env = dict(environ)
    env["JUPYTER_TOKEN"] = env.pop("GANTRY_WORKSPACE_TOKEN")
    return env


def answers(url: str, token: str, *, timeout: float = 2.0) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": "token " + token})  # noqa: S310
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until_answers(
    process: subprocess.Popen, url: str, token: str, *, timeout: float
) -> bool | None:
    """True once the server answers ``url`` with 200; False if it exited first; None if it
    did not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if answers(url, token):
            return True
        time.sleep(0.25)
    return None


def report_port(api_url: str, attempt_token: str, port: int, *, give_up_s: float) -> str:
    """POST the port to Gantry; "" once accepted, else why not. Retried while Gantry cannot
    answer or asks to come back (no answer, 429, 5xx), up to ``give_up_s`` seconds."""
    body = json.dumps({"port": port}).encode()
    deadline = time.monotonic() + give_up_s
    pause = 0.5
    while True:
        request = urllib.request.Request(  # noqa: S310 (Gantry's own URL, from the backend)
            api_url.rstrip("/") + REPORT_PATH,
            data=body,
            method="POST",
            headers={
                "Authorization": "Attempt " + attempt_token,
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        why = ""
        retry = True
        try:
            with _OPENER.open(request, timeout=10) as response:
                response.read(65536)
                return ""
        except urllib.error.HTTPError as exc:
            why = f"HTTP {exc.code}: {exc.read(2000).decode('utf-8', 'replace')}"
            retry = exc.code == 429 or exc.code >= 500
        except (urllib.error.URLError, OSError, ValueError) as exc:
            why = f"no answer from {api_url}: {exc}"
        if not retry or time.monotonic() + pause > deadline:
            return why
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


def _hold(path: str) -> None:
    """Wait until ``path`` exists: the simulator starts the job's process at submit (only
    then does it hold the secrets) and creates the file when it gives the job its GPUs."""
    while not os.path.exists(path):
        time.sleep(0.1)


def _stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(server: str, environ: dict[str, str]) -> int:
    missing = [name for name in REQUIRED_ENV if not environ.get(name)]
    if missing:
        raise SetupError(f"not set: {', '.join(missing)} (Gantry's backend sets them)")
    base_url = environ["GANTRY_WORKSPACE_BASE_URL"]
    bind = environ.get("GANTRY_WORKSPACE_BIND") or "0.0.0.0"  # noqa: S104 (the node's network)
    fixed = environ.get("GANTRY_WORKSPACE_PORT", "")
    if fixed and not (fixed.isdigit() and 1024 <= int(fixed) <= 65535):
        raise SetupError(f"GANTRY_WORKSPACE_PORT {fixed!r} is not a port from 1024 to 65535")
    try:
        timeout = float(environ.get("GANTRY_WORKSPACE_START_TIMEOUT_S") or DEFAULT_START_TIMEOUT_S)
    except ValueError:
        raise SetupError("GANTRY_WORKSPACE_START_TIMEOUT_S is not a number") from None
    token = environ["GANTRY_WORKSPACE_TOKEN"]
    env = server_environment(environ)
    # The workspace's own directory where the backend names one (Slurm: the same for each
    # of its attempts, so a resumed workspace finds its files), else where the job runs.
    root = environ.get("GANTRY_WORKSPACE_HOME") or os.getcwd()
    os.makedirs(root, mode=0o700, exist_ok=True)
    for attempt in range(1, BIND_TRIES + 1):
        port = int(fixed) if fixed else free_port(bind)
        command = server_command(server, bind=bind, port=port, base_url=base_url, root=root)
        say(f"starting {server} on {bind}:{port}{base_url}")
        process = subprocess.Popen(command, env=env)  # noqa: S603 (a fixed program)
        _pass_signals_to(process)
        status_url = f"http://{_url_host(connect_host(bind))}:{port}{base_url}api/status"
        answered = wait_until_answers(process, status_url, token, timeout=timeout)
        if answered:
            break
        if answered is None:
            say(f"the server did not answer within {timeout:g} s")
            _stop(process)
            return EXIT_NEVER_ANSWERED
        if fixed or attempt == BIND_TRIES:
            say(f"the server exited with status {process.returncode} before it answered")
            return process.returncode or EXIT_NEVER_ANSWERED
        say(f"the server exited before it answered (port {port} taken?): trying another port")
    refused = report_port(
        environ["GANTRY_API_URL"], environ["GANTRY_ATTEMPT_TOKEN"], port, give_up_s=REPORT_GIVE_UP_S
    )
    if refused:
        say(f"Gantry did not take the address: {refused}")
        _stop(process)
        return EXIT_SETUP
    say(f"ready: port {port} reported to Gantry")
    return exit_code(process.wait())


def exit_code(returncode: int) -> int:
    """The server's status as a shell reports it: 128 + N for a server killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _pass_signals_to(process: subprocess.Popen) -> None:
    def forward(signum, frame):
        if process.poll() is None:
            process.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gantry-workspace", description="Start a Gantry workspace's server on this node."
    )
    parser.add_argument("server", choices=SERVERS)
    parser.add_argument(
        "--start-when-exists",
        metavar="PATH",
        default="",
        help="wait until PATH exists before starting (the simulator's GPU allocation)",
    )
    args = parser.parse_args(argv)
    if args.start_when_exists:
        _hold(args.start_when_exists)
    try:
        return run(args.server, dict(os.environ))
    except SetupError as exc:
        say(str(exc))
        return EXIT_SETUP


if __name__ == "__main__":
    sys.exit(main())
