from django.urls import path

from telemetry import api, verdicts_api

urlpatterns = [
    path("attempts/events/", api.AttemptEventsApi.as_view(), name="attempt-events"),
    path("runs/<int:id>/verdicts/", verdicts_api.RunVerdictsApi.as_view(), name="run-verdicts"),
]
