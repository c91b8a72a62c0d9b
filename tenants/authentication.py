from django.utils import timezone
from rest_framework import authentication, exceptions

from tenants.models import ApiToken


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gty_…`` (``Token`` is accepted too). Only hashes are stored."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower().decode() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        try:
            secret = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Malformed token.") from None
        now = timezone.now()
        token = (
            ApiToken.objects.select_related("user")
            .filter(key_hash=ApiToken.hash_secret(secret), revoked_at__isnull=True)
            .first()
        )
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("Token expired.")
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'
