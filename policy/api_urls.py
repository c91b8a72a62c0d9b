from django.urls import path

from policy import api

urlpatterns = [
    path("replays/", api.ReplayListApi.as_view(), name="replay-list"),
    path("replays/<int:id>/", api.ReplayDetailApi.as_view(), name="replay-detail"),
    path("replays/<int:id>/cancel/", api.ReplayCancelApi.as_view(), name="replay-cancel"),
]
