"""What a workspace's card says, from plain values: its phase, the steps of its start with
their times, and its time left. Pure: the selector (``jobs.selectors.workspaces``) reads
the rows, the page, the API and the CLI show what this computes."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from jobs.models import TERMINAL_STATES, RunState


class Phase:
    """Where a workspace is, in the words its card uses (docs/workspaces.md)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    IDLE_WARNING = "idle warning"
    SUSPENDED = "suspended"
    ENDED = "ended"


PHASES = (
    Phase.QUEUED,
    Phase.STARTING,
    Phase.RUNNING,
    Phase.IDLE_WARNING,
    Phase.SUSPENDED,
    Phase.ENDED,
)


@dataclass(frozen=True)
class WorkspaceTimes:
    """The moments a workspace's card is made of: its run's, its latest attempt's and its
    Workspace row's."""

    state: str
    submitted_at: datetime
    admitted_at: datetime | None
    attempt_submitted_at: datetime | None
    attempt_started_at: datetime | None
    ready_at: datetime | None
    warned_at: datetime | None
    suspended_at: datetime | None
    finished_at: datetime | None
    started_at: datetime | None
    max_runtime_minutes: int
    extended_minutes: int


@dataclass(frozen=True)
class Step:
    key: str
    label: str
    at: datetime | None


def workspace_phase(times: WorkspaceTimes) -> str:
    """Queued while it waits for admission; starting from its admission until its server
    answered; running, or idle warning once its owner was warned; suspended; ended."""
    if times.state in TERMINAL_STATES:
        return Phase.ENDED
    if times.state == RunState.SUSPENDED:
        return Phase.SUSPENDED
    if times.state in (RunState.QUEUED, RunState.PREEMPTED):
        return Phase.QUEUED
    if times.state == RunState.RUNNING and times.ready_at is not None:
        return Phase.IDLE_WARNING if times.warned_at is not None else Phase.RUNNING
    return Phase.STARTING


def workspace_steps(times: WorkspaceTimes) -> list[Step]:
    """The steps of its life with their times (None: not reached), in order. The idle
    warning and the suspension show only once they happened: most workspaces have neither."""
    steps = [
        Step("queued", "Queued", times.submitted_at),
        Step("admitted", "Admitted", times.admitted_at),
        Step("submitted", "Submitted to the cluster", times.attempt_submitted_at),
        Step("job_running", "Job running", times.attempt_started_at),
        Step("server_ready", "Server ready", times.ready_at),
    ]
    if times.warned_at is not None:
        steps.append(Step("idle_warning", "Idle warning", times.warned_at))
    if times.suspended_at is not None:
        steps.append(Step("suspended", "Suspended", times.suspended_at))
    steps.append(Step("ended", "Ended", times.finished_at))
    return steps


def workspace_time_left(
    *,
    started_at: datetime | None,
    max_runtime_minutes: int,
    extended_minutes: int,
    now: datetime,
) -> timedelta | None:
    """How long it may still run: started_at + max runtime + extensions - now, never below
    zero; None before it started (it gets its whole time once it does)."""
    if started_at is None:
        return None
    end = started_at + timedelta(minutes=max_runtime_minutes + extended_minutes)
    return max(end - now, timedelta(0))


def duration_words(value: timedelta) -> str:
    """``2 h 05 min``, ``45 min``, ``0 min``: how the card and the CLI say a time left."""
    minutes = int(value.total_seconds() // 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"
