"""Asking for a what-if report, cancelling it, sharing it and running it again: each a
platform admin's act, audited ("replay.request", "replay.cancel", "replay.share",
"replay.rerun"), the replay itself enqueued once the row is committed."""

from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core.types import UserLike, signed_in
from jobs.enqueue import after_commit
from policy.models import ReplayReport
from policy.selectors import duration_words, replay_check, report_stale
from tenants.models import Tenant
from tenants.services.audit import audit_record

REPLAY_TASK = "policy.tasks.replay_report_run"


def _audit(*, actor: UserLike, action: str, report: ReplayReport, before=None, after=None):
    audit_record(
        actor=actor, action=action, target=f"replay {report.pk}", before=before, after=after
    )


@transaction.atomic
def replay_report_create(
    *,
    actor: UserLike,
    window_start: datetime,
    window_end: datetime,
    proposal: object,
    confirm_warnings: bool = False,
    share: bool = False,
) -> ReplayReport:
    """A report replaying [window_start, window_end) under ``proposal`` (its JSON), queued
    for a background worker; audited as "replay.request".

    Refused with ValidationError, nothing written, when ``replay_check`` finds errors
    ("window", "proposal"), or finds warnings (an overcommitted flavor) that
    ``confirm_warnings`` does not confirm ("confirm_warnings", the warnings themselves).
    Several reports may be asked for at once: they are replayed one at a time, oldest
    first, each page saying what it waits for.
    """
    now = timezone.now()
    check = replay_check(
        window_start=window_start, window_end=window_end, proposal=proposal, now=now
    )
    if check.errors:
        raise ValidationError(check.errors)
    if check.warnings and not confirm_warnings:
        raise ValidationError(
            {"confirm_warnings": [*check.warnings, "Nothing was replayed: confirm to go on."]}
        )
    assert check.proposal is not None
    report = ReplayReport.objects.create(
        requested_by=signed_in(actor),
        created_at=now,
        window_start=window_start,
        window_end=window_end,
        proposal=check.proposal.to_json(),
        submissions=check.submissions,
        estimate_s=check.estimate_s,
        confirmed_warnings=list(check.warnings),
        shared=share,
    )
    report.tenants.set(Tenant.objects.filter(slug__in=check.tenants))
    _audit(
        actor=actor,
        action="replay.request",
        report=report,
        after={
            "window_start": window_start.isoformat(),
            "window_end": window_end.isoformat(),
            "proposal": report.proposal,
            "submissions": check.submissions,
            "estimate": duration_words(check.estimate_s),
            "confirmed_warnings": report.confirmed_warnings,
            "shared": share,
        },
    )
    after_commit(REPLAY_TASK, report.pk)
    return report


@transaction.atomic
def replay_report_cancel(*, report: ReplayReport, actor: UserLike) -> ReplayReport:
    """Stop a queued or running report; audited as "replay.cancel".

    A queued report ends ``cancelled`` at once; a running one is flagged, and its worker,
    which reads the flag at least every second, stops and ends it ``cancelled`` (a worker
    that is gone: at once, as its report will not be claimed again). An ended report is
    refused (ValidationError), nothing changed.
    """
    report = ReplayReport.objects.select_for_update().get(pk=report.pk)
    now = timezone.now()
    if report.ended:
        raise ValidationError(
            f"Report {report.pk} is {report.get_status_display().lower()}: there is nothing "
            "to cancel."
        )
    if report.status == ReplayReport.Status.QUEUED or report_stale(report=report, now=now):
        report.status = ReplayReport.Status.CANCELLED
        report.finished_at = now
        report.run_token = None
    report.cancel_requested = True
    report.save(update_fields=["status", "finished_at", "run_token", "cancel_requested"])
    _audit(actor=actor, action="replay.cancel", report=report, after={"status": report.status})
    return report


@transaction.atomic
def replay_report_share(*, report: ReplayReport, shared: bool, actor: UserLike) -> ReplayReport:
    """Share the report with finance and the admins of the tenants it concerns, or stop
    sharing it; audited as "replay.share" when it changes."""
    report = ReplayReport.objects.select_for_update().get(pk=report.pk)
    if report.shared != shared:
        before = {"shared": report.shared}
        report.shared = shared
        report.save(update_fields=["shared"])
        after = {"shared": shared}
        _audit(actor=actor, action="replay.share", report=report, before=before, after=after)
    return report


@transaction.atomic
def replay_report_rerun(*, report: ReplayReport, actor: UserLike) -> ReplayReport:
    """Queue a failed or cancelled report again, or one whose worker was lost (running,
    silent for ``STALE_AFTER``): the replay starts over, its earlier result dropped; audited
    as "replay.rerun". Refused (ValidationError) for a report that is queued, running or
    done."""
    report = ReplayReport.objects.select_for_update().get(pk=report.pk)
    now = timezone.now()
    again = report.status in (ReplayReport.Status.FAILED, ReplayReport.Status.CANCELLED)
    if not (again or report_stale(report=report, now=now)):
        raise ValidationError(
            f"Report {report.pk} is {report.get_status_display().lower()}: only a failed, "
            "cancelled or stopped report is run again."
        )
    before = {"status": report.status, "progress": report.progress}
    report.status = ReplayReport.Status.QUEUED
    report.progress = 0.0
    report.cancel_requested = False
    report.run_token = None
    report.started_at = report.finished_at = report.heartbeat_at = None
    report.result = None
    report.error = ""
    report.save(
        update_fields=[
            "status",
            "progress",
            "cancel_requested",
            "run_token",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "result",
            "error",
        ]
    )
    _audit(actor=actor, action="replay.rerun", report=report, before=before)
    after_commit(REPLAY_TASK, report.pk)
    return report
