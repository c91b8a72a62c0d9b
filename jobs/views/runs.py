"""Researcher pages: thin views over jobs.selectors and jobs.services.

Every run and experiment is fetched through a viewable-scoped selector: another tenant's
objects are 404, exactly like missing ones.
"""

import json
import uuid
from functools import wraps
from http import HTTPStatus
from itertools import groupby

import yaml
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.paginator import Page, Paginator
from django.http import Http404, HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.template.defaultfilters import timesince_filter
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clusters.backends import BackendError
from clusters.models import Cluster
from clusters.selectors import cluster_get_manageable, cluster_list_manageable
from clusters.services import cluster_test_connection
from core.http import ascii_id, form_page, or_404
from core.types import UserLike
from images.access import image_list_usable_by_tenants
from jobs import live, spec
from jobs.access import (
    experiment_can_rerun,
    experiment_list_viewable,
    run_can_cancel,
    run_can_submit,
    run_list_viewable,
    template_list_manageable,
    template_list_usable,
    template_tenants_manageable,
)
from jobs.forms import (
    ClusterCapacityForm,
    RunPreviewForm,
    RunSubmitForm,
    TemplateForm,
    initial_from_experiment,
    initial_from_template,
    template_initial,
)
from jobs.models import Run, RunState
from jobs.reproducibility import experiment_diff, runtime_rows
from jobs.run_rows import RUN_ROW_FIELDS, run_row, run_row_html, run_rows_version
from jobs.selectors import logs
from jobs.selectors.estimates import run_start_estimate, start_records, start_records_shown
from jobs.selectors.experiments import (
    ExperimentFilters,
    experiment_attempts,
    experiment_compare_choices,
    experiment_filter_projects,
    experiment_filter_templates,
    experiment_get_viewable,
    experiment_page_viewable,
    experiment_pair_get_viewable,
    experiment_record,
)
from jobs.selectors.logs import run_log_tail
from jobs.selectors.nodes import cluster_node_map
from jobs.selectors.queue import (
    admission_preview,
    flavor_node_limits,
    topology_levels_offered,
)
from jobs.selectors.runs import (
    run_attempts,
    run_events,
    run_get_viewable,
    run_page_viewable,
    runs_usage,
)
from jobs.selectors.templates import template_get_manageable, template_get_usable
from jobs.services import capacity, lifecycle, submission
from jobs.services import templates as template_services
from jobs.services.specs import experiment_spec
from jobs.services.templates import TEMPLATE_FIELDS, template_save
from tenants import invitations as tenant_invitations
from tenants import services as tenant_services
from tenants.access import (
    is_platform_admin,
    is_tenant_admin,
    membership_can_manage,
    roles_forget,
    tenant_list_submittable,
    tenant_list_viewable,
)
from tenants.forms import MemberAddForm, QuotaForm, quota_initial
from tenants.invitations import invitation_sent_message, member_add_or_invite
from tenants.models import Invitation, Membership, Tenant
from tenants.selectors import (
    flavor_list_manageable,
    invitation_get_pending,
    invitation_list_pending,
    membership_get,
    project_list_submittable,
    quota_get_manageable,
    quota_list_for_tenant,
    quota_list_viewable,
)

RUNS_PER_PAGE = 25
EXPERIMENTS_PER_PAGE = 25
# The experiments offered to compare with on an experiment page; the experiments list
# (in its compare mode) finds any other.
COMPARE_CHOICES = 50
# The first page of the run list refreshes itself this often (htmx polling its rows).
RUN_LIST_REFRESH_S = 5
# The run list counts matching runs up to here, then says "more than".
RUN_COUNT_LIMIT = 10_000
MAX_RUN_ID = 2**63 - 1  # a BigAutoField
TEMPLATES_PER_PAGE = 50
TEMPLATE_PICKER_SIZE = 100
QUOTAS_PER_PAGE = 50
CLUSTERS_PER_PAGE = 25
PREVIEW_FIELDS = (
    "tenant",
    "flavor",
    "nodes",
    "gpus_per_node",
    "priority",
    "topology_level",
    "topology_mode",
)
LOG_TAIL_LINES = 200
# However long its lines, the tail on a run page stays small; the whole log is a download.
LOG_TAIL_MAX_CHARS = 64 * 1024
# A submit form sent after the session ended waits in the session for the login (bounded:
# a session row is no place for a large upload).
DRAFT_SESSION_KEY = "jobs.run_submit.draft"
DRAFT_MAX_CHARS = 256 * 1024
# The submit form carries its user's id, signed: a draft kept through a login is shown only
# to the person who wrote it, not to whoever logs in next on a shared browser.
DRAFT_OWNER_FIELD = "draft_owner"
DRAFT_OWNER_SALT = "gantry.jobs.run_submit.draft_owner"
# Large experiment fields a list never shows.
_LIST_DEFERRED = ("experiment__command", "experiment__params", "experiment__env")


