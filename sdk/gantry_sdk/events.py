"""The fields of each event, checked before it is queued: a bad value raises ``TypeError``
or ``ValueError`` here, and the reporter counts the event as rejected instead of sending it."""

from __future__ import annotations

import math

MAX_URI_CHARS = 2048


def _seconds(value, name):
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0")
    return value


def _count(value, name):
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be an integer >= 0")
    return int(value)


def _timestamp(value, name):
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a unix time in seconds")
    return value


def _uri(value):
    value = str(value)
    if not value or len(value) > MAX_URI_CHARS:
        raise ValueError(f"uri must have 1 to {MAX_URI_CHARS} characters")
    return value


def step_window_fields(
    steps, step_time_s, data_wait_s, comm_wait_s, checkpoint_s, start, end, step, clock
):
    """The fields of a ``step_window`` event (see ``Reporter.step_window``); ``clock``
    gives the default ``end``, now."""
    fields = {
        "steps": _count(steps, "steps"),
        "step_time_s": _seconds(step_time_s, "step_time_s"),
        "data_wait_s": _seconds(data_wait_s, "data_wait_s"),
        "comm_wait_s": _seconds(comm_wait_s, "comm_wait_s"),
        "checkpoint_s": _seconds(checkpoint_s, "checkpoint_s"),
    }
    end = clock() if end is None else _timestamp(end, "end")
    if start is None:
        busy = fields["steps"] * fields["step_time_s"] + fields["checkpoint_s"]
        start = end - busy
    start = _timestamp(start, "start")
    if start > end:
        raise ValueError("start must not be after end")
    fields["start"] = start
    fields["end"] = end
    fields["step"] = None if step is None else _count(step, "step")
    return fields


def checkpoint_fields(step, uri, seconds):
    """The fields of a ``checkpoint_saved`` or ``checkpoint_restored`` event."""
    return {
        "step": _count(step, "step"),
        "uri": _uri(uri),
        "seconds": _seconds(seconds, "seconds"),
    }


def rank_window_fields(identity, window, fields):
    """The fields of a ``rank_window`` event: the rank's ``identity`` (``rank``,
    ``local_rank``, ``world_size``, ``host``, ``gpu``), the rank's ``window`` number (1, 2,
    …) and the timings of a checked ``step_window`` (its ``fields``)."""
    event = dict(identity)
    event["window"] = window
    for name in RANK_WINDOW_TIMINGS:
        event[name] = fields[name]
    return event


RANK_WINDOW_TIMINGS = ("start", "end", "steps", "step_time_s", "data_wait_s", "comm_wait_s")
