"""The experiment spec (version 1) and experiment templates, as plain data.

A spec is a nested document (YAML or JSON) that names an experiment; ``ExperimentInput``
is the flat request the services validate. Both read their fields from
``jobs.experiment_fields.FIELDS``: each with its ``ExperimentInput`` name (``gpus_per_node``)
and its dotted spec name (``resources.gpus_per_node``). The parser reports errors under the
dotted names a document has; ``template_apply`` and the services report them by field name,
and a spec's edge (``errors_to_spec``) says them once in the spec's names.

No Django here: the server, the tests and a command line client share this module.
"""

import json
from collections.abc import Iterable, Mapping, Set
from typing import Any

from clusters.env_names import env_name_refusal
from jobs.experiment_fields import SPEC_FIELDS, ExperimentField

SPEC_VERSION = 1
SPEC_KIND = "experiment"
NON_FIELD = "non_field_errors"

# Canonical order: the order of keys in an exported spec.
FIELDS = SPEC_FIELDS
BY_DOTTED = {f.spec: f for f in FIELDS}
BY_FIELD = {f.name: f for f in FIELDS}
# The document's keys outside the groups, in order: the fields' and the template's, which
# follows the name.
_TOP_FIELD_KEYS = tuple(dict.fromkeys(f.spec.partition(".")[0] for f in FIELDS))
GROUPS = tuple(dict.fromkeys(f.spec.partition(".")[0] for f in FIELDS if "." in f.spec))
# Keys of the document that are not values of the experiment.
META_KEYS = ("version", "kind", "template")
TOP_LEVEL_KEYS = (
    "version",
    "kind",
    *(name for key in _TOP_FIELD_KEYS for name in ((key, "template") if key == "name" else (key,))),
)
REQUIRED = ("version", "kind", "tenant", "project")
# What an experiment needs, from the spec or from its template.
REQUIRED_VALUES = tuple(f.spec for f in FIELDS if f.required and f.spec not in REQUIRED)
# What a template may set, lock and bound.
TEMPLATE_FIELDS = tuple(f.spec for f in FIELDS if f.spec != "tenant")
RANGE_FIELDS = tuple(f.spec for f in FIELDS if f.type == "integer")


def _property(field: ExperimentField) -> dict[str, Any]:
    """The JSON Schema of one field's value."""
    schema: dict[str, Any] = {"type": field.type}
    if field.text and field.max_length is not None:
        schema["maxLength"] = field.max_length
    if field.minimum is not None:
        schema["minimum"] = field.minimum
    if field.maximum is not None:
        schema["maximum"] = field.maximum
    if field.pattern:
        schema["pattern"] = field.pattern
    if field.choices:
        schema["enum"] = list(field.choices)
    if field.name == "env":
        schema["additionalProperties"] = {"type": "string"}
    if field.doc:
        schema["description"] = field.doc
    return schema


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema


def _properties() -> dict[str, Any]:
    properties: dict[str, Any] = {
        "version": {"type": "integer", "const": SPEC_VERSION},
        "kind": {"type": "string", "const": SPEC_KIND},
        "template": {
            "type": "string",
            "description": "A template of the tenant, or a global one, by name.",
        },
    }
    groups: dict[str, dict[str, Any]] = {}
    for field in FIELDS:
        group, dot, key = field.spec.partition(".")
        if dot:
            groups.setdefault(group, {})[key] = _property(field)
        else:
            properties[group] = _property(field)
    properties.update({group: _object(members) for group, members in groups.items()})
    return {key: properties[key] for key in TOP_LEVEL_KEYS}


SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://gantry.example.org/schemas/experiment-spec-v1.json",
    "title": "Gantry experiment spec, version 1",
    **_object(_properties(), REQUIRED),
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
    return {BY_DOTTED[name].name: value for name, value in flat.items() if name in BY_DOTTED}


def errors_to_spec(errors: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Errors by ExperimentInput field → errors by dotted spec name (others kept as named):
    what a spec's submitter is told, in the names of the document."""
    translated: dict[str, list[str]] = {}
    for name, messages in errors.items():
        dotted = BY_FIELD[name].spec if name in BY_FIELD else name
        translated.setdefault(dotted, []).extend(messages)
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
            elif BY_DOTTED[name].name not in values:
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
        default = values.get(BY_DOTTED[name].name)
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

    Values and errors are by ExperimentInput field name; ``locked`` and ``ranges`` by
    dotted spec name, as a template stores them. A locked field may be submitted only with
    the template's value; every ranged field of the merged result must be inside its range.
    """
    merged = {**template_values, **submitted}
    errors: dict[str, list[str]] = {}
    for name in locked:
        field = BY_DOTTED[name].name
        if field in submitted and submitted[field] != template_values.get(field):
            _add(
                errors,
                field,
                f"Locked by template {template_name}: must be "
                f"{_shown(template_values.get(field))}.",
            )
    for name, bounds in ranges.items():
        field = BY_DOTTED[name].name
        value: Any = merged.get(field)
        if field in errors or not _has_type(value, "integer"):
            continue
        if not bounds["min"] <= value <= bounds["max"]:
            _add(
                errors,
                field,
                f"Must be between {bounds['min']} and {bounds['max']} (template {template_name}).",
            )
    required = (BY_DOTTED[name].name for name in REQUIRED_VALUES)
    for field, message in _missing(merged, required).items():
        errors.setdefault(field, []).extend(message)
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
        value = values.get(spec_field.name)
        if value is None or value in ("", {}):
            continue
        group, dot, key = spec_field.spec.partition(".")
        if dot:
            spec.setdefault(group, {})[key] = value
        else:
            spec[group] = _sorted(value) if spec_field.type == "object" else value
    if template:
        spec["template"] = template
    return {key: spec[key] for key in TOP_LEVEL_KEYS if key in spec}
