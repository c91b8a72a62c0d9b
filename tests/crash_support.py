"""Machinery of the crash and outage tests (tests/portal/test_crash_recovery.py).

Real Celery processes to ``kill -9``, kill points inside a worker so that a kill lands at
a chosen step of a submit, throwaway PostgreSQL and Redis servers to restart, a submitting
client that rides out outages, and the figures the tests record for docs/reliability.md.

Subcommands, run in subprocesses (``python -m tests.crash_support …``):

- ``worker [CELERY WORKER OPTIONS]``: a Celery worker; with ``GANTRY_CRASH_KILL_POINTS``
  set to a directory, every worker process waits at the kill point the test armed there;
- ``seed``: the small world of the outage test, in the database of ``DATABASE_URL``;
- ``client --runs N --progress FILE``: submit N runs one after the other, each exactly once
  whatever fails in between;
- ``doc FIGURES.json``: write the figures of a run into the "Crashes and outages" section
  of docs/reliability.md.
"""

import argparse
import contextlib
import json
import os
import shlex
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

    def kill(self) -> None:
        """``kill -9`` the process and every process it started."""
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


def celery_beat(*, env: dict, log_path: Path, schedule: Path) -> Process:
    argv = [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "INFO"]
    return Process([*argv, "--schedule", str(schedule)], env=env, log_path=log_path)


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


# --- throwaway PostgreSQL and Redis ------------------------------------------------------------


def _parse_exports(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export":
            key, _, value = words[1].partition("=")
            values[key] = value
    return values


class ThrowawayServices:
    """PostgreSQL and Redis of our own on private 127.0.0.1 ports, started by
    scripts/test-services.sh (throwaway mode) and restarted here.

    The first servers are the script's daemons. Every restart starts the server as a child
    of this process instead: PID 1 of this machine does not reap orphans, and a killed
    postmaster left as a zombie would still look alive to the next one (its lock file).
    """

    def __init__(self, *, state_dir: Path, database_url: str, broker_url: str, state: dict):
        self.state_dir = state_dir
        self.database_url = database_url
        self.broker_url = broker_url
        self.pg_bindir = Path(state["PG_BINDIR"])
        self.pg_owner = state["PG_OWNER"]
        self.pg_data = Path(state["PG_DATA"])
        self.redis_port = int(state["REDIS_PORT"])
        self.redis_dir = Path(state["REDIS_PIDFILE"]).parent
        self.pg_port = int(database_url.rsplit(":", 1)[1].split("/")[0])
        self.db_name = database_url.rsplit("/", 1)[1]
        self.postgres: subprocess.Popen | None = None
        self.redis: subprocess.Popen | None = None

    @classmethod
    def start(cls, *, db_name: str) -> "ThrowawayServices":
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "GANTRY_TEST_SERVICES_STATE"}
        } | {
            "GANTRY_TEST_SERVICES": "throwaway",
            "GANTRY_TEST_SERVICES_TOOLS": "0",
            "GANTRY_TEST_PRIVATE_PG_PORT": str(free_port()),
            "GANTRY_TEST_PRIVATE_REDIS_PORT": str(free_port()),
            "GANTRY_TEST_DB_NAME": db_name,
            "GANTRY_TEST_REDIS_DB": "0",
        }
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "test-services.sh"), "start"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"test-services.sh start failed:\n{done.stderr[-3000:]}")
        exported = _parse_exports(done.stdout)
        state_dir = Path(exported["GANTRY_TEST_SERVICES_STATE"])
        state = {}
        for line in (state_dir / "state").read_text().splitlines():
            key, _, value = shlex.split(line)[0].partition("=")
            state[key] = value
        return cls(
            state_dir=state_dir,
            database_url=exported["DATABASE_URL"],
            broker_url=exported["CELERY_BROKER_URL"],
            state=state,
        )

    # PostgreSQL

    def connect(self, dbname: str | None = None):
        import psycopg

        return psycopg.connect(
            host="127.0.0.1",
            port=self.pg_port,
            user="postgres",
            dbname=dbname or self.db_name,
            autocommit=True,
            connect_timeout=3,
        )

    def postgres_accepts(self) -> bool:
        try:
            with self.connect() as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:
            return False

    def _as_owner(self) -> dict:
        if os.geteuid() != 0:
            return {}
        import pwd

        entry = pwd.getpwnam(self.pg_owner)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def postgres_stop(self) -> None:
        """A clean stop (``pg_ctl stop -m fast``): sessions are told and closed."""
        subprocess.run(
            [str(self.pg_bindir / "pg_ctl"), "-D", str(self.pg_data), "-m", "fast", "-w", "stop"],
            cwd=self.pg_data.parent,
            check=True,
            capture_output=True,
            timeout=60,
            **self._as_owner(),
        )
        if self.postgres is not None:
            self.postgres.wait(timeout=30)
            self.postgres = None

    def postgres_kill(self) -> None:
        """``kill -9`` the postmaster and every server process: a crash, then recovery."""
        assert self.postgres is not None, "kill only a postmaster we started (see class doc)"
        postmaster = self.postgres.pid
        os.kill(postmaster, signal.SIGSTOP)  # no new server process from here on
        for pid in child_pids(postmaster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.kill(postmaster, signal.SIGKILL)
        self.postgres.wait(timeout=30)
        self.postgres = None

    def postgres_start(self) -> None:
        """Start the server again with the options it last ran with, as our child."""
        options = shlex.split((self.pg_data / "postmaster.opts").read_text())
        log = (self.state_dir / "postgres-restarts.log").open("a")
        with log:
            self.postgres = subprocess.Popen(
                options,
                cwd=self.pg_data.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._as_owner(),
            )
        wait_until(self.postgres_accepts, timeout=60, what="PostgreSQL to accept connections")

    # Redis

    def redis_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.redis_port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def redis_stop(self) -> None:
        """A clean stop (SIGTERM). This Redis keeps nothing on disk: its queues are lost."""
        if self.redis is not None:
            self.redis.terminate()
            self.redis.wait(timeout=30)
            self.redis = None
        else:
            pid = int((self.redis_dir / "redis.pid").read_text())
            os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not self.redis_answers(), timeout=30, what="Redis to stop")

    def redis_start(self) -> None:
        # The options of scripts/test-services.sh, in the foreground.
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.redis_dir),
                "--pidfile",
                str(self.redis_dir / "redis.pid"),
                "--logfile",
                str(self.redis_dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self.redis_answers, timeout=30, what="Redis to answer")

    def stop(self) -> None:
        """Stop everything, ours first (so that we reap it), then what the script started."""
        if self.redis is not None:
            self.redis_stop()
        if self.postgres is not None:
            self.postgres_stop()
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "test-services.sh"), "stop", str(self.state_dir)],
            capture_output=True,
            timeout=120,
        )


