"""``make run``: Gantry on its embedded default, in one command.

Migrates the SQLite database, seeds the demo once, empties the metric files of earlier
processes (``manage.py prepare_run``, one process), then runs gunicorn, a Celery worker,
Celery beat and the workspace proxy as real processes on the filesystem broker (no server to
install).
Ctrl-C (or SIGTERM) stops every process it started; data stays in ``GANTRY_DATA_DIR``.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from portal.env import env_bool

STOP_GRACE_S = 10


def _env() -> dict[str, str]:
    env = os.environ.copy()
    env["GANTRY_EMBEDDED"] = "1"
    env.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    return env


def _commands(env: dict[str, str]) -> dict[str, list[str]]:
    python = sys.executable
    bind = f"{env.get('GANTRY_BIND', '127.0.0.1')}:{env.get('GANTRY_PORT', '8000')}"
    return {
        # --preload: Django starts once, in gunicorn's master, and both workers fork from it
        # (a start of Django costs ~1.5 s of CPU, paid while the worker and beat start too).
        "web": [
            python, "-m", "gunicorn", "portal.wsgi:application",
            "--bind", bind, "--workers", "2", "--threads", "4", "--preload",
            "--access-logfile", "-", "--graceful-timeout", "5",
        ],
        "worker": [
            python, "-m", "celery", "-A", "portal", "worker",
            "--loglevel", "INFO", "--concurrency", "2", "--without-mingle", "--without-gossip",
        ],
        # Its lock and last runs are in GANTRY_DATA_DIR/beat (portal/beat.py).
        "beat": [python, "-m", "celery", "-A", "portal", "beat", "--loglevel", "INFO"],
        # On GANTRY_WORKSPACE_PROXY_PORT (default GANTRY_PORT + 1), loopback only.
        "proxy": [python, "-m", "portal.workspace_proxy"],
    }  # fmt: skip


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], env=env, check=True)


def _stop(processes: dict[str, subprocess.Popen]) -> None:
    # SIGTERM to each leader lets gunicorn and Celery shut down warmly; whatever is left of a
    # process group after the grace period is killed.
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def main() -> int:
    os.chdir(Path(__file__).resolve().parent.parent)
    env = _env()
    # migrate, seed_demo and metrics_reset in one process: each start of Django costs seconds.
    _manage(env, "prepare_run", "--speedup", env.get("GANTRY_SIM_SPEEDUP", "30"))

    stopping = False

    def request_stop(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    # Each child leads its own process group, so stopping one stops everything it forked.
    processes = {
        name: subprocess.Popen(command, env=env, start_new_session=True)
        for name, command in _commands(env).items()
    }
    port = env.get("GANTRY_PORT", "8000")
    # migrate has already read the settings, so a malformed GANTRY_DEBUG stopped us there.
    debug = "on (GANTRY_DEBUG)" if env_bool("GANTRY_DEBUG", default=False) else "off"
    print(
        f"\nGantry is running on http://127.0.0.1:{port}/  (Ctrl-C stops everything)"
        f"\nDjango debug pages: {debug}\n",
        flush=True,
    )
    exit_code = 0
    while not stopping:
        for name, process in processes.items():
            if process.poll() is not None:
                print(f"{name} exited with code {process.returncode}; stopping", file=sys.stderr)
                stopping, exit_code = True, 1
        time.sleep(0.5)
    _stop(processes)
    print("Gantry stopped.")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
