"""JSON Schemas, checked one way: ``JsonSchema(schema).validate(value)`` raises ``SchemaError``
with a message that names the field, or returns the value unchanged.

Every strict JSON input from outside the portal's forms — a cluster's backend settings
(``clusters.backends.slurm_settings``, ``k8s_settings``), its telemetry source
(``telemetry.source_settings``) and the job-side SDK's events (``telemetry.sdk_events``) —
is described by a JSON Schema (draft 2020-12) written as a Python dict beside its owner, and
checked here. The owner builds its typed result from the checked value.

Two choices differ from plain draft 2020-12, because the inputs are JSON: ``integer`` is an
``int`` (not ``1.0``, not ``true``) and ``number`` a finite ``int`` or ``float`` (not NaN,
not infinity, not ``true``).

Messages. The first error in the schema's own order is reported. Its message is the
``messages[<keyword>]`` of the subschema whose keyword failed, else the nearest ``message``
found walking from that subschema up to the root, else ``"<path>: <reason>"``. A message is
a ``string.Template``; it may use:

- ``$path``: where the value is, as ``flavors.a100.product`` or ``targets[1]``;
- ``$name`` and ``$parent``: the last and the one-but-last step of the path, quoted
  (``'partition'``); for ``required`` the path ends with the missing key;
- ``$value``: the value, quoted (``'ftp://b'``, ``15.0``); ``$type``: its Python type's name
  (``list``);
- ``$reason``: the plain reason (``must be a string``, or what a format check said);
- ``$unknown``, ``$allowed``, ``$s`` for ``additionalProperties``: the unknown keys and the
  known ones, comma-separated, and "s" when more than one key is unknown.

Formats are named checks given with the schema: ``{"format": "http-url"}`` calls the check
registered under "http-url", which raises ValueError saying what is wrong; that text is
``$reason``.

Speed. A schema is compiled once per process, on first use, into a plain yes/no check
(``core.schema_check``); jsonschema is asked only for the first error of a value that check
refused. Pure: no Django.
"""

import math
import re
import string
from collections.abc import Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

from core.schema_check import Check, FormatCheck, compile_check

if TYPE_CHECKING:
    import jsonschema

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}
# Keywords whose value maps names to subschemas: a walk passes over these mappings.
_NAMED_SUBSCHEMAS = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})


class SchemaError(ValueError):
    """A value does not have the shape its schema describes. The message names the field
    and says what is wrong; ``path`` is where, as the message writes it."""

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


