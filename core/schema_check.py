"""A JSON Schema compiled to a plain yes/no check, for inputs checked on a hot path.

jsonschema walks the schema anew for every value (about 200 µs for one SDK event, ten times
the hand-written checks it replaced); the check compiled here answers the same question in a
few µs by calling one small function per keyword. It says only whether a value matches:
``core.schema.JsonSchema`` still asks jsonschema for the first error, and only of a value
this check refused. It covers the keywords our schemas use, with jsonschema's meaning
(``integer`` and ``number`` as ``core.schema`` defines them; a keyword ignores values of
types it does not apply to); a schema with any other keyword, an ``enum``/``const`` that
is not all strings, or ``uniqueItems`` of items that need not be strings, is not compiled
(``None``) and jsonschema checks it. The tests hold the two to the same answers
(tests/core/test_schema_check.py). Pure: no Django.

A schema that is not compiled also costs jsonschema's import on its first check in each
process: 4 to 6 s on a loaded two-core machine, most of it rfc3987-syntax building its
grammar (Jupyter's dependencies install it, and jsonschema loads it for its formats). Every
Gantry process paid that on its first Slurm call until ``uniqueItems`` compiled here (see
the workspace start benchmark in docs/benchmarks.md).
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]
# A named format's check: a ValueError or a false result refuses the value.
FormatCheck = Callable[[Any], object]

# Keywords that only carry text for people and messages: they never refuse a value.
_ANNOTATIONS = frozenset({"message", "messages", "title", "description", "$comment"})


class _Unsupported(Exception):
    """The schema uses a keyword this module does not compile."""


def _all(checks: list[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]

    def every(value: Any) -> bool:
        for check in checks:  # noqa: SIM110 (a loop: all() would build a generator per value)
            if not check(value):
                return False
        return True

    return every


def _type_check(kinds: str | list[str], type_checks: Mapping[str, Check]) -> Check:
    names = [kinds] if isinstance(kinds, str) else list(kinds)
    if any(name not in type_checks for name in names):
        raise _Unsupported(f"type {names}")
    checks = [type_checks[name] for name in names]
    return checks[0] if len(checks) == 1 else lambda value: any(c(value) for c in checks)


def _strings(choices: object) -> frozenset[str]:
    """``enum``/``const`` choices as a set, when all are strings: a string equals only a
    string, so ``in`` means what jsonschema's equality means (which tells ``1`` from
    ``True``)."""
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise _Unsupported("enum or const of other than strings")
    return frozenset(choices)


class _Compiler:
    def __init__(
        self, type_checks: Mapping[str, Check], formats: Mapping[str, FormatCheck]
    ) -> None:
        self.types = type_checks
        self.formats = formats

    def compile(self, schema: object) -> Check:
        if schema is True:
            return lambda value: True
        if schema is False:
            return lambda value: False
        if not isinstance(schema, Mapping):
            raise _Unsupported(repr(schema))
        checks = [self._keyword(keyword, expected, schema) for keyword, expected in schema.items()]
        kept = [check for check in checks if check is not None]
        return _all(kept) if kept else (lambda value: True)

    def _keyword(self, keyword: str, expected: Any, schema: Mapping[str, Any]) -> Check | None:
        is_number, is_string = self.types["number"], self.types["string"]
        is_array, is_object = self.types["array"], self.types["object"]
        if keyword in _ANNOTATIONS or keyword in ("then", "else"):
            return None  # then/else are compiled with their "if"
        if keyword == "type":
            return _type_check(expected, self.types)
        if keyword in ("enum", "const"):
            choices = _strings(expected if keyword == "enum" else [expected])
            return lambda value: isinstance(value, str) and value in choices
        if keyword == "minimum" and "maximum" in schema:
            high = schema["maximum"]
            return lambda value: not is_number(value) or expected <= value <= high
        if keyword == "maximum" and "minimum" in schema:
            return None  # checked with the minimum
        if keyword == "minimum":
            return lambda value: not is_number(value) or value >= expected
        if keyword == "maximum":
            return lambda value: not is_number(value) or value <= expected
        if keyword == "exclusiveMinimum":
            return lambda value: not is_number(value) or value > expected
        if keyword == "exclusiveMaximum":
            return lambda value: not is_number(value) or value < expected
        if keyword == "minLength":
            return lambda value: not is_string(value) or len(value) >= expected
        if keyword == "maxLength":
            return lambda value: not is_string(value) or len(value) <= expected
        if keyword == "pattern":
            search = re.compile(expected).search
            return lambda value: not is_string(value) or search(value) is not None
        if keyword == "format":
            return self._format(expected)
        if keyword == "required":
            names = list(expected)
            return lambda value: not is_object(value) or all(name in value for name in names)
        if keyword in ("minProperties", "minItems"):
            applies = is_object if keyword == "minProperties" else is_array
            return lambda value: not applies(value) or len(value) >= expected
        if keyword == "maxItems":
            return lambda value: not is_array(value) or len(value) <= expected
        if keyword == "properties":
            return self._properties(expected)
        if keyword == "additionalProperties":
            return self._additional(expected, schema)
        if keyword == "propertyNames":
            key_check = self.compile(expected)
            return lambda value: not is_object(value) or all(key_check(key) for key in value)
        if keyword == "items":
            item_check = self.compile(expected)
            return lambda value: not is_array(value) or all(item_check(item) for item in value)
        if keyword == "uniqueItems":
            return self._unique(expected, schema)
        if keyword in ("allOf", "anyOf"):
            parts = [self.compile(part) for part in expected]
            combine = all if keyword == "allOf" else any
            return lambda value: combine(part(value) for part in parts)
        if keyword == "not":
            refused = self.compile(expected)
            return lambda value: not refused(value)
        if keyword == "if":
            return self._if(expected, schema)
        raise _Unsupported(keyword)

    def _format(self, name: str) -> Check | None:
        check = self.formats.get(name)
        if check is None:
            return None  # jsonschema passes a format it has no check for

        def conforms(value: Any) -> bool:
            try:
                return bool(check(value))
            except ValueError:
                return False

        return conforms

    def _properties(self, expected: Mapping[str, Any]) -> Check:
        is_object = self.types["object"]
        named = [(name, self.compile(sub)) for name, sub in expected.items()]

        def properties(value: Any) -> bool:
            if not is_object(value):
                return True
            for name, check in named:  # noqa: SIM110 (as in _all)
                if name in value and not check(value[name]):
                    return False
            return True

        return properties

    def _additional(self, expected: Any, schema: Mapping[str, Any]) -> Check:
        if "patternProperties" in schema:
            raise _Unsupported("patternProperties")
        is_object = self.types["object"]
        known = frozenset(schema.get("properties", {}))
        extra_check = self.compile(expected)
        return lambda value: (
            not is_object(value)
            or all(extra_check(value[key]) for key in value if key not in known)
        )

    def _unique(self, expected: Any, schema: Mapping[str, Any]) -> Check | None:
        """``uniqueItems`` of a list whose ``items`` must be strings: a string equals only a
        string, so a set finds repeats as jsonschema's equality does (which tells ``1`` from
        ``True``); an item of another type fails ``items`` anyway."""
        if expected is False:
            return None
        items = schema.get("items")
        if not isinstance(items, Mapping) or items.get("type") != "string":
            raise _Unsupported("uniqueItems of other than strings")
        is_array, is_string = self.types["array"], self.types["string"]

        def unique(value: Any) -> bool:
            if not is_array(value):
                return True
            strings = [item for item in value if is_string(item)]
            return len(set(strings)) == len(strings)

        return unique

    def _if(self, condition: Any, schema: Mapping[str, Any]) -> Check:
        matches = self.compile(condition)
        then = self.compile(schema.get("then", True))
        otherwise = self.compile(schema.get("else", True))
        return lambda value: then(value) if matches(value) else otherwise(value)


def compile_check(
    schema: Mapping[str, Any],
    *,
    type_checks: Mapping[str, Check],
    formats: Mapping[str, FormatCheck],
) -> Check | None:
    """``schema`` as one function that says whether a value matches it, or None when the
    schema uses a keyword this module does not compile. ``type_checks`` holds a check per
    JSON type name; ``formats`` the named format checks (a ValueError or a false result
    refuses the value, as jsonschema's ``FormatChecker`` reads them)."""
    try:
        return _Compiler(type_checks, formats).compile(schema)
    except _Unsupported:
        return None
