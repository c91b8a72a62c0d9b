"""How people prove who they are: API tokens, and password logins with a lockout.

Password logins (the login page, Django admin's, the token endpoint of the API) all go through
``ThrottledModelBackend``: after ``GANTRY_LOGIN_FAILURE_LIMIT`` failures for one username, or
``GANTRY_LOGIN_FAILURE_LIMIT_PER_IP`` from one client address, within
``GANTRY_LOGIN_LOCKOUT_S`` seconds, further attempts are refused (even with the right
password) until the oldest of those failures leaves the window. Only failures count: the
password is checked first, then the attempt is decided and, if wrong, counted in one atomic
step (``login_attempt_end``), so concurrent wrong attempts cannot all slip under the limit
and concurrent right ones are never refused by attempts still in flight. The failures are
rows in the database, so every web worker counts the same ones. A successful login clears
the failures of its username; the address's count only expires, so a person with an account
of their own cannot reset the count of the address they guess from.
"""

import ipaddress
import math
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework import authentication, exceptions

from tenants.models import ApiToken, LoginFailure, max_length_of

# "Last used" is kept to the minute: a script calling the API many times a second would
# otherwise write the token's row on every request.
TOKEN_LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer gty_…`` (``Token`` is accepted too). Only hashes are stored."""

    keywords = (b"bearer", b"token")

    def authenticate(self, request):
        # Compared as bytes: a scheme that is not UTF-8 is simply not ours (no decode error).
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() not in self.keywords:
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
        if token.outlived_password:
            raise exceptions.AuthenticationFailed(
                "Token revoked: the account's password changed since it was made. "
                "Create a new one (your account page, POST /api/v1/tokens/ or gantry login)."
            )
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("Token expired.")
        if token.last_used_at is None or now - token.last_used_at >= TOKEN_LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


@dataclass(frozen=True)
class Lockout:
    """Why password logins are refused right now, and for how long."""

    retry_after_s: int
    by_address: bool  # False: too many failures for the username

    @property
    def message(self) -> str:
        minutes = max(1, math.ceil(self.retry_after_s / 60))
        whom = "from your network address" if self.by_address else "for this username"
        return (
            f"Too many failed logins {whom}. Logins are refused for {minutes} more "
            f"minute{'s' if minutes != 1 else ''}, even with the right password."
        )


def client_ip(request) -> str | None:
    """The address of the client, seen through ``GANTRY_NUM_PROXIES`` trusted proxies.

    Behind N proxies the client is the N-th address from the right of X-Forwarded-For (each
    proxy appends the address it received the request from); anything further left was
    written by the client and is not trusted. None when the value is not an IP address.
    """
    meta = request.META
    address = meta.get("REMOTE_ADDR", "")
    proxies = settings.GANTRY_NUM_PROXIES
    forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
    if proxies > 0 and forwarded:
        hops = [hop.strip() for hop in forwarded.split(",")]
        address = hops[-min(proxies, len(hops))]
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def _normalized(username: str) -> str:
    return username.strip().lower()[: max_length_of(LoginFailure, "username")]


def _window_start(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.GANTRY_LOGIN_LOCKOUT_S)


def _retry_after(failures: Q, *, limit: int, now: datetime) -> int | None:
    """Seconds until fewer than ``limit`` of the matching failures are inside the window."""
    times = list(
        LoginFailure.objects.filter(failures, at__gt=_window_start(now))
        .order_by("-at")
        .values_list("at", flat=True)[:limit]
    )
    if len(times) < limit:
        return None
    return max(1, math.ceil((times[-1] - _window_start(now)).total_seconds()))


def login_lockout(*, username: str, ip_address: str | None, now: datetime | None = None):
    """The Lockout in force for a login as ``username`` from ``ip_address``, or None."""
    now = now or timezone.now()
    retry_after = _retry_after(
        Q(username=_normalized(username)), limit=settings.GANTRY_LOGIN_FAILURE_LIMIT, now=now
    )
    if retry_after is not None:
        return Lockout(retry_after_s=retry_after, by_address=False)
    if ip_address is not None:
        retry_after = _retry_after(
            Q(ip_address=ip_address), limit=settings.GANTRY_LOGIN_FAILURE_LIMIT_PER_IP, now=now
        )
        if retry_after is not None:
            return Lockout(retry_after_s=retry_after, by_address=True)
    return None


# High 32 bits of the PostgreSQL advisory lock that makes a login's check-and-count one
# step: the logins' own namespace; the low 32 bits name the username.
_LOGIN_LOCK_NAMESPACE = 0x676C6F67  # "glog"


def _login_lock_key(username: str) -> int:
    return (_LOGIN_LOCK_NAMESPACE << 32) | zlib.crc32(_normalized(username).encode())


def login_attempt_end(
    *, username: str, ip_address: str | None, succeeded: bool, now: datetime | None = None
) -> Lockout | None:
    """Decide a login whose password has been checked, as one atomic step: the Lockout in
    force (nothing counted: the login is refused whatever its password), or None with the
    attempt settled: a wrong password counted as a failure, a right one clearing the
    username's failures.

    Deciding after the password check is what makes only failures count: an attempt still
    in flight has proved nothing, so it cannot refuse another (eight people logging in as
    one service account at once all get in). Deciding and counting in one step is what
    makes the limit hold for concurrent wrong attempts on any number of workers: each one
    is decided after the failures counted before it, so past the limit the answer is the
    lockout, never the result of the password check.

    Attempts on one username take turns here (PostgreSQL: an advisory lock on the username;
    SQLite: its IMMEDIATE transactions), so its limit holds exactly; the password check
    stays outside the lock, so they do not queue behind each other's hashing. Attempts on
    different usernames do not wait for each other: a lock shared by every login made them
    queue one behind the other whenever many people logged in at once. The per-address
    limit is therefore checked without waiting for attempts on other usernames: concurrent
    guesses from one address can pass it by at most the number of requests the portal
    serves at once."""
    now = now or timezone.now()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_login_lock_key(username)])
        lockout = login_lockout(username=username, ip_address=ip_address, now=now)
        if lockout is not None:
            return lockout
        if succeeded:
            login_failures_clear(username=username)
        else:
            login_failure_record(username=username, ip_address=ip_address, now=now)
    return None


def login_failure_record(
    *, username: str, ip_address: str | None, now: datetime | None = None
) -> None:
    """Count one failed login; failures that left the window are dropped on the way (those
    another login is dropping meanwhile are left to it: two logins deleting the same rows in
    different orders would deadlock)."""
    now = now or timezone.now()
    expired = LoginFailure.objects.filter(at__lte=_window_start(now)).select_for_update(
        skip_locked=True
    )
    LoginFailure.objects.filter(pk__in=expired.values("pk")).delete()
    LoginFailure.objects.create(username=_normalized(username), ip_address=ip_address, at=now)


def login_failures_clear(*, username: str) -> None:
    LoginFailure.objects.filter(username=_normalized(username)).delete()


def refused_by_lockout(request) -> Lockout | None:
    """The Lockout that refused this request's login inside ``authenticate``, if one did."""
    return getattr(request, "gantry_login_lockout", None)


class ThrottledModelBackend(ModelBackend):
    """Django's username and password check, refused while a Lockout is in force.

    Raising PermissionDenied makes ``django.contrib.auth.authenticate`` stop at once (no
    other backend is asked) and return None, so every caller refuses the login.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(User.USERNAME_FIELD)
        if username is None or password is None:
            return None  # not a password login (e.g. OpenID Connect's callback)
        ip_address = client_ip(request) if request is not None else None
        # A lockout already in force refuses without the cost of hashing the password.
        lockout = login_lockout(username=username, ip_address=ip_address)
        if lockout is None:
            user = super().authenticate(request, username=username, password=password, **kwargs)
            lockout = login_attempt_end(
                username=username, ip_address=ip_address, succeeded=user is not None
            )
        if lockout is not None:
            # The view learns here that it is a lockout, not a wrong password
            # (``refused_by_lockout``), also when the lockout began while this request was
            # on its way (concurrent guesses).
            if request is not None:
                request.gantry_login_lockout = lockout
            raise PermissionDenied("login locked out")
        return user
