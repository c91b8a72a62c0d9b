"""Machinery of the crash tests (tests/portal/test_crash_recovery.py, tests/portal/test_chaos.py):
waiting, processes of our own to ``kill -9`` and start again, Celery workers and beats, and
kill points inside a worker so that a kill lands at a chosen step of a submit.

``python -m tests.crash_support worker [CELERY WORKER OPTIONS]`` runs a Celery worker; with
``GANTRY_CRASH_KILL_POINTS`` set to a directory, every worker process waits at the kill
point the test armed there.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELIABILITY_DOC = ROOT / "docs" / "reliability.md"
SECTION = "## Crashes and outages"

# --- waiting and processes -------------------------------------------------------------------


def wait_until(predicate: Callable, *, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until it returns something true; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


class Process:
    """A process of ours in its own session (so ``kill`` reaches everything it started),
    with its output appended to a log file."""

    def __init__(self, argv: list[str], *, env: dict, log_path: Path):
        self.argv, self.env, self.log_path = argv, env, log_path
        self.popen: subprocess.Popen | None = None
        # Every start (its session id and its leader's start time), for stop() to leave
        # nothing behind.
        self.sessions: list[tuple[int, str | None]] = []
        self.log_offset = 0
        self._cpu_of_killed_s = 0.0

    def start(self) -> "Process":
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("a") as log:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.sessions.append((self.popen.pid, _start_time(self.popen.pid)))
        return self

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_since_start(self) -> str:
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode("utf-8", "replace")

    def cpu_s(self) -> float:
        """CPU seconds used by every start so far (of a killed one, until its kill)."""
        return self._cpu_of_killed_s + (session_cpu_s(self.popen.pid) if self.alive else 0.0)

    def kill(self) -> None:
        """``kill -9`` the process and every process it started."""
        self._cpu_of_killed_s += session_cpu_s(self.popen.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self, *, timeout: float = 20) -> None:
        """SIGTERM, then SIGKILL for whatever of any of its starts is still there."""
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        for session, started in self.sessions:
            leader = _start_time(session)
            if leader is not None and leader != started:
                # The id went to another process (ids wrap): this session has no process
                # left, or the id could not have been given again. Never kill a stranger
                # (a slurmrestd of the Slurm tests, say: a session leader too).
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session, signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def tree_cpu_s(root: int, *, by: int = 1) -> float:
    """CPU seconds of the processes whose field ``by`` of their stat is ``root`` (1: the
    parent, 3: the session), and of ``root`` itself, each with its reaped children's."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields and (int(entry.name) == root or int(fields[by]) == root):
            total += sum(int(value) for value in fields[11:15])  # u, s, cu, cs time
    return total / tick


def session_cpu_s(session: int) -> float:
    return tree_cpu_s(session, by=3)


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def gantry_env(*, database_url: str, broker_url: str, data_dir: Path, **extra: str) -> dict:
    """The environment of a Gantry process: tests.settings on the given servers, with the
    admission cycle and the backend sync every second (as test_integration does)."""
    return os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker_url,
        "GANTRY_DATA_DIR": str(data_dir),
        "GANTRY_ADMISSION_INTERVAL_S": "1",
        "GANTRY_SYNC_INTERVAL_S": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


WORKER_OPTIONS = [
    "--without-mingle",
    "--without-gossip",
    "--without-heartbeat",
    "--loglevel",
    "INFO",
]


def celery_worker(*, env: dict, log_path: Path, concurrency: int, kill_points: bool) -> Process:
    """A prefork worker: ``kill_points`` runs it through this module's launcher.

    The parent notices a killed pool process at once or, often, only at its pool
    maintenance (every 5 s); until then the dead process's message counts against the
    worker's prefetch, so that worker takes no other message. Hence several small workers.
    """
    options = ["--pool", "prefork", "--concurrency", str(concurrency), *WORKER_OPTIONS]
    if kill_points:
        argv = [sys.executable, "-m", "tests.crash_support", "worker", *options]
    else:
        argv = [sys.executable, "-m", "celery", "-A", "portal", "worker", *options]
    return Process(argv, env=env, log_path=log_path)


def celery_beat(*, env: dict, log_path: Path) -> Process:
    """A beat: it leads, or stands by while another leads (portal/beat.py)."""
    argv = [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "INFO"]
    return Process(argv, env=env, log_path=log_path)


def wait_ready(worker: Process, *, timeout: float = 60) -> None:
    wait_until(
        lambda: "ready." in worker.log_since_start() or not worker.alive,
        timeout=timeout,
        what="the Celery worker to be ready",
    )
    assert worker.alive, worker.log_since_start()[-3000:]


# --- kill points -------------------------------------------------------------------------------

KILL_POINTS_ENV = "GANTRY_CRASH_KILL_POINTS"
# Where a kill can be aimed inside a submit: before the backend call (the attempt is
# claimed, no job yet), after it (the job exists, Gantry has not recorded it), after the
# task's work and before the broker's ack, or anywhere (no wait: the kill follows at a
# random delay wherever the worker then is).
PHASES = ("before_backend", "after_backend", "before_ack", "anywhere")
# A worker waits this long at an armed kill point; the test kills it well before.
KILL_POINT_WAIT_S = 15.0


