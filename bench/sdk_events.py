"""Checking the SDK's events: the compiled schema check vs jsonschema vs hand-written checks.

Every training rank posts its events in batches of up to 500; each is checked against
``telemetry.sdk_events.EVENT_SCHEMA``. Gantry runs the schema compiled once into a plain
check (``core/schema_check.py``); the rows beside it are jsonschema on the same schema
(what ran before) and the hand-written checks the schema replaced (``handwritten_ok``, as
``telemetry/services.py`` had them before commit ffb6a54, shape only). All three must give
the same answers on the batch; the run stops if they do not.
"""

import math
import timeit

from bench.report import Section, ratio
from telemetry import sdk_events

T = 1_760_000_000.0
BATCH = 500


def batch() -> list[object]:
    """A mixed batch as a rank sends it: step windows, checkpoints, a ready, a few broken."""
    events: list[object] = []
    for seq in range(1, BATCH + 1):
        ts = T + seq
        event: dict[str, object] = {"seq": seq, "ts": ts, "type": sdk_events.STEP_WINDOW,
            "start": ts - 10, "end": ts, "steps": 20, "step_time_s": 0.5, "data_wait_s": 0.01,
            "comm_wait_s": 0.02, "checkpoint_s": 0.0, "step": seq * 20}  # fmt: skip
        if seq % 10 == 0:
            kind = sdk_events.CHECKPOINT_SAVED if seq % 20 else sdk_events.CHECKPOINT_RESTORED
            event = {"seq": seq, "ts": ts, "type": kind, "step": seq, "uri": f"s3://b/{seq}",
                     "seconds": 2.5}  # fmt: skip
        elif seq % 50 == 1:
            event = {"seq": seq, "ts": ts, "type": sdk_events.READY}
        broken = {0: {"seq": True}, 1: {"seconds": math.nan}, 2: {"type": "bye"}, 3: {"ts": 1}}
        if seq % 37 == 0:
            event |= broken[seq // 37 % 4]
        events.append(event)
    return events


def _int(value: object, low: int = 0, high: int = sdk_events.MAX_SEQ) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _seconds(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value >= 0


def _moment(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return sdk_events.EARLIEST_TS <= value <= sdk_events.LATEST_TS


def handwritten_ok(raw: object) -> bool:
    if not isinstance(raw, dict) or not _int(raw.get("seq"), low=1) or not _moment(raw.get("ts")):
        return False
    kind = raw.get("type")
    if kind == sdk_events.STEP_WINDOW:
        names = ("data_wait_s", "comm_wait_s", "checkpoint_s")
        return (
            _moment(raw.get("start"))
            and _moment(raw.get("end"))
            and _int(raw.get("steps"), high=sdk_events.MAX_STEPS)
            and "step_time_s" in raw
            and _seconds(raw["step_time_s"])
            and all(_seconds(raw.get(name, 0.0)) for name in names)
            and (raw.get("step") is None or _int(raw["step"]))
        )
    if kind in (sdk_events.CHECKPOINT_SAVED, sdk_events.CHECKPOINT_RESTORED):
        uri = raw.get("uri")
        return (
            _int(raw.get("step"))
            and _seconds(raw.get("seconds"))
            and isinstance(uri, str)
            and 1 <= len(uri) <= sdk_events.MAX_URI_LENGTH
            and "\x00" not in uri
        )
    return kind == sdk_events.READY


def run() -> Section:
    events = batch()
    compiled = sdk_events.EVENT.is_valid
    jsonschema_check = sdk_events.EVENT._validator().is_valid
    answers = [handwritten_ok(event) for event in events]
    assert [compiled(event) for event in events] == answers, "compiled check differs"
    assert [jsonschema_check(event) for event in events] == answers, "jsonschema differs"

    def per_event(check) -> float:
        seconds = min(timeit.repeat(lambda: [check(e) for e in events], number=3, repeat=5))
        return seconds / 3 / len(events)

    timings = {
        "compiled schema (Gantry)": per_event(compiled),
        "jsonschema, same schema": per_event(jsonschema_check),
        "hand-written checks": per_event(handwritten_ok),
    }
    ours = timings["compiled schema (Gantry)"]
    section = Section(
        title="SDK events: checking a batch against the event schema (pure)",
        intro=(
            f"A batch of {len(events)} events (step windows, checkpoints saved and restored, "
            f"ready; {answers.count(False)} broken) checked against "
            "`telemetry.sdk_events.EVENT_SCHEMA`, as `sdk_events_ingest` does before building "
            "rows. All three give the same answers (asserted). Best of 5."
        ),
        columns=["check", "per event", "vs Gantry"],
    )
    for name, seconds in timings.items():
        section.rows.append([name, f"{seconds * 1e6:,.1f} µs", ratio(seconds, ours)])
    section.notes.append(
        "The check alone, without building the event's row (about 10 µs more, the same for "
        "all three)."
    )
    return section
