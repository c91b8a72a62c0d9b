"""REST API for runs and experiments: parse, call one service or selector, render.

Every lookup goes through the tenant-scoped selectors, so another tenant's run is a 404
exactly like a missing one.
"""

from django.core.exceptions import ValidationError as DjangoValidationError
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error

from jobs.models import Experiment, Run
from jobs.selectors import (
    experiment_get_viewable,
    experiment_list_viewable,
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
)
from jobs.services import run_cancel, run_submit

ID = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="Missing, or of another tenant.")


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


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
        run = run_get_viewable(user=request.user, run_id=run.pk)
        location = request.build_absolute_uri(reverse("api:run-detail", args=[run.pk]))
        return Response(
            RunDetailSerializer(run).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": location},
        )

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
