"""``make bench``: every benchmark reports Gantry's time beside a baseline from the same run,
and the results are written to docs/benchmarks.md with the machine they ran on."""

import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench import admission

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


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


def main() -> int:
    rows = admission.run()
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench`; each row is Gantry beside a baseline measured in the same run.",
        "",
        f"- Machine: {machine()}",
        f"- Run at: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        "| benchmark | Gantry | baseline | baseline time | speed-up |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row["baseline_s"] / row["gantry_s"]
        lines.append(
            f"| {row['name']} | {row['gantry_s'] * 1000:.1f} ms | {row['baseline']} | "
            f"{row['baseline_s'] * 1000:.1f} ms | {ratio:.1f}× |"
        )
    text = "\n".join(lines) + "\n"
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
