from django.urls import path

from tenants import api

urlpatterns = [
    path("tokens/", api.TokenCreateApi.as_view(), name="token-create"),
    path("tokens/current/", api.TokenRevokeApi.as_view(), name="token-revoke"),
]
