from django.urls import include, path

app_name = "api"
urlpatterns = [
    path("", include("tenants.api_urls")),
    path("", include("images.api_urls")),
    path("", include("jobs.api_urls")),
    path("", include("telemetry.api_urls")),
]
