"""REST API for runs and experiments: parse, call one service or selector, render.

Every lookup goes through the tenant-scoped selectors, so another tenant's run is a 404
exactly like a missing one. The runtime report is the one endpoint a job calls: it takes
only the job's per-attempt token, which names the attempt it may write.
"""

import io

from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.urls import reverse
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import authentication, generics, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import (
    APIException,
    AuthenticationFailed,
    ParseError,
    PermissionDenied,
    ValidationError,
)
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import APIView

from jobs.capacity import quota_usage_list
from jobs.models import Attempt, Experiment, Run
from jobs.selectors import (
    attempt_get_for_token,
    experiment_get_viewable,
    experiment_list_viewable,
    run_attempts,
    run_get_viewable,
    run_list_viewable,
)
from jobs.serializers import (
    ErrorSerializer,
    ExperimentFilterSerializer,
    ExperimentInputSerializer,
    ExperimentSerializer,
    RunDetailSerializer,
    RunFilterSerializer,
    RunSerializer,
    RuntimeReportResultSerializer,
    RuntimeReportSerializer,
)
from jobs.services import (
    MAX_RUNTIME_REPORT_BYTES,
    attempt_report_runtime,
    run_cancel,
    run_logs,
    run_rerun,
    run_submit,
)
from tenants.models import Quota
from tenants.selectors import quota_list_viewable

ID = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="Missing, or of another tenant.")


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


MAX_LOG_TAIL = 10_000


class RunLogsQuerySerializer(serializers.Serializer):
    tail = serializers.IntegerField(
        min_value=1, max_value=MAX_LOG_TAIL, default=200, help_text="Last lines to return."
    )


class RunLogsSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    attempt = serializers.IntegerField(
        allow_null=True, help_text="Number of the latest attempt, whose logs these are."
    )
    logs = serializers.CharField(allow_blank=True)


def _created(request, run: Run) -> Response:
    run = run_get_viewable(user=request.user, run_id=run.pk)
    location = request.build_absolute_uri(reverse("api:run-detail", args=[run.pk]))
    return Response(
        RunDetailSerializer(run).data,
        status=status.HTTP_201_CREATED,
        headers={"Location": location},
    )


