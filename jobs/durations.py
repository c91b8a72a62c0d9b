"""How long a run has waited or run, for people: plain data in, plain data out."""

from dataclasses import dataclass
from datetime import datetime


def duration_text(seconds: float) -> str:
    """Wall time for people: "45 s", "12 min 05 s", "3 h 05 min", "2 d 4 h"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@dataclass(frozen=True, slots=True)
class RunDuration:
    """The one span of a run's life worth showing in a list, in wall seconds.

    ``kind``: "queued" (never started, still waiting: since submission), "running" (since
    it first started), "queued again" (started before, now waiting for a restart: since
    submission), "ran" (first start to end), "never ran" (ended before starting: submission
    to end)."""

    kind: str
    seconds: float

    @property
    def text(self) -> str:
        return duration_text(self.seconds)

    @property
    def label(self) -> str:
        return {
            "queued": "queued",
            "running": "running",
            "queued again": "since submission (restarting)",
            "ran": "run time",
            "never ran": "queued, never started",
        }[self.kind]


def run_duration(
    *,
    submitted_at: datetime,
    started_at: datetime | None,
    finished_at: datetime | None,
    running: bool,
    terminal: bool,
    now: datetime,
) -> RunDuration:
    """The span to show for a run in these states and at these times. A clock that went
    backwards shows 0 s, never a negative time."""

    def span(start: datetime, end: datetime) -> float:
        return max(0.0, (end - start).total_seconds())

    if terminal:
        end = finished_at or now
        if started_at is None:
            return RunDuration("never ran", span(submitted_at, end))
        return RunDuration("ran", span(started_at, end))
    if running:
        return RunDuration("running", span(started_at or submitted_at, now))
    if started_at is None:
        return RunDuration("queued", span(submitted_at, now))
    return RunDuration("queued again", span(submitted_at, now))
