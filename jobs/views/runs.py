"""The run pages: the list, a run's page and its live sections, its log, cancelling, and
restarting a run without one of its nodes.

Every run is fetched through a viewable-scoped selector: another tenant's runs are 404,
exactly like missing ones.
"""

import uuid
from http import HTTPStatus

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.template.defaultfilters import timesince_filter
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from clusters.backends import BackendError
from core.http import or_404
from jobs import live
from jobs.access import (
    experiment_can_rerun,
    run_can_cancel,
    run_can_submit,
)
from jobs.models import RunKind, RunState
from jobs.reproducibility import runtime_rows
from jobs.run_rows import RUN_ROW_FIELDS, run_row, run_row_html, run_rows_version
from jobs.selectors import logs
from jobs.selectors.estimates import run_start_estimate, start_records, start_records_shown
from jobs.selectors.logs import run_log_tail
from jobs.selectors.runs import (
    run_attempts,
    run_events,
    run_get_viewable,
    run_page_viewable,
    runs_usage,
)
from jobs.services import lifecycle, restart
from jobs.views.params import page_cursor

RUNS_PER_PAGE = 25
# The first page of the run list refreshes itself this often (htmx polling its rows).
RUN_LIST_REFRESH_S = 5
# The run list counts matching runs up to here, then says "more than".
RUN_COUNT_LIMIT = 10_000
LOG_TAIL_LINES = 200
# However long its lines, the tail on a run page stays small; the whole log is a download.
LOG_TAIL_MAX_CHARS = 64 * 1024


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
    before = page_cursor(request.GET.get("before", ""))
    after = None if before is not None else page_cursor(request.GET.get("after", ""))
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


def attempt_records(attempts) -> list[tuple]:
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
            attempt.cause_class,
            attempt.cause_evidence,
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
    context["attempt_records"] = attempt_records(attempts)
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
        # A workspace is launched anew, never re-run (run_rerun refuses it).
        "can_rerun": run.kind == RunKind.BATCH
        and experiment_can_rerun(user=request.user, experiment=run.experiment),
        "RunKind": RunKind,
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


@login_required
@require_POST
def run_restart_excluding(request: HttpRequest, run_id: int) -> HttpResponse:
    """Restart the run without the node the form names (``node``): one click from a
    straggler's verdict on the run page. Whoever may cancel the run may."""
    run = or_404(run_get_viewable, user=request.user, run_id=run_id)
    node = request.POST.get("node", "")
    # PermissionDenied propagates: the user can see the run, so a 403 leaks nothing.
    try:
        restart.run_restart_excluding(run=run, node=node, actor=request.user)
    except ValidationError as exc:
        messages.error(request, f"Run {run.pk} was not restarted: {' '.join(exc.messages)}")
    else:
        messages.success(
            request,
            f"Run {run.pk} leaves its nodes and resumes from its latest checkpoint without "
            f"{node.strip()}.",
        )
    return redirect("jobs:run_detail", run_id=run.pk)
