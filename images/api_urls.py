from django.urls import path

from images import api

urlpatterns = [
    path("images/", api.ImageListApi.as_view(), name="image-list"),
]
