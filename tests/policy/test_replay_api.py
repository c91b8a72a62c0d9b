"""What-if reports over the REST API: the same checks, permissions and rows as the pages."""

import json
from datetime import timedelta

import pytest
import time_machine
from django.test import Client
from django.urls import reverse

from policy.models import ReplayReport
from policy.services.replaying import replay_report_run
from tenants.models import AuditEvent
from tenants.services.tokens import api_token_create
from tests.policy.support import NOW, T0, WINDOW, record_history, submit

pytestmark = pytest.mark.django_db

SWAP = {
    "quotas": [
        {"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24},
        {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8},
    ]
}
REQUEST = {
    "window_start": T0.isoformat(),
    "window_end": (T0 + WINDOW).isoformat(),
    "proposal": SWAP,
    "share": True,
}


def api(user) -> Client:
    client = Client()
    if user is not None:
        _, secret = api_token_create(user=user)
        client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
    return client


def post(client: Client, url: str, body=None):
    return client.post(url, json.dumps(body or {}), content_type="application/json")


@pytest.fixture
def queued_runs(world):
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        submit(world, "vision", work_s=300)
        submit(world, "nlp", work_s=300)


def test_a_platform_admin_asks_for_a_report_and_reads_it_done(world):
    record_history(world)
    client = api(world.platform_admin)
    with time_machine.travel(NOW, tick=False):
        created = post(client, reverse("api:replay-list"), REQUEST)
    assert created.status_code == 201
    body = created.json()
    assert (body["status"], body["progress"], body["requested_by"], body["submissions"]) == (
        "queued",
        0.0,
        "paul",
        6,
    )
    assert (body["tenants"], body["shared"], body["result"]) == (["nlp", "vision"], True, None)

    with time_machine.travel(NOW, tick=False):
        replay_report_run(report_id=body["id"])
    done = client.get(reverse("api:replay-detail", args=[body["id"]])).json()
    assert done["status"] == "done"
    nlp, vision = done["result"]["tenants"]
    assert (nlp["tenant"], nlp["actual"]["queue_p95_s"], nlp["proposed"]["queue_p95_s"]) == (
        "nlp",
        720.0,
        1200.0,
    )
    assert (vision["actual"]["queue_p95_s"], vision["proposed"]["queue_p95_s"]) == (420.0, 0.0)
    assert round(done["result"]["platform"]["proposed"]["utilisation"], 2) == 34.17
    assert done["result"]["lines"][:2] == [
        "Wins (shorter p95 queue time): vision.",
        "Loses (longer p95 queue time): nlp.",
    ]
    assert done["result"]["fidelity"]["within"] is True

    # The admin of vision reads vision's row and the platform totals; nothing of nlp.
    tara = api(world.tenant_admin_a).get(reverse("api:replay-detail", args=[body["id"]]))
    assert "nlp" not in tara.content.decode()
    assert [t["tenant"] for t in tara.json()["result"]["tenants"]] == ["vision"]
    assert [q["tenant"] for q in tara.json()["proposal"]["quotas"]] == ["vision"]


def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(world, queued_runs):
    client = api(world.platform_admin)
    events = AuditEvent.objects.count()
    negative = {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": -1}]}
    overcommit = {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24}]}
    with time_machine.travel(NOW, tick=False):
        answers = [
            post(client, reverse("api:replay-list"), REQUEST | {"proposal": negative}),
            post(client, reverse("api:replay-list"), REQUEST | {"proposal": overcommit}),
            post(client, reverse("api:replay-list"), REQUEST | {"window_end": "yesterday"}),
        ]
    assert [a.status_code for a in answers] == [400, 400, 400]
    assert answers[0].json() == {
        "proposal": ["vision a100-80gb: the guarantee cannot be -1 GPUs (0 at least)."]
    }
    assert answers[1].json()["confirm_warnings"][-1] == "Nothing was replayed: confirm to go on."
    assert list(answers[2].json()) == ["window_end"]
    assert ReplayReport.objects.count() == 0
    assert AuditEvent.objects.count() == events


def test_who_may_use_the_replays_api(world, queued_runs):
    with time_machine.travel(NOW, tick=False):
        created = post(api(world.platform_admin), reverse("api:replay-list"), REQUEST).json()
    users = {
        "anonymous": None,
        "alice": world.researcher_a,
        "bob": world.researcher_b,
        "tara": world.tenant_admin_a,
        "fiona": world.finance,
    }
    detail = reverse("api:replay-detail", args=[created["id"]])
    cancel = reverse("api:replay-cancel", args=[created["id"]])
    answers = {
        name: (
            api(user).get(reverse("api:replay-list")).status_code,
            post(api(user), reverse("api:replay-list"), REQUEST).status_code,
            api(user).get(detail).status_code,
            post(api(user), cancel).status_code,
        )
        for name, user in users.items()
    }
    assert answers == {
        "anonymous": (401, 401, 401, 401),
        "alice": (200, 404, 404, 404),
        "bob": (200, 404, 404, 404),
        "tara": (200, 404, 200, 403),
        "fiona": (200, 404, 200, 403),
    }
    assert ReplayReport.objects.get().status == "queued"
    listed = api(world.researcher_a).get(reverse("api:replay-list")).json()
    assert (listed["count"], listed["results"]) == (0, [])


def test_cancelling_over_the_api(world, queued_runs):
    client = api(world.platform_admin)
    with time_machine.travel(NOW, tick=False):
        created = post(client, reverse("api:replay-list"), REQUEST)
    cancel = reverse("api:replay-cancel", args=[created.json()["id"]])
    first = post(client, cancel)
    assert (first.status_code, first.json()["status"]) == (202, "cancelled")
    again = post(client, cancel)
    assert again.status_code == 409
    assert again.json() == {
        "detail": f"Report {created.json()['id']} is cancelled: there is nothing to cancel."
    }


def test_the_schema_describes_the_replays_api(world):
    schema = Client().get(reverse("api-schema"), {"format": "json"}).json()
    assert {"/api/v1/replays/", "/api/v1/replays/{id}/", "/api/v1/replays/{id}/cancel/"} <= set(
        schema["paths"]
    )
    assert set(schema["paths"]["/api/v1/replays/"]) == {"get", "post"}