def _is_integer(instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(instance: object) -> bool:
    return (
        isinstance(instance, int | float)
        and not isinstance(instance, bool)
        and math.isfinite(instance)
    )


# Each JSON type as a check of a Python value: jsonschema's own for the others.
_TYPE_CHECKS: dict[str, Check] = {
    "string": lambda instance: isinstance(instance, str),
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda instance: isinstance(instance, bool),
    "array": lambda instance: isinstance(instance, list),
    "object": lambda instance: isinstance(instance, dict),
    "null": lambda instance: instance is None,
}


@cache
def _validator_class() -> Any:
    """Draft 2020-12 with JSON's integers and numbers. jsonschema is imported on the first
    check, not when the portal starts: most processes never check a schema."""
    from jsonschema import validators

    draft = validators.Draft202012Validator
    return validators.extend(
        draft,
        type_checker=draft.TYPE_CHECKER.redefine_many(
            {
                "integer": lambda _checker, instance: _is_integer(instance),
                "number": lambda _checker, instance: _is_number(instance),
            }
        ),
    )


def field_path(steps: Iterable[object]) -> str:
    """``("flavors", "a100", "product")`` as ``flavors.a100.product``; list indices as
    ``[1]``."""
    path = ""
    for step in steps:
        if isinstance(step, int):
            path += f"[{step}]"
        else:
            path += f".{step}" if path else str(step)
    return path


def _subschemas(root: Mapping[str, Any], schema_path: Iterable[object]) -> list[Mapping[str, Any]]:
    """The subschemas from ``root`` down the path of a failed keyword (its last step),
    outermost first."""
    found = [root]
    node: Any = root
    expect_keyword = True  # the next step is a keyword, not a property name or an index
    for step in list(schema_path)[:-1]:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            break
        if expect_keyword and step in _NAMED_SUBSCHEMAS:
            expect_keyword = False  # a mapping of names to subschemas
        elif isinstance(node, Mapping):
            found.append(node)
            expect_keyword = True
        else:
            expect_keyword = False  # a list of subschemas
    return found


def _reason(error: "jsonschema.ValidationError") -> str:
    """What is wrong, in plain words, when no message is given."""
    keyword, expected, schema = error.validator, error.validator_value, error.schema
    if keyword == "type":
        kinds = [expected] if isinstance(expected, str) else list(expected)
        return "must be " + " or ".join(_TYPE_NAMES.get(kind, kind) for kind in kinds)
    if keyword == "required":
        return "is required"
    if keyword == "enum":
        return "must be one of " + ", ".join(str(choice) for choice in expected)
    if keyword == "const":
        return f"must be {expected!r}"
    if keyword in ("minimum", "maximum") and {"minimum", "maximum"} <= set(schema):
        return f"must be from {schema['minimum']} to {schema['maximum']}"
    if keyword in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        words = {
            "minimum": "at least",
            "exclusiveMinimum": "more than",
            "maximum": "at most",
            "exclusiveMaximum": "less than",
        }
        return f"must be {words[keyword]} {expected}"
    if keyword == "minLength" and expected == 1:
        return "must not be empty"
    if keyword in ("minLength", "maxLength"):
        return (
            f"must have {'at least' if keyword == 'minLength' else 'at most'} {expected} characters"
        )
    if keyword in ("minItems", "maxItems", "minProperties", "maxProperties"):
        bound = "at least" if keyword.startswith("min") else "at most"
        unit = "items" if keyword.endswith("Items") else "keys"
        return f"must have {bound} {expected} {unit}"
    if keyword == "uniqueItems":
        return "must not repeat an item"
    if keyword == "pattern":
        return "has characters that are not allowed"
    if keyword == "format" and error.cause is not None:
        return str(error.cause)
    if keyword == "format":
        return f"is not a valid {expected}"
    if keyword in ("anyOf", "oneOf"):
        return "matches none of the shapes allowed here"
    if keyword == "not":
        return "is not allowed here"
    return str(error.message)


class JsonSchema:
    """One JSON Schema and its format checks, compiled on first use (once per process for
    the module-level schemas)."""

    def __init__(
        self, schema: Mapping[str, Any], *, formats: Mapping[str, FormatCheck] | None = None
    ) -> None:
        self.schema = schema
        self.formats = dict(formats or {})
        self._compiled: Any = None
        self._check: Check | None = None

    def _validator(self) -> Any:
        if self._compiled is None:
            from jsonschema import FormatChecker

            # The schemas are checked against the metaschema by the tests
            # (tests/core/test_schema.py), not here: that takes a tenth of a second.
            validator_class = _validator_class()
            checker = FormatChecker(formats=())
            for name, check in self.formats.items():
                checker.checks(name, raises=ValueError)(check)
            self._compiled = validator_class(self.schema, format_checker=checker)
        return self._compiled

    def check_schema(self) -> None:
        """Raise when the schema itself is no valid draft 2020-12 schema."""
        _validator_class().check_schema(self.schema)

    def is_valid(self, value: object) -> bool:
        if self._check is None:
            compiled = compile_check(self.schema, type_checks=_TYPE_CHECKS, formats=self.formats)
            self._check = compiled or self._validator().is_valid
        return bool(self._check(value))

    def error(self, value: object, *, where: str = "") -> SchemaError | None:
        """The first problem of ``value``, its message prefixed with ``where``; None when
        there is none."""
        if self.is_valid(value):
            return None
        first = next(iter(self._validator().iter_errors(value)), None)
        if first is None:
            return None
        return self._error(first, where=where)

    def validate(self, value: Any, *, where: str = "") -> Any:
        """``value`` when it matches the schema; raises ``SchemaError`` otherwise."""
        problem = self.error(value, where=where)
        if problem is not None:
            raise problem
        return value

    def _error(self, error: "jsonschema.ValidationError", *, where: str) -> SchemaError:
        steps = list(error.absolute_path)
        fields: dict[str, str] = {}
        if error.validator == "required" and isinstance(error.instance, Mapping):
            missing = [key for key in error.validator_value if key not in error.instance]
            steps.append(missing[0])
        elif error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
            known = list(error.schema.get("properties", {}))
            patterns = list(error.schema.get("patternProperties", {}))
            unknown = sorted(
                str(key)
                for key in error.instance
                if key not in known and not any(re.search(p, str(key)) for p in patterns)
            )
            fields |= {
                "unknown": ", ".join(unknown),
                "allowed": ", ".join(known),
                "s": "s" if len(unknown) > 1 else "",
            }
        path = field_path(steps)
        reason = _reason(error)
        if "unknown" in fields:
            reason = f"unknown key{fields['s']}: {fields['unknown']}"
        template = self._template(error)
        if template is None:
            message = f"{path}: {reason}" if path else reason
        else:
            names = [repr(step) for step in steps]
            fields |= {
                "path": path,
                "name": names[-1] if names else "",
                "parent": names[-2] if len(names) > 1 else "",
                "value": repr(error.instance),
                "type": type(error.instance).__name__,
                "reason": reason,
            }
            message = string.Template(template).safe_substitute(fields)
        return SchemaError(f"{where}{message}", path=path)

    def _template(self, error: "jsonschema.ValidationError") -> str | None:
        chain = _subschemas(self.schema, error.absolute_schema_path)
        deepest = error.schema
        if chain[-1] is not deepest:
            chain.append(deepest)
        by_keyword = deepest.get("messages")
        if isinstance(by_keyword, Mapping) and isinstance(by_keyword.get(error.validator), str):
            return str(by_keyword[error.validator])
        for subschema in reversed(chain):
            message = subschema.get("message")
            if isinstance(message, str):
                return message
        return None
