"""Gantry's log lines as JSON objects, one per line (``GANTRY_LOG_FORMAT=json``).

Fields: time (UTC, ISO 8601), level, logger, message, the run_id, attempt_id and cluster of
the line's ``log_context`` (core/log_context.py) when it has them, and the traceback of an
exception. Nothing else from the record: an ``extra`` passed to a log call is not written,
so no object that holds a secret (a request and its headers, a backend's settings) leaks
into the log by being attached to a record.
"""

import json
import logging
from datetime import UTC, datetime

from django.core.exceptions import PermissionDenied

from core.log_context import LOG_CONTEXT_FIELDS


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in LOG_CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


class RefusalWithoutTraceback(logging.Filter):
    """A request refused with PermissionDenied (403) is one log line, not a traceback.

    Django logs the refusal with the exception attached, so every 403 wrote the stack of
    the view that refused: noise that buried real errors. The line keeps the status, method
    and path; a refusal is the code working as meant, so its stack tells nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], PermissionDenied):
            record.exc_info = None
            record.exc_text = None
        return True
