"""What a benchmark hands back for docs/benchmarks.md, and small timing helpers."""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Section:
    title: str
    intro: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"## {self.title}", "", self.intro, ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "---|" * len(self.columns))
        lines.extend("| " + " | ".join(row) + " |" for row in self.rows)
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"


def quick() -> bool:
    """``GANTRY_BENCH_QUICK=1``: the benchmarks that know it run on small sizes only, to
    check that they work (admission, cycle, trace, placement). Never for docs/benchmarks.md."""
    return os.environ.get("GANTRY_BENCH_QUICK") == "1"


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def best_of(fn: Callable[[], object], *, repeat: int) -> float:
    return min(timed(fn)[0] for _ in range(repeat))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def ratio(slow: float, fast: float) -> str:
    return f"{slow / fast:,.1f}×"
