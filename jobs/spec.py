"""The experiment spec (version 1) and experiment templates, as plain data.

A spec is a nested document (YAML or JSON) that names an experiment; ``ExperimentInput``
is the flat request the services validate. ``FIELDS`` is the one table between the two:
every dotted spec name (``resources.gpus_per_node``) with its ``ExperimentInput`` field
(``gpus_per_node``) and JSON type. Errors are reported under dotted spec names.

No Django here: the server, the tests and a command line client share this module.
"""

import json
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import Any

from clusters.env_names import env_name_refusal

SPEC_VERSION = 1
SPEC_KIND = "experiment"
NON_FIELD = "non_field_errors"


@dataclass(frozen=True)
class SpecField:
    dotted: str  # name in the spec, e.g. "resources.nodes"
    field: str  # name in ExperimentInput, e.g. "nodes"
    type: str  # JSON type: "string", "integer" or "object"


# Canonical order: the order of keys in an exported spec.
FIELDS: tuple[SpecField, ...] = (
    SpecField("tenant", "tenant", "string"),
    SpecField("project", "project", "string"),
    SpecField("name", "name", "string"),
    SpecField("image", "image", "string"),
    SpecField("command", "command", "string"),
    SpecField("resources.flavor", "flavor", "string"),
    SpecField("resources.nodes", "nodes", "integer"),
    SpecField("resources.gpus_per_node", "gpus_per_node", "integer"),
    SpecField("resources.max_runtime_minutes", "max_runtime_minutes", "integer"),
    SpecField("resources.topology_level", "topology_level", "string"),
    SpecField("resources.topology_mode", "topology_mode", "string"),
    SpecField("code.repository", "code_repository", "string"),
    SpecField("code.commit", "code_commit", "string"),
    SpecField("dataset.uri", "dataset_uri", "string"),
    SpecField("dataset.version", "dataset_version", "string"),
    SpecField("params", "params", "object"),
    SpecField("env", "env", "object"),
    SpecField("priority", "priority", "integer"),
    SpecField("max_restarts", "max_restarts", "integer"),
    SpecField("checkpoint_dir", "checkpoint_dir", "string"),
)
BY_DOTTED = {f.dotted: f for f in FIELDS}
BY_FIELD = {f.field: f for f in FIELDS}
GROUPS = ("resources", "code", "dataset")
# Keys of the document that are not values of the experiment.
META_KEYS = ("version", "kind", "template")
TOP_LEVEL_KEYS = (
    "version",
    "kind",
    "tenant",
    "project",
    "name",
    "template",
    "image",
    "command",
    "resources",
    "code",
    "dataset",
    "params",
    "env",
    "priority",
    "max_restarts",
    "checkpoint_dir",
)
REQUIRED = ("version", "kind", "tenant", "project")
# What an experiment needs, from the spec or from its template.
REQUIRED_VALUES = (
    "image",
    "command",
    "resources.flavor",
    "resources.nodes",
    "resources.gpus_per_node",
)
# What a template may set, lock and bound.
TEMPLATE_FIELDS = tuple(f.dotted for f in FIELDS if f.dotted != "tenant")
RANGE_FIELDS = tuple(f.dotted for f in FIELDS if f.type == "integer")

