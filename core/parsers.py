"""The API's JSON parser: bodies whose every string is text PostgreSQL can store, nested
no deeper than any request of Gantry's needs."""

import io
import json
from collections.abc import Iterable

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.renderers import JSONRenderer

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


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The body is too large."
    default_code = "payload_too_large"


class BoundedJsonTextParser(BaseParser):
    """JSON text (as ``JsonTextParser``) of at most ``max_bytes``: a larger body is 413,
    refused on its declared length before it is read, else once ``max_bytes + 1`` bytes
    are in; bytes that are not text in the request's charset (UTF-8 unless it names
    another) are 400 with the first bad byte.

    Not a ``JSONParser`` subclass on purpose: DRF reads the whole body into memory before
    calling those (and Django then answers a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``
    with a bare HTML 400); this one gets the stream and reads no further than its limit."""

    media_type = "application/json"
    renderer_class = JSONRenderer
    max_bytes: int

    def parse(self, stream, media_type=None, parser_context=None):
        context = parser_context or {}
        request = context.get("request")
        declared = request.META.get("CONTENT_LENGTH", "") if request is not None else ""
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_bytes:
            raise self._too_large()
        body = stream.read(self.max_bytes + 1) if stream is not None else b""
        if len(body) > self.max_bytes:
            raise self._too_large()
        encoding = context.get("encoding") or settings.DEFAULT_CHARSET
        try:
            body.decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(
                f"The body is not {encoding} text: byte {exc.start} "
                f"(0x{body[exc.start]:02x}) is {exc.reason}."
            ) from None
        return JsonTextParser().parse(io.BytesIO(body), media_type, context)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"The body is larger than {self.max_bytes // 1024} KiB.")
