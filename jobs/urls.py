from django.urls import path

from jobs.views import (
    clusters,
    experiments,
    members,
    quotas,
    runs,
    submit,
    templates,
    workspaces,
)

app_name = "jobs"
urlpatterns = [
    path("runs/", runs.run_list, name="run_list"),
    path("runs/new/", submit.run_submit, name="run_submit"),
    path("runs/preview/", submit.run_preview, name="run_preview"),
    path("runs/<int:run_id>/", runs.run_detail, name="run_detail"),
    path("runs/<int:run_id>/live/", runs.run_live, name="run_live"),
    path("runs/<int:run_id>/log/", runs.run_log_download, name="run_log_download"),
    path("runs/<int:run_id>/cancel/", runs.run_cancel, name="run_cancel"),
    path(
        "runs/<int:run_id>/restart-excluding/",
        runs.run_restart_excluding,
        name="run_restart_excluding",
    ),
    path("workspaces/", workspaces.workspace_list, name="workspace_list"),
    path("workspaces/new/", workspaces.workspace_launch_page, name="workspace_launch"),
    path("workspaces/<int:run_id>/", workspaces.workspace_detail, name="workspace_detail"),
    path(
        "workspaces/<int:run_id>/extend/",
        workspaces.workspace_extend_page,
        name="workspace_extend",
    ),
    path("workspaces/<int:run_id>/stop/", workspaces.workspace_stop_page, name="workspace_stop"),
    path(
        "workspaces/<int:run_id>/suspend/",
        workspaces.workspace_suspend_page,
        name="workspace_suspend",
    ),
    path(
        "workspaces/<int:run_id>/resume/",
        workspaces.workspace_resume_page,
        name="workspace_resume",
    ),
    path("experiments/", experiments.experiment_list, name="experiment_list"),
    path(
        "experiments/<int:experiment_id>/", experiments.experiment_detail, name="experiment_detail"
    ),
    path(
        "experiments/<int:experiment_id>/rerun/",
        experiments.experiment_rerun,
        name="experiment_rerun",
    ),
    path("experiments/diff/", experiments.experiment_compare, name="experiment_diff"),
    path("quotas/", quotas.quota_list, name="quota_list"),
    path("quotas/edit/", quotas.quota_edit, name="quota_edit"),
    path("tenants/<slug:slug>/members/", members.tenant_members, name="tenant_members"),
    path("tenants/<slug:slug>/members/add/", members.member_add, name="member_add"),
    path(
        "tenants/<slug:slug>/invitations/<int:invitation_id>/revoke/",
        members.invitation_revoke,
        name="invitation_revoke",
    ),
    path(
        "tenants/<slug:slug>/members/<int:user_id>/role/", members.member_role, name="member_role"
    ),
    path(
        "tenants/<slug:slug>/members/<int:user_id>/remove/",
        members.member_remove,
        name="member_remove",
    ),
    path("clusters/", clusters.cluster_list, name="cluster_list"),
    path("clusters/nodes/", clusters.cluster_nodes, name="cluster_nodes"),
    path("clusters/<slug:name>/capacity/", clusters.cluster_capacity, name="cluster_capacity"),
    path("clusters/<slug:name>/test/", clusters.cluster_test, name="cluster_test"),
    path(
        "experiments/<int:experiment_id>/spec.yaml",
        experiments.experiment_spec_download,
        name="experiment_spec",
    ),
    path("templates/", templates.template_list, name="template_list"),
    path("templates/new/", templates.template_create, name="template_create"),
    path("templates/<int:template_id>/", templates.template_edit, name="template_edit"),
    path("templates/<int:template_id>/delete/", templates.template_delete, name="template_delete"),
]
