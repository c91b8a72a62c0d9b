"""The person's own account: logging in (with the lockout), password, API tokens."""

import uuid

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse_lazy
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from core.http import or_404
from core.types import signed_in
from tenants.authentication import Lockout, refused_by_lockout
from tenants.credentials import api_token_issue_once
from tenants.forms import ApiTokenForm
from tenants.models import ApiToken
from tenants.oidc import oidc_enabled
from tenants.selectors import api_token_get_own, api_token_list_own
from tenants.services.tokens import (
    API_TOKEN_DEFAULT_DAYS,
    CredentialsRevokedBecause,
    api_token_revoke,
    user_credentials_revoke,
)


class LockoutAwareAuthenticationForm(AuthenticationForm):
    """Says plainly that logins are locked out rather than "wrong password"."""

    lockout: Lockout | None = None

    def clean(self):
        try:
            return super().clean()
        except ValidationError:
            # The lockout is checked where the attempt is counted, in one step
            # (``ThrottledModelBackend``): refused there, say so, not "wrong password".
            self.lockout = refused_by_lockout(self.request)
            if self.lockout is not None:
                raise ValidationError(self.lockout.message, code="locked") from None
            raise


class LoginView(auth_views.LoginView):
    """Django's login page; 429 with Retry-After while logins are locked out."""

    form_class = LockoutAwareAuthenticationForm

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["oidc_enabled"] = oidc_enabled()
        context["oidc_provider_name"] = settings.GANTRY_OIDC_PROVIDER_NAME
        return context

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.lockout is not None:
            response.status_code = 429
            response["Retry-After"] = str(form.lockout.retry_after_s)
        return response


class PasswordChangeView(auth_views.PasswordChangeView):
    """Changing the password logs out every other session of the user (Django compares each
    session's hash of the password); this one is kept by ``update_session_auth_hash``. The
    user's API tokens are revoked."""

    success_url = reverse_lazy("account")

    def form_valid(self, form):
        response = super().form_valid(form)  # saves the password, keeps this session
        tokens, _ = user_credentials_revoke(
            user=form.user,
            actor=form.user,
            because=CredentialsRevokedBecause.PASSWORD_CHANGED,
            keep_session_key=self.request.session.session_key,
        )
        revoked = f" and {tokens} API token{'s' if tokens != 1 else ''} revoked" if tokens else ""
        messages.success(
            self.request, f"Password changed. Your other sessions have been logged out{revoked}."
        )
        return response


@login_required
@require_GET
def account(request: HttpRequest) -> HttpResponse:
    return _account_page(request, form=_new_token_form())


def _new_token_form() -> ApiTokenForm:
    return ApiTokenForm(
        initial={
            "submission_key": uuid.uuid4(),
            "name": "api",
            "expires_in_days": API_TOKEN_DEFAULT_DAYS,
        }
    )


def _account_page(
    request: HttpRequest,
    *,
    form: ApiTokenForm,
    created: tuple[ApiToken, str] | None = None,
) -> HttpResponse:
    """The account page; 400 while the token form has errors. ``created`` is a token just
    made and its secret, shown in this one answer only."""
    return render(
        request,
        "registration/account.html",
        {
            "tokens": api_token_list_own(user=request.user),
            "has_password": signed_in(request.user).has_usable_password(),
            "oidc_provider_name": settings.GANTRY_OIDC_PROVIDER_NAME,
            "now": timezone.now(),
            "form": form,
            "created": created,
        },
        status=400 if form.errors else 200,
    )


@never_cache
@login_required
@require_POST
def api_token_create_own(request: HttpRequest) -> HttpResponse:
    """Create a token and show its secret in this answer, the only place it ever appears: it
    is not redirected to (a redirect would have to keep the secret in the session until the
    next page), and the answer is marked no-store so no cache keeps it either. The form
    makes one token however often it is sent (a double click, a reload, concurrent posts):
    the other answers name the token it made."""
    form = ApiTokenForm(request.POST)
    if form.is_valid():
        days = form.cleaned_data["expires_in_days"]
        try:
            token, secret = api_token_issue_once(
                user=request.user,
                name=form.cleaned_data["name"],
                submission_key=form.cleaned_data["submission_key"],
                expires_in_days=API_TOKEN_DEFAULT_DAYS if days is None else days,
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            if secret is None:
                messages.info(
                    request,
                    f"This form was already submitted: it made the token {token.name} "
                    f"(gty_{token.prefix}…), listed below. Its secret was shown once, in the "
                    "answer to the first submission; revoke it and create another if you "
                    "did not keep it.",
                )
                return _account_page(request, form=_new_token_form())
            return _account_page(request, form=_new_token_form(), created=(token, secret))
    return _account_page(request, form=form)


@login_required
@require_POST
def api_token_revoke_own(request: HttpRequest, token_id: int) -> HttpResponse:
    token = or_404(api_token_get_own, user=request.user, token_id=token_id)
    api_token_revoke(token=token)
    messages.success(request, f"Revoked the token {token.name} ({token.prefix}…).")
    return redirect("account")
