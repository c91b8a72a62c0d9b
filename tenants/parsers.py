"""The API's JSON parser: bodies whose every string is text PostgreSQL can store."""

import json

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class JsonTextParser(JSONParser):
    """JSON whose strings are all valid Unicode.

    ``"\\ud800"`` is valid JSON, but it decodes to an unpaired surrogate, which UTF-8 cannot
    encode: stored, it makes PostgreSQL fail; named back in an error (an unknown key), it
    makes rendering the response fail. Either is a 500, so such a body is refused whole.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise ParseError(
                "JSON parse error - a string holds an unpaired surrogate (\\ud800 to \\udfff), "
                "which is not Unicode text."
            ) from None
        return data
