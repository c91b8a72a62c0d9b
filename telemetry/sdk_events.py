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
# Timestamps outside these bounds are a broken clock, not telemetry.
EARLIEST_TS = datetime(2000, 1, 1, tzinfo=UTC).timestamp()
LATEST_TS = datetime(2100, 1, 1, tzinfo=UTC).timestamp()

READY = "ready"
STEP_WINDOW = "step_window"
CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_RESTORED = "checkpoint_restored"

_TIMESTAMP = {"type": "number", "minimum": EARLIEST_TS, "maximum": LATEST_TS}
_SECONDS = {"type": "number", "minimum": 0}
_STEP = {"type": "integer", "minimum": 0, "maximum": MAX_SEQ}


def _of_type(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"if": {"properties": {"type": {"const": kind}}}, "then": schema}


EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["seq", "ts", "type"],
    "properties": {
        "seq": {"type": "integer", "minimum": 1, "maximum": MAX_SEQ},
        "ts": _TIMESTAMP,
        "type": {"enum": [READY, STEP_WINDOW, CHECKPOINT_SAVED, CHECKPOINT_RESTORED]},
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
                        # PostgreSQL's jsonb cannot hold U+0000.
                        "uri": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_URI_LENGTH,
                            "pattern": r"^[^\x00]*$",
                        },
                        "seconds": _SECONDS,
                    },
                },
            )
            for kind in (CHECKPOINT_SAVED, CHECKPOINT_RESTORED)
        ),
    ],
}
EVENT = JsonSchema(EVENT_SCHEMA)