@never_cache
@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    """The runs the user may read, newest first. Its first page refreshes itself: the page
    polls itself with ``partial=rows`` for the results alone (filters kept), sending the
    version of the results it shows as ``shown``; the answer is 204, nothing to swap, while
    the results would render the same."""
    state = request.GET.get("state", "")
    invalid_state = state if state and state not in RunState.values else ""
    if invalid_state:
        state = ""
    tenant = request.GET.get("tenant", "")
    mine = request.GET.get("mine") == "1"
    before = _cursor(request.GET.get("before", ""))
    after = None if before is not None else _cursor(request.GET.get("after", ""))
    page = run_page_viewable(
        user=request.user,
        size=RUNS_PER_PAGE,
        states=[state] if state else [],
        tenant_slug=tenant,
        submitted_by=request.user if mine else None,
        before=before,
        after=after,
        count_up_to=RUN_COUNT_LIMIT,
        columns=RUN_ROW_FIELDS,
    )
    now = timezone.now()
    runs_usage(page.runs, now=now)
    records = start_records_shown(page.runs, flavor_of=lambda run: run.flavor.slug, now=now)
    rows = [run_row(run, now=now, records=records) for run in page.runs]
    paged = before is not None or after is not None
    partial = request.GET.get("partial") == "rows"
    # The query the links of the results keep: the filters and the page, not what a poll
    # adds (each link sets ``partial`` itself).
    query = request.GET.copy()
    query.pop("partial", None)
    query.pop("shown", None)
    results = {
        "page": page,
        "runs": page.runs,
        "state": state,
        "tenant": tenant,
        "mine": mine,
        "filtered": bool(state or tenant or mine),
        "paged": paged,
        "refresh_s": None if paged else RUN_LIST_REFRESH_S,
        "query": query,
        "nav_can_submit": run_can_submit(user=request.user),
    }
    # All else the results show follows from the query.
    version = run_rows_version(
        rows, page.newer, page.older, page.count, sorted(query.lists()), results["nav_can_submit"]
    )
    if partial and request.GET.get("shown") == version:
        return HttpResponse(status=HTTPStatus.NO_CONTENT)  # htmx swaps nothing
    results |= {"rows_html": [run_row_html(row) for row in rows], "version": version}
    if partial:
        # The results alone, without the page's context processors (navigation, counts).
        return HttpResponse(render_to_string("jobs/_run_results.html", results))
    context = {
        **results,
        "states": RunState.choices,
        "invalid_state": invalid_state,
        "tenants": page.tenants,
    }
    return render(request, "jobs/run_list.html", context)


def _cursor(value: str) -> int | None:
    """A run id to page from; anything else shows the newest runs, as a stale link should."""
    run_id = ascii_id(value)
    return run_id if run_id is not None and run_id <= MAX_RUN_ID else None


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
                if template is not None:
                    exc = ValidationError(spec.errors_to_input(exc.message_dict))
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
    if tenants:
        context |= _preview_context(
            request.user, {name: form[name].value() for name in PREVIEW_FIELDS}
        )[0]
    failed = request.method == "POST" and bool(form.errors)
    return render(request, "jobs/run_submit.html", context, status=400 if failed else 200)


def _template_chosen(user: UserLike, value: str):
    """The template a submission starts from (``?template=<id>``), or None; 404 for one
    the user may not use."""
    if not value:
        return None
    return or_404(template_get_usable, user=user, template_id=_positive_id(value))


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


def _status_context(request: HttpRequest, run) -> dict:
    estimate = run_start_estimate(run=run)
    now = timezone.now()
    record = ""
    if estimate is not None and estimate.full_limits is not None:
        flavor = run.flavor.slug
        record = start_records(flavors=[flavor], now=now)[flavor].sentence(now=now)
    return {
        "RunState": RunState,
        "run": run,
        "start_estimate": estimate,
        "start_summary": estimate.summary(now=now) if estimate else "",
        "start_record": record,
        "events": run_events(run=run, user=request.user),
        "attempts": run_attempts(run=run),
        "can_cancel": not run.is_terminal and run_can_cancel(user=request.user, run=run),
    }


