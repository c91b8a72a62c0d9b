"""Issue 31.2: the account page's token form makes one token per form, however often and
however concurrently it is sent."""

import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

from django.test import Client
from django.urls import reverse

from tenants.models import ApiToken, AuditEvent
from tests.conftest import make_user

SECRET = re.compile(r"gty_[A-Za-z0-9_-]{43}")


def _form_fields(html: str) -> dict[str, str]:
    form = html[html.index("data-token-create") :]
    return {
        name: re.search(rf'name="{name}" value="([^"]*)"', form)[1]
        for name in ("csrfmiddlewaretoken", "submission_key", "name", "expires_in_days")
    }


def test_eight_concurrent_posts_of_one_form_make_one_token(live_server, transactional_db):
    # Given alice's account page, open in a browser (her session and CSRF cookies)
    alice = make_user("alice")
    browser = Client()
    browser.force_login(alice)
    page = browser.get(reverse("account"))
    fields = _form_fields(page.content.decode()) | {"name": "laptop"}
    cookie = "; ".join(f"{key}={morsel.value}" for key, morsel in browser.cookies.items())
    url = live_server.url + reverse("api_token_create")

    def post(_) -> tuple[int, str]:
        request = urllib.request.Request(
            url,
            data=urllib.parse.urlencode(fields).encode(),
            headers={"Cookie": cookie, "Referer": live_server.url + reverse("account")},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    # When the form is sent eight times at once (a double click, a flaky connection's retry)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(post, range(8)))

    # Then one token exists; one answer shows its secret, the seven others name it
    token = ApiToken.objects.get()
    assert (token.user, token.name, str(token.submission_key)) == (
        alice,
        "laptop",
        fields["submission_key"],
    )
    assert [status for status, _ in answers] == [200] * 8
    secrets_shown = [set(SECRET.findall(body)) for _, body in answers]
    shown = [found for found in secrets_shown if found]
    assert len(shown) == 1 and len(shown[0]) == 1
    assert ApiToken.hash_secret(shown[0].pop()) == token.key_hash
    repeated = f"This form was already submitted: it made the token laptop (gty_{token.prefix}…)"
    assert sum(repeated in body for _, body in answers) == 7
    assert AuditEvent.objects.filter(action="token.create").count() == 1


def test_a_form_sent_again_later_names_its_token_and_makes_none(client, world):
    client.force_login(world.researcher_a)
    form = {"submission_key": str(uuid.uuid4()), "name": "laptop", "expires_in_days": "30"}

    first = client.post(reverse("api_token_create"), form)
    again = client.post(reverse("api_token_create"), form)

    assert (first.status_code, again.status_code) == (200, 200)
    assert len(SECRET.findall(first.content.decode())) >= 1
    assert not SECRET.search(again.content.decode())
    assert "This form was already submitted" in again.content.decode()
    assert ApiToken.objects.count() == 1
    # Another person's form with the same value is theirs: it makes their own token.
    client.force_login(world.researcher_b)
    assert SECRET.search(client.post(reverse("api_token_create"), form).content.decode())
    assert ApiToken.objects.filter(user=world.researcher_b).count() == 1


def test_a_form_without_its_one_time_value_makes_nothing(client, world):
    client.force_login(world.researcher_a)

    response = client.post(reverse("api_token_create"), {"name": "laptop"})

    assert response.status_code == 400
    assert "This form is out of date: open your account page again." in response.content.decode()
    assert not ApiToken.objects.exists()
