"""The API's JSON parser: bodies whose every string is text PostgreSQL can store, nested
no deeper than any request of Gantry's needs."""

import json
from collections.abc import Iterable

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# Parameters, env and template values are a few levels deep; 32 is far beyond them and far
# below where Python's recursion limit turns parsing or rendering into a 500.
MAX_JSON_DEPTH = 32
TOO_DEEP = f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."


def json_depth(value) -> int:
    """How deeply lists and objects nest in a parsed JSON value (a scalar is 0), without
    recursion, so any depth is measured."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[object]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


class JsonTextParser(JSONParser):
    """JSON whose strings are all valid Unicode.

    ``"\\ud800"`` is valid JSON, but it decodes to an unpaired surrogate, which UTF-8 cannot
    encode: stored, it makes PostgreSQL fail; named back in an error (an unknown key), it
    makes rendering the response fail. Either is a 500, so such a body is refused whole.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # nested past Python's own limit: refused before any check
            raise ParseError(TOO_DEEP) from None
        if json_depth(data) > MAX_JSON_DEPTH:
            raise ParseError(TOO_DEEP)
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ParseError(
                "JSON parse error - a string holds an unpaired surrogate (\\ud800 to \\udfff), "
                "which is not Unicode text."
            ) from None
        return data