def clone_schema(*, source: dict, target: ThrowawayServices) -> None:
    """The tables of an already migrated database (``source``: Django connection settings)
    into the throwaway one: a second ``migrate`` would cost seconds for the same schema."""
    env = os.environ | {"PGPASSWORD": source.get("PASSWORD") or ""}
    dump = subprocess.run(
        [
            str(target.pg_bindir / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "-h",
            source["HOST"] or "127.0.0.1",
            "-p",
            str(source["PORT"] or 5432),
            "-U",
            source["USER"] or "postgres",
            source["NAME"],
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [
            str(target.pg_bindir / "psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(target.pg_port),
            "-U",
            "postgres",
            target.db_name,
        ],
        input=dump.stdout,
        check=True,
        capture_output=True,
        timeout=120,
    )


# --- figures -------------------------------------------------------------------------------------


def figures_path(default_dir: Path) -> Path:
    """Where the tests write their figures: $GANTRY_RELIABILITY_FIGURES (a JSON file, for
    ``python -m tests.crash_support doc``), else a file in pytest's temporary directory."""
    configured = os.environ.get("GANTRY_RELIABILITY_FIGURES")
    return Path(configured) if configured else default_dir / "crash-figures.json"


def measured_on() -> dict:
    import platform
    from datetime import UTC, datetime

    import celery

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, Python "
        f"{platform.python_version()}, Celery {celery.__version__}",
    }


def record_figures(path: Path, scenario: str, figures: dict) -> None:
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[scenario] = figures | measured_on()
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
    print(f"\n[{scenario}] " + json.dumps(figures, sort_keys=True))


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def render_section(figures: dict) -> str:
    kills = figures["worker_kills"]
    restarts = figures["server_restarts"]
    outage = figures["backend_outage"]
    phases = ", ".join(f"{n} {phase}" for phase, n in sorted(kills["kills_by_phase"].items()))
    errors = ", ".join(f"{n} {kind}" for kind, n in sorted(restarts["client_errors"].items()))
    lines = [
        SECTION,
        "",
        "Three scenarios with real processes, in `tests/portal/test_crash_recovery.py` (marked",
        "`integration`, part of `make test`, 2.5 to 3 minutes together). Each ends with exact",
        "counts read from the backends themselves (the simulator's job table; the Kubernetes",
        "API, listed over HTTP by the official client) and from the database, and fails on any",
        "difference. The tests write their figures to `$GANTRY_RELIABILITY_FIGURES` (a JSON",
        "file); `python -m tests.crash_support doc FIGURES.json` writes them here. These are",
        f"from a run on {kills['date']} ({kills['machine']}),",
        "shared with other work.",
        "",
        "### kill -9 of the Celery worker during submits",
        "",
        f"Four workers of one pool process each, and beat. {kills['runs']} runs, one after the",
        "other, alternately on the simulator and on Kubernetes (the fake API server of",
        "`tests/k8s_fake`). The submit of every run is killed once, with SIGKILL, at a point",
        f"chosen by a seeded random generator (seed {kills['seed']}): before the backend call",
        "(attempt claimed, no job yet), after it (the job exists, Gantry has not recorded it),",
        "after the work and before the broker's ack, or anywhere (0-30 ms after the task",
        "started). Kill points in the worker (`tests/crash_support.py`) hold the submit there",
        "until the kill. The victim is the pool process (its parent requeues the message:",
        "`acks_late` + `reject_on_worker_lost`) or, one kill in five, the whole worker, which is",
        "started again at once (its message stays unacknowledged in Redis; beat's sync",
        "re-drives submits stuck for 30 s).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| kills | {kills['kills']}: {kills['pool_process_kills']} of a pool process, "
        f"{kills['worker_kills']} of a whole worker |",
        f"| kills by point | {phases} |",
        f"| runs submitted / SUCCEEDED | {kills['runs']} / {kills['runs_succeeded']} |",
        f"| backend jobs (simulator + Kubernetes) | {kills['simulator_jobs']} + "
        f"{kills['kubernetes_jobs']} = {kills['simulator_jobs'] + kills['kubernetes_jobs']}, "
        "each recorded on its attempt |",
        f"| attempts per run, jobs per attempt (min / max) | {kills['attempts_per_run_min']} / "
        f"{kills['attempts_per_run_max']}, {kills['jobs_per_attempt_min']} / "
        f"{kills['jobs_per_attempt_max']} |",
        f"| run events lost / duplicated | {kills['events_lost']} / {kills['events_duplicated']} |",
        f"| submits recorded by the sync that found their job | {kills['adopted_by_sync']} |",
        f"| time from a kill to the job recorded ({kills['interrupted_submits']} kills before "
        f"the record), p50 / max | {_seconds(kills['recovery_p50_s'])} / "
        f"{_seconds(kills['recovery_max_s'])} |",
        f"| from the last kill until every run had finished | "
        f"{_seconds(kills['converged_after_last_kill_s'])} |",
        "",
        "A killed pool process costs seconds, a killed worker 30 s: its parent notices the",
        "dead pool process at once or at its next pool maintenance (every 5 s), and only",
        "then requeues the message; a whole worker's message waits for the re-drive.",
        "",
        "### Redis and PostgreSQL restarted during activity",
        "",
        "Throwaway servers on private 127.0.0.1 ports, started by `scripts/test-services.sh`",
        "(throwaway mode) and restarted by the test as its own children. This Redis keeps",
        "nothing on disk, so a restart loses every queued and unacknowledged message",
        "(docker-compose's Redis keeps an append-only file: it loses less). PostgreSQL runs",
        "the test database with `synchronous_commit = on`: the throwaway server's `off` could",
        "lose commits it acknowledged in a crash. A worker (2 pool processes), beat and a",
        f"client that submits {restarts['runs']} runs one after the other (it looks its run up",
        "by name before trying again, as a careful API client would) run throughout; the",
        "simulator runs the jobs; the test triggers the accounting and DailyUsage roll-ups",
        "every second. Redis is restarted while a submit holds its message unacknowledged.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| restarts and downtime | {restarts['downtime']} |",
        f"| runs submitted / in the database / SUCCEEDED | {restarts['runs']} / "
        f"{restarts['runs_in_database']} / {restarts['runs_succeeded']} |",
        f"| client: tries again after an error ({errors or 'none'}); the run had been "
        f"recorded | {restarts['client_retries']}; {restarts['client_found_recorded']} |",
        f"| simulator jobs; per run (min / max) | {restarts['simulator_jobs']}; "
        f"{restarts['jobs_per_run_min']} / {restarts['jobs_per_run_max']} |",
        f"| run events lost / duplicated | {restarts['events_lost']} / "
        f"{restarts['events_duplicated']} |",
        f"| attempt accounting rows / finished attempts | {restarts['accounting_rows']} / "
        f"{restarts['finished_attempts']} |",
        f"| budget ledger (TenantMonthUsage) / Σ attempts' GPU × (end − start) | "
        f"{restarts['ledger_gpu_s']:.3f} / {restarts['attempts_gpu_s']:.3f} GPU-s |",
        f"| DailyUsage / attempt accounting, allocated | {restarts['daily_usage_gpu_s']} / "
        f"{restarts['accounting_gpu_s']} GPU-s (whole seconds per attempt) |",
        f"| Gantry processes restarted by hand | {restarts['processes_restarted']} |",
        f"| from the last restart until every run had finished | "
        f"{_seconds(restarts['converged_after_last_restart_s'])} |",
        "",
        "Tasks that ran while PostgreSQL was down failed and were dropped; beat's next",
        "admission cycle and sync, and the 30-second re-drive of submits, made up for them.",
        "",
        "### Backend unreachable",
        "",
        "The fake Kubernetes API server is stopped while runs run, new runs are submitted,",
        "and it comes back on the same port.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| runs running / submitted during the outage | {outage['running_at_outage']} / "
        f"{outage['submitted_during_outage']} |",
        f"| outage | {_seconds(outage['outage_s'])} |",
        f'| attempts showing "backend unreachable" (run page) | {outage["attempts_reporting"]} '
        f"of {outage['runs']} |",
        f"| from the server's return until every run ran again, errors cleared | "
        f"{_seconds(outage['converged_after_return_s'])} |",
        f"| Kubernetes Jobs per attempt (min / max); runs SUCCEEDED | "
        f"{outage['jobs_per_attempt_min']} / {outage['jobs_per_attempt_max']}; "
        f"{outage['runs_succeeded']} of {outage['runs']} |",
        f"| run events lost / duplicated | {outage['events_lost']} / "
        f"{outage['events_duplicated']} |",
        "",
        "### What the scenarios found",
        "",
        "Fixed (the first three with regression tests of their own, in",
        "`tests/portal/test_crash_recovery.py`; the scenarios cover the rest):",
        "",
        "- **A job found by the sync was never recorded.** When the worker died after the",
        "  backend created the job, the next sync (the simulator and Slurm find jobs by name)",
        "  moved the attempt to RUNNING without its job id, its submission time or the run's",
        "  PENDING event; the telemetry collector, which maps simulator jobs by id, would never",
        "  see it. The sync now records the acceptance exactly as the submit would",
        '  (`_attempt_accept`, event "… (found by the sync)").',
        "- **A broker outage failed submits that had been recorded.** The message to Redis",
        "  is sent after the commit; when Redis was down, the error reached the caller: an",
        "  error page or API answer for a run that existed, inviting a second submit.",
        "  Messages are now sent with `on_commit(robust=True)`: logged; beat makes up for them.",
        '- **Running runs did not say "backend unreachable".** The sync refreshed the',
        "  inventory first; when that failed, the sync that records the error on every live",
        "  attempt was skipped. The sync now comes first.",
        "- **A Redis restart could stop a Celery worker.** Celery 5.7.0 closes the collected",
        "  broker connection after a connection loss; with Redis and an unacknowledged",
        "  (`acks_late`) task this raises AttributeError and the worker exits",
        '  ("Unrecoverable error"). Celery is held below 5.7 (pyproject.toml).',
        "- **Settings.** Workers and beat retry the broker for as long as it takes, also at",
        "  start; a PostgreSQL that does not answer fails a connection in 10 s (libpq would",
        "  wait forever). Django's `CONN_HEALTH_CHECKS` already replaces a web process's",
        "  stale connection after a PostgreSQL restart; workers open one per task.",
        "",
        "Not fixed (open points):",
        "",
        "- **Cancels are not re-driven.** A cancel or a preemption whose message is lost (a",
        "  whole worker killed, Redis restarted) waits for Redis's visibility timeout (1 h)",
        "  or, if Redis lost it, for the job to end by itself.",
        "- **The re-drive multiplies messages.** Every sync re-sends every submit older than",
        "  30 s; during a long backend outage each copy retries with backoff on its own.",
        "- **A new pool process imports the Kubernetes client's API classes on first use**",
        "  (1.5-7 s on this machine) before its first Kubernetes call; the test worker loads",
        "  them before forking its pool, as a production worker could.",
        "",
    ]
    return "\n".join(lines)


INTRO = """# Reliability

How Gantry behaves under load and when parts of it fail, measured by tests that run in CI.
Each section says how its figures were produced.
"""


def write_section(figures: dict, doc: Path = RELIABILITY_DOC) -> None:
    """Replace this document's crash section (or add it), leaving every other section."""
    text = doc.read_text() if doc.exists() else INTRO
    section = render_section(figures)
    start = text.find(SECTION + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        rest = "" if end < 0 else text[end + 1 :]
        text = text[:start] + section + ("\n" + rest if rest else "")
    doc.write_text(text.rstrip("\n") + "\n")


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


CLIENT_TENANT, CLIENT_USER, CLIENT_FLAVOR = "vision", "alice", "h100-80gb"
CLIENT_IMAGE = "registry.example.org/ml/pytorch@sha256:" + "a" * 64


def _seed() -> None:
    import django

    django.setup()
    from django.contrib.auth.models import User

    from clusters.models import Cluster
    from clusters.services import cluster_refresh_inventory
    from images.models import Image
    from tenants.models import GpuFlavor, Membership, Project, Quota, Tenant

    flavor = GpuFlavor.objects.create(slug=CLIENT_FLAVOR, name="NVIDIA H100 80GB", memory_gb=80)
    tenant = Tenant.objects.create(slug=CLIENT_TENANT, name="Vision Lab")
    Project.objects.create(tenant=tenant, slug="detection", name="Detection")
    Quota.objects.create(tenant=tenant, flavor=flavor, guaranteed_gpus=16)
    repository, _, digest = CLIENT_IMAGE.partition("@")
    Image.objects.create(repository=repository, digest=digest, status=Image.Status.APPROVED)
    user = User.objects.create_user(username=CLIENT_USER, password="not-used-here")
    Membership.objects.create(user=user, tenant=tenant, role="researcher")
    cluster = Cluster.objects.create(
        name="sim-1",
        backend=Cluster.Backend.SIMULATOR,
        settings={
            "speedup": 1000,
            "pools": [{"flavor": CLIENT_FLAVOR, "nodes": 2, "gpus_per_node": 8}],
        },
    )
    cluster_refresh_inventory(cluster=cluster)


def _client(runs: int, progress: Path, interval: float, give_up_s: float) -> None:
    """Submit ``runs`` runs named chaos-NNN, each exactly once: after an error, look the
    run up by its name before trying again (the commit may have happened)."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.db import close_old_connections, connection

    from jobs.models import Experiment
    from jobs.services.submission import ExperimentInput, run_submit

    retries, found_recorded, errors = 0, 0, {}

    def report(submitted: int) -> None:
        staged = progress.with_suffix(".new")
        staged.write_text(
            json.dumps(
                {
                    "submitted": submitted,
                    "retries": retries,
                    "found_recorded": found_recorded,
                    "errors": errors,
                }
            )
        )
        os.replace(staged, progress)

    report(0)
    for index in range(runs):
        name = f"chaos-{index:03d}"
        deadline = time.monotonic() + give_up_s
        submit_raised = False
        while True:
            try:
                # What Django does around every web request: drop a connection that is too
                # old or that fails its health check (CONN_MAX_AGE, CONN_HEALTH_CHECKS).
                close_old_connections()
                if Experiment.objects.filter(name=name).exists():
                    found_recorded += submit_raised  # it raised, yet it had committed
                    break
                submit_raised = True
                run_submit(
                    user=User.objects.get(username=CLIENT_USER),
                    data=ExperimentInput(
                        tenant=CLIENT_TENANT,
                        project="detection",
                        image=CLIENT_IMAGE,
                        command="python train.py",
                        flavor=CLIENT_FLAVOR,
                        nodes=1,
                        gpus_per_node=1,
                        name=name,
                        env={"GANTRY_SIM_DURATION_S": "1500"},
                    ),
                )
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise
                kind = type(exc).__name__
                errors[kind] = errors.get(kind, 0) + 1
                retries += 1
                with contextlib.suppress(Exception):
                    connection.close()
                time.sleep(0.2)
        report(index + 1)
        time.sleep(interval)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "worker":
        _worker(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m tests.crash_support")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("seed")
    client = commands.add_parser("client")
    client.add_argument("--runs", type=int, required=True)
    client.add_argument("--progress", type=Path, required=True)
    client.add_argument("--interval", type=float, default=0.2)
    client.add_argument("--give-up-s", type=float, default=90)
    doc = commands.add_parser("doc")
    doc.add_argument("figures", type=Path)
    args = parser.parse_args(argv)
    if args.command == "seed":
        _seed()
    elif args.command == "client":
        _client(args.runs, args.progress, args.interval, args.give_up_s)
    else:
        write_section(json.loads(args.figures.read_text()))


if __name__ == "__main__":
    main(sys.argv[1:])
