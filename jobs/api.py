"""REST API for runs and experiments: parse, call one service or selector, render.

Every lookup goes through the tenant-scoped selectors, so another tenant's run is a 404
exactly like a missing one. The runtime reports (rank 0's, and every other rank's
versions) are the endpoints here a job calls: they take only the job's per-attempt token,
which names the attempt they may write.
"""

import uuid

from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.urls import reverse
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
)
from rest_framework import authentication, generics, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import (
    AuthenticationFailed,
    PermissionDenied,
    ValidationError,
)
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.settings import api_settings
from rest_framework.utils.urls import remove_query_param, replace_query_param
from rest_framework.views import APIView

from core.api import ATTEMPT_TOKEN_RESPONSES, NOT_FOUND, UNAUTHENTICATED, Conflict, ErrorSerializer
from core.http import or_404
from core.parsers import BoundedJsonTextParser, JsonTextParser
from jobs.access import experiment_list_viewable, run_list_viewable
from jobs.models import Attempt, Experiment, Run
from jobs.selectors.capacity import quota_usage_list
from jobs.selectors.experiments import experiment_get_viewable
from jobs.selectors.logs import run_logs
from jobs.selectors.runs import (
    attempt_get_for_token,
    attempt_token_refusal,
    run_attempts,
    run_get_viewable,
    run_page_viewable,
)
from jobs.serializers.experiments import (
    ExperimentFilterSerializer,
    ExperimentInputSerializer,
    ExperimentSerializer,
)
from jobs.serializers.runs import (
    RUN_COLUMNS,
    RUN_DETAIL_COLUMNS,
    RestartExcludingSerializer,
    RunDetailSerializer,
    RunFilterSerializer,
    RunSerializer,
)
from jobs.serializers.runtime import (
    RankReportResultSerializer,
    RankReportSerializer,
    RuntimeReportResultSerializer,
    RuntimeReportSerializer,
)
from jobs.services.backend_sync import MAX_RUNTIME_REPORT_BYTES, attempt_report_runtime
from jobs.services.lifecycle import run_cancel
from jobs.services.rank_runtime import attempt_report_rank_runtime
from jobs.services.restart import run_restart_excluding
from jobs.services.submission import run_rerun, run_submit
from tenants.models import Quota
from tenants.selectors import quota_list_viewable

# Ids are positive: the routes match digits only, so "-1" is no API path at all.
ID = OpenApiParameter("id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH)
INVALID_QUERY = OpenApiResponse(description="Query parameter name → list of messages.")
INVALID_PAGE = OpenApiResponse(ErrorSerializer, description="No such page.")
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    {"type": "string", "format": "uuid"},
    OpenApiParameter.HEADER,
    description="A UUID of your choosing: the same request sent again with the same key "
    "answers with the run the first one queued and queues nothing new.",
)


def idempotency_key(request) -> uuid.UUID | None:
    """The request's ``Idempotency-Key`` header as a UUID (None without one); a value that
    is not a UUID is a 400 naming the header, before anything is done."""
    value = request.headers.get(IDEMPOTENCY_HEADER)
    if value is None:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValidationError(
            {IDEMPOTENCY_HEADER: [f"{IDEMPOTENCY_HEADER} must be a UUID."]}
        ) from None


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
    run = or_404(run_get_viewable, user=request.user, run_id=run.pk, columns=RUN_DETAIL_COLUMNS)
    location = request.build_absolute_uri(reverse("api:run-detail", args=[run.pk]))
    return Response(
        RunDetailSerializer(run, context={"request": request}).data,
        status=status.HTTP_201_CREATED,
        headers={"Location": location},
    )


class RunListQuerySerializer(RunFilterSerializer):
    before = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="Runs older than this run."
    )
    after = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="Runs newer than this run."
    )

    def validate(self, attrs):
        if "page" in self.initial_data:
            # A client of the old numbered pages would otherwise get the first page forever.
            raise serializers.ValidationError(
                {
                    "page": [
                        "The run list has no page numbers: follow its next and previous "
                        "links (before= and after= a run id)."
                    ]
                }
            )
        if "before" in attrs and "after" in attrs:
            raise serializers.ValidationError({"after": ["Give before or after, not both."]})
        return attrs


