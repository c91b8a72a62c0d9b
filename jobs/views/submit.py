"""The submit page: the form (from scratch, a template or an earlier experiment), its quota
preview, and the draft a login keeps.
"""

import json
import uuid
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.forms import BoundField
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods

from core.http import ascii_id, or_404
from core.types import UserLike
from images.access import image_list_usable_by_tenants
from jobs.access import (
    experiment_list_viewable,
    template_list_usable,
)
from jobs.experiment_fields import FORM_ROWS, PREVIEW_FIELDS
from jobs.forms import (
    FORM_FIELDS,
    RunPreviewForm,
    RunSubmitForm,
    initial_from_experiment,
    initial_from_template,
)
from jobs.models import Run
from jobs.selectors.experiments import (
    experiment_get_viewable,
)
from jobs.selectors.preview import admission_preview
from jobs.selectors.refusals import flavor_node_limits, topology_levels_offered
from jobs.selectors.templates import template_get_usable
from jobs.services import submission
from jobs.services import templates as template_services
from jobs.views.params import positive_id
from tenants.access import (
    tenant_list_submittable,
)
from tenants.selectors import (
    project_list_submittable,
)

TEMPLATE_PICKER_SIZE = 100
# A submit form sent after the session ended waits in the session for the login (bounded:
# a session row is no place for a large upload).
DRAFT_SESSION_KEY = "jobs.run_submit.draft"
DRAFT_MAX_CHARS = 256 * 1024
# The submit form carries its user's id, signed: a draft kept through a login is shown only
# to the person who wrote it, not to whoever logs in next on a shared browser.
DRAFT_OWNER_FIELD = "draft_owner"
DRAFT_OWNER_SALT = "gantry.jobs.run_submit.draft_owner"


