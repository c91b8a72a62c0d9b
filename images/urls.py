from django.urls import path

from images import views

app_name = "images"
urlpatterns = [
    path("", views.image_list, name="image_list"),
    path("import/", views.image_import, name="image_import"),
    path("<int:image_id>/", views.image_detail, name="image_detail"),
    path("<int:image_id>/status/", views.image_status, name="image_status"),
    path("<int:image_id>/visibility/", views.image_visibility, name="image_visibility"),
    path("<int:image_id>/recheck/", views.image_recheck, name="image_recheck"),
    path("registries/", views.registry_list, name="registry_list"),
    path("registries/new/", views.registry_create, name="registry_create"),
    path("registries/<slug:name>/edit/", views.registry_edit, name="registry_edit"),
    path("registries/<slug:name>/test/", views.registry_test, name="registry_test"),
]
