"""REST API for workspaces: list and launch, a workspace's card, Extend, Stop.

Every lookup goes through ``workspace_get_viewable``: a workspace the user may not see is
a 404 exactly like a missing one. Launching takes an ``Idempotency-Key`` like runs do.
"""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.settings import api_settings

from core.api import NOT_FOUND, UNAUTHENTICATED, Conflict, ErrorSerializer
from core.http import or_404
from core.parsers import JsonTextParser
from jobs.access import workspace_list_viewable
from jobs.api import ID, IDEMPOTENCY_KEY, _page_link, idempotency_key
from jobs.models import Run
from jobs.selectors.workspaces import (
    workspace_card_of,
    workspace_get_viewable,
    workspace_page_viewable,
)
from jobs.serializers.workspaces import (
    WorkspaceExtendSerializer,
    WorkspaceInputSerializer,
    WorkspacePageSerializer,
    WorkspaceSerializer,
)
from jobs.services.workspace_lifecycle import workspace_resume, workspace_suspend
from jobs.services.workspaces import workspace_extend, workspace_launch, workspace_stop

FIELD_ERRORS = OpenApiResponse(description="Field name → list of messages.")
ENDED = OpenApiResponse(ErrorSerializer, description="The workspace has ended.")


class WorkspaceListQuerySerializer(serializers.Serializer):
    before = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="Workspaces older than this."
    )
    after = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, required=False, help_text="Workspaces newer than this."
    )

    def validate(self, attrs):
        if "before" in attrs and "after" in attrs:
            raise serializers.ValidationError({"after": ["Give before or after, not both."]})
        return attrs


def _card(request, run_id: int, status_code: int = status.HTTP_200_OK) -> Response:
    run = or_404(workspace_get_viewable, user=request.user, run_id=run_id)
    card = workspace_card_of(user=request.user, run=run)
    return Response(WorkspaceSerializer(card).data, status=status_code)


@extend_schema(tags=["workspaces"])
def _transition(request, pk: str, service) -> Response:
    """Stop, suspend or resume (``service``) the workspace the user can see: 403 when the
    service says it is not theirs to do (seeing it, a 403 leaks nothing), 409 when its
    state does not allow it, else its card (202: the backend finishes the job)."""
    run = or_404(workspace_get_viewable, user=request.user, run_id=int(pk))
    try:
        service(run=run, actor=request.user)
    except DjangoPermissionDenied as exc:
        raise PermissionDenied(str(exc)) from None
    except DjangoValidationError as exc:
        raise Conflict(" ".join(exc.messages)) from None
    return _card(request, run.pk, status.HTTP_202_ACCEPTED)