_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://gantry.example.org/schemas/experiment-spec-v1.json",
    "title": "Gantry experiment spec, version 1",
    **_object(
        {
            "version": {"type": "integer", "const": SPEC_VERSION},
            "kind": {"type": "string", "const": SPEC_KIND},
            "tenant": {**_STRING, "description": "Tenant slug."},
            "project": {**_STRING, "description": "Project slug within the tenant."},
            "name": {**_STRING, "maxLength": 200},
            "template": {
                **_STRING,
                "description": "A template of the tenant, or a global one, by name.",
            },
            "image": {
                **_STRING,
                "description": "repository@sha256:<64 hex>, or repository:tag resolved at submit.",
            },
            "command": {**_STRING, "description": "Shell command, at most 16 KiB."},
            "resources": _object(
                {
                    "flavor": {**_STRING, "description": "GPU flavor slug, e.g. a100-80gb."},
                    "nodes": {**_INTEGER, "minimum": 1},
                    "gpus_per_node": {**_INTEGER, "minimum": 1},
                    "max_runtime_minutes": {**_INTEGER, "minimum": 1, "maximum": 30 * 24 * 60},
                    "topology_level": {
                        **_STRING,
                        "maxLength": 63,
                        "description": "A topology level of the clusters, e.g. leaf: the "
                        "gang's nodes share one domain of it.",
                    },
                    "topology_mode": {
                        "type": "string",
                        "enum": ["preferred", "required"],
                        "description": "required: wait for one domain of the level; "
                        "preferred (the default): as tight as the free nodes allow.",
                    },
                }
            ),
            "code": _object(
                {
                    "repository": {**_STRING, "maxLength": 500},
                    "commit": {**_STRING, "pattern": "^[0-9a-f]{40}$"},
                }
            ),
            "dataset": _object(
                {"uri": {**_STRING, "maxLength": 500}, "version": {**_STRING, "maxLength": 200}}
            ),
            "params": {"type": "object", "description": "Free-form JSON object."},
            "env": {"type": "object", "additionalProperties": _STRING},
            "priority": {**_INTEGER, "minimum": 0, "maximum": 100},
            "max_restarts": {**_INTEGER, "minimum": 0, "maximum": 20},
            "checkpoint_dir": {**_STRING, "maxLength": 500},
        },
        REQUIRED,
    ),
}

_KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "": TOP_LEVEL_KEYS,
    **{group: tuple(SPEC_SCHEMA["properties"][group]["properties"]) for group in GROUPS},
}


def json_type(value: object) -> str:
    """The JSON type of ``value`` with its article, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return "an unknown type"


_EXPECTED = {"string": "a string", "integer": "an integer", "object": "an object"}


# PostgreSQL text cannot hold U+0000: a string with it is refused before any lookup by it.
_NUL_MESSAGE = "Must not contain NUL characters."


def _has_type(value: object, type_: str) -> bool:
    if type_ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "string":
        return isinstance(value, str)
    return isinstance(value, Mapping)


def _add(errors: dict[str, list[str]], name: str, message: str) -> None:
    errors.setdefault(name, []).append(message)


def _unknown(
    errors: dict[str, list[str]], document: Mapping[str, Any], prefix: str, allowed: Set[str]
) -> None:
    known = _KNOWN_KEYS[prefix]
    for key in document:
        if key not in allowed:
            name = f"{prefix}.{key}" if prefix else str(key)
            _add(errors, name, f"Unknown field; known fields: {', '.join(known)}.")


def _flatten(
    document: Mapping[str, Any], errors: dict[str, list[str]], allowed: tuple[str, ...]
) -> dict[str, Any]:
    """Values of ``document`` by dotted name, checking keys and types."""
    groups = {name.partition(".")[0] for name in allowed if "." in name}
    top = {name for name in allowed if "." not in name} | groups
    _unknown(errors, document, "", top)
    flat: dict[str, Any] = {}
    for group in groups:
        if group not in document:
            continue
        inner = document[group]
        if not isinstance(inner, Mapping):
            _add(errors, group, f"Expected an object, got {json_type(inner)}.")
            continue
        members = {name.partition(".")[2] for name in allowed if name.startswith(group + ".")}
        _unknown(errors, inner, group, members)
        flat.update({f"{group}.{key}": value for key, value in inner.items() if key in members})
    flat.update({key: document[key] for key in top - groups if key in document})
    for name, value in flat.items():
        spec_field = BY_DOTTED.get(name)
        if spec_field is None:  # a meta key
            continue
        if not _has_type(value, spec_field.type):
            _add(errors, name, f"Expected {_EXPECTED[spec_field.type]}, got {json_type(value)}.")
        elif spec_field.type == "string" and "\x00" in value:
            _add(errors, name, _NUL_MESSAGE)
        elif name == "env":
            for key, item in value.items():
                refusal = env_name_refusal(key) if "\x00" not in key else None
                if refusal is not None:
                    _add(errors, name, refusal)
                elif not isinstance(item, str):
                    _add(
                        errors, name, f"The value of {key} must be a string, not {json_type(item)}."
                    )
                elif "\x00" in key or "\x00" in item:
                    _add(errors, name, _NUL_MESSAGE)
    return flat


def _missing(values: Mapping[str, Any], names: Iterable[str]) -> dict[str, list[str]]:
    return {name: ["This field is required."] for name in names if name not in values}


def to_input(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted spec names → ExperimentInput field names (meta keys dropped)."""
    return {BY_DOTTED[name].field: value for name, value in flat.items() if name in BY_DOTTED}


