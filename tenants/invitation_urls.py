from django.urls import path

from tenants import invitation_views

app_name = "invitations"
urlpatterns = [
    path("", invitation_views.invitation_list, name="list"),
    path("<int:invitation_id>/accept/", invitation_views.invitation_accept_own, name="accept"),
    path("<int:invitation_id>/decline/", invitation_views.invitation_decline_own, name="decline"),
]
