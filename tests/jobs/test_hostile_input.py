"""No 5xx on hostile input, and a refusal changes nothing: JSON nested past any sane depth on
every JSON endpoint, Authorization headers that are not text, and ids spelled with digits
that ``str.isdigit`` takes and ``int`` does not ("²"), or beyond a bigint."""

import json

import pytest
from django.core.cache import cache
from django.urls import reverse
from rest_framework.test import APIClient

from core.http import ascii_id
from core.parsers import MAX_JSON_DEPTH, json_depth
from jobs.models import AttemptRankRuntime, Checkpoint, Experiment, Run, RunEvent
from jobs.services.backend_submit import attempt_token_issue
from telemetry.models import AttemptAccounting, SdkEvent, StepWindow
from tenants.models import ApiToken
from tenants.services.tokens import api_token_create
from tests.conftest import experiment_input
from tests.jobs.test_lifecycle import run_to_running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_throttle(db):  # the throttle counts in the database cache when embedded
    cache.clear()
    yield
    cache.clear()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def bearer(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def counts() -> tuple[int, ...]:
    return (
        Run.objects.count(),
        Experiment.objects.count(),
        ApiToken.objects.count(),
        SdkEvent.objects.count(),
    )


def test_the_depth_of_json_is_measured_without_recursion():
    assert [json_depth(v) for v in (1, "x", [], {}, [[]], {"a": [1, {"b": 2}]})] == [
        0, 0, 1, 1, 2, 3,
    ]  # fmt: skip
    assert json_depth(json.loads(nested(900))) == 900


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 30_000])  # bodies under 64 KiB
def test_json_nested_too_deep_is_400_on_every_json_endpoint(world, depth):
    """Tokens, runs, specs, the attempt report and the SDK events: each a clear 400."""
    run = _submitted(world)
    run_to_running(world, run)
    attempt = run.attempts.get()
    job = APIClient()
    job.credentials(HTTP_AUTHORIZATION="Attempt " + attempt_token_issue(attempt=attempt))
    person = bearer(world.researcher_a)
    before = counts()
    body = nested(depth)
    for client, url in (
        (person, reverse("api:token-create")),
        (person, reverse("api:run-list")),
        (person, reverse("api:spec-submit")),
        (job, reverse("api:attempt-report")),
        (job, reverse("api:attempt-rank-report")),
        (job, reverse("api:attempt-events")),
    ):
        response = client.post(url, body, content_type="application/json")
        assert response.status_code == 400, (url, response.status_code)
        assert response.json() == {
            "detail": f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."
        }
    assert counts() == before


def test_json_as_deep_as_allowed_is_parsed(world):
    """At the limit the body reaches the serializer, which says what is wrong with it."""
    body = {"name": "x", "expires_in_days": nested(MAX_JSON_DEPTH - 1)}
    response = bearer(world.researcher_a).post(
        reverse("api:token-create"), json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 400
    assert "expires_in_days" in response.json()


def test_a_form_json_field_nested_too_deep_is_a_field_error(world, client):
    client.force_login(world.researcher_a)
    data = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "command": "python train.py",
        "flavor": "a100-80gb",
        "nodes": "1",
        "gpus_per_node": "2",
        "params": nested(5_000),
        "env": "{}",
        "priority": "50",
        "max_runtime_minutes": "60",
        "max_restarts": "0",
    }
    before = counts()
    response = client.post(reverse("jobs:run_submit"), data)
    assert response.status_code == 400
    assert response.context["form"].errors["params"] == [
        f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."
    ]
    assert counts() == before


@pytest.mark.parametrize(
    "header",
    [
        b"Bearer \xff\xfe",  # a token that is not text
        b"\xff\xfe gty_x",  # a scheme that is not text
        b"Attempt \xc3\x28",  # an attempt token that is not UTF-8
        b"\xc3\x28",
    ],
)
def test_an_authorization_header_that_is_not_text_is_401(world, header):
    client = APIClient()
    # WSGI hands headers over as latin-1 text: the bytes arrive as they were sent.
    response = client.get(reverse("api:run-list"), HTTP_AUTHORIZATION=header.decode("latin-1"))
    assert response.status_code in (401, 403)
    assert response.status_code == 401 or header == b"\xc3\x28"  # no scheme: anonymous, 403


@pytest.mark.parametrize("value", ["²", "١٢", "1²", "99999999999999999999", "0", "-1", " 1"])
def test_ids_that_are_not_plain_ascii_numbers_are_not_ids(value):
    assert ascii_id(value) is None


@pytest.mark.parametrize("value", ["²", "٣", "99999999999999999999", "0", "x"])
def test_a_bad_id_in_the_submit_form_from_is_404(world, client, value):
    client.force_login(world.researcher_a)
    response = client.get(reverse("jobs:run_submit"), {"from": value})
    assert response.status_code == 404