@extend_schema(tags=["runs"])
class RunViewSet(viewsets.GenericViewSet):
    serializer_class = RunSerializer
    parser_classes = [JSONParser]
    lookup_value_regex = "[0-9]+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no real user
            return Run.objects.none()
        return run_list_viewable(user=self.request.user)

    @extend_schema(parameters=[RunFilterSerializer], responses=RunSerializer(many=True))
    def list(self, request):
        filters = RunFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        runs = self.get_queryset()
        if filters.validated_data.get("state"):
            runs = runs.filter(state__in=filters.validated_data["state"])
        if filters.validated_data.get("tenant"):
            runs = runs.filter(tenant__slug=filters.validated_data["tenant"])
        page = self.paginate_queryset(runs)
        return self.get_paginated_response(RunSerializer(page, many=True).data)

    @extend_schema(
        request=ExperimentInputSerializer,
        responses={
            201: RunDetailSerializer,
            400: OpenApiResponse(description="Field name → list of messages."),
        },
    )
    def create(self, request):
        serializer = ExperimentInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            run = run_submit(user=request.user, data=serializer.to_experiment_input())
        except DjangoValidationError as exc:
            raise ValidationError(as_serializer_error(exc)) from None
        return _created(request, run)

    @extend_schema(parameters=[ID], responses={200: RunDetailSerializer, 404: NOT_FOUND})
    def retrieve(self, request, pk: str):
        run = run_get_viewable(user=request.user, run_id=int(pk))
        return Response(RunDetailSerializer(run).data)

    @extend_schema(
        parameters=[ID],
        request=None,
        responses={
            202: RunDetailSerializer,
            403: OpenApiResponse(ErrorSerializer, description="Not the submitter or an admin."),
            404: NOT_FOUND,
            409: OpenApiResponse(ErrorSerializer, description="The run has already ended."),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk: str):
        """Cancel at once if the run has not reached a cluster, else through the backend."""
        run = run_get_viewable(user=request.user, run_id=int(pk))
        try:
            run_cancel(run=run, actor=request.user)
        except DjangoValidationError as exc:
            raise Conflict(" ".join(exc.messages)) from None
        run = run_get_viewable(user=request.user, run_id=int(pk))
        return Response(RunDetailSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        parameters=[ID, RunLogsQuerySerializer],
        responses={200: RunLogsSerializer, 404: NOT_FOUND},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk: str):
        """The last lines of the latest attempt's logs, as its backend keeps them."""
        query = RunLogsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        run = run_get_viewable(user=request.user, run_id=int(pk))
        latest = run_attempts(run=run).last()
        body = {
            "run": run.pk,
            "attempt": latest.number if latest else None,
            "logs": run_logs(run=run, tail=query.validated_data["tail"]),
        }
        return Response(RunLogsSerializer(body).data)


@extend_schema(tags=["experiments"])
class ExperimentViewSet(viewsets.GenericViewSet):
    serializer_class = ExperimentSerializer
    lookup_value_regex = "[0-9]+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no real user
            return Experiment.objects.none()
        return experiment_list_viewable(user=self.request.user)

    @extend_schema(parameters=[ExperimentFilterSerializer])
    def list(self, request):
        filters = ExperimentFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        experiments = self.get_queryset()
        if filters.validated_data.get("tenant"):
            experiments = experiments.filter(tenant__slug=filters.validated_data["tenant"])
        page = self.paginate_queryset(experiments)
        return self.get_paginated_response(ExperimentSerializer(page, many=True).data)

    @extend_schema(parameters=[ID], responses={200: ExperimentSerializer, 404: NOT_FOUND})
    def retrieve(self, request, pk: str):
        experiment = experiment_get_viewable(user=request.user, experiment_id=int(pk))
        return Response(ExperimentSerializer(experiment).data)

    @extend_schema(
        parameters=[ID],
        request=None,
        responses={
            201: RunDetailSerializer,
            400: OpenApiResponse(
                description="It cannot run again as recorded (e.g. its image is blocked)."
            ),
            403: OpenApiResponse(ErrorSerializer, description="Not a member of the tenant."),
            404: NOT_FOUND,
        },
    )
    @action(detail=True, methods=["post"])
    def rerun(self, request, pk: str):
        """Queue a new run of the same experiment record, exactly as recorded."""
        experiment = experiment_get_viewable(user=request.user, experiment_id=int(pk))
        try:
            run = run_rerun(experiment=experiment, user=request.user)
        except DjangoPermissionDenied as exc:
            # The user can read the experiment, so a 403 leaks nothing.
            raise PermissionDenied(str(exc)) from None
        except DjangoValidationError as exc:
            raise ValidationError(as_serializer_error(exc)) from None
        return _created(request, run)


# --- the job's runtime report ---------------------------------------------------------------


class AttemptTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Attempt gat_<attempt id>.<signature>``: the token a job finds in
    ``GANTRY_ATTEMPT_TOKEN``. It is derived from the secret key, never stored."""

    keyword = b"attempt"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise AuthenticationFailed("Malformed Authorization header.")
        try:
            token = header[1].decode("ascii")
        except UnicodeError:
            raise AuthenticationFailed("Invalid attempt token.") from None
        attempt = attempt_get_for_token(token=token)
        if attempt is None:
            raise AuthenticationFailed("Invalid attempt token.")
        return AnonymousUser(), attempt

    def authenticate_header(self, request):
        return 'Attempt realm="api"'


class AttemptTokenScheme(OpenApiAuthenticationExtension):
    target_class = AttemptTokenAuthentication
    name = "attemptToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Attempt <token>` with the job's GANTRY_ATTEMPT_TOKEN.",
        }


class HasAttemptToken(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Attempt)


class RuntimeReportParser(JSONParser):
    """JSON of at most ``MAX_RUNTIME_REPORT_BYTES``: a larger body is refused unread."""

    def parse(self, stream, media_type=None, parser_context=None):
        body = stream.read(MAX_RUNTIME_REPORT_BYTES + 1)
        if len(body) > MAX_RUNTIME_REPORT_BYTES:
            raise ParseError(f"The report is larger than {MAX_RUNTIME_REPORT_BYTES // 1024} KiB.")
        return super().parse(io.BytesIO(body), media_type, parser_context)


@extend_schema(tags=["attempts"])
class AttemptRuntimeReportApi(APIView):
    authentication_classes = [AttemptTokenAuthentication]
    permission_classes = [HasAttemptToken]
    parser_classes = [RuntimeReportParser]

    @extend_schema(
        request=RuntimeReportSerializer,
        responses={
            200: RuntimeReportResultSerializer,
            400: OpenApiResponse(description="Field name → list of messages."),
            401: OpenApiResponse(ErrorSerializer, description="No or an invalid attempt token."),
            409: OpenApiResponse(
                ErrorSerializer, description="The attempt ended more than an hour ago."
            ),
        },
    )
    def post(self, request):
        """Report the runtime of the attempt the token was issued for (driver, CUDA,
        framework and NCCL versions, nodes, GPU UUIDs). The latest report replaces the
        previous one; repeating it changes nothing."""
        serializer = RuntimeReportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        attempt = request.auth
        try:
            changed = attempt_report_runtime(attempt=attempt, report=serializer.validated_data)
        except DjangoValidationError as exc:
            if "state" in exc.message_dict:
                raise Conflict(" ".join(exc.message_dict["state"])) from None
            raise ValidationError(as_serializer_error(exc)) from None
        attempt.refresh_from_db(
            fields=["runtime_env", "node_list", "gpu_uuids", "runtime_reported_at"]
        )
        result = {
            "attempt": attempt.pk,
            "run": attempt.run_id,
            "changed": changed,
            "runtime_env": attempt.runtime_env,
            "node_list": attempt.node_list,
            "gpu_uuids": attempt.gpu_uuids,
            "runtime_reported_at": attempt.runtime_reported_at,
        }
        return Response(RuntimeReportResultSerializer(result).data)


# --- quotas --------------------------------------------------------------------------------


class QuotaFilterSerializer(serializers.Serializer):
    tenant = serializers.SlugField(max_length=63, required=False, help_text="Tenant slug.")


class QuotaUsageSerializer(serializers.Serializer):
    tenant = serializers.CharField(source="quota.tenant.slug")
    flavor = serializers.CharField(source="quota.flavor.slug")
    guaranteed_gpus = serializers.IntegerField(source="quota.guaranteed_gpus")
    borrow_limit_gpus = serializers.IntegerField(source="quota.borrow_limit_gpus")
    max_gpus_per_run = serializers.IntegerField(source="quota.max_gpus_per_run", allow_null=True)
    monthly_gpu_hour_budget = serializers.IntegerField(
        source="quota.monthly_gpu_hour_budget", allow_null=True
    )
    budget_mode = serializers.ChoiceField(
        source="quota.budget_mode", choices=Quota.BudgetMode.choices
    )
    in_use = serializers.IntegerField(help_text="GPUs the tenant's runs hold now.")
    borrowable = serializers.IntegerField(help_text="GPUs a run could borrow now.")
    beyond_guarantee = serializers.IntegerField()
    idle = serializers.IntegerField(help_text="GPUs of the flavor no run holds.")
    gpu_hours = serializers.FloatField(help_text="GPU hours allocated this month.")
    budget_left = serializers.FloatField(allow_null=True)
    burn_percent = serializers.FloatField(allow_null=True)


@extend_schema(tags=["quotas"])
class QuotaListApi(generics.GenericAPIView):
    serializer_class = QuotaUsageSerializer

    @extend_schema(parameters=[QuotaFilterSerializer], responses=QuotaUsageSerializer(many=True))
    def get(self, request):
        """Quotas of every tenant you may read, with what each uses now and this month."""
        filters = QuotaFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        quotas = quota_list_viewable(user=request.user)
        if filters.validated_data.get("tenant"):
            quotas = quotas.filter(tenant__slug=filters.validated_data["tenant"])
        usages = quota_usage_list(quotas=self.paginate_queryset(quotas))
        return self.get_paginated_response(QuotaUsageSerializer(usages, many=True).data)
