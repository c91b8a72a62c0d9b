"""REST API for experiment specs and templates: parse, call one service or selector, render.

A spec is submitted as JSON (``POST /specs/``); errors name the spec's dotted fields
(``resources.gpus_per_node``). The JSON Schema of the spec is served at ``/spec/schema/``
and published in the OpenAPI document as the ``ExperimentSpec`` component.
"""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.urls import reverse
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import NOT_FOUND, UNAUTHENTICATED, ErrorSerializer
from core.http import or_404
from core.parsers import JsonTextParser
from jobs.access import template_list_usable
from jobs.api import ID, IDEMPOTENCY_KEY, INVALID_PAGE, idempotency_key
from jobs.models import ExperimentTemplate
from jobs.selectors.experiments import experiment_get_viewable
from jobs.selectors.preview import spec_preview
from jobs.selectors.runs import run_get_viewable
from jobs.serializers.runs import RunSerializer
from jobs.serializers.simulate import SimulationSerializer
from jobs.services.specs import experiment_spec, spec_submit
from jobs.spec import SPEC_SCHEMA
from tenants.models import Tenant

SPEC_ERRORS = OpenApiResponse(
    description='Dotted spec field → list of messages, e.g. {"resources.nodes": ["…"]}.'
)
# JSON Schema keywords that an OpenAPI 3.0 schema object does not know.
_NOT_OPENAPI_30 = {"$schema", "$id", "const"}


class ExperimentSpecSerializer(serializers.Serializer):
    """Stands for the experiment spec in the OpenAPI document; never used to parse."""


def openapi_schema_of(schema):
    """SPEC_SCHEMA as an OpenAPI 3.0 schema object: ``const`` becomes a one-value enum."""
    if isinstance(schema, dict):
        converted = {
            key: openapi_schema_of(value)
            for key, value in schema.items()
            if key not in _NOT_OPENAPI_30
        }
        if "const" in schema:
            converted["enum"] = [schema["const"]]
        return converted
    if isinstance(schema, list):
        return [openapi_schema_of(item) for item in schema]
    return schema


class ExperimentSpecScheme(OpenApiSerializerExtension):
    target_class = ExperimentSpecSerializer

    def get_name(self, auto_schema, direction):
        return "ExperimentSpec"

    def map_serializer(self, auto_schema, direction):
        return openapi_schema_of(SPEC_SCHEMA)


@extend_schema(tags=["specs"])
class SpecSubmitApi(APIView):
    parser_classes = [JsonTextParser]

    @extend_schema(
        request=ExperimentSpecSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: RunSerializer,
            400: SPEC_ERRORS,
            401: UNAUTHENTICATED,
            403: ErrorSerializer,
        },
    )
    def post(self, request):
        """Submit an experiment spec (version 1). Nothing is created if any field is bad."""
        try:
            run = spec_submit(
                user=request.user,
                document=request.data,
                submission_key=idempotency_key(request),
            )
        except DjangoPermissionDenied as exc:
            raise PermissionDenied(str(exc)) from None
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from None
        run = or_404(run_get_viewable, user=request.user, run_id=run.pk)
        location = request.build_absolute_uri(reverse("api:run-detail", args=[run.pk]))
        return Response(
            RunSerializer(run).data, status=status.HTTP_201_CREATED, headers={"Location": location}
        )


@extend_schema(tags=["specs"])
class RunSimulateApi(APIView):
    parser_classes = [JsonTextParser]

    @extend_schema(
        request=ExperimentSpecSerializer,
        responses={200: SimulationSerializer, 400: SPEC_ERRORS, 401: UNAUTHENTICATED},
    )
    def post(self, request):
        """What submitting this spec now would do, changing nothing: start, borrow, wait or
        be refused, and when the same run would start in other shapes (another split over
        nodes, another flavor, a looser topology), fastest first."""
        try:
            preview = spec_preview(user=request.user, document=request.data)
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from None
        return Response(SimulationSerializer(preview).data)


@extend_schema(tags=["specs"])
class ExperimentSpecApi(APIView):
    @extend_schema(
        parameters=[ID],
        responses={200: ExperimentSpecSerializer, 401: UNAUTHENTICATED, 404: NOT_FOUND},
    )
    def get(self, request, id: int):  # named like the {id} of the other experiment paths
        """The spec that submits this experiment again, exactly as recorded."""
        experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=id)
        return Response(experiment_spec(experiment))


@extend_schema(tags=["specs"])
class SpecSchemaApi(APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, 401: UNAUTHENTICATED})
    def get(self, request):
        """The JSON Schema (draft 2020-12) of the experiment spec, version 1."""
        return Response(SPEC_SCHEMA)


class TemplateSerializer(serializers.ModelSerializer):
    tenant: "serializers.SlugRelatedField[Tenant]" = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True, help_text="Null for a global template."
    )
    values = serializers.DictField(
        child=serializers.JSONField(), read_only=True, help_text="A partial spec: the defaults."
    )
    locked = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Dotted spec fields a submission may not change.",
    )
    ranges = serializers.DictField(
        child=serializers.DictField(child=serializers.IntegerField()),
        read_only=True,
        help_text='Dotted integer field → {"min": n, "max": m}.',
    )

    class Meta:
        model = ExperimentTemplate
        fields = ["id", "tenant", "name", "description", "values", "locked", "ranges", "updated_at"]
        read_only_fields = fields


@extend_schema(
    tags=["specs"],
    responses={200: TemplateSerializer(many=True), 401: UNAUTHENTICATED, 404: INVALID_PAGE},
)
class TemplateListApi(generics.ListAPIView):
    """Templates the user may submit from: those of their tenants, and global ones."""

    serializer_class = TemplateSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no real user
            return ExperimentTemplate.objects.none()
        return template_list_usable(user=self.request.user)