@dataclass(frozen=True)
class Reached:
    seq: int
    phase: str
    attempt_id: int
    pid: int


class KillPoints:
    """Worker side. The test plans one kill per run: file ``plan-<experiment name>`` holds a
    sequence number, a phase and how long to wait there. The worker process that reaches
    that phase of that run's submit claims the kill by renaming the file (so no other
    process, and no redelivery, stops for it again), says where it is in ``reached`` and
    waits."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._run_names: dict[int, str] = {}

    def _run_name(self, attempt_id: int) -> str:
        if attempt_id not in self._run_names:
            from jobs.models import Attempt

            name = Attempt.objects.filter(pk=attempt_id).values_list(
                "run__experiment__name", flat=True
            )
            self._run_names[attempt_id] = name.first() or ""
        return self._run_names[attempt_id]

    def reach(self, phase: str, attempt_id: int) -> None:
        if not any(self.directory.glob("plan-*")):
            return  # nothing armed: no need to ask the database for the run's name
        plan = self.directory / f"plan-{self._run_name(attempt_id)}"
        try:
            seq, planned, wait_s = plan.read_text().split()
        except (FileNotFoundError, ValueError):
            return
        if planned != phase:
            return
        try:
            os.rename(plan, self.directory / f"claimed-{seq}")
        except FileNotFoundError:
            return  # another worker process claimed it first
        line = f"{seq} {phase} {attempt_id} {os.getpid()} {time.time():.3f}\n".encode()
        fd = os.open(self.directory / "reached", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        time.sleep(float(wait_s))


class _BackendWithKillPoints:
    """A backend whose submit passes the kill points before and after the real call."""

    def __init__(self, backend, points: KillPoints):
        self._backend, self._points = backend, points

    def submit(self, spec, *, may_exist=True):
        self._points.reach("before_backend", spec.attempt_id)
        job_id = self._backend.submit(spec, may_exist=may_exist)
        self._points.reach("after_backend", spec.attempt_id)
        return job_id

    def __getattr__(self, name):
        return getattr(self._backend, name)


def install_kill_points(directory: Path) -> None:
    """In a worker (before its pool forks): route submits through the kill points."""
    from celery.signals import task_postrun, task_prerun

    from jobs.services import backend_submit, backend_sync

    points = KillPoints(directory)
    for module in (backend_submit, backend_sync):
        real = module.backend_for
        module.backend_for = lambda cluster, real=real: _BackendWithKillPoints(
            real(cluster), points
        )

    def is_submit(sender) -> bool:
        return getattr(sender, "name", "") == "jobs.tasks.attempt_submit"

    @task_prerun.connect(weak=False)
    def anywhere(sender=None, args=(), **kwargs):
        if is_submit(sender):
            points.reach("anywhere", args[0])

    @task_postrun.connect(weak=False)
    def before_ack(sender=None, args=(), **kwargs):
        # With acks_late the message is acknowledged after this, by the pool's parent.
        if is_submit(sender):
            points.reach("before_ack", args[0])


class KillSwitch:
    """Test side of the kill points."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def plan(self, seq: int, phase: str, run_name: str, *, wait_s: float | None = None) -> None:
        """Stop the submit of run ``run_name`` at ``phase``: for ``wait_s`` seconds, or
        until killed ("anywhere" does not wait: the kill follows at a random delay)."""
        if wait_s is None:
            wait_s = 0 if phase == "anywhere" else KILL_POINT_WAIT_S
        staged = self.directory / "plan.new"
        staged.write_text(f"{seq} {phase} {wait_s}")
        os.replace(staged, self.directory / f"plan-{run_name}")

    def cancel_plans(self) -> None:
        for plan in self.directory.glob("plan-*"):
            plan.unlink(missing_ok=True)

    def reached(self) -> list[Reached]:
        try:
            lines = (self.directory / "reached").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [
            Reached(int(seq), phase, int(attempt_id), int(pid))
            for seq, phase, attempt_id, pid, _ in (line.split() for line in lines)
        ]


# --- subcommands ------------------------------------------------------------------------------


def _worker(argv: list[str]) -> None:
    import django

    django.setup()
    # Load the backends before the pool forks, down to the Kubernetes API classes the client
    # imports on first use: a new pool process (there is one after every kill) would
    # otherwise spend seconds building them before its first Kubernetes call.
    from kubernetes import client

    import clusters.backends.kubernetes
    import clusters.backends.simulator  # noqa: F401
    from portal.celery import app

    for api in ("BatchV1Api", "CoreV1Api", "CustomObjectsApi"):
        getattr(client, api)

    directory = os.environ.get(KILL_POINTS_ENV)
    if directory:
        install_kill_points(Path(directory))
    app.worker_main(["worker", *argv])


def main(argv: list[str]) -> None:
    if argv[:1] != ["worker"]:
        raise SystemExit("usage: python -m tests.crash_support worker [CELERY WORKER OPTIONS]")
    _worker(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
