"""The simulator's workspaces: a real server process on 127.0.0.1 for each workspace job
(docs/workspaces.md, "Backends"), so the demo opens a real notebook.

The job's process is Gantry's launcher (``gantry_sdk.workspace``), started at submit, the
only moment the job's secrets exist (they are never stored), in a process group of its own.
It holds until the simulator gives the job its GPUs (``start`` creates the file it waits
for), then starts JupyterLab on a free port of 127.0.0.1 and reports the port to Gantry as
on any cluster. The simulator's sync follows it by its pid and start time (the pid alone
could be another process's after a reboot or wrap-around), from any process of Gantry; the
process that started it reaps it and writes its exit status next to its log.

``stop_all`` ends every process this Python process started: tests call it after each test.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings

from clusters.backends.base import JobSpec, job_env
from clusters.job_env import ATTEMPT_TOKEN_ENV, WORKSPACE_BIND_ENV, WORKSPACE_TOKEN_ENV
from clusters.models import SimulatedJob

BIND = "127.0.0.1"
LAUNCHER = "gantry_sdk.workspace"
# What the job's process gets of the worker's environment: nothing else (no database URL,
# no secret key), as a cluster's job would not.
PASSED_ON = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
STOP_GRACE_S = 10.0

_spawned: dict[int, subprocess.Popen] = {}
_spawned_lock = threading.Lock()


def directory() -> Path:
    return Path(settings.DATA_DIR) / "sim-workspaces"


def _paths(name: str) -> tuple[Path, Path, Path]:
    """The job's start file, exit status file and log."""
    base = directory()
    return base / f"{name}.start", base / f"{name}.exit", base / f"{name}.log"


def files_of(run_id: int) -> Path:
    """The workspace's files (its server's root directory), kept across its attempts."""
    return directory() / f"run-{int(run_id)}"


def files_release(run_id: int) -> None:
    """The workspace's files deleted, once it has ended for good (none: nothing to do)."""
    shutil.rmtree(files_of(run_id), ignore_errors=True)


def spec_fields(spec: JobSpec) -> dict[str, Any]:
    """What the job's stored description says of its workspace (never its secret)."""
    if spec.workspace is None:
        return {}
    return {"workspace": {"server": spec.workspace.server, "base_url": spec.workspace.base_url}}


def spawn_for(job: SimulatedJob, spec: JobSpec) -> None:
    """Start the process of a workspace's job just recorded, and record how to find it."""
    assert spec.workspace is not None
    secrets = {ATTEMPT_TOKEN_ENV: spec.attempt_token, WORKSPACE_TOKEN_ENV: spec.workspace.token}
    handle = spawn(
        name=job.name,
        run_id=spec.run_id,
        server=spec.workspace.server,
        env=job_env(spec) | secrets,
    )
    job.profile = {**job.profile, "workspace": {**job.profile["workspace"], **handle}}
    job.save(update_fields=["profile"])


def finish_if_done(job: SimulatedJob, now: datetime) -> None:
    """A workspace's job runs while its process does, up to its time limit (wall time)."""
    assert job.started_at is not None
    handle = job.profile["workspace"]
    if now - job.started_at >= timedelta(seconds=job.max_runtime_s):
        stop(job.name, handle)
        job.state, job.exit_code, job.failure_reason = "FAILED", None, "TIMEOUT"
        job.finished_at = job.started_at + timedelta(seconds=job.max_runtime_s)
        job.message = f"the workspace reached its time limit of {job.max_runtime_s // 60} min"
    else:
        ended, code = exit_status(job.name, handle)
        if not ended:
            return
        job.exit_code, job.finished_at = code, now
        if code == 0:
            job.state, job.failure_reason = "SUCCEEDED", ""
            job.message = "the workspace server was shut down"
        elif code is None:
            job.state, job.failure_reason = "FAILED", "UNKNOWN"
            job.message = "the workspace server is gone (its exit status is unknown)"
        else:
            job.state, job.failure_reason = "FAILED", "USER_EXIT"
            job.message = f"the workspace server exited with status {code}"
    job.save(update_fields=["state", "exit_code", "failure_reason", "finished_at", "message"])