# The page is one object, though it answers a list action (which the schema would make an array).
@extend_schema_serializer(many=False)
class RunPageSerializer(serializers.Serializer):
    next = serializers.URLField(allow_null=True, help_text="The older runs; null on the last page.")
    previous = serializers.URLField(
        allow_null=True, help_text="The newer runs; null on the newest page."
    )
    results = RunSerializer(many=True)


def _page_link(url: str, cursor: str, run_id: int | None) -> str | None:
    """``url`` paging from ``run_id`` (``before=`` or ``after=`` it), other filters kept."""
    if run_id is None:
        return None
    others = remove_query_param(remove_query_param(url, "before"), "after")
    return replace_query_param(others, cursor, run_id)


@extend_schema(tags=["runs"])
class RunViewSet(viewsets.GenericViewSet):
    serializer_class = RunSerializer
    parser_classes = [JsonTextParser]
    lookup_value_regex = "[0-9]+"
    pagination_class = None  # the list pages by position itself (run_page_viewable)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no real user
            return Run.objects.none()
        return run_list_viewable(user=self.request.user)

    @extend_schema(
        parameters=[RunListQuerySerializer],
        responses={200: RunPageSerializer, 400: INVALID_QUERY, 401: UNAUTHENTICATED},
    )
    def list(self, request):
        """Runs of every tenant you may read, newest first, a page at a time: follow
        ``next`` for older runs and ``previous`` for newer ones."""
        query = RunListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        size = api_settings.PAGE_SIZE
        assert size is not None  # REST_FRAMEWORK["PAGE_SIZE"] (portal/settings.py)
        page = run_page_viewable(
            user=request.user,
            size=size,
            states=query.validated_data.get("state", ()),
            tenant_slug=query.validated_data.get("tenant", ""),
            before=query.validated_data.get("before"),
            after=query.validated_data.get("after"),
            columns=RUN_COLUMNS,
        )
        url = request.build_absolute_uri()
        body = {
            "next": _page_link(url, "before", page.older),
            "previous": _page_link(url, "after", page.newer),
            "results": RunSerializer(page.runs, many=True).data,
        }
        return Response(body)

    @extend_schema(
        request=ExperimentInputSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: RunDetailSerializer,
            400: OpenApiResponse(description="Field name → list of messages."),
            401: UNAUTHENTICATED,
        },
    )
    def create(self, request):
        serializer = ExperimentInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            run = run_submit(
                user=request.user,
                data=serializer.to_experiment_input(),
                submission_key=idempotency_key(request),
            )
        except DjangoValidationError as exc:
            raise ValidationError(as_serializer_error(exc)) from None
        return _created(request, run)

    @extend_schema(
        parameters=[ID],
        responses={200: RunDetailSerializer, 401: UNAUTHENTICATED, 404: NOT_FOUND},
    )
    def retrieve(self, request, pk: str):
        run = or_404(run_get_viewable, user=request.user, run_id=int(pk))
        return Response(RunDetailSerializer(run, context={"request": request}).data)

    @extend_schema(
        parameters=[ID],
        request=None,
        responses={
            202: RunDetailSerializer,
            401: UNAUTHENTICATED,
            403: OpenApiResponse(ErrorSerializer, description="Not the submitter or an admin."),
            404: NOT_FOUND,
            409: OpenApiResponse(ErrorSerializer, description="The run has already ended."),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk: str):
        """Cancel at once if the run has not reached a cluster, else through the backend."""
        run = or_404(run_get_viewable, user=request.user, run_id=int(pk))
        try:
            run_cancel(run=run, actor=request.user)
        except DjangoValidationError as exc:
            raise Conflict(" ".join(exc.messages)) from None
        run = or_404(run_get_viewable, user=request.user, run_id=int(pk))
        return Response(
            RunDetailSerializer(run, context={"request": request}).data,
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(
        parameters=[ID],
        request=RestartExcludingSerializer,
        responses={
            202: RunDetailSerializer,
            400: OpenApiResponse(description="Field name → list of messages."),
            401: UNAUTHENTICATED,
            403: OpenApiResponse(ErrorSerializer, description="Not the submitter or an admin."),
            404: NOT_FOUND,
            409: OpenApiResponse(
                ErrorSerializer,
                description="Refused, nothing changed: the run is not on its nodes, the node "
                "is not one of them or is excluded already, or no node would be left to "
                "place the run on.",
            ),
        },
    )
    @action(detail=True, methods=["post"], url_path="restart-excluding")
    def restart_excluding(self, request, pk: str):
        """Take the run off its nodes and requeue it to resume from its latest checkpoint on
        other nodes, without ``node`` from then on; not counted against its restarts."""
        run = or_404(run_get_viewable, user=request.user, run_id=int(pk))
        body = RestartExcludingSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run_restart_excluding(run=run, node=body.validated_data["node"], actor=request.user)
        except DjangoValidationError as exc:
            raise Conflict(" ".join(exc.messages)) from None
        run = or_404(run_get_viewable, user=request.user, run_id=int(pk))
        return Response(
            RunDetailSerializer(run, context={"request": request}).data,
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(
        parameters=[ID, RunLogsQuerySerializer],
        responses={
            200: RunLogsSerializer,
            400: INVALID_QUERY,
            401: UNAUTHENTICATED,
            404: NOT_FOUND,
        },
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk: str):
        """The last lines of the latest attempt's logs, as its backend keeps them."""
        query = RunLogsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        run = or_404(run_get_viewable, user=request.user, run_id=int(pk))
        attempts = run_attempts(run=run)
        latest = attempts[-1] if attempts else None
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

    @extend_schema(
        parameters=[ExperimentFilterSerializer],
        responses={
            200: ExperimentSerializer(many=True),
            400: INVALID_QUERY,
            401: UNAUTHENTICATED,
            404: INVALID_PAGE,
        },
    )
    def list(self, request):
        filters = ExperimentFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        experiments = self.get_queryset()
        if filters.validated_data.get("tenant"):
            experiments = experiments.filter(tenant__slug=filters.validated_data["tenant"])
        page = self.paginate_queryset(experiments)
        return self.get_paginated_response(ExperimentSerializer(page, many=True).data)

    @extend_schema(
        parameters=[ID],
        responses={200: ExperimentSerializer, 401: UNAUTHENTICATED, 404: NOT_FOUND},
    )
    def retrieve(self, request, pk: str):
        experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=int(pk))
        return Response(ExperimentSerializer(experiment).data)

    @extend_schema(
        parameters=[ID, IDEMPOTENCY_KEY],
        request=None,
        responses={
            201: RunDetailSerializer,
            400: OpenApiResponse(
                description="It cannot run again as recorded (e.g. its image is blocked)."
            ),
            401: UNAUTHENTICATED,
            403: OpenApiResponse(ErrorSerializer, description="Not a member of the tenant."),
            404: NOT_FOUND,
        },
    )
    @action(detail=True, methods=["post"])
    def rerun(self, request, pk: str):
        """Queue a new run of the same experiment record, exactly as recorded."""
        experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=int(pk))
        try:
            run = run_rerun(
                experiment=experiment, user=request.user, submission_key=idempotency_key(request)
            )
        except DjangoPermissionDenied as exc:
            # The user can read the experiment, so a 403 leaks nothing.
            raise PermissionDenied(str(exc)) from None
        except DjangoValidationError as exc:
            raise ValidationError(as_serializer_error(exc)) from None
        return _created(request, run)


# --- the job's runtime report ---------------------------------------------------------------


class AttemptTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Attempt gat_<attempt id>.<random>``: the token a job finds in
    ``GANTRY_ATTEMPT_TOKEN``. Random, stored only as a digest, valid for one attempt while
    it is live (submitting, pending or running, and no later attempt of its run exists)."""

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
        attempt = self.attempt_for(token)
        if attempt is None:
            raise AuthenticationFailed("Invalid attempt token.")
        refusal = attempt_token_refusal(attempt)
        if refusal is not None:
            # Only the holder of a genuine token learns this: it names the holder's attempt.
            raise AuthenticationFailed(refusal)
        return AnonymousUser(), attempt

    def attempt_for(self, token: str) -> Attempt | None:
        """The attempt ``token`` was issued for, or None; an endpoint that needs more of the
        attempt with it reads it here, in the same statement."""
        return attempt_get_for_token(token=token)

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


class AttemptTokenApi(APIView):
    """The base of every endpoint a job calls with its attempt token: ``request.auth`` is
    the attempt the token was issued for."""

    authentication_classes = [AttemptTokenAuthentication]
    permission_classes = [HasAttemptToken]


class RuntimeReportParser(BoundedJsonTextParser):
    max_bytes = MAX_RUNTIME_REPORT_BYTES


@extend_schema(tags=["attempts"])
class AttemptRuntimeReportApi(AttemptTokenApi):
    parser_classes = [RuntimeReportParser]

    @extend_schema(
        request=RuntimeReportSerializer,
        responses={
            200: RuntimeReportResultSerializer,
            400: OpenApiResponse(
                description="Field name → list of messages; or malformed JSON, or a body "
                "that is not UTF-8 text."
            ),
            **ATTEMPT_TOKEN_RESPONSES,
            413: OpenApiResponse(ErrorSerializer, description="The body is over 64 KiB."),
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


@extend_schema(tags=["attempts"])
class AttemptRankReportApi(AttemptTokenApi):
    parser_classes = [RuntimeReportParser]

    @extend_schema(
        request=RankReportSerializer,
        responses={
            200: RankReportResultSerializer,
            400: OpenApiResponse(
                description="Field name → list of messages (a rank not below the attempt's "
                "GPU count: `rank`); or malformed JSON, or a body that is not UTF-8 text."
            ),
            **ATTEMPT_TOKEN_RESPONSES,
            413: OpenApiResponse(ErrorSerializer, description="The body is over 64 KiB."),
        },
    )
    def post(self, request):
        """Report the NCCL, driver and CUDA versions of one rank of the attempt the token
        was issued for, and its host: what every rank other than 0 sends once (rank 0's
        are in its runtime report). A rank reporting again replaces what it said."""
        serializer = RankReportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        attempt = request.auth
        report = dict(serializer.validated_data)
        rank = report.pop("rank")
        try:
            changed = attempt_report_rank_runtime(attempt=attempt, rank=rank, report=report)
        except DjangoValidationError as exc:
            raise ValidationError(as_serializer_error(exc)) from None
        result = {"attempt": attempt.pk, "run": attempt.run_id, "rank": rank, "changed": changed}
        return Response(RankReportResultSerializer(result).data)


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

    @extend_schema(
        parameters=[QuotaFilterSerializer],
        responses={
            200: QuotaUsageSerializer(many=True),
            400: INVALID_QUERY,
            401: UNAUTHENTICATED,
            404: INVALID_PAGE,
        },
    )
    def get(self, request):
        """Quotas of every tenant you may read, with what each uses now and this month."""
        filters = QuotaFilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        quotas = quota_list_viewable(user=request.user)
        if filters.validated_data.get("tenant"):
            quotas = quotas.filter(tenant__slug=filters.validated_data["tenant"])
        page = self.paginate_queryset(quotas)
        assert page is not None  # the view paginates (REST_FRAMEWORK["PAGE_SIZE"])
        usages = quota_usage_list(quotas=page)
        return self.get_paginated_response(QuotaUsageSerializer(usages, many=True).data)
