"""Whether a workspace is in use, from evidence, and what its tenant's policy does about it.
Pure: plain data in and out (docs/workspaces.md, "Idle from evidence").

A workspace is in use while any of these says so:
- a kernel executed or produced output within the threshold (Jupyter Server's per-kernel
  ``last_activity``: tracked messages and every message of a busy kernel), a computation
  running whether or not a browser watches it (the anchors' most repeated complaint is a
  culler that killed one in a closed tab, jupyterhub #1498);
- a terminal read or wrote (its ``last_activity``);
- a person acted through the proxy: a message to a kernel or a terminal, a file saved
  (state-changing requests). An open tab alone is not use: JupyterLab polls while a tab
  is open, and "kept a tab open and walked away" is how GPUs were held for days
  (berkeley-dsep-infra/datahub#1038). That is also why the server's own
  ``last_activity``, which API polling refreshes, is not read;
- its GPUs were active (DCGM).
Idle on every signal for the tenant's threshold, the owner is warned, then the workspace is
suspended: its GPUs are released, its files kept. A kernel that is busy but silent, with
its GPUs idle, is warned about too; it is suspended only if the tenant says so, since a
CPU computation without output looks the same from outside.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class IdleAction(StrEnum):
    IN_USE = "in_use"
    IDLE = "idle"  # idle, not yet for long enough to warn
    WARN = "warn"
    SUSPEND = "suspend"


@dataclass(frozen=True, slots=True)
class WorkspaceSignals:
    """What was observed of one workspace at ``now``. ``None``: no evidence on that signal
    (the server did not answer, no GPU sample yet): never counted as use, nor as idleness
    beyond what the other signals say."""

    now: datetime
    ready_at: datetime  # when its server first answered: nothing is idle before
    busy_kernels: int = 0
    kernel_activity_at: datetime | None = None  # the latest of the kernels' last_activity
    terminal_activity_at: datetime | None = None
    proxy_activity_at: datetime | None = None  # the latest thing a person did through it
    # False when the server did not answer this time: its kernels are unknown, so nothing is
    # suspended on this scan (a busy kernel might be why it is slow to answer).
    server_answered: bool = True
    gpu_active_at: datetime | None = None  # the end of the latest GPU-active minute


@dataclass(frozen=True, slots=True)
class WorkspacePolicy:
    suspend_after: timedelta
    warn_before: timedelta
    suspend_silent_busy: bool = False


@dataclass(frozen=True, slots=True)
class IdleVerdict:
    action: IdleAction
    idle_since: datetime | None  # the last evidence of use; None while in use
    suspend_at: datetime | None  # when it will be suspended if nothing changes
    silent_busy: bool = False  # idle on every signal but a busy kernel without output


def last_use(signals: WorkspaceSignals) -> datetime:
    """The latest evidence of use on any signal (at least when the server came up)."""
    evidence = (
        signals.ready_at,
        signals.kernel_activity_at,
        signals.terminal_activity_at,
        signals.proxy_activity_at,
        signals.gpu_active_at,
    )
    return min(signals.now, max(moment for moment in evidence if moment is not None))


def idle_verdict(
    signals: WorkspaceSignals, policy: WorkspacePolicy, *, warned_at: datetime | None
) -> IdleVerdict:
    """What to do now. A workspace is suspended only once its owner was warned at least
    ``warn_before`` earlier: a warning missed (the scan did not run, the threshold was
    lowered) moves the suspension, never skips the warning."""
    since = last_use(signals)
    idle_for = signals.now - since
    silent_busy = signals.busy_kernels > 0
    if idle_for <= timedelta(0):
        return IdleVerdict(IdleAction.IN_USE, None, None)
    warn_at = since + policy.suspend_after - policy.warn_before
    if signals.now < warn_at:
        return IdleVerdict(IdleAction.IDLE, since, since + policy.suspend_after, silent_busy)
    if silent_busy and not policy.suspend_silent_busy:
        return IdleVerdict(IdleAction.WARN, since, None, silent_busy)
    # Warned during this idle streak: suspended once the warning is old enough.
    warned = warned_at is not None and warned_at >= warn_at - _ONE_SCAN
    suspend_at = max(since + policy.suspend_after, (warned_at or signals.now) + policy.warn_before)
    if warned and signals.now >= suspend_at and signals.server_answered:
        return IdleVerdict(IdleAction.SUSPEND, since, suspend_at, silent_busy)
    return IdleVerdict(IdleAction.WARN, since, suspend_at, silent_busy)


# A warning sent by the scan just before the streak's warning time (the scan runs once a
# minute, its "now" is a little earlier than the next scan's) still counts for the streak.
_ONE_SCAN = timedelta(minutes=1)