class WorkspaceViewSet(viewsets.GenericViewSet):
    serializer_class = WorkspaceSerializer
    parser_classes = [JsonTextParser]
    lookup_value_regex = "[0-9]+"
    pagination_class = None  # pages by position itself (workspace_page_viewable)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no real user
            return Run.objects.none()
        return workspace_list_viewable(user=self.request.user)

    @extend_schema(
        parameters=[WorkspaceListQuerySerializer],
        responses={200: WorkspacePageSerializer, 400: FIELD_ERRORS, 401: UNAUTHENTICATED},
    )
    def list(self, request):
        """Your workspaces; a tenant admin's also every workspace of their tenants; a
        platform admin's all. Newest first, a page at a time: follow ``next``."""
        query = WorkspaceListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        size = api_settings.PAGE_SIZE
        assert size is not None  # REST_FRAMEWORK["PAGE_SIZE"] (portal/settings.py)
        page = workspace_page_viewable(
            user=request.user,
            size=size,
            before=query.validated_data.get("before"),
            after=query.validated_data.get("after"),
        )
        url = request.build_absolute_uri()
        body = {
            "next": _page_link(url, "before", page.older),
            "previous": _page_link(url, "after", page.newer),
            "results": WorkspaceSerializer(page.cards, many=True).data,
        }
        return Response(body)

    @extend_schema(
        request=WorkspaceInputSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={201: WorkspaceSerializer, 400: FIELD_ERRORS, 401: UNAUTHENTICATED},
    )
    def create(self, request):
        """Launch a workspace: queued through the same admission as every run."""
        body = WorkspaceInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run = workspace_launch(
                user=request.user,
                data=body.to_workspace_input(),
                submission_key=idempotency_key(request),
            )
        except DjangoValidationError as exc:
            raise ValidationError(as_serializer_error(exc)) from None
        response = _card(request, run.pk, status.HTTP_201_CREATED)
        location = reverse("api:workspace-detail", args=[run.pk])
        response["Location"] = request.build_absolute_uri(location)
        return response

    @extend_schema(
        parameters=[ID],
        responses={200: WorkspaceSerializer, 401: UNAUTHENTICATED, 404: NOT_FOUND},
    )
    def retrieve(self, request, pk: str):
        return _card(request, int(pk))

    @extend_schema(
        parameters=[ID],
        request=WorkspaceExtendSerializer,
        responses={
            200: WorkspaceSerializer,
            400: FIELD_ERRORS,
            401: UNAUTHENTICATED,
            403: OpenApiResponse(
                ErrorSerializer, description="Not its owner or a tenant admin of its tenant."
            ),
            404: NOT_FOUND,
            409: ENDED,
        },
    )
    @action(detail=True, methods=["post"])
    def extend(self, request, pk: str):
        """Add ``hours`` to its limit, within its tenant's maximum (extensions included)."""
        run = or_404(workspace_get_viewable, user=request.user, run_id=int(pk))
        body = WorkspaceExtendSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            workspace_extend(run=run, actor=request.user, hours=body.validated_data["hours"])
        except DjangoPermissionDenied as exc:
            # The user can see the workspace, so a 403 leaks nothing.
            raise PermissionDenied(str(exc)) from None
        except DjangoValidationError as exc:
            if "state" in exc.message_dict:
                raise Conflict(" ".join(exc.message_dict["state"])) from None
            raise ValidationError(as_serializer_error(exc)) from None
        return _card(request, run.pk)

    @extend_schema(
        parameters=[ID],
        request=None,
        responses={
            202: WorkspaceSerializer,
            401: UNAUTHENTICATED,
            403: OpenApiResponse(ErrorSerializer, description="Not its owner or an admin."),
            404: NOT_FOUND,
            409: ENDED,
        },
    )
    @action(detail=True, methods=["post"])
    def stop(self, request, pk: str):
        """Stop it: at once if it holds no job (queued, suspended), else through its
        backend; its GPUs are released."""
        return _transition(request, pk, workspace_stop)

    @extend_schema(
        parameters=[ID],
        request=None,
        responses={
            202: WorkspaceSerializer,
            401: UNAUTHENTICATED,
            403: OpenApiResponse(ErrorSerializer, description="Not its owner."),
            404: NOT_FOUND,
            409: OpenApiResponse(ErrorSerializer, description="Not running."),
        },
    )
    @action(detail=True, methods=["post"])
    def suspend(self, request, pk: str):
        """Release its GPUs and keep its files: its job is stopped, and it waits, SUSPENDED,
        for ``resume``."""
        return _transition(request, pk, workspace_suspend)

    @extend_schema(
        parameters=[ID],
        request=None,
        responses={
            202: WorkspaceSerializer,
            401: UNAUTHENTICATED,
            403: OpenApiResponse(ErrorSerializer, description="Not its owner."),
            404: NOT_FOUND,
            409: OpenApiResponse(ErrorSerializer, description="Not suspended."),
        },
    )
    @action(detail=True, methods=["post"])
    def resume(self, request, pk: str):
        """Queue a suspended workspace again: admission decides when it starts, with its
        files."""
        return _transition(request, pk, workspace_resume)
