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

from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.safestring import SafeString

# htmx stops polling an element whose request is answered with this status.
HTMX_STOP_POLLING = 286
# How often a live page part (``live_page``) asks for itself again.
LIVE_PAGE_REFRESH_S = 10


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


# --- live page parts ---------------------------------------------------------------------


@dataclass(frozen=True)
class LivePage:
    """A part of a page that refreshes itself (templates/_live_page.html): its HTML, the
    version of that HTML, and the URL a poll asks for it with that version."""

    id: str
    html: SafeString
    version: str
    url: str
    refresh_s: int


def live_page(
    request: HttpRequest,
    *,
    part_id: str,
    template: str,
    context: Mapping[str, Any],
    refresh_s: int | None = None,
) -> LivePage:
    """``template`` rendered with ``context`` as a page part that refreshes itself, like the
    run list: the same page polled with ``partial=<part_id>`` and the version it shows.

    Rendered without the context processors (the navigation is the page's, not the part's),
    so the part holds no per-request token and equal data gives equal HTML: its version is
    a digest of the HTML itself, so whatever the part shows is in its version and nothing it
    showed can stay behind once the data changes."""
    html = render_to_string(template, context)
    version = hashlib.sha256(html.encode()).hexdigest()[:16]
    query = request.GET.copy()
    query["partial"] = part_id
    query["shown"] = version
    return LivePage(
        id=part_id,
        html=SafeString(html),
        version=version,
        url=f"{request.path}?{query.urlencode()}",
        refresh_s=refresh_s or LIVE_PAGE_REFRESH_S,
    )


def live_page_poll(request: HttpRequest, part: LivePage) -> HttpResponse | None:
    """The answer to a poll of ``part``: 204 while the page shows its version, the part
    alone when it changed; None when the request is not a poll of it (render the page)."""
    if request.GET.get("partial") != part.id:
        return None
    if request.GET.get("shown") == part.version:
        return HttpResponse(status=204)
    return HttpResponse(render_to_string("_live_page.html", {"live_page": part}).strip())
