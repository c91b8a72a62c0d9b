"""Issue 21.4: the token endpoint's throttle and the login lockout hold across processes.

The tests that prove it start gunicorn with several worker processes, as production runs it,
on each shared cache Gantry supports, and send concurrent requests."""

import http.cookiejar
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django.test import RequestFactory

from tenants.authentication import Lockout, _login_lock_key, login_attempt_end, refused_by_lockout
from tenants.models import LoginFailure
from tenants.throttling import Limit, claim
from tests import REPOSITORY
from tests.celery_support import free_port, wait_for

WORKERS = 3
# Threads a worker: 12 requests served at once, more than the lockout's 5 failures, so
# attempts in flight could lock a name if they were counted (issue 31.2).
THREADS = 4
PASSWORD = "a-long-enough-test-password-7"


# --- the slots, in this process ------------------------------------------------------------


def test_a_limit_allows_n_requests_in_any_window_and_says_when_a_slot_frees(db):
    limit = Limit(requests=3, window_s=60)
    ident = f"client:{uuid.uuid4()}"
    assert [claim(scope="t", ident=ident, limit=limit, now=1000.0 + i) for i in range(3)] == [
        None,
        None,
        None,
    ]
    # The fourth, 10 s after the first: the first slot frees at 1060.
    assert claim(scope="t", ident=ident, limit=limit, now=1010.0) == 50.0
    # Another client has slots of its own.
    assert claim(scope="t", ident=f"other:{uuid.uuid4()}", limit=limit, now=1010.0) is None


def test_a_slot_frees_when_its_window_has_passed(db):
    limit = Limit(requests=1, window_s=1)
    ident = f"client:{uuid.uuid4()}"
    assert claim(scope="t", ident=ident, limit=limit) is None
    assert claim(scope="t", ident=ident, limit=limit) == 1.0
    time.sleep(2.1)  # the cache keeps whole seconds
    assert claim(scope="t", ident=ident, limit=limit) is None


# --- several gunicorn workers --------------------------------------------------------------


def _env(data_dir: Path, cache_url: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE", "GANTRY_CACHE_URL"}
    }
    return env | {
        "GANTRY_EMBEDDED": "1",
        "GANTRY_DATA_DIR": str(data_dir),
        "GANTRY_CACHE_URL": cache_url,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }


def _post(url: str, body: dict) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _redis_cache_url() -> str:
    """This test process's own Redis database (tests/settings.py gives each xdist worker
    one), as a cache: keys are prefixed and per-run usernames keep runs apart."""
    broker = os.environ["CELERY_BROKER_URL"]
    assert re.fullmatch(r"redis://[^/]+/\d+", broker), broker
    return broker


@pytest.fixture(scope="module", params=["db://", "redis"], ids=["database-cache", "redis-cache"])
def portal(request, tmp_path_factory):
    """gunicorn with WORKERS worker processes of THREADS threads on the embedded SQLite
    database, with the
    cache under test; yields (base URL, access log path, usernames)."""
    cache_url = request.param if request.param == "db://" else _redis_cache_url()
    tmp_path = tmp_path_factory.mktemp("portal")
    env = _env(tmp_path / "data", cache_url)
    run = uuid.uuid4().hex[:8]
    users = {"ok": f"throttled-{run}", "guesser": f"guessed-{run}", "crowd": f"crowd-{run}"}
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPOSITORY, env=env,
                   check=True, timeout=300)  # fmt: skip
    create = "; ".join(
        f"User.objects.create_user({name!r}, password={PASSWORD!r})" for name in users.values()
    )
    subprocess.run(
        [*manage, "shell", "-c", f"from django.contrib.auth.models import User; {create}"],
        cwd=REPOSITORY, env=env, check=True, timeout=120,
    )  # fmt: skip
    port = free_port()
    access_log = tmp_path / "access.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "portal.wsgi:application",
         "--bind", f"127.0.0.1:{port}", "--workers", str(WORKERS), "--threads", str(THREADS),
         "--access-logfile", str(access_log), "--access-logformat", "%(p)s %(U)s %(s)s"],
        cwd=REPOSITORY, env=env, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(f"{base}/healthz"), timeout=60, what="gunicorn")
        yield base, access_log, users
    finally:
        server.terminate()
        server.wait(timeout=30)


