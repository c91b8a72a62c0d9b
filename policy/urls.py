from django.urls import path

from policy import views

app_name = "policy"
urlpatterns = [
    path("", views.report_list, name="report_list"),
    path("new/", views.report_new, name="report_new"),
    path("<int:report_id>/", views.report_detail, name="report_detail"),
    path("<int:report_id>/cancel/", views.report_cancel, name="report_cancel"),
    path("<int:report_id>/rerun/", views.report_rerun, name="report_rerun"),
    path("<int:report_id>/share/", views.report_share, name="report_share"),
    path("<int:report_id>/apply/", views.report_apply, name="report_apply"),
]
