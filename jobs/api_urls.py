from django.urls import path
from rest_framework.routers import SimpleRouter

from jobs import api
from jobs.api_workspace import WorkspaceAddressApi
from jobs.spec_api import (
    ExperimentSpecApi,
    RunSimulateApi,
    SpecSchemaApi,
    SpecSubmitApi,
    TemplateListApi,
)
from jobs.workspace_api import WorkspaceViewSet

router = SimpleRouter()
router.register("runs", api.RunViewSet, basename="run")
router.register("experiments", api.ExperimentViewSet, basename="experiment")
router.register("workspaces", WorkspaceViewSet, basename="workspace")

urlpatterns = [
    path("attempts/report/", api.AttemptRuntimeReportApi.as_view(), name="attempt-report"),
    path("attempts/rank-report/", api.AttemptRankReportApi.as_view(), name="attempt-rank-report"),
    path("attempts/workspace/", WorkspaceAddressApi.as_view(), name="attempt-workspace-address"),
    path("quotas/", api.QuotaListApi.as_view(), name="quota-list"),
    path("specs/", SpecSubmitApi.as_view(), name="spec-submit"),
    path("runs/simulate/", RunSimulateApi.as_view(), name="run-simulate"),
    path("spec/schema/", SpecSchemaApi.as_view(), name="spec-schema"),
    path(
        "experiments/<int:id>/spec/",
        ExperimentSpecApi.as_view(),
        name="experiment-spec",
    ),
    path("templates/", TemplateListApi.as_view(), name="template-list"),
    *router.urls,
]
