from django.urls import path
from rest_framework.routers import SimpleRouter

from jobs import api

router = SimpleRouter()
router.register("runs", api.RunViewSet, basename="run")
router.register("experiments", api.ExperimentViewSet, basename="experiment")

urlpatterns = [
    path("attempts/report/", api.AttemptRuntimeReportApi.as_view(), name="attempt-report"),
    *router.urls,
]