def _attempt_records(attempts) -> list[tuple]:
    """Each attempt with its runtime report as rows to show."""
    return [(attempt, runtime_rows(attempt.runtime_env)) for attempt in attempts]


def _status_inputs(context) -> tuple:
    run, estimate = context["run"], context["start_estimate"]
    return (
        run.pk,
        run.state,
        run.borrowed,
        run.over_budget,
        run.wait_reason,
        run.wait_message,
        run.queue_position,
        run.tenant.slug,
        run.failure_reason,
        run.cancel_requested_at is not None,
        context["can_cancel"],
        estimate is not None,
        context["start_summary"],
        context["start_record"],
        estimate and estimate.estimated_at,
        estimate and timesince_filter(estimate.estimated_at),
    )


def _placement_inputs(context) -> tuple:
    run, latest = context["run"], context["latest_attempt"]
    return (
        run.cluster.name if run.cluster else None,
        run.is_terminal,
        latest and latest.node_list,
        latest and latest.placement,
        run.restarts,
        run.experiment.max_restarts,
        run.started_at,
        run.finished_at,
    )


def _events_inputs(context) -> tuple:
    return tuple(
        (
            event.at,
            event.from_state,
            event.to_state,
            event.reason,
            event.shown_message,
            event.actor.get_username() if event.actor else None,
        )
        for event in context["events"]
    )


def _attempts_inputs(context) -> tuple:
    attempts = tuple(
        (
            attempt.number,
            attempt.cluster.name,
            attempt.backend_job_id,
            attempt.state,
            attempt.node_list,
            attempt.placement,
            attempt.started_at,
            attempt.finished_at,
            attempt.exit_code,
            attempt.failure_reason,
            attempt.failure_message,
            attempt.backend_error,
        )
        for attempt in context["attempts"]
    )
    return (*attempts, context["run"].is_terminal)


def _logs_inputs(context) -> tuple:
    return (
        context["run"].pk,
        context["run"].is_terminal,
        context["logs"],
        context["logs_cut"],
        context["log_tail_lines"],
        context["log_tail_kib"],
    )


def _runtime_inputs(context) -> tuple:
    return tuple(
        (
            attempt.pk,
            attempt.number,
            attempt.cluster.name,
            attempt.cluster.backend,
            attempt.state,
            attempt.is_ended,
            attempt.runtime_reported_at,
            runtime,
            attempt.node_list,
            attempt.gpu_uuids,
            attempt.rendered_spec,
        )
        for attempt, runtime in context["attempt_records"]
    )


# The live sections of the run page, each swapped in on its own; the inputs of each are what
# its template shows (a poll compares versions of them, and renders only what changed).
RUN_LIVE_SECTIONS = (
    live.LiveSectionSpec("run-status", "jobs/live/_status.html", _status_inputs),
    live.LiveSectionSpec("run-placement", "jobs/live/_placement.html", _placement_inputs),
    live.LiveSectionSpec("run-events", "jobs/live/_events.html", _events_inputs),
    live.LiveSectionSpec("run-attempts", "jobs/live/_attempts.html", _attempts_inputs),
    live.LiveSectionSpec("run-logs", "jobs/live/_logs.html", _logs_inputs),
    live.LiveSectionSpec("run-runtime", "jobs/live/_runtime.html", _runtime_inputs),
)


def _run_live_context(request: HttpRequest, run) -> dict:
    context = _status_context(request, run)
    attempts = list(context["attempts"])
    context["attempts"] = attempts
    context["events"] = list(context["events"])
    context["latest_attempt"] = attempts[-1] if attempts else None
    context["attempt_records"] = _attempt_records(attempts)
    context["logs"], context["logs_cut"] = run_log_tail(
        run=run, lines=LOG_TAIL_LINES, max_chars=LOG_TAIL_MAX_CHARS, attempts=attempts
    )
    context["log_tail_lines"] = LOG_TAIL_LINES
    context["log_tail_kib"] = LOG_TAIL_MAX_CHARS // 1024
    return context


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = or_404(run_get_viewable, user=request.user, run_id=run_id)
    live_context = _run_live_context(request, run)
    sections = live.sections_render(
        request=request,
        specs=RUN_LIVE_SECTIONS,
        context=live_context,
        versions=live.sections_versions(specs=RUN_LIVE_SECTIONS, context=live_context),
    )
    context = {
        "run": run,
        "live": {section.id.removeprefix("run-"): section for section in sections},
        "live_poll_ms": settings.GANTRY_LIVE_POLL_MS,
        "can_rerun": experiment_can_rerun(user=request.user, experiment=run.experiment),
        "submission_key": uuid.uuid4(),  # of the re-run form
    }
    return render(request, "jobs/run_detail.html", context)


