"""Helpers of the web and API edge.

``or_404`` is the edge's one conversion of "not found": selectors and access gates raise
the model's ``DoesNotExist`` (or ``tenants.access.NotVisible``) alike for a missing object
and one the user may not see; views and API endpoints call them through ``or_404``, so
outsiders get the same 404 as for what does not exist, and nothing below the edge knows
about HTTP.

``form_page`` is the one create/edit page: a form, a service that saves, a redirect.

``ascii_id`` reads an id from a URL or a form: ASCII digits only (``str.isdigit`` also
takes "²", which ``int`` refuses), within a bigint.
"""

from collections.abc import Callable, Mapping
from typing import ParamSpec, TypeVar

from django.apps import apps
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from core.forms import ServiceErrorsMixin
from core.ids import MAX_ID

P = ParamSpec("P")
T = TypeVar("T")


def or_404(lookup: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``lookup(*args, **kwargs)``, with a DoesNotExist answered as 404 (DRF answers an
    Http404 with its own 404 too)."""
    try:
        return lookup(*args, **kwargs)
    except ObjectDoesNotExist as exc:
        raise Http404(_not_found_text(exc)) from None


def _not_found_text(exc: ObjectDoesNotExist) -> str:
    """What a 404 says: the kind of thing that was not found, in words ("No such run."), not
    the ORM's message ("Run matching query does not exist."), which names a model and a query."""
    for model in apps.get_models():
        if type(exc) is getattr(model, "DoesNotExist", None):
            return f"No such {model._meta.verbose_name}."
    text = str(exc).strip()
    return text if text.endswith(".") else f"{text or 'Not found'}."


def form_page(
    request: HttpRequest,
    form: ServiceErrorsMixin,
    *,
    save: Callable[[dict], T],
    done: Callable[[T], HttpResponse],
    template: str,
    context: Mapping[str, object] | None = None,
) -> HttpResponse:
    """A create or edit page. On a POST whose form is valid, ``save(cleaned_data)`` calls the
    service; a ValidationError it raises goes onto the form's fields, else ``done(saved)``
    answers (a redirect with its message). Otherwise the page with the form: 400 while the
    form has errors, so a failed save is never a 200."""
    if request.method == "POST" and form.is_valid():
        try:
            saved = save(form.cleaned_data)
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            return done(saved)
    return render(
        request,
        template,
        {"form": form, **(context or {})},
        status=400 if form.errors else 200,
    )


def ascii_id(text: str | None) -> int | None:
    """``text`` as an id (1 to ``MAX_ID``, ASCII digits only), else None."""
    if not text or not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    value = int(text)
    return value if 1 <= value <= MAX_ID else None
