"""What-if reports over the REST API (issue 38): ask for one, list and read them, cancel one.
The same permissions and the same rows as the pages (``policy.access``); the same checks
(``policy.selectors.replay_check``) through the same services."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import APIView

from core.api import NOT_FOUND, UNAUTHENTICATED, Conflict, ErrorSerializer
from core.http import or_404
from policy.access import (
    report_get_manageable,
    report_get_viewable,
    report_list_viewable,
    require_replay_requester,
)
from policy.models import ReplayReport
from policy.results import ReportView
from policy.selectors import ReportShown, report_shown
from policy.services.reports import replay_report_cancel, replay_report_create

ID = OpenApiParameter("id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH)
NO_SUCH_PAGE = OpenApiResponse(ErrorSerializer, description="Not for you, or no such page.")
NOT_A_PLATFORM_ADMIN = OpenApiResponse(
    ErrorSerializer, description="You read the report, but only platform admins act on it."
)


class ReplayRequestSerializer(serializers.Serializer):
    window_start = serializers.DateTimeField()
    window_end = serializers.DateTimeField(help_text="In the past, after window_start.")
    proposal = serializers.JSONField(
        help_text='{"quotas": [{"tenant", "flavor", "guaranteed", "borrow_limit", '
        '"max_gpus_per_run", "budget_gpu_hours", "budget_hard", "weight"}], "nodes": '
        '[{"cluster", "flavor", "count", "gpus_per_node"}], "preemption": false|null, '
        '"starvation_after_s": number|null} (docs/what-if-reports.md)'
    )
    confirm_warnings = serializers.BooleanField(
        default=False, help_text="Replay even though guarantees exceed the capacity."
    )
    share = serializers.BooleanField(
        default=False, help_text="Share with finance and the concerned tenants' admins."
    )


class TenantRowSerializer(serializers.Serializer):
    tenant = serializers.CharField()
    runs = serializers.IntegerField()
    actual = serializers.DictField(help_text="What happened: queue_p50_s, queue_p95_s, …")
    proposed = serializers.DictField(help_text="Under the proposal, the same figures")


class ReplayResultSerializer(serializers.Serializer):
    tenants = TenantRowSerializer(many=True)
    platform = serializers.DictField(help_text="utilisation (%), gpu_hours, … actual/proposed")
    lines = serializers.ListField(child=serializers.CharField(), help_text="In plain words")
    fidelity = serializers.DictField(help_text="The replay of the policy in force vs reality")


class ReplayReportSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=ReplayReport.Status.choices)
    progress = serializers.FloatField(help_text="0 to 1")
    requested_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    window_start = serializers.DateTimeField()
    window_end = serializers.DateTimeField()
    proposal = serializers.JSONField(help_text="Of your tenants only, for a tenant admin")
    submissions = serializers.IntegerField(help_text="Runs in the window when it was asked for")
    estimate_s = serializers.FloatField()
    shared = serializers.BooleanField()
    tenants = serializers.ListField(child=serializers.CharField())
    error = serializers.CharField(allow_blank=True)
    result = ReplayResultSerializer(allow_null=True, help_text="null until it is done")


def _figures(outcome) -> dict:
    return {
        "queue_p50_s": outcome.queue_p50_s,
        "queue_p95_s": outcome.queue_p95_s,
        "gpu_hours": outcome.gpu_hours,
        "preemptions": outcome.preemptions,
        "lost_gpu_hours": outcome.lost_gpu_hours,
        "not_started": outcome.not_started,
        "budgets": [
            {"flavor": b.flavor, "month": b.month, "used_gpu_hours": b.used_gpu_hours,
             "budget_gpu_hours": b.budget_gpu_hours, "hard": b.hard}
            for b in outcome.budgets
        ],
    }  # fmt: skip


def _result(view: ReportView) -> dict:
    return {
        "tenants": [
            {
                "tenant": row.tenant,
                "runs": row.actual.runs,
                "actual": _figures(row.actual),
                "proposed": _figures(row.proposed),
            }
            for row in view.rows
        ],
        "platform": {
            side: {
                "utilisation": outcome.utilisation,
                "gpu_hours": outcome.gpu_hours,
                "capacity_gpu_hours": outcome.capacity_gpu_hours,
                "preemptions": outcome.preemptions,
                "lost_gpu_hours": outcome.lost_gpu_hours,
                "not_started": outcome.not_started,
            }
            for side, outcome in (("actual", view.actual), ("proposed", view.proposed))
        },
        "lines": list(view.lines),
        "fidelity": {
            "within": view.fidelity.within,
            "observed_utilisation": view.fidelity.observed_utilisation,
            "replayed_utilisation": view.fidelity.replayed_utilisation,
            "tenants": [
                {"tenant": row.tenant, "observed_p50_s": row.observed_p50_s,
                 "replayed_p50_s": row.replayed_p50_s, "within": row.within}
                for row in view.fidelity.tenants
            ],
            "reasons": list(view.fidelity.reasons),
        },
    }  # fmt: skip


def _body(shown: ReportShown) -> dict:
    report = shown.report
    return {
        "id": report.pk,
        "status": report.status,
        "progress": report.progress,
        "requested_by": report.requested_by.get_username() if report.requested_by else None,
        "created_at": report.created_at,
        "started_at": report.started_at,
        "finished_at": report.finished_at,
        "window_start": report.window_start,
        "window_end": report.window_end,
        "proposal": shown.proposal,
        "submissions": report.submissions,
        "estimate_s": report.estimate_s,
        "shared": report.shared,
        "tenants": list(shown.tenants),
        "error": report.error,
        "result": None if shown.view is None else _result(shown.view),
    }


def _data(request, report: ReplayReport) -> dict:
    return ReplayReportSerializer(_body(report_shown(user=request.user, report=report))).data


@extend_schema(tags=["what-if"])
class ReplayListApi(generics.GenericAPIView):
    serializer_class = ReplayReportSerializer

    @extend_schema(
        responses={
            200: ReplayReportSerializer(many=True),
            401: UNAUTHENTICATED,
            404: OpenApiResponse(ErrorSerializer, description="No such page."),
        }
    )
    def get(self, request):
        """The what-if reports you may read, newest first: every report for platform admins,
        those shared with you for finance and tenant admins (your tenants' rows); none for
        anybody else."""
        page = self.paginate_queryset(
            report_list_viewable(user=request.user).select_related("requested_by")
        )
        return self.get_paginated_response([_data(request, report) for report in page or ()])

    @extend_schema(
        request=ReplayRequestSerializer,
        responses={
            201: ReplayReportSerializer,
            400: OpenApiResponse(
                description="Field name → list of messages; nothing stored. "
                "confirm_warnings lists the warnings to confirm."
            ),
            401: UNAUTHENTICATED,
            404: NO_SUCH_PAGE,
        },
    )
    def post(self, request):
        """Replay a past window under a proposal, in the background (platform admins)."""
        or_404(require_replay_requester, request.user)
        body = ReplayRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            report = replay_report_create(actor=request.user, **body.validated_data)
        except DjangoValidationError as exc:
            raise ValidationError(as_serializer_error(exc)) from None
        return Response(_data(request, report), status=status.HTTP_201_CREATED)


@extend_schema(tags=["what-if"])
class ReplayDetailApi(APIView):
    @extend_schema(
        parameters=[ID],
        responses={200: ReplayReportSerializer, 401: UNAUTHENTICATED, 404: NOT_FOUND},
    )
    def get(self, request, id: int):
        """One report: its progress, and its result once done (your tenants' rows)."""
        report = or_404(report_get_viewable, user=request.user, report_id=id)
        return Response(_data(request, report))


@extend_schema(tags=["what-if"])
class ReplayCancelApi(APIView):
    @extend_schema(
        parameters=[ID],
        request=None,
        responses={
            202: ReplayReportSerializer,
            401: UNAUTHENTICATED,
            403: NOT_A_PLATFORM_ADMIN,
            404: NOT_FOUND,
            409: OpenApiResponse(ErrorSerializer, description="The report has already ended."),
        },
    )
    def post(self, request, id: int):
        """Stop the replay: a queued report at once, a running one within a second or so."""
        report = or_404(report_get_manageable, user=request.user, report_id=id)
        try:
            report = replay_report_cancel(report=report, actor=request.user)
        except DjangoValidationError as exc:
            raise Conflict(" ".join(exc.messages)) from None
        report.refresh_from_db()
        return Response(_data(request, report), status=status.HTTP_202_ACCEPTED)