def errors_to_spec(errors: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Errors by ExperimentInput field → errors by dotted spec name (others kept as named)."""
    translated: dict[str, list[str]] = {}
    for name, messages in errors.items():
        dotted = BY_FIELD[name].dotted if name in BY_FIELD else name
        translated.setdefault(dotted, []).extend(messages)
    return translated


def errors_to_input(errors: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Errors by dotted spec name → errors by ExperimentInput field (others kept as named)."""
    translated: dict[str, list[str]] = {}
    for name, messages in errors.items():
        field = BY_DOTTED[name].field if name in BY_DOTTED else name
        translated.setdefault(field, []).extend(messages)
    return translated


def spec_parse(document: object) -> tuple[dict[str, Any] | None, dict[str, list[str]]]:
    """Check a spec document's keys and types.

    Returns the values by ExperimentInput field name (only those the document gives) and no
    errors, or None and errors by dotted spec name. The template is read with
    ``spec_template_name``; without one, every value an experiment needs must be given.
    """
    if not isinstance(document, Mapping):
        return None, {NON_FIELD: [f"Expected an object, got {json_type(document)}."]}
    errors: dict[str, list[str]] = {}
    flat = _flatten(document, errors, (*META_KEYS, *BY_DOTTED))
    for name, message in _missing(document, REQUIRED).items():
        errors.setdefault(name, []).extend(message)
    version = document.get("version", SPEC_VERSION)
    if not _has_type(version, "integer"):
        _add(errors, "version", f"Expected an integer, got {json_type(version)}.")
    elif version != SPEC_VERSION:
        _add(errors, "version", f"Unsupported version {version}; this server reads {SPEC_VERSION}.")
    kind = document.get("kind", SPEC_KIND)
    if kind != SPEC_KIND:
        _add(errors, "kind", f'Must be "{SPEC_KIND}".')
    template = document.get("template")
    if "template" in document and not isinstance(template, str):
        _add(errors, "template", f"Expected a string, got {json_type(template)}.")
    elif isinstance(template, str) and "\x00" in template:
        _add(errors, "template", _NUL_MESSAGE)
    if "template" not in document:
        for name, message in _missing(flat, REQUIRED_VALUES).items():
            errors.setdefault(name, []).extend(message)
    if errors:
        return None, errors
    return to_input(flat), {}


def spec_values_typed(document: object) -> dict[str, Any]:
    """The values of a spec that ``spec_parse`` refused whose own key and type are right, by
    ExperimentInput field name: what can still be checked against the server's rules, so a
    rejected spec names every failing field at once, not the type errors first and the rest
    on the next try."""
    if not isinstance(document, Mapping):
        return {}
    errors: dict[str, list[str]] = {}
    flat = _flatten(document, errors, (*META_KEYS, *BY_DOTTED))
    return to_input({name: value for name, value in flat.items() if name not in errors})


def spec_template_name(document: Mapping[str, Any]) -> str | None:
    """The template a parsed spec starts from, if any."""
    return document.get("template")


def template_values_parse(values: object) -> tuple[dict[str, Any] | None, dict[str, list[str]]]:
    """A template's values: a partial spec without version, kind, tenant or template."""
    if not isinstance(values, Mapping):
        return None, {NON_FIELD: [f"Expected an object, got {json_type(values)}."]}
    errors: dict[str, list[str]] = {}
    flat = _flatten(values, errors, TEMPLATE_FIELDS)
    if errors:
        return None, errors
    return to_input(flat), {}


def template_rules_check(
    values: Mapping[str, Any], locked: object, ranges: object
) -> dict[str, list[str]]:
    """Errors in a template's locks and ranges, given its parsed values (by field name).

    A locked field needs a value to be locked to; a range is ``{"min": n, "max": m}`` of
    integers, n ≤ m, on an integer field that has a default value inside it.
    """
    errors: dict[str, list[str]] = {}
    if not isinstance(locked, list) or not all(isinstance(name, str) for name in locked):
        _add(errors, "locked", "Expected a list of field names.")
    else:
        for name in locked:
            if name not in TEMPLATE_FIELDS:
                _add(
                    errors, "locked", f"{name}: unknown field; known: {', '.join(TEMPLATE_FIELDS)}."
                )
            elif BY_DOTTED[name].field not in values:
                _add(errors, "locked", f"{name}: give the value it is locked to.")
    if not isinstance(ranges, Mapping):
        _add(errors, "ranges", "Expected an object of field names to {min, max}.")
        return errors
    for name, bounds in ranges.items():
        if name not in RANGE_FIELDS:
            _add(
                errors, "ranges", f"{name}: not a numeric field; known: {', '.join(RANGE_FIELDS)}."
            )
            continue
        if (
            not isinstance(bounds, Mapping)
            or set(bounds) != {"min", "max"}
            or not all(_has_type(bound, "integer") for bound in bounds.values())
        ):
            _add(errors, "ranges", f'{name}: expected {{"min": <integer>, "max": <integer>}}.')
            continue
        if bounds["min"] > bounds["max"]:
            _add(errors, "ranges", f"{name}: min must not be greater than max.")
            continue
        default = values.get(BY_DOTTED[name].field)
        if default is None:
            _add(errors, "ranges", f"{name}: give a default value inside the range.")
        elif not bounds["min"] <= default <= bounds["max"]:
            _add(errors, "ranges", f"{name}: the default {default} is outside the range.")
    return errors


def _shown(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def template_apply(
    template_values: Mapping[str, Any],
    locked: Iterable[str],
    ranges: Mapping[str, Mapping[str, int]],
    submitted: Mapping[str, Any],
    *,
    template_name: str = "",
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Start from the template's values and overlay the submitted ones.

    Values are by ExperimentInput field name; ``locked`` and ``ranges`` and the errors are
    by dotted spec name. A locked field may be submitted only with the template's value;
    every ranged field of the merged result must be inside its range.
    """
    merged = {**template_values, **submitted}
    errors: dict[str, list[str]] = {}
    for name in locked:
        field = BY_DOTTED[name].field
        if field in submitted and submitted[field] != template_values.get(field):
            _add(
                errors,
                name,
                f"Locked by template {template_name}: must be "
                f"{_shown(template_values.get(field))}.",
            )
    for name, bounds in ranges.items():
        value: Any = merged.get(BY_DOTTED[name].field)
        if name in errors or not _has_type(value, "integer"):
            continue
        if not bounds["min"] <= value <= bounds["max"]:
            _add(
                errors,
                name,
                f"Must be between {bounds['min']} and {bounds['max']} (template {template_name}).",
            )
    flat = {BY_FIELD[field].dotted: value for field, value in merged.items() if field in BY_FIELD}
    for name, message in _missing(flat, REQUIRED_VALUES).items():
        errors.setdefault(name, []).extend(message)
    return merged, errors


def _sorted(value: Any) -> Any:
    """JSON with object keys sorted at every level, so exports compare equal."""
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def spec_of(values: Mapping[str, Any], *, template: str | None = None) -> dict[str, Any]:
    """The spec of an experiment given as ExperimentInput values, in canonical key order.

    Empty optional values ("" and {}) are left out; integers are always written, so the
    spec still means the same if a default changes.
    """
    spec: dict[str, Any] = {"version": SPEC_VERSION, "kind": SPEC_KIND}
    for spec_field in FIELDS:
        value = values.get(spec_field.field)
        if value is None or value in ("", {}):
            continue
        group, dot, key = spec_field.dotted.partition(".")
        if dot:
            spec.setdefault(group, {})[key] = value
        else:
            spec[group] = _sorted(value) if spec_field.type == "object" else value
    if template:
        spec["template"] = template
    return {key: spec[key] for key in TOP_LEVEL_KEYS if key in spec}
