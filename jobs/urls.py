from django.urls import path

from jobs import views

app_name = "jobs"
urlpatterns = [
    path("", views.run_list, name="run_list"),
    path("runs/new/", views.run_submit, name="run_submit"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/status/", views.run_status, name="run_status"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path("experiments/<int:experiment_id>/", views.experiment_detail, name="experiment_detail"),
]
