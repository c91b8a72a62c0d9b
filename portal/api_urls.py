from django.urls import include, path

from portal.api_index import ApiIndex

app_name = "api"
urlpatterns = [
    path("", ApiIndex.as_view(), name="index"),
    path("", include("tenants.api_urls")),
    path("", include("images.api_urls")),
    path("", include("jobs.api_urls")),
    path("", include("telemetry.api_urls")),
    path("", include("policy.api_urls")),
]