@pytest.mark.parametrize("value", ["²", "٣", "99999999999999999999"])
def test_a_bad_cloned_from_is_a_form_error_and_queues_nothing(world, client, value):
    client.force_login(world.researcher_a)
    data = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "command": "python train.py",
        "flavor": "a100-80gb",
        "nodes": "1",
        "gpus_per_node": "2",
        "params": "{}",
        "env": "{}",
        "priority": "50",
        "max_runtime_minutes": "60",
        "max_restarts": "0",
        "cloned_from": value,
    }
    before = counts()
    response = client.post(reverse("jobs:run_submit"), data)
    assert response.status_code == 400
    assert "cloned_from" in response.context["form"].errors
    assert counts() == before


@pytest.mark.parametrize("value", ["²", "99999999999999999999"])
def test_bad_ids_elsewhere_are_404_or_ignored_never_500(world, client, value):
    client.force_login(world.researcher_a)
    assert client.get(reverse("jobs:experiment_diff"), {"a": value, "b": "1"}).status_code == 404
    # A run-list cursor that is no id shows the newest runs, as a stale link should.
    assert client.get(reverse("jobs:run_list"), {"before": value}).status_code == 200


def _submitted(world) -> Run:
    from jobs.services.submission import run_submit

    return run_submit(user=world.researcher_a, data=experiment_input(world))


SDK_ENDPOINTS = [
    ("api:attempt-report", 64),
    ("api:attempt-rank-report", 64),
    ("api:attempt-events", 256),
]


def _job_state(attempt) -> tuple:
    attempt.refresh_from_db()
    return (
        counts(),
        attempt.runtime_env,
        attempt.runtime_reported_at,
        Checkpoint.objects.count(),
        RunEvent.objects.count(),
        StepWindow.objects.count(),
        AttemptAccounting.objects.count(),
        AttemptRankRuntime.objects.count(),
    )


@pytest.fixture
def job_client(world):
    run = _submitted(world)
    run_to_running(world, run)
    attempt = run.attempts.get()
    job = APIClient()
    job.credentials(HTTP_AUTHORIZATION="Attempt " + attempt_token_issue(attempt=attempt))
    return job, attempt


@pytest.mark.parametrize(("endpoint", "limit_kib"), SDK_ENDPOINTS)
def test_a_10_mb_body_on_an_sdk_endpoint_is_413_and_changes_nothing(
    job_client, endpoint, limit_kib
):
    job, attempt = job_client
    before = _job_state(attempt)
    report = json.dumps({"source": "s", "events": [], "hostname": "x" * 10_000_000})

    response = job.post(reverse(endpoint), report, content_type="application/json")

    assert response.status_code == 413
    assert response.json() == {"detail": f"The body is larger than {limit_kib} KiB."}
    assert _job_state(attempt) == before


@pytest.mark.parametrize(("endpoint", "limit_kib"), SDK_ENDPOINTS)
def test_a_body_one_byte_over_the_limit_is_413_and_one_at_it_is_parsed(
    job_client, endpoint, limit_kib
):
    job, attempt = job_client
    before = _job_state(attempt)
    head, tail = b'{"hostname": "', b'"}'

    def body(size: int) -> bytes:
        return head + b"x" * (size - len(head) - len(tail)) + tail

    over = job.post(reverse(endpoint), body(limit_kib * 1024 + 1), content_type="application/json")
    at = job.post(reverse(endpoint), body(limit_kib * 1024), content_type="application/json")

    assert (over.status_code, over.json()) == (
        413,
        {"detail": f"The body is larger than {limit_kib} KiB."},
    )
    assert at.status_code == 400  # read and parsed: the fields are what is wrong with it
    assert "detail" not in at.json()
    assert _job_state(attempt) == before


@pytest.mark.parametrize(("endpoint", "limit_kib"), SDK_ENDPOINTS)
@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            b'{"hostname": "caf\xe9"}',
            "The body is not utf-8 text: byte 17 (0xe9) is invalid continuation byte.",
        ),
        (b"\xff\xfe{}", "The body is not utf-8 text: byte 0 (0xff) is invalid start byte."),
        (
            b'{"source": "s", "events": [{"type": "ready", "seq": 1, "ts": 1e9}]}\xc3',
            "The body is not utf-8 text: byte 67 (0xc3) is unexpected end of data.",
        ),
    ],
    ids=["latin-1", "utf-16-bom", "cut-sequence"],
)
def test_a_body_that_is_not_utf8_is_400_with_the_bad_byte_and_changes_nothing(
    job_client, endpoint, limit_kib, body, detail
):
    job, attempt = job_client
    before = _job_state(attempt)

    response = job.post(reverse(endpoint), body, content_type="application/json")

    assert response.status_code == 400
    assert response.json() == {"detail": detail}
    assert _job_state(attempt) == before