def _login_required_keeping_draft(view):
    """``login_required``, except that a form POSTed after the session ended (expired, or
    logged out elsewhere) is not lost: its fields wait in the new anonymous session, which
    Django's login keeps, and the next GET of the view after logging in shows them again to
    check and submit. Nothing is replayed unseen; the form's one-time submission key comes
    back with the fields, so the run can still be queued only once."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        if request.method == "POST":
            fields = {
                name: values
                for name, values in request.POST.lists()
                if name != "csrfmiddlewaretoken"
            }
            if len(json.dumps(fields)) <= DRAFT_MAX_CHARS:
                request.session[DRAFT_SESSION_KEY] = fields
                messages.warning(
                    request,
                    "Your session ended before the run was submitted. Log in again: "
                    "your input is kept for you to check and submit.",
                )
        return redirect_to_login(request.get_full_path())

    return wrapper


def _draft_restored(request: HttpRequest) -> QueryDict | None:
    """The submit form's fields kept through a login (see above), once, and only for the
    user who filled them in."""
    fields = request.session.pop(DRAFT_SESSION_KEY, None) if request.method == "GET" else None
    if not isinstance(fields, dict):
        return None
    owner = (fields.pop(DRAFT_OWNER_FIELD, None) or [""])[0]
    try:
        if signing.loads(owner, salt=DRAFT_OWNER_SALT) != request.user.pk:
            return None
    except signing.BadSignature:
        return None
    data = QueryDict(mutable=True)
    for name, values in fields.items():
        data.setlist(name, values)
    return data


@_login_required_keeping_draft
@require_http_methods(["GET", "POST"])
def run_submit(request: HttpRequest) -> HttpResponse:
    tenants = list(tenant_list_submittable(user=request.user))
    choices = {
        "tenants": tenants,
        "projects": project_list_submittable(user=request.user),
        "images": image_list_usable_by_tenants(tenants=tenants),
        "flavor_limits": flavor_node_limits(),
        "topology_levels": topology_levels_offered(),
    }
    source = None
    restored = _draft_restored(request)
    sent = request.POST if request.method == "POST" else restored or request.GET
    template = _template_chosen(request.user, sent.get("template", ""))
    initial = {"tenant": tenants[0].slug} if len(tenants) == 1 else {}
    if template is not None:
        initial |= initial_from_template(template)
    if request.method == "POST":
        form = RunSubmitForm(request.POST, initial=initial, **choices)
        if template is not None:
            form.lock(template)
        source_id = ascii_id(request.POST.get("cloned_from"))
        if source_id is not None:
            # Only for the notice above the form; the service decides whether it is allowed.
            source = experiment_list_viewable(user=request.user).filter(pk=source_id).first()
        if form.is_valid():
            key = form.cleaned_data["submission_key"]
            if template is None:
                data = form.experiment_input()

                def create() -> Run:
                    return submission.run_record(
                        user=request.user, data=data, submission_key=key, template=None
                    )
            else:
                chosen, values = template, form.template_values()

                def create() -> Run:
                    return template_services.template_run_record(
                        user=request.user, template=chosen, values=values, submission_key=key
                    )

            try:
                submitted = submission.submission_once(
                    user=request.user, submission_key=key, create=create
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                run = submitted.run
                if submitted.replayed:
                    messages.info(
                        request,
                        f"This form was already submitted as run {run.pk}: nothing new was "
                        "queued. Open the submit page again to queue another run.",
                    )
                else:
                    messages.success(request, f"Run {run.pk} submitted.")
                return redirect("jobs:run_detail", run_id=run.pk)
    elif restored is not None:
        form = RunSubmitForm(restored, initial=initial, **choices)
        if template is not None:
            form.lock(template)
    else:
        if request.GET.get("from"):  # an empty ?from= is no source, as before
            source_id = ascii_id(request.GET["from"])
            if source_id is None:
                raise Http404("No such experiment")
            source = or_404(experiment_get_viewable, user=request.user, experiment_id=source_id)
            initial = initial_from_experiment(source)
        form = RunSubmitForm(initial=initial | {"submission_key": uuid.uuid4()}, **choices)
        if template is not None:
            form.lock(template)
    context = {
        "form": form,
        "tenants": tenants,
        "source": source,
        "template": template,
        "templates": template_list_usable(user=request.user)[:TEMPLATE_PICKER_SIZE],
        "restored": restored is not None,
        "draft_owner": signing.dumps(request.user.pk, salt=DRAFT_OWNER_SALT),
    }
    context |= _form_layout(form)
    if tenants:
        context |= _preview_context(
            request.user, {name: form[name].value() for name in PREVIEW_FIELDS}
        )[0]
    failed = request.method == "POST" and bool(form.errors)
    return render(request, "jobs/run_submit.html", context, status=400 if failed else 200)


def _form_layout(form: RunSubmitForm) -> dict:
    """What the page draws the form and its quota check from (``jobs.experiment_fields``):
    the fieldsets, each a legend and its rows of fields; the quota check's fields, as a CSS
    selector its htmx attributes include and trigger on, and the values of those a template
    locks (a disabled input is not sent, so they go as hx-vals)."""
    sections: list[tuple[str, list[tuple[str, list[BoundField]]]]] = []
    for row, (legend, css) in FORM_ROWS.items():
        fields = [form[field.name] for field in FORM_FIELDS if field.form_row == row]
        if not sections or sections[-1][0] != legend:
            sections.append((legend, []))
        sections[-1][1].append((css, fields))
    locked = {name: form[name].value() for name in PREVIEW_FIELDS if form.fields[name].disabled}
    return {
        "form_sections": sections,
        "preview_fields": ", ".join(f"#{form[name].auto_id}" for name in PREVIEW_FIELDS),
        "preview_locked": json.dumps(locked, cls=DjangoJSONEncoder) if locked else "",
    }


def _template_chosen(user: UserLike, value: str):
    """The template a submission starts from (``?template=<id>``), or None; 404 for one
    the user may not use."""
    if not value:
        return None
    return or_404(template_get_usable, user=user, template_id=positive_id(value))


def _preview_context(user: UserLike, data) -> tuple[dict, int]:
    """The preview panel's context and status: 400 when the values cannot be previewed."""
    form = RunPreviewForm(data)
    if not form.is_valid():
        problems = [message for errors in form.errors.values() for message in errors]
        return {"preview": None, "preview_problems": problems}, 400
    try:
        preview = admission_preview(user=user, **form.preview_arguments())
    except ValidationError as exc:
        return {"preview": None, "preview_problems": exc.messages}, 400
    return {"preview": preview, "preview_problems": []}, 200


@never_cache
@login_required
@require_GET
def run_preview(request: HttpRequest) -> HttpResponse:
    """The submit form's quota panel: would this run start now, borrow, or wait?"""
    context, status = _preview_context(request.user, request.GET)
    return render(request, "jobs/_run_preview.html", context, status=status)
