"""A cluster's telemetry source: ``cluster.settings["telemetry"]`` checked against
``SETTINGS_SCHEMA`` (``source_settings_parse``); ``telemetry.collection`` ``SOURCES`` builds
the source the settings name.

``{"source": "dcgm", "targets": [...], "timeout_s": 5}``,
``{"source": "prometheus", "url": ..., "step_s": 15, "selector": "{job=\\"dcgm\\"}",
"node_selector": "{job=\\"node\\"}", "timeout_s": 10, "token_env": "PROM_TOKEN"}`` or
``{"source": "simulator"}``. Unknown keys are refused. Pure: no Django.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from core.schema import JsonSchema, SchemaError
from telemetry.sources import (
    DCGM_TIMEOUT_S,
    DEFAULT_STEP_S,
    PROMETHEUS_TIMEOUT_S,
    url_problem,
)


class SourceKind(StrEnum):
    DCGM = "dcgm"
    PROMETHEUS = "prometheus"
    SIMULATOR = "simulator"  # a simulator cluster's own jobs (implied for those clusters)


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """``cluster.settings["telemetry"]`` validated. Secrets appear only as an environment
    variable's name (``token_env``)."""

    source: SourceKind
    targets: tuple[str, ...] = ()  # dcgm
    url: str = ""  # prometheus
    step_s: int = DEFAULT_STEP_S  # prometheus
    selector: str = ""  # prometheus
    node_selector: str | None = None  # prometheus: the node exporter's queries (else selector)
    timeout_s: float = DCGM_TIMEOUT_S
    token_env: str | None = None  # prometheus


def _http_url(value: object) -> bool:
    """The "http-url" format: an http(s) URL without credentials."""
    problem = url_problem(value) if isinstance(value, str) else None
    if problem is not None:
        raise ValueError(problem)
    return True


_CHOICES = ", ".join(kind.value for kind in SourceKind)
_URL_MESSAGES = {"type": "$path must be a string URL", "format": "$path $reason"}
_URL = {"type": "string", "format": "http-url", "messages": _URL_MESSAGES}


def _seconds(low: float, high: float) -> dict[str, Any]:
    message = f"$path must be a number of seconds from {low:g} to {high:g}, not $value"
    return {"type": "number", "minimum": low, "maximum": high, "message": message}


def _kind(kind: SourceKind, properties: dict[str, Any], **rules: Any) -> dict[str, Any]:
    """The keys of the ``kind`` source: only these, checked as ``properties`` say."""
    return {
        "if": {"properties": {"source": {"const": kind.value}}},
        "then": {
            "additionalProperties": False,
            "properties": {"source": {}, **properties},
            "messages": {
                "additionalProperties": f"unknown key$s for the {kind} source: $unknown "
                "(allowed: $allowed)"
            },
            **rules,
        },
    }


_TARGETS_MESSAGE = (
    'the dcgm source needs "targets": a list of dcgm-exporter URLs like '
    "http://10.0.0.5:9400/metrics"
)
SETTINGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["source"],
    "messages": {
        "type": "telemetry settings must be a JSON object, not $type",
        "required": f'telemetry settings need "source": one of {_CHOICES}',
    },
    "properties": {
        "source": {
            "enum": [kind.value for kind in SourceKind],
            "message": f"unknown telemetry source $value: use one of {_CHOICES}",
        },
    },
    "allOf": [
        _kind(SourceKind.SIMULATOR, {}),
        _kind(
            SourceKind.DCGM,
            {
                "targets": {
                    "type": "array",
                    "minItems": 1,
                    "items": _URL,
                    "messages": {"type": _TARGETS_MESSAGE, "minItems": _TARGETS_MESSAGE},
                },
                "timeout_s": _seconds(0.1, 120),
            },
            required=["targets"],
            message=_TARGETS_MESSAGE,
        ),
        _kind(
            SourceKind.PROMETHEUS,
            {
                "url": _URL
                | {
                    # Where a token would sit.
                    "pattern": r"^[^?#]*$",
                    "messages": _URL_MESSAGES
                    | {
                        "pattern": "url must be the Prometheus base URL without a query or "
                        "fragment, not $value",
                    },
                },
                "step_s": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 3600,
                    "message": "step_s must be a whole number of seconds from 1 to 3600, "
                    "not $value",
                },
                "selector": {
                    "type": "string",
                    "pattern": r"^(\{[^\r\n]*\})?\Z",
                    "message": "selector must be a label matcher in braces on one line, "
                    'like {job="dcgm"}, not $value',
                },
                "node_selector": {
                    "type": "string",
                    "pattern": r"^(\{[^\r\n]*\})?\Z",
                    "message": "node_selector must be a label matcher in braces on one line, "
                    'like {job="node"}, not $value',
                },
                "timeout_s": _seconds(0.1, 120),
                "token_env": {
                    "type": ["string", "null"],
                    "pattern": r"^[A-Za-z_][A-Za-z0-9_]*\Z",
                    "message": "token_env must be the NAME of an environment variable "
                    "(letters, digits and underscores, not starting with a digit), not $value",
                },
            },
            required=["url"],
            message='the prometheus source needs "url": the Prometheus server\'s base URL '
            "like http://prometheus:9090",
        ),
    ],
}
SETTINGS = JsonSchema(SETTINGS_SCHEMA, formats={"http-url": _http_url})


def source_settings_parse(raw: Any) -> SourceSettings:
    """Validate ``cluster.settings["telemetry"]``; every problem is a ``SchemaError`` (a
    ValueError) saying which."""
    SETTINGS.validate(raw)
    kind = SourceKind(raw["source"])
    if kind is SourceKind.SIMULATOR:
        return SourceSettings(source=kind)
    if kind is SourceKind.DCGM:
        targets = tuple(raw["targets"])
        for i, target in enumerate(targets):
            if target in targets[:i]:
                raise SchemaError(f"targets[{i}] repeats {target}", path=f"targets[{i}]")
        timeout = float(raw.get("timeout_s", DCGM_TIMEOUT_S))
        return SourceSettings(source=kind, targets=targets, timeout_s=timeout)
    return SourceSettings(
        source=kind,
        url=raw["url"].rstrip("/"),
        step_s=raw.get("step_s", DEFAULT_STEP_S),
        selector=raw.get("selector", ""),
        node_selector=raw.get("node_selector"),
        timeout_s=float(raw.get("timeout_s", PROMETHEUS_TIMEOUT_S)),
        token_env=raw.get("token_env"),
    )
