from django.urls import path

from telemetry import api

urlpatterns = [
    path("attempts/events/", api.AttemptEventsApi.as_view(), name="attempt-events"),
]
