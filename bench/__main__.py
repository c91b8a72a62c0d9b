"""``make bench``: every benchmark reports Gantry beside a baseline measured in the same run;
the results go to docs/benchmarks.md with the machine they ran on.

``python -m bench [admission] [cycle] [trace] [telemetry] [k8s] [slurm] [finance]`` runs
some of them and only prints.

The admission cycle runs against the database ``gantry_bench`` on the server of
DATABASE_URL (created and migrated here, so the tests' database is never touched), with
Celery on its in-memory broker: tasks enqueued on commit are dropped, not run.
"""

import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.db import bench_database_url, ensure_database
from bench.report import Section

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BENCHMARKS = ("admission", "cycle", "trace", "telemetry", "k8s", "slurm", "finance")


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


def setup_django() -> None:
    url = bench_database_url(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry")
    )
    ensure_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ["GANTRY_DEBUG"] = "0"  # DEBUG would keep every query in memory
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def run(name: str) -> list[Section]:
    sys.stderr.write(f"bench: {name}…\n")
    if name == "admission":
        from bench import admission

        return admission.run()
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
    if name == "finance":
        setup_django()
        from bench import finance

        return finance.run()
    from bench import trace

    return trace.run()


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        sys.stderr.write(f"bench: unknown benchmark {', '.join(sorted(unknown))}\n")
        return 2
    sections = [section for name in BENCHMARKS if name in names for section in run(name)]
    text = "\n".join(
        [
            "# Benchmarks",
            "",
            "Written by `make bench`; each benchmark reports Gantry beside a baseline measured "
            "in the same run. Method and trace mapping: [benchmarks-notes.md]"
            "(benchmarks-notes.md).",
            "",
            f"- Machine: {machine()}",
            f"- Run at: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "",
            *(section.markdown() for section in sections),
        ]
    )
    sys.stdout.write(text)
    if set(names) == set(BENCHMARKS):
        DOCS.parent.mkdir(exist_ok=True)
        DOCS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
