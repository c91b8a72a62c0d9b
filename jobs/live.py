"""Live sections of a page: rendered on the server, each with a version of its content, so
a poll can send back only the sections that changed (as htmx out-of-band swaps) and stop
once nothing will change any more.

A page renders every section with its version in a hidden input; its poller sends those
versions, and the answer holds the sections whose version differs (none: 204, or 286, which
tells htmx to stop polling, once the page shows the final state of a finished object).

A version is a digest of what the section shows (its inputs: the values its template reads,
as plain data), not of its HTML, so a poll renders only the sections that changed. Each
section's ``inputs`` must name every value its template shows: equal inputs, equal HTML
(the tests render each section through a run's life and hold the two together).
"""

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.http import HttpRequest
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.safestring import SafeString

# htmx stops polling an element whose request is answered with this status.
HTMX_STOP_POLLING = 286


@dataclass(frozen=True)
class LiveSectionSpec:
    id: str  # of its element on the page, and the name its version is sent under
    template: str
    # The values the template shows, read from the page's context (plain data: strings,
    # numbers, booleans, None, dates, and lists, tuples and dicts of them).
    inputs: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class LiveSection:
    id: str
    html: SafeString
    version: str


_SCALARS = (str, int, float, bool, type(None), datetime, date, timedelta, Decimal, UUID)


def _plain(value: Any) -> Any:
    """``value`` as plain data with a faithful repr; anything else (a model instance, whose
    repr hides its fields) is a mistake in a section's inputs."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Promise):
        return str(value)
    if isinstance(value, list | tuple):
        return tuple(_plain(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((str(key), _plain(item)) for key, item in value.items()))
    raise TypeError(f"A live section's inputs are plain data, not {type(value).__name__}")


def section_version(section_id: str, inputs: Any) -> str:
    """A digest of what a section shows: its inputs, and the time zone and language they are
    shown in."""
    shown = (
        section_id,
        timezone.get_current_timezone_name(),
        translation.get_language(),
        _plain(inputs),
    )
    return hashlib.sha256(repr(shown).encode()).hexdigest()[:16]


def sections_versions(
    *, specs: Sequence[LiveSectionSpec], context: Mapping[str, Any]
) -> dict[str, str]:
    """Each section's version, by id, without rendering it."""
    return {spec.id: section_version(spec.id, spec.inputs(context)) for spec in specs}


def sections_render(
    *,
    request: HttpRequest,
    specs: Sequence[LiveSectionSpec],
    context: Mapping[str, Any],
    versions: Mapping[str, str],
    only: Collection[str] | None = None,
) -> list[LiveSection]:
    """The sections (those in ``only``, if given) rendered with ``context``, in ``specs``
    order. Rendered without the context processors (the navigation's queries are the page's,
    not each section's): a section gets what ``context`` holds, and the CSRF token for its
    forms."""
    values = {**context, "csrf_token": get_token(request)}
    return [
        LiveSection(spec.id, render_to_string(spec.template, values), versions[spec.id])
        for spec in specs
        if only is None or spec.id in only
    ]


def sections_changed(versions: Mapping[str, str], shown: Mapping[str, str]) -> list[str]:
    """The ids of the sections whose version differs from the one a page says it ``shown``."""
    return [
        section_id for section_id, version in versions.items() if shown.get(section_id) != version
    ]
