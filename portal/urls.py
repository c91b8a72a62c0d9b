from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from portal import accounts, metrics, views
from portal.openapi import DocsView, SchemaView
from portal.security import csp_update
from tenants.oidc import OidcCallbackView, OidcLoginView

urlpatterns = [
    path("", views.home, name="home"),
    path("members/", views.members, name="members"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    path("accounts/login/", accounts.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/", accounts.account, name="account"),
    path("accounts/password/", accounts.PasswordChangeView.as_view(), name="password_change"),
    path("accounts/tokens/new/", accounts.api_token_create_own, name="api_token_create"),
    path(
        "accounts/tokens/<int:token_id>/revoke/",
        accounts.api_token_revoke_own,
        name="api_token_revoke",
    ),
    # OpenID Connect single sign-on (tenants/oidc.py); 404 unless GANTRY_OIDC_ISSUER is set.
    path("oidc/authenticate/", OidcLoginView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", OidcCallbackView.as_view(), name="oidc_authentication_callback"),
    path("admin/", admin.site.urls),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file of its own, so the page
    # needs no inline script; Swagger UI draws its icons from data: URLs.
    path(
        "api/docs/",
        csp_update(img_src=["data:"])(DocsView.as_view(url_name="api-schema")),
        name="api-docs",
    ),
    path("api/v1/", include("portal.api_urls")),
    path("notifications/", include("tenants.notification_urls")),
    path("accounts/invitations/", include("tenants.invitation_urls")),
    path("images/", include("images.urls")),
    path("finance/", include("finance.urls")),
    path("what-if/", include("policy.urls")),
    path("", include("telemetry.urls")),
    path("", include("tenants.urls")),
    path("", include("jobs.urls")),
]
