"""Live sections of a page: rendered on the server, each with a version of its content, so
a poll can send back only the sections that changed (as htmx out-of-band swaps) and stop
once nothing will change any more.

A page renders every section with its version in a hidden input; its poller sends those
versions, and the answer holds the sections whose version differs (none: 204, or 286, which
tells htmx to stop polling, once the page shows the final state of a finished object).
"""

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from django.http import HttpRequest
from django.middleware.csrf import get_token
from django.template.loader import render_to_string
from django.utils.safestring import SafeString

# htmx stops polling an element whose request is answered with this status.
HTMX_STOP_POLLING = 286
# A form's CSRF token is masked anew on every render: it is no change of content.
_CSRF_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')


@dataclass(frozen=True)
class LiveSection:
    id: str  # of its element on the page, and the name its version is sent under
    html: SafeString
    version: str


def section_version(html: str) -> str:
    """A digest of what a section shows: equal for equal content, whatever its CSRF token."""
    return hashlib.sha256(_CSRF_TOKEN.sub("", html).encode()).hexdigest()[:16]


def sections_render(
    *, request: HttpRequest, templates: Sequence[tuple[str, str]], context: Mapping
) -> dict[str, LiveSection]:
    """Each (id, template) rendered with ``context``, by id. Rendered without the context
    processors (the navigation's queries are the page's, not each section's): a section
    gets what ``context`` holds, and the CSRF token for its forms."""
    values = {**context, "csrf_token": get_token(request)}
    sections = {}
    for section_id, template in templates:
        html = render_to_string(template, values)
        sections[section_id] = LiveSection(section_id, html, section_version(html))
    return sections


def sections_changed(
    sections: Iterable[LiveSection], shown: Mapping[str, str]
) -> list[LiveSection]:
    """The sections whose version differs from the one a page says it ``shown``."""
    return [section for section in sections if shown.get(section.id) != section.version]
