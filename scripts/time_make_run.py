"""Seconds from `make run` to its first page, on a fresh clone: a cold start and a warm one.

Clones the repository (its committed HEAD: commit first) into a temporary directory, runs
`make run` there on a free port, polls the page it serves until it answers 200 (redirects
followed: ``/`` leads to the login page), stops it with Ctrl-C's signal, starts it again in
the same clone (the venv and the data kept: the warm start) and removes the clone. Needs only
git, make and Python 3.11 (what `make run` needs); nothing is installed outside the clone.

Prints, per start, the wall seconds to the first page, the CPU seconds (user + system) that
`make run` and every process it started spent until then, the machine's load average before
and after, and the wall and CPU seconds of each phase (which ends when `make run` prints):

    venv      the virtualenv made, pip upgraded   (make prints the install command)
    install   Gantry and its runtime dependencies installed   (make prints the run command)
    prepare   migrate, demo seed, metric files reset    ("Gantry is running")
    serve     gunicorn's first answer to the page

    python3 scripts/time_make_run.py [--repository PATH] [--port N] [--keep]

The environment is passed on as it is (PYTHONDONTWRITEBYTECODE included: it is printed,
because it decides whether a start reuses the bytecode of the one before), except the
variables that would take `make run` off its embedded default (DATABASE_URL and the like).
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `make run` on its embedded default: these would point it at servers of their own.
NOT_PASSED = ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "GANTRY_DATA_DIR")
PHASE_MARKERS = (
    ("venv", re.compile(r"-m pip install .*-e \.")),
    ("install", re.compile(r"-m portal\.embedded")),
    ("prepare", re.compile(r"Gantry is running on")),
)
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 60
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: the fields after it follow its ")".
    return text[text.rindex(")") + 2 :].split()


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of ``root`` and its live descendants, each with the children it
    has waited for (so finished steps such as pip and migrate count too)."""
    parents: dict[int, int] = {}
    cpu: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None:
            continue
        # After the name: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = sum(int(value) for value in fields[11:15])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        tree.update(children)
        frontier.extend(children)
    return sum(cpu.get(pid, 0) for pid in tree) / CLOCK_TICKS


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def answers_200(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our http URL
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


class Start:
    """One `make run` in ``clone``, its output timestamped line by line."""

    def __init__(self, clone: Path, port: int, log: Path):
        env = {key: value for key, value in os.environ.items() if key not in NOT_PASSED}
        env["GANTRY_PORT"] = str(port)
        self.url = f"http://127.0.0.1:{port}/"
        self.log = log.open("a")
        # Phase -> (wall, CPU) seconds when it ended.
        self.phases: dict[str, tuple[float, float]] = {}
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            ["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE,  # noqa: S607 - on PATH
            stderr=subprocess.STDOUT, start_new_session=True, text=True, bufsize=1,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            elapsed = time.monotonic() - self.started
            self.log.write(f"{elapsed:8.2f} {line}")
            for phase, marker in PHASE_MARKERS:
                if phase not in self.phases and marker.search(line):
                    self.phases[phase] = (elapsed, tree_cpu_seconds(self.process.pid))

    def first_page(self) -> tuple[float, float]:
        """Wall and CPU seconds until the page answers 200."""
        deadline = self.started + START_TIMEOUT_S
        while not answers_200(self.url):
            if self.process.poll() is not None:
                raise SystemExit(f"make run exited with {self.process.returncode}: see the log")
            if time.monotonic() > deadline:
                raise SystemExit(f"no answer from {self.url} within {START_TIMEOUT_S} s")
            time.sleep(0.1)
        wall = time.monotonic() - self.started
        return wall, tree_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        """Ctrl-C's signal to make and portal.embedded, which stops what it started."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.reader.join(timeout=5)
        self.log.close()


def measure(clone: Path, port: int, log: Path, name: str) -> float:
    before = load_average()
    start = Start(clone, port, log)
    try:
        wall, cpu = start.first_page()
    finally:
        start.stop()
    ends = [*start.phases.items(), ("serve", (wall, cpu))]
    phases, previous = [], (0.0, 0.0)
    for phase, (at, cpu_at) in ends:
        phases.append(f"{phase} {at - previous[0]:.1f} s ({cpu_at - previous[1]:.1f} s CPU)")
        previous = (at, cpu_at)
    print(
        f"{name}: first page in {wall:.1f} s wall, {cpu:.1f} s CPU (user+sys);"
        f" load average before {before}, after {load_average()}\n  {', '.join(phases)}",
        flush=True,
    )
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", default=str(ROOT), help="what to clone (default: this)")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its log")
    args = parser.parse_args()
    port = args.port or free_port()
    work = Path(tempfile.mkdtemp(prefix="gantry-time-make-run."))
    clone, log = work / "gantry", work / "make-run.log"
    commit = subprocess.run(  # noqa: S603 - fixed commands, no shell
        ["git", "-C", args.repository, "rev-parse", "--short", "HEAD"],  # noqa: S607 - on PATH
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    print(
        f"commit {commit}, {os.cpu_count()} CPUs, port {port}, "
        f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}",
        flush=True,
    )
    try:
        clone_command = ["git", "clone", "-q", args.repository, str(clone)]
        subprocess.run(clone_command, check=True)  # noqa: S603 - a fixed command, no shell
        measure(clone, port, log, "cold (fresh clone)")
        measure(clone, port, log, "warm (second start)")
    finally:
        if args.keep:
            print(f"kept {work} (log: {log})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