def _burst(url: str, bodies: list[dict]) -> list[int]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda body: _post(url, body), bodies))


def _workers_that_served(access_log: Path, path: str) -> set[str]:
    return {
        line.split()[0] for line in access_log.read_text().splitlines() if line.split()[1] == path
    }


def test_the_token_limit_holds_across_gunicorn_workers(portal):
    base, access_log, users = portal
    body = {"username": users["ok"], "password": PASSWORD}

    statuses = _burst(f"{base}/api/v1/tokens/", [body] * 15)

    # 10 a minute per client and username, however the requests were spread.
    assert sorted(statuses) == [201] * 10 + [429] * 5
    # On a loaded machine one worker may have taken the whole burst: more requests of the
    # same minute until another worker answered too; it refuses them as well, since the
    # count is shared.
    more: list[int] = []
    for _ in range(30):
        sent = 15 + len(more)
        wait_for(
            lambda sent=sent: len(access_log.read_text().splitlines()) >= sent,
            timeout=10,
            what="log",
        )
        if len(_workers_that_served(access_log, "/api/v1/tokens/")) > 1:
            break
        more += _burst(f"{base}/api/v1/tokens/", [body] * 4)
    assert set(more) <= {429}
    assert len(_workers_that_served(access_log, "/api/v1/tokens/")) > 1


def test_the_login_lockout_holds_for_concurrent_guesses(portal):
    base, _, users = portal
    guess = {"username": users["guesser"], "password": "wrong-guess"}

    statuses = _burst(f"{base}/api/v1/tokens/", [guess] * 9)

    # Five failures lock the username: concurrent guesses cannot all slip in before the
    # first failures are counted.
    assert sorted(statuses) == [400] * 5 + [429] * 4
    # Locked out even with the right password.
    right = {"username": users["guesser"], "password": PASSWORD}
    assert _post(f"{base}/api/v1/tokens/", right) == 429


def _log_in_on_the_page(base: str, username: str, password: str) -> int:
    """The login page as a browser uses it (its CSRF cookie and field), not following the
    redirect of a success: the status of the POST."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), _NoRedirect
    )
    with opener.open(f"{base}/accounts/login/", timeout=30) as page:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.read().decode())
    assert token is not None
    body = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token[1], "username": username, "password": password}
    ).encode()
    request = urllib.request.Request(f"{base}/accounts/login/", data=body, method="POST")
    try:
        with opener.open(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_concurrent_logins_with_the_right_password_all_succeed_across_workers(portal):
    base, _, users = portal
    body = {"username": users["crowd"], "password": PASSWORD}

    with ThreadPoolExecutor(max_workers=8) as pool:
        pages = list(pool.map(lambda _: _log_in_on_the_page(base, *body.values()), range(8)))
    tokens = _burst(f"{base}/api/v1/tokens/", [body] * 8)

    # Only failures count towards the lockout: eight logins at once are eight logins.
    assert pages == [302] * 8
    assert tokens == [201] * 8


# --- the lockout's lock on PostgreSQL, with threads ------------------------------------------


def _in_threads(count: int, target) -> list:
    """``target`` in ``count`` threads at once, each on a database connection of its own."""

    def work(_):
        try:
            return target()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(work, range(count)))


def _hold_login_lock(username: str, held: threading.Event, release: threading.Event) -> None:
    """What an attempt in flight on ``username`` holds: its lock, until ``release``."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_login_lock_key(username)])
            held.set()
            release.wait(timeout=30)
    finally:
        connections.close_all()


