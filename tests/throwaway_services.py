"""Throwaway PostgreSQL and Redis servers of a test's own, to stop, kill and start again
(tests/portal/test_chaos.py), started by scripts/test-services.sh in throwaway mode."""

import contextlib
import os
import shlex
import signal
import socket
import subprocess
from pathlib import Path

from tests.crash_support import ROOT, child_pids, free_port, tree_cpu_s, wait_until


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
        self._cpu_of_stopped_postgres_s = 0.0

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

    def postgres_cpu_s(self) -> float:
        """CPU seconds of every PostgreSQL server so far (of a stopped one, until its stop):
        its postmaster and the processes it started, those that ended included."""
        return self._cpu_of_stopped_postgres_s + self._running_postgres_cpu_s()

    def _running_postgres_cpu_s(self) -> float:
        try:
            postmaster = int((self.pg_data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0.0
        return tree_cpu_s(postmaster)

    def postgres_stop(self) -> None:
        """A clean stop (``pg_ctl stop -m fast``): sessions are told and closed."""
        self._cpu_of_stopped_postgres_s += self._running_postgres_cpu_s()
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
        self._cpu_of_stopped_postgres_s += self._running_postgres_cpu_s()
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
    into the throwaway one, with the record of its migrations (a web process is ready only
    with every migration applied, ``portal.readiness``): a second ``migrate`` would cost
    seconds for the same schema."""
    env = os.environ | {"PGPASSWORD": source.get("PASSWORD") or ""}
    connect = [
        "-h",
        source["HOST"] or "127.0.0.1",
        "-p",
        str(source["PORT"] or 5432),
        "-U",
        source["USER"] or "postgres",
        source["NAME"],
    ]
    dumps = [
        subprocess.run(
            [str(target.pg_bindir / "pg_dump"), *what, "--no-owner", "--no-privileges", *connect],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        ).stdout
        for what in (["--schema-only"], ["--data-only", "--table=django_migrations"])
    ]
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
        input=b"\n".join(dumps),
        check=True,
        capture_output=True,
        timeout=120,
    )
