from django.urls import path

from tenants import views

app_name = "tenants"
urlpatterns = [
    path("flavors/", views.flavor_list, name="flavor_list"),
    path("flavors/new/", views.flavor_create, name="flavor_create"),
    path("flavors/<str:slug>/edit/", views.flavor_edit, name="flavor_edit"),
    path("audit/", views.audit_list, name="audit_list"),
    path("tenants/<slug:slug>/idle-policy/", views.idle_policy, name="idle_policy"),
    path("tenants/<slug:slug>/workspace-policy/", views.workspace_policy, name="workspace_policy"),
]
