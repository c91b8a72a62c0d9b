"""Plain-text rendering: aligned tables and fields, times, durations. No third-party libraries."""

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO


def print_json(value: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(value, indent=2), file=stream or sys.stdout)


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns separated by two spaces; numeric columns right-aligned."""
    text = [[cell(value) for value in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in text)]) for i, h in enumerate(headers)]
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(width) if right else value.ljust(width)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(row) for row in text)])


def print_fields(rows: Sequence[tuple[str, Any]]) -> None:
    """One ``label  value`` line per row, the values aligned."""
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {'-' if value in (None, '') else value}")


def when(value: str | None) -> str:
    """An API timestamp in local time, to the second."""
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"
