from django.urls import path

from telemetry import views
from telemetry.kpis import views as kpi_views

app_name = "telemetry"
urlpatterns = [
    path("runs/<int:run_id>/telemetry/", views.run_telemetry, name="run_telemetry"),
    path("goodput/", views.goodput, name="goodput"),
    path("tenants/<slug:slug>/goodput/", views.tenant_goodput, name="tenant_goodput"),
    path("telemetry/unmapped/", views.unmapped_samples, name="unmapped_samples"),
    path("platform/kpis/", kpi_views.platform_kpis, name="platform_kpis"),
]