def spawn(*, name: str, run_id: int, server: str, env: dict[str, str]) -> dict[str, int]:
    """Start the launcher of job ``name`` with ``env`` (the job's variables and secrets),
    holding until ``start``; returns how to find it again (pid and start time)."""
    start_file, exit_file, log_path = _paths(name)
    root = files_of(run_id)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in (start_file, exit_file):
        stale.unlink(missing_ok=True)
    sdk = str(Path(settings.BASE_DIR) / "sdk")
    job_env = {key: os.environ[key] for key in PASSED_ON if key in os.environ}
    job_env |= env | {
        WORKSPACE_BIND_ENV: BIND,
        "PYTHONPATH": sdk,
        "JUPYTER_RUNTIME_DIR": str(directory() / f"{name}.runtime"),
    }
    with open(log_path, "ab") as log:
        process = subprocess.Popen(  # noqa: S603 (our own launcher, arguments as a list)
            [sys.executable, "-m", LAUNCHER, server, "--start-when-exists", str(start_file)],
            env=job_env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with _spawned_lock:
        _spawned[process.pid] = process
    threading.Thread(
        target=_reap, args=(process, exit_file), name=f"reap-{name}", daemon=True
    ).start()
    return {"pid": process.pid, "started": _start_ticks(process.pid) or 0}


def _reap(process: subprocess.Popen, exit_file: Path) -> None:
    code = process.wait()
    partial = exit_file.with_suffix(".exit-partial")
    partial.write_text(str(code))
    partial.replace(exit_file)
    with _spawned_lock:
        _spawned.pop(process.pid, None)


def start(name: str) -> None:
    """The job has its GPUs: its launcher starts the server."""
    start_file, _, _ = _paths(name)
    start_file.touch()


def _stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and start time (clock ticks after boot), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _start_ticks(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[1] if stat else None


def _is_it(handle: dict[str, int]) -> bool:
    stat = _stat(int(handle.get("pid", 0))) if handle.get("pid") else None
    return stat is not None and stat[1] == handle.get("started")


def exit_status(name: str, handle: dict[str, int]) -> tuple[bool, int | None]:
    """(ended, exit status): ended with the status its parent recorded, or with None when
    it is gone without one (its parent died first); (False, None) while it lives. A process
    that has exited but is not reaped yet lives until its parent writes its status."""
    _, exit_file, _ = _paths(name)
    try:
        return True, int(exit_file.read_text())
    except (OSError, ValueError):
        pass
    if _is_it(handle):
        return False, None
    return True, None


def stop(name: str, handle: dict[str, int], *, grace: float = STOP_GRACE_S) -> None:
    """End the job's process group: SIGTERM (Jupyter shuts its kernels down), then SIGKILL
    for whatever is left after ``grace`` seconds. Idempotent."""
    start_file, _, _ = _paths(name)
    start_file.unlink(missing_ok=True)
    if not _is_it(handle):
        return
    _kill_group(int(handle["pid"]), grace=grace)


def _kill_group(pgid: int, *, grace: float) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        stat = _stat(pgid)
        if stat is None or stat[0] == "Z":
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def log_tail(name: str, *, lines: int) -> list[str]:
    _, _, log_path = _paths(name)
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def stop_all(*, grace: float = STOP_GRACE_S) -> int:
    """End every workspace process this Python process started and wait until each is
    reaped; returns how many were still running."""
    with _spawned_lock:
        processes = list(_spawned.values())
    running = [process for process in processes if process.poll() is None]
    for process in running:
        _kill_group(process.pid, grace=grace)
    for process in processes:
        process.wait()
    return len(running)
