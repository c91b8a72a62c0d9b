from django.urls import path

from jobs.views import runs as views

app_name = "jobs"
urlpatterns = [
    path("runs/", views.run_list, name="run_list"),
    path("runs/new/", views.run_submit, name="run_submit"),
    path("runs/preview/", views.run_preview, name="run_preview"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/live/", views.run_live, name="run_live"),
    path("runs/<int:run_id>/log/", views.run_log_download, name="run_log_download"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("experiments/", views.experiment_list, name="experiment_list"),
    path("experiments/<int:experiment_id>/", views.experiment_detail, name="experiment_detail"),
    path("experiments/<int:experiment_id>/rerun/", views.experiment_rerun, name="experiment_rerun"),
    path("experiments/diff/", views.experiment_compare, name="experiment_diff"),
    path("quotas/", views.quota_list, name="quota_list"),
    path("quotas/edit/", views.quota_edit, name="quota_edit"),
    path("tenants/<slug:slug>/members/", views.tenant_members, name="tenant_members"),
    path("tenants/<slug:slug>/members/add/", views.member_add, name="member_add"),
    path(
        "tenants/<slug:slug>/invitations/<int:invitation_id>/revoke/",
        views.invitation_revoke,
        name="invitation_revoke",
    ),
    path("tenants/<slug:slug>/members/<int:user_id>/role/", views.member_role, name="member_role"),
    path(
        "tenants/<slug:slug>/members/<int:user_id>/remove/",
        views.member_remove,
        name="member_remove",
    ),
    path("clusters/", views.cluster_list, name="cluster_list"),
    path("clusters/nodes/", views.cluster_nodes, name="cluster_nodes"),
    path("clusters/<slug:name>/capacity/", views.cluster_capacity, name="cluster_capacity"),
    path("clusters/<slug:name>/test/", views.cluster_test, name="cluster_test"),
    path(
        "experiments/<int:experiment_id>/spec.yaml",
        views.experiment_spec_download,
        name="experiment_spec",
    ),
    path("templates/", views.template_list, name="template_list"),
    path("templates/new/", views.template_create, name="template_create"),
    path("templates/<int:template_id>/", views.template_edit, name="template_edit"),
    path("templates/<int:template_id>/delete/", views.template_delete, name="template_delete"),
]