def _waiting_for_login_lock(username: str) -> bool:
    """Whether an attempt waits for ``username``'s lock now (PostgreSQL's lock table shows
    a bigint advisory key as its high and low 32 bits)."""
    key = _login_lock_key(username)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid = %s AND objid = %s",
            [key >> 32, key & 0xFFFFFFFF],
        )
        return cursor.fetchone()[0] > 0


pg_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the lock is PostgreSQL's advisory lock"
)


def _log_in(username: str, password: str, address: str):
    """One password login through every authentication backend, as the views make it: the
    user, "locked" when the lockout refused it, or None for a wrong password."""
    request = RequestFactory().post("/accounts/login/", REMOTE_ADDR=address)
    user = authenticate(request, username=username, password=password)
    return "locked" if refused_by_lockout(request) is not None else user


@pg_only
def test_concurrent_logins_with_the_right_password_all_succeed(transactional_db, settings):
    # Given an account, its password hashed as in production: checking it takes long enough
    # for the attempts to overlap
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    user = User.objects.create_user("crowd", password=PASSWORD)

    # When eight people log in with the right password at once, while four guess wrong
    # (one short of the lockout, however they interleave)
    def attempt(i: int):
        password = PASSWORD if i < 8 else "wrong-again"
        try:
            return _log_in("crowd", password, f"192.0.2.{10 + i}")
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=12) as pool:
        outcomes = list(pool.map(attempt, range(12)))

    # Then every right password gets in, and no attempt in flight counted against them:
    # the wrong ones are wrong passwords, not a lockout.
    assert outcomes[:8] == [user] * 8
    assert outcomes[8:] == [None] * 4
    assert LoginFailure.objects.filter(username="crowd").count() <= 4


@pg_only
def test_concurrent_wrong_passwords_count_exactly(transactional_db):
    User.objects.create_user("guessed", password=PASSWORD)

    outcomes = _in_threads(9, lambda: _log_in("guessed", "wrong-guess", "192.0.2.7"))

    # Five failures counted before the limit, four refused: none slipped in unseen.
    assert outcomes.count(None) == 5
    assert outcomes.count("locked") == 4
    assert LoginFailure.objects.filter(username="guessed").count() == 5
    # The name is locked, even for the right password.
    assert _log_in("guessed", PASSWORD, "192.0.2.9") == "locked"


@pg_only
def test_concurrent_attempts_on_one_username_are_decided_exactly(transactional_db):
    username = f"guessed-{uuid.uuid4().hex[:8]}"

    outcomes = _in_threads(
        9,
        lambda: login_attempt_end(username=username, ip_address="192.0.2.7", succeeded=False),
    )

    assert sum(outcome is None for outcome in outcomes) == 5
    assert sum(isinstance(outcome, Lockout) for outcome in outcomes) == 4
    assert LoginFailure.objects.filter(username=username).count() == 5


@pg_only
def test_an_attempt_being_decided_holds_up_its_username_only(transactional_db):
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_login_lock, args=("Alice", held, release))
    holder.start()
    try:
        assert held.wait(timeout=30)
        with ThreadPoolExecutor(max_workers=2) as pool:

            def end(username: str):
                try:
                    return login_attempt_end(
                        username=username, ip_address="192.0.2.8", succeeded=False
                    )
                finally:
                    connections.close_all()

            same = pool.submit(end, " alice ")  # the same username, as the form may send it
            # Another username goes through while alice's attempt is being decided…
            assert pool.submit(end, "bob").result(timeout=30) is None
            assert LoginFailure.objects.filter(username="bob").count() == 1
            # …alice's next attempt waits for it.
            wait_for(lambda: _waiting_for_login_lock("alice"), timeout=30, what="the wait")
            assert not same.done()
            assert LoginFailure.objects.filter(username="alice").count() == 0
            release.set()
            assert same.result(timeout=30) is None
        assert LoginFailure.objects.filter(username="alice").count() == 1
    finally:
        release.set()
        holder.join(timeout=30)
