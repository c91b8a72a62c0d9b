"""The idle streak of a running attempt and what a tenant's idle-GPU policy does about it.
Pure: plain data in and out.

The idle definition is the accounting's (telemetry/accounting.py): a GPU is idle in a
minute whose activity is below ``IDLE_THRESHOLD``, and a minute without a value is not
idle: idleness needs evidence. For the policy, an attempt is idle in a minute when at least
one of its GPUs reported that minute and every GPU that reported it was below the threshold.

The streak is counted over the minutes that have data: going back from the latest such
minute, it is the number of idle minutes before the first minute that is not idle. A minute
that no GPU reported (a telemetry gap) neither counts nor breaks the streak, so a gap can
delay the policy but never make it act on a guess.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Generic, TypeVar

from telemetry.accounting import IDLE_THRESHOLD

Minute = TypeVar("Minute", int, datetime)


@dataclass(frozen=True, slots=True)
class IdleStreak(Generic[Minute]):
    minutes: int  # consecutive idle minutes with data, up to the latest one
    since: Minute | None = None  # the streak's first minute; None without a streak
    latest: Minute | None = None  # the latest minute with data; None without data


def idle_streak(
    samples: Iterable[tuple[Minute, float | None]], *, threshold: float = IDLE_THRESHOLD
) -> IdleStreak[Minute]:
    """The current idle streak of one attempt.

    ``samples`` are (minute, activity 0-1) pairs, one per GPU and minute, in any order; a
    minute's largest value may stand for all of its GPUs. A missing or non-finite activity
    is no evidence and is ignored.
    """
    peaks: dict[Minute, float] = {}
    for minute, activity in samples:
        if activity is None or not math.isfinite(activity):
            continue
        peaks[minute] = max(activity, peaks.get(minute, activity))
    if not peaks:
        return IdleStreak(minutes=0)
    minutes = 0
    since = None
    for minute in sorted(peaks, reverse=True):
        if peaks[minute] >= threshold:
            break
        minutes += 1
        since = minute
    return IdleStreak(minutes=minutes, since=since, latest=max(peaks))


class IdleAction(StrEnum):
    NONE = "none"
    WARN = "warn"  # warn the submitter, once per streak
    CLEAR = "clear"  # the warned streak is over: the next one may be warned again
    CANCEL = "cancel"


def idle_action(
    *, streak: int, notify_after: int | None, cancel_after: int | None, warned: bool
) -> IdleAction:
    """What the policy does now about an attempt idle for ``streak`` minutes.

    ``notify_after`` and ``cancel_after`` are the tenant's thresholds in idle minutes (None:
    off); ``warned`` says that the attempt's latest warning has not been cleared. Cancelling
    wins over warning. A warning is cleared once the streak is below the warning threshold
    (streaks only grow until a minute that is not idle, so that is a new streak, or the
    threshold was raised): the next warning comes when the threshold is reached again.
    """
    if cancel_after is not None and streak >= cancel_after:
        return IdleAction.CANCEL
    if notify_after is None:
        return IdleAction.NONE
    if streak >= notify_after:
        return IdleAction.NONE if warned else IdleAction.WARN
    return IdleAction.CLEAR if warned else IdleAction.NONE
