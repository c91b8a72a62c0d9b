"""The what-if pages (issue 38): the reports, a new one, a report with its live progress and
its result side by side, and applying its proposal. Thin: parse, call one service or
selector, render. Platform admins ask for and act on reports; finance and the tenant admins
a report is shared with read it (their rows); everybody else gets 404.
"""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.http import or_404
from jobs.live import live_page, live_page_poll
from jobs.replay_report import duration
from policy.access import (
    replay_can_request,
    report_get_manageable,
    report_get_viewable,
    report_list_viewable,
    require_replay_reader,
    require_replay_requester,
)
from policy.forms import ApplyForm, ReplayRequestForm
from policy.results import gpu_hours_chart, queue_chart
from policy.selectors import (
    apply_plan,
    duration_words,
    proposal_editor_lines,
    queued_ahead,
    report_running_other,
    report_shown,
    report_stale,
)
from policy.services.applying import replay_report_apply
from policy.services.reports import (
    replay_report_cancel,
    replay_report_create,
    replay_report_rerun,
    replay_report_share,
)

REPORTS_PER_PAGE = 25
# How often a report's page asks for its progress while it runs, and once it has ended.
RUNNING_REFRESH_S = 2
ENDED_REFRESH_S = 60


def _detail_url(report_id: int) -> str:
    return reverse("policy:report_detail", args=[report_id])


@login_required
@require_GET
def report_list(request: HttpRequest) -> HttpResponse:
    or_404(require_replay_reader, request.user)
    reports = report_list_viewable(user=request.user).select_related("requested_by")
    page = Paginator(reports, REPORTS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "policy/report_list.html",
        {
            "page_obj": page,
            "reports": page.object_list,
            "can_request": replay_can_request(user=request.user),
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def report_new(request: HttpRequest) -> HttpResponse:
    """The window and the proposal, edited next to today's quotas and pools."""
    or_404(require_replay_requester, request.user)
    quotas, pools = proposal_editor_lines()
    form = ReplayRequestForm(
        request.POST if request.method == "POST" else None,
        quotas=quotas,
        pools=pools,
        starvation_now_s=float(settings.GANTRY_STARVATION_AFTER_S),
    )
    if request.method == "POST" and form.is_valid():
        bounds = form.window_bounds(now=timezone.now())
        if bounds is not None:
            try:
                report = replay_report_create(
                    actor=request.user,
                    window_start=bounds[0],
                    window_end=bounds[1],
                    proposal=form.proposal(),
                    confirm_warnings=form.cleaned_data["confirm_warnings"],
                    share=form.cleaned_data["share"],
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(
                    request,
                    f"Report {report.pk} is queued: {report.submissions:,} runs to replay, "
                    f"about {duration_words(report.estimate_s)}.",
                )
                return redirect(_detail_url(report.pk))
    return render(
        request,
        "policy/report_new.html",
        {"form": form, "warnings": form.errors.get("confirm_warnings")},
        status=400 if form.errors else 200,
    )


def _report_context(request: HttpRequest, report) -> dict:
    now = timezone.now()
    shown = report_shown(user=request.user, report=report)
    view = shown.view
    return {
        "report": report,
        "shown": shown,
        "view": view,
        "queue_chart": view and queue_chart(view),
        "gpu_hours_chart": view and gpu_hours_chart(view),
        "can_manage": replay_can_request(user=request.user),
        "stale": report_stale(report=report, now=now),
        "waiting_for": report.status == report.Status.QUEUED
        and report_running_other(report=report, now=now),
        "queued_ahead": queued_ahead(report=report),
        "estimate": duration_words(report.estimate_s),
        "percent": round(report.progress * 100),
        "starvation_words": duration(shown.proposal.get("starvation_after_s")),
    }


@never_cache
@login_required
@require_GET
def report_detail(request: HttpRequest, report_id: int) -> HttpResponse:
    """The report: its request, its progress (live) and, once done, its result."""
    report = or_404(report_get_viewable, user=request.user, report_id=report_id)
    context = _report_context(request, report)
    part = live_page(
        request,
        part_id="report-live",
        template="policy/_report_live.html",
        context=context,
        refresh_s=ENDED_REFRESH_S if report.ended else RUNNING_REFRESH_S,
    )
    return live_page_poll(request, part) or render(
        request, "policy/report_detail.html", {**context, "live_page": part}
    )


def _act(request: HttpRequest, report_id: int, act, done: str) -> HttpResponse:
    report = or_404(report_get_manageable, user=request.user, report_id=report_id)
    try:
        act(report=report, actor=request.user)
    except ValidationError as exc:
        for message in exc.messages:
            messages.error(request, message)
    else:
        messages.success(request, done.format(id=report.pk))
    return redirect(_detail_url(report.pk))


@login_required
@require_POST
def report_cancel(request: HttpRequest, report_id: int) -> HttpResponse:
    return _act(request, report_id, replay_report_cancel, "Report {id} is cancelled.")


@login_required
@require_POST
def report_rerun(request: HttpRequest, report_id: int) -> HttpResponse:
    return _act(request, report_id, replay_report_rerun, "Report {id} is queued again.")


@login_required
@require_POST
def report_share(request: HttpRequest, report_id: int) -> HttpResponse:
    shared = request.POST.get("shared") == "on"

    def share(*, report, actor):
        return replay_report_share(report=report, shared=shared, actor=actor)

    done = "Report {id} is shared." if shared else "Report {id} is no longer shared."
    return _act(request, report_id, share, done)


@login_required
@require_http_methods(["GET", "POST"])
def report_apply(request: HttpRequest, report_id: int) -> HttpResponse:
    """The quotas the proposal sets, today's beside them; set on confirmation only."""
    report = or_404(report_get_manageable, user=request.user, report_id=report_id)
    form = ApplyForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            changes = replay_report_apply(
                report=report,
                actor=request.user,
                confirm_overcommit=form.cleaned_data["confirm_overcommit"],
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            messages.success(
                request,
                f"Applied report {report.pk}: {len(changes)} quota"
                f"{'s' if len(changes) != 1 else ''} set, each in the audit log.",
            )
            return redirect(reverse("jobs:quota_list"))
    return render(
        request,
        "policy/report_apply.html",
        {"report": report, "plan": apply_plan(report=report), "form": form},
        status=400 if form.errors else 200,
    )