@never_cache
@login_required
@require_GET
def run_live(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's live sections that changed since the versions the page sent (all of
    them without versions), for htmx to swap out of band. Nothing changed: 204, or 286
    (htmx stops polling) once the run has finished, as the page then shows its end. Only
    the changed sections are rendered."""
    run = or_404(run_get_viewable, user=request.user, run_id=run_id)
    context = _run_live_context(request, run)
    versions = live.sections_versions(specs=RUN_LIVE_SECTIONS, context=context)
    changed = live.sections_changed(versions, request.GET)
    if changed:
        sections = live.sections_render(
            request=request,
            specs=RUN_LIVE_SECTIONS,
            context=context,
            versions=versions,
            only=changed,
        )
        return render(request, "jobs/live/_changed.html", {"sections": sections})
    return HttpResponse(status=live.HTMX_STOP_POLLING if run.is_terminal else 204)


@login_required
@require_GET
def run_log_download(request: HttpRequest, run_id: int) -> HttpResponseBase:
    """The latest attempt's whole log as a file, streamed (it may be gigabytes)."""
    run = or_404(run_get_viewable, user=request.user, run_id=run_id)
    try:
        download = logs.run_log_download(run=run)
    except BackendError as exc:
        return HttpResponse(f"The log is unavailable: {exc}", status=503, content_type="text/plain")
    if download is None:
        raise Http404("No log yet: it appears once the cluster has accepted the job.")
    filename, chunks = download
    response = StreamingHttpResponse(chunks, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
@require_POST
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    run = or_404(run_get_viewable, user=request.user, run_id=run_id)
    # PermissionDenied propagates: the user can see the run, so a 403 leaks nothing.
    try:
        run = lifecycle.run_cancel(run=run, actor=request.user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        if run.state == RunState.CANCELLED:
            messages.success(request, f"Run {run.pk} is cancelled.")
        else:
            messages.info(request, f"Cancel of run {run.pk} requested from the cluster.")
    return redirect("jobs:run_detail", run_id=run.pk)


# Longer than any stored value of its field: the filter could match nothing longer.
_FILTER_MAX_CHARS = {"name": 200, "owner": 150, "image": 400, "commit": 40}


@login_required
@require_GET
def experiment_list(request: HttpRequest) -> HttpResponse:
    """The experiments the user may read, newest first, searched by name and filtered by
    owner, project, image, commit and template (all in the query string). With
    ``compare=<id>`` it picks the other side of a comparison: the experiments of that
    one's tenant, each with a link to the diff."""
    query = request.GET
    texts = {name: query.get(name, "").strip()[:limit] for name, limit in _FILTER_MAX_CHARS.items()}
    project, template = ascii_id(query.get("project")), ascii_id(query.get("template"))
    unknown = [
        label
        for label, field, value in (
            ("project", "project", project),
            ("template", "template", template),
        )
        if query.get(field) and value is None
    ]
    compare_with = None
    if query.get("compare"):
        compare_with = or_404(
            experiment_get_viewable, user=request.user, experiment_id=_positive_id(query["compare"])
        )
    filters = ExperimentFilters(
        **texts,
        mine=query.get("mine") == "1",
        project=project,
        template=template,
        tenant=compare_with.tenant_id if compare_with else None,
    )
    before = _cursor(query.get("before", ""))
    after = None if before is not None else _cursor(query.get("after", ""))
    page = experiment_page_viewable(
        user=request.user, size=EXPERIMENTS_PER_PAGE, filters=filters, before=before, after=after
    )
    return render(
        request,
        "jobs/experiment_list.html",
        {
            "page": page,
            "rows": page.rows,
            "filters": filters,
            "filtered": filters.any,
            "unknown": unknown,
            "projects": experiment_filter_projects(tenants=page.tenants),
            "templates": experiment_filter_templates(tenants=page.tenants),
            "compare_with": compare_with,
            "paged": before is not None or after is not None,
        },
    )


@login_required
@require_GET
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=experiment_id)
    runs = run_list_viewable(user=request.user).filter(experiment=experiment)
    page = Paginator(runs.defer(*_LIST_DEFERRED), RUNS_PER_PAGE).get_page(request.GET.get("page"))
    # The attempt records of the runs on this page only: an experiment re-run for months
    # would otherwise load every attempt it ever had.
    attempts = experiment_attempts(experiment=experiment).filter(
        run__in=[run.pk for run in page.object_list]
    )
    return render(
        request,
        "jobs/experiment_detail.html",
        {
            "experiment": experiment,
            "page_obj": page,
            "runs": page.object_list,
            "params_json": json.dumps(experiment.params, indent=2, sort_keys=True),
            "env_items": sorted(experiment.env.items()),
            "attempts_by_run": [
                (run_id, _attempt_records(group))
                for run_id, group in groupby(attempts, lambda attempt: attempt.run_id)
            ],
            "can_rerun": experiment_can_rerun(user=request.user, experiment=experiment),
            "submission_key": uuid.uuid4(),  # of the re-run form
            "compare_choices": experiment_compare_choices(
                experiment=experiment, limit=COMPARE_CHOICES
            ),
            "compare_choices_limit": COMPARE_CHOICES,
        },
    )


@login_required
@require_GET
def experiment_spec_download(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The experiment's spec as YAML, to edit and submit again (CLI or API)."""
    experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=experiment_id)
    document = yaml.safe_dump(experiment_spec(experiment), sort_keys=False, allow_unicode=True)
    response = HttpResponse(document, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="experiment-{experiment.pk}.yaml"'
    return response


@login_required
@require_POST
def experiment_rerun(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Queue a new run of the same experiment record, exactly as recorded."""
    experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=experiment_id)
    try:
        key = (
            uuid.UUID(request.POST["submission_key"]) if "submission_key" in request.POST else None
        )
    except ValueError:
        messages.error(request, "Not re-run: the form is damaged. Reload the page and try again.")
        return redirect("jobs:experiment_detail", experiment_id=experiment.pk)
    # PermissionDenied propagates: the user can read the experiment, so a 403 leaks nothing.
    try:
        submitted = submission.submission_once(
            user=request.user,
            submission_key=key,
            create=lambda: submission.run_rerun_record(
                experiment=experiment, user=request.user, submission_key=key
            ),
        )
    except ValidationError as exc:
        messages.error(request, "Not re-run: " + " ".join(exc.messages))
        return redirect("jobs:experiment_detail", experiment_id=experiment.pk)
    run = submitted.run
    if submitted.replayed:
        messages.info(request, f"Already re-run as run {run.pk}: nothing new was queued.")
    else:
        messages.success(request, f"Run {run.pk} re-runs experiment {experiment.pk} exactly.")
    return redirect("jobs:run_detail", run_id=run.pk)


def _positive_id(value: str) -> int:
    experiment_id = ascii_id(value)
    if experiment_id is None:
        raise Http404("No such experiment")
    return experiment_id


@login_required
@require_GET
def experiment_compare(request: HttpRequest) -> HttpResponse:
    """Two experiments of one tenant side by side (``?a=&b=``), every differing field
    highlighted; ``only=changed`` leaves out the fields that are the same."""
    a, b = or_404(
        experiment_pair_get_viewable,
        user=request.user,
        a_id=_positive_id(request.GET.get("a", "")),
        b_id=_positive_id(request.GET.get("b", "")),
    )
    rows = experiment_diff(experiment_record(a), experiment_record(b))
    only_changed = request.GET.get("only") == "changed"
    return render(
        request,
        "jobs/experiment_diff.html",
        {
            "a": a,
            "b": b,
            "rows": [row for row in rows if row.differs] if only_changed else rows,
            "differing": sum(row.differs for row in rows),
            "total": len(rows),
            "only_changed": only_changed,
        },
    )


# --- quotas and capacity -------------------------------------------------------------------


class _FirstPageCountingPaginator(Paginator):
    """A Paginator that reads the first page with one row more than it shows and counts only
    if that row is there: a first page with room to spare holds every item, so its count is
    its length (most tenants have fewer quotas than a page). Other pages as Paginator."""

    def get_page(self, number) -> Page:
        if number not in (None, "", "1") or self.orphans:
            return super().get_page(number)
        rows = list(self.object_list[: self.per_page + 1])
        if len(rows) <= self.per_page:
            self.__dict__["count"] = len(rows)  # Paginator.count is a cached_property
        return Page(rows[: self.per_page], 1, self)


@login_required
@require_GET
def quota_list(request: HttpRequest) -> HttpResponse:
    """Quotas, use and budget burn of every tenant the user may read."""
    tenants = list(tenant_list_viewable(user=request.user))
    quotas = quota_list_viewable(user=request.user)
    slug = request.GET.get("tenant", "")
    tenant = next((t for t in tenants if t.slug == slug), None)
    if slug:
        quotas = quotas.filter(tenant__slug=slug)
    page = _FirstPageCountingPaginator(quotas, QUOTAS_PER_PAGE).get_page(request.GET.get("page"))
    can_manage = is_platform_admin(request.user)
    return render(
        request,
        "jobs/quota_list.html",
        {
            "page_obj": page,
            "usages": capacity.quota_usage_list(quotas=list(page.object_list), tenant=tenant),
            "tenants": tenants,
            "tenant": slug,
            "can_manage": can_manage,
            "flavors": or_404(flavor_list_manageable, user=request.user) if can_manage else (),
            "member_tenants": [
                t for t in tenants if can_manage or is_tenant_admin(request.user, t.pk)
            ],
            "overcommits": capacity.flavor_overcommits(),
            "show_overcommit_figures": can_manage,
        },
    )


@login_required
@require_GET
def tenant_members(request: HttpRequest, slug: str) -> HttpResponse:
    """A tenant's members with what their runs hold now, beside the tenant's quota use, and
    the forms that add members, change their roles and remove them (for its tenant admins
    and platform admins, the only ones who see the page)."""
    tenant = or_404(capacity.tenant_get_members_viewable, user=request.user, slug=slug)
    return _members_page(request, tenant)


def _members_page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    add_form: MemberAddForm | None = None,
    error: str = "",
) -> HttpResponse:
    """The members page; 400 when it shows a refused change (``add_form`` errors, ``error``)."""
    add_form = add_form or MemberAddForm()
    return render(
        request,
        "jobs/tenant_members.html",
        {
            "tenant": tenant,
            "members": capacity.member_usage_list(tenant=tenant),
            "usages": capacity.quota_usage_list(
                quotas=list(quota_list_for_tenant(tenant=tenant)), tenant=tenant
            ),
            "add_form": add_form,
            "adds_directly": is_platform_admin(request.user),
            "invitations": invitation_list_pending(tenant=tenant, now=timezone.now()),
            "roles": Membership.Role.choices,
            "error": error,
        },
        status=400 if error or add_form.errors else 200,
    )


def _after_member_change(request: HttpRequest, tenant: Tenant, message: str) -> HttpResponse:
    """Back to the members page, or to the tenant's quotas when the change took the user's
    own right to manage members (a tenant admin who stepped down or left)."""
    messages.success(request, message)
    roles_forget(request.user)
    if membership_can_manage(user=request.user, tenant=tenant):
        return redirect("jobs:tenant_members", slug=tenant.slug)
    return redirect(f"{reverse('jobs:quota_list')}?tenant={tenant.slug}")


@login_required
@require_POST
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = or_404(capacity.tenant_get_members_viewable, user=request.user, slug=slug)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            added = member_add_or_invite(
                tenant=tenant,
                identifier=form.cleaned_data["user"],
                role=form.cleaned_data["role"],
                actor=request.user,
                now=timezone.now(),
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            if isinstance(added, Invitation):
                messages.success(request, invitation_sent_message(added))
            else:
                messages.success(
                    request,
                    f"Added {added.user.get_username()} to {tenant.slug} as "
                    f"{added.get_role_display().lower()}.",
                )
            return redirect("jobs:tenant_members", slug=tenant.slug)
    return _members_page(request, tenant, add_form=form)


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, slug: str, invitation_id: int) -> HttpResponse:
    tenant = or_404(capacity.tenant_get_members_viewable, user=request.user, slug=slug)
    invitation = or_404(invitation_get_pending, tenant=tenant, invitation_id=invitation_id)
    or_404(
        tenant_invitations.invitation_revoke,
        invitation=invitation,
        actor=request.user,
        now=timezone.now(),
    )
    messages.success(request, f"Withdrew the invitation of {invitation.identifier}.")
    return redirect("jobs:tenant_members", slug=tenant.slug)


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    tenant = or_404(capacity.tenant_get_members_viewable, user=request.user, slug=slug)
    membership = or_404(membership_get, tenant=tenant, user_id=user_id)
    try:
        changed = or_404(
            tenant_services.membership_role_change,
            membership=membership,
            role=request.POST.get("role", ""),
            actor=request.user,
        )
    except ValidationError as exc:
        return _members_page(request, tenant, error=" ".join(exc.messages))
    return _after_member_change(
        request,
        tenant,
        f"{changed.user.get_username()} is now {changed.get_role_display().lower()} of "
        f"{tenant.slug}.",
    )


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    tenant = or_404(capacity.tenant_get_members_viewable, user=request.user, slug=slug)
    membership = or_404(membership_get, tenant=tenant, user_id=user_id)
    try:
        or_404(tenant_services.membership_remove, membership=membership, actor=request.user)
    except ValidationError as exc:
        return _members_page(request, tenant, error=" ".join(exc.messages))
    return _after_member_change(
        request,
        tenant,
        f"Removed {membership.user.get_username()} from {tenant.slug}. Their runs stay; they "
        f"can no longer submit to {tenant.slug}.",
    )


@login_required
@require_http_methods(["GET", "POST"])
def quota_edit(request: HttpRequest) -> HttpResponse:
    """Create or change the quota of ``?tenant=`` for ``?flavor=`` (platform admins)."""
    tenant, flavor, quota = or_404(
        quota_get_manageable,
        user=request.user,
        tenant_slug=request.GET.get("tenant", ""),
        flavor_slug=request.GET.get("flavor", ""),
    )
    if request.method == "POST":
        form = QuotaForm(request.POST)
        if form.is_valid():
            try:
                change = capacity.quota_update_checked(
                    tenant=tenant, flavor=flavor, actor=request.user, **form.cleaned_data
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(request, f"Saved the {flavor.slug} quota of {tenant.slug}.")
                if change.overcommit is not None:
                    messages.warning(request, change.overcommit.message)
                if change.beyond_guarantee:
                    messages.warning(
                        request,
                        f"{tenant.slug} now uses {change.in_use} of "
                        f"{change.quota.guaranteed_gpus} guaranteed {flavor.slug} GPUs: "
                        f"{change.beyond_guarantee} beyond the guarantee. Running runs keep "
                        "their GPUs; new runs can only borrow until use drops below it.",
                    )
                return redirect(f"{reverse('jobs:quota_list')}?tenant={tenant.slug}")
    else:
        form = QuotaForm(initial=quota_initial(quota))
    usage = capacity.quota_usage_list(quotas=[quota], tenant=tenant)[0] if quota else None
    return render(
        request,
        "jobs/quota_edit.html",
        {"form": form, "tenant": tenant, "flavor": flavor, "quota": quota, "usage": usage},
        status=400 if form.errors else 200,
    )


@login_required
@require_GET
def cluster_list(request: HttpRequest) -> HttpResponse:
    clusters = or_404(cluster_list_manageable, user=request.user)
    page = Paginator(clusters, CLUSTERS_PER_PAGE).get_page(request.GET.get("page"))
    held = capacity.held_gpus_by_pool(clusters=page.object_list)
    rows = [
        (
            cluster,
            [(pool, held.get((cluster.pk, pool.flavor_id), 0)) for pool in cluster.flavors.all()],
        )
        for cluster in page.object_list
    ]
    return render(
        request,
        "jobs/cluster_list.html",
        {
            "page_obj": page,
            "rows": rows,
            "Backend": Cluster.Backend,
            "overcommits": capacity.flavor_overcommits(),
            "show_overcommit_figures": True,  # platform admins only
        },
    )


@login_required
@require_POST
def cluster_test(request: HttpRequest, name: str) -> HttpResponse:
    cluster = or_404(cluster_get_manageable, user=request.user, name=name)
    ok, message = cluster_test_connection(cluster=cluster)
    (messages.success if ok else messages.error)(request, message)
    return redirect("jobs:cluster_list")


@login_required
@require_http_methods(["GET", "POST"])
def cluster_capacity(request: HttpRequest, name: str) -> HttpResponse:
    """Edit a simulator cluster's GPUs per flavor; other clusters report theirs."""
    cluster = or_404(cluster_get_manageable, user=request.user, name=name)
    editable = cluster.backend == Cluster.Backend.SIMULATOR
    if request.method == "POST":
        form = ClusterCapacityForm(request.POST)
        if form.is_valid():
            try:
                pool = capacity.cluster_capacity_set(
                    cluster=cluster, actor=request.user, **form.cleaned_data
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(
                    request,
                    f"{cluster.name} now has {pool.nodes} × {pool.gpus_per_node} "
                    f"{pool.flavor.slug} GPUs ({pool.capacity_gpus} in all).",
                )
                return redirect("jobs:cluster_list")
    else:
        pools = {pool.flavor.slug: pool for pool in cluster.flavors.all()}
        chosen = pools.get(request.GET.get("flavor", ""))
        initial = (
            {"flavor": chosen.flavor, "nodes": chosen.nodes, "gpus_per_node": chosen.gpus_per_node}
            if chosen
            else {"nodes": 1, "gpus_per_node": 8}
        )
        form = ClusterCapacityForm(initial=initial)
    return render(
        request,
        "jobs/cluster_capacity.html",
        {"cluster": cluster, "form": form, "editable": editable},
        status=400 if form.errors else 200,
    )


@never_cache
@login_required
@require_GET
def cluster_nodes(request: HttpRequest) -> HttpResponse:
    """The node map: every enabled cluster's nodes by topology domain, what holds each GPU
    and each flavor's fragmentation (members of tenants, finance and platform admins)."""
    node_map = or_404(cluster_node_map, user=request.user)
    part = live.live_page(
        request,
        part_id="nodes-live",
        template="jobs/cluster_nodes.html",
        context={"node_map": node_map},
    )
    return live.live_page_poll(request, part) or render(
        request, "jobs/cluster_nodes_page.html", {"node_map": node_map, "live_page": part}
    )


# --- experiment templates ------------------------------------------------------------------


@login_required
@require_GET
def template_list(request: HttpRequest) -> HttpResponse:
    """Templates the user manages (tenant admins: their tenants'; platform admins: all)."""
    templates = or_404(template_list_manageable, user=request.user)
    page = Paginator(templates, TEMPLATES_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request, "jobs/template_list.html", {"page_obj": page, "templates": page.object_list}
    )


@login_required
@require_http_methods(["GET", "POST"])
def template_create(request: HttpRequest) -> HttpResponse:
    or_404(template_list_manageable, user=request.user)  # 404 for users who manage none
    tenants = list(template_tenants_manageable(user=request.user))
    choices = {"tenants": tenants, "allow_global": is_platform_admin(request.user)}

    def save(data: dict):
        tenant = next((t for t in tenants if t.slug == data["tenant"]), None)
        return template_save(actor=request.user, tenant=tenant, **_template_fields(data))

    def done(template) -> HttpResponse:
        messages.success(request, f"Template {template.name} is saved.")
        return redirect("jobs:template_list")

    return form_page(
        request,
        TemplateForm(request.POST, **choices)
        if request.method == "POST"
        else TemplateForm(**choices),
        save=save,
        done=done,
        template="jobs/template_form.html",
        context={"template": None},
    )


def _template_fields(data: dict) -> dict:
    return {name: data[name] for name in TEMPLATE_FIELDS}


@login_required
@require_http_methods(["GET", "POST"])
def template_edit(request: HttpRequest, template_id: int) -> HttpResponse:
    template = or_404(template_get_manageable, user=request.user, template_id=template_id)

    def save(data: dict):
        return template_save(
            actor=request.user, tenant=template.tenant, template=template, **_template_fields(data)
        )

    def done(saved) -> HttpResponse:
        messages.success(request, f"Template {saved.name} is saved.")
        return redirect("jobs:template_list")

    return form_page(
        request,
        TemplateForm(request.POST)
        if request.method == "POST"
        else TemplateForm(initial=template_initial(template)),
        save=save,
        done=done,
        template="jobs/template_form.html",
        context={"template": template},
    )


@login_required
@require_POST
def template_delete(request: HttpRequest, template_id: int) -> HttpResponse:
    template = or_404(template_get_manageable, user=request.user, template_id=template_id)
    template_services.template_delete(actor=request.user, template=template)
    messages.success(request, f"Template {template.name} is deleted.")
    return redirect("jobs:template_list")
