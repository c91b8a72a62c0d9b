from django.urls import path

from telemetry import node_views, views
from telemetry.kpis import views as kpi_views

app_name = "telemetry"
urlpatterns = [
    path("runs/<int:run_id>/telemetry/", views.run_telemetry, name="run_telemetry"),
    path("goodput/", views.goodput, name="goodput"),
    path("tenants/<slug:slug>/goodput/", views.tenant_goodput, name="tenant_goodput"),
    path("telemetry/unmapped/", views.unmapped_samples, name="unmapped_samples"),
    path("platform/kpis/", kpi_views.platform_kpis, name="platform_kpis"),
    path("telemetry/nodes/", node_views.node_list, name="node_health"),
    path("telemetry/nodes/<slug:cluster>/<str:node>/", node_views.node_detail, name="node_detail"),
    path(
        "telemetry/nodes/<slug:cluster>/<str:node>/quarantine/",
        node_views.node_act,
        {"act": "quarantine"},
        name="node_quarantine",
    ),
    path(
        "telemetry/nodes/<slug:cluster>/<str:node>/release/",
        node_views.node_act,
        {"act": "release"},
        name="node_release",
    ),
    path(
        "telemetry/nodes/<slug:cluster>/<str:node>/health-check/",
        node_views.node_health_check,
        name="node_health_check",
    ),
]
