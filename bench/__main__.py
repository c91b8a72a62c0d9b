"""``make bench``: every benchmark reports Gantry beside a baseline measured in the same run;
the results go to docs/benchmarks.md with the machine they ran on.

``python -m bench [admission] [placement] [backfill] [cycle] [trace] [node_health]
[stragglers] [verdicts] [workspace_idle] [estimates] [telemetry] [ranks] [k8s] [slurm]
[finance] [load] [runlist] [workspace_proxy] [workspace_start] [replay]`` runs some of them
and only prints. ``GANTRY_BENCH_QUICK=1`` runs admission, placement, backfill, cycle, trace,
node_health, stragglers, verdicts, workspace_idle, estimates and replay on small sizes (does it
still work?) and never writes docs/benchmarks.md.

The admission cycle runs against the database ``gantry_bench`` on the server of
DATABASE_URL (created and migrated here, so the tests' database is never touched), with
Celery on its in-memory broker: tasks enqueued on commit are dropped, not run. ``ranks``,
``runlist``, ``load``, ``workspace_proxy`` and ``workspace_start`` use databases of their
own, named after DATABASE_URL's (``<name>_ranks``, ``<name>_runlist``, ``<name>_replay``,
``<name>_load_before``, ``<name>_load_after``, ``<name>_workspace_proxy`` and
``<name>_workspace_start``); ``load`` also starts gunicorn, a Celery worker and beat on the
Redis of CELERY_BROKER_URL (the cache too; the after stack on the next Redis database),
twice side by side: for the code of an earlier commit (it needs this repository's history,
as a clone has it) and for this checkout.
"""

import os
import platform
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from bench.db import bench_database_url, ensure_database, own_database_url
from bench.report import Section, quick

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BENCHMARKS = (
    "admission",
    "placement",
    "backfill",
    "cycle",
    "trace",
    "node_health",
    "stragglers",
    "verdicts",
    "workspace_idle",
    "estimates",
    "telemetry",
    "ranks",
    "k8s",
    "slurm",
    "finance",
    "load",
    "runlist",
    "workspace_proxy",
    "workspace_start",
    "replay",
)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


# What `make bench` was given: each benchmark derives its database and broker from these,
# not from what an earlier benchmark of the same run set.
GIVEN_DATABASE_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry")
GIVEN_BROKER_URL = os.environ.get("CELERY_BROKER_URL")


def setup_django(database_suffix: str = "", *, real_broker: bool = False) -> None:
    """Django on the benchmarks' database, or with ``database_suffix`` on one of its own
    named after DATABASE_URL's (a benchmark that seeds a million rows keeps them apart).
    ``real_broker``: keep CELERY_BROKER_URL, for a benchmark that runs a Celery worker.
    Called again by a later benchmark of the same run, it moves Django to that database
    (the processes a benchmark starts read the same environment)."""
    given = GIVEN_DATABASE_URL
    url = own_database_url(given, database_suffix) if database_suffix else bench_database_url(given)
    ensure_database(url)
    os.environ["DATABASE_URL"] = url
    if not real_broker:
        os.environ["CELERY_BROKER_URL"] = "memory://"
    elif GIVEN_BROKER_URL is None:
        os.environ.pop("CELERY_BROKER_URL", None)
    else:
        os.environ["CELERY_BROKER_URL"] = GIVEN_BROKER_URL
    os.environ["GANTRY_DEBUG"] = "0"  # DEBUG would keep every query in memory
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    django.setup()
    connections.close_all()
    # The connection reads this same dict: the next query opens the database named here.
    settings.DATABASES["default"]["NAME"] = urlsplit(url).path.lstrip("/")
    call_command("migrate", verbosity=0)


def run(name: str) -> list[Section]:
    sys.stderr.write(f"bench: {name}…\n")
    if name == "admission":
        from bench import admission

        return admission.run()
    if name == "placement":
        from bench import placement

        return placement.run()
    if name == "backfill":
        from bench import backfill

        return backfill.run()
    if name == "cycle":
        setup_django()
        from bench import cycle

        return cycle.run()
    if name == "k8s":
        from bench import k8s

        return k8s.run()
    if name == "slurm":
        from bench import slurm

        return slurm.run()
    if name == "telemetry":
        setup_django()
        from bench import telemetry

        return telemetry.run()
    if name == "ranks":
        setup_django("_ranks")
        from bench import ranks

        return ranks.run()
    if name == "finance":
        setup_django()
        from bench import finance

        return finance.run()
    if name == "runlist":
        setup_django("_runlist")
        from bench import runlist

        return runlist.run()
    if name == "load":
        setup_django("_load", real_broker=True)
        from bench import load

        return load.run()
    if name == "workspace_start":
        setup_django("_workspace_start")
        from bench import workspace_start

        return workspace_start.run()
    if name == "workspace_proxy":
        setup_django("_workspace_proxy")
        from bench import workspace_proxy

        return workspace_proxy.run()
    if name == "replay":
        setup_django("_replay")
        from bench import replay

        return replay.run()
    if name == "node_health":
        from bench import node_health

        return node_health.run()
    if name == "stragglers":
        from bench import stragglers

        return stragglers.run()
    if name == "verdicts":
        from bench import verdicts

        return verdicts.run()
    if name == "workspace_idle":
        from bench import workspace_idle

        return workspace_idle.run()
    if name == "estimates":
        from bench import estimates

        return estimates.run()
    from bench import trace

    return trace.run()


class LoadWatch:
    """The machine's load while one benchmark runs: the 1-minute load average sampled every
    few seconds. A mean above the cores the benchmark itself keeps busy means other work ran
    beside it, and its figures say so in docs/benchmarks.md."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> "LoadWatch":
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.monotonic() - self.started

    def line(self, name: str) -> str:
        mean = sum(self.samples) / len(self.samples)
        cores = os.cpu_count() or 1
        # The benchmarks use at most one process per core (the placement replays).
        beside = " while other work ran on the machine" if mean > cores + 1 else ""
        return (
            f"`{name}`: {self.seconds / 60:,.1f} min, load average {mean:.1f} "
            f"(max {max(self.samples):.1f}) on {cores} cores{beside}"
        )


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        sys.stderr.write(f"bench: unknown benchmark {', '.join(sorted(unknown))}\n")
        return 2
    started = datetime.now(UTC)
    sections: list[Section] = []
    loads: list[str] = []
    for name in (name for name in BENCHMARKS if name in names):
        with LoadWatch() as watch:
            sections.extend(run(name))
        loads.append(watch.line(name))
        sys.stderr.write(f"bench: {loads[-1]}\n")
    text = "\n".join(
        [
            "# Benchmarks",
            "",
            "Written by `make bench`; each benchmark reports Gantry beside a baseline measured "
            "in the same run. Method and trace mapping: [benchmarks-notes.md]"
            "(benchmarks-notes.md).",
            "",
            f"- Machine: {machine()}",
            f"- Run at: {started:%Y-%m-%d %H:%M}–{datetime.now(UTC):%H:%M} UTC",
            "- Each benchmark's wall time and the machine's load meanwhile (1-minute load "
            "average, sampled every 5 s):",
            *(f"  - {load}" for load in loads),
            "",
            *(section.markdown() for section in sections),
        ]
    )
    sys.stdout.write(text)
    if set(names) == set(BENCHMARKS) and not quick():
        DOCS.parent.mkdir(exist_ok=True)
        DOCS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
