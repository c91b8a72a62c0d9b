from django.urls import path

from tenants import notification_views

app_name = "notifications"
urlpatterns = [
    path("", notification_views.notification_list, name="list"),
    path("read/", notification_views.notification_read_all, name="read_all"),
]
