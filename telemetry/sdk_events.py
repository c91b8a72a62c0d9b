"""The events the job-side SDK posts (docs/sdk.md), as a JSON Schema: ``EVENT_SCHEMA``.

An event that does not match is rejected and counted, not stored; fields the schema does not
name are ignored, since newer SDKs may send more. Pure: no Django.
"""

from datetime import UTC, datetime
from typing import Any

from core.schema import JsonSchema

MAX_URI_LENGTH = 2048
MAX_SEQ = 2**63 - 1
MAX_STEPS = 2**31 - 1
# Per-rank windows (issue 36): a rank is < the world size, at most this many ranks.
MAX_WORLD_SIZE = 65536
MAX_HOST_LENGTH = 255
MAX_GPU_LENGTH = 64
MAX_WINDOW = 2**31 - 1
# Timestamps outside these bounds are a broken clock, not telemetry.
EARLIEST_TS = datetime(2000, 1, 1, tzinfo=UTC).timestamp()
LATEST_TS = datetime(2100, 1, 1, tzinfo=UTC).timestamp()

READY = "ready"
STEP_WINDOW = "step_window"
CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_RESTORED = "checkpoint_restored"
RANK_WINDOW = "rank_window"

_TIMESTAMP = {"type": "number", "minimum": EARLIEST_TS, "maximum": LATEST_TS}
_SECONDS = {"type": "number", "minimum": 0}
_STEP = {"type": "integer", "minimum": 0, "maximum": MAX_SEQ}
# PostgreSQL's text and jsonb cannot hold U+0000.
_NO_NUL = r"^[^\x00]*$"


def _text(max_length: int) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": _NO_NUL}


def _of_type(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"if": {"properties": {"type": {"const": kind}}}, "then": schema}


EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["seq", "ts", "type"],
    "properties": {
        "seq": {"type": "integer", "minimum": 1, "maximum": MAX_SEQ},
        "ts": _TIMESTAMP,
        "type": {"enum": [READY, STEP_WINDOW, CHECKPOINT_SAVED, CHECKPOINT_RESTORED, RANK_WINDOW]},
    },
    "allOf": [
        _of_type(
            STEP_WINDOW,
            {
                "required": ["start", "end", "steps", "step_time_s"],
                "properties": {
                    "start": _TIMESTAMP,
                    "end": _TIMESTAMP,
                    "steps": {"type": "integer", "minimum": 0, "maximum": MAX_STEPS},
                    "step_time_s": _SECONDS,
                    "data_wait_s": _SECONDS,
                    "comm_wait_s": _SECONDS,
                    "checkpoint_s": _SECONDS,
                    "step": {"anyOf": [{"type": "null"}, _STEP]},
                },
            },
        ),
        *(
            _of_type(
                kind,
                {
                    "required": ["step", "uri", "seconds"],
                    "properties": {
                        "step": _STEP,
                        "uri": _text(MAX_URI_LENGTH),
                        "seconds": _SECONDS,
                    },
                },
            )
            for kind in (CHECKPOINT_SAVED, CHECKPOINT_RESTORED)
        ),
        # One rank's step window (every rank sends its own): ``rank < world_size`` is checked
        # by ``telemetry.rank_windows``, which says so in the refusal.
        _of_type(
            RANK_WINDOW,
            {
                "required": [
                    "rank",
                    "world_size",
                    "host",
                    "gpu",
                    "window",
                    "start",
                    "end",
                    "steps",
                    "step_time_s",
                ],
                "properties": {
                    "rank": {"type": "integer", "minimum": 0, "maximum": MAX_WORLD_SIZE - 1},
                    "local_rank": {"type": "integer", "minimum": 0, "maximum": MAX_WORLD_SIZE - 1},
                    "world_size": {"type": "integer", "minimum": 1, "maximum": MAX_WORLD_SIZE},
                    "host": _text(MAX_HOST_LENGTH),
                    "gpu": _text(MAX_GPU_LENGTH),
                    "window": {"type": "integer", "minimum": 1, "maximum": MAX_WINDOW},
                    "start": _TIMESTAMP,
                    "end": _TIMESTAMP,
                    "steps": {"type": "integer", "minimum": 0, "maximum": MAX_STEPS},
                    "step_time_s": _SECONDS,
                    "data_wait_s": _SECONDS,
                    "comm_wait_s": _SECONDS,
                },
            },
        ),
    ],
}
EVENT = JsonSchema(EVENT_SCHEMA)
