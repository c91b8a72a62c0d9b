"""The workspaces API: schema, launch (idempotent), list and card, Extend, Stop, by persona."""

import uuid
from datetime import timedelta

import pytest
import time_machine
import yaml
from django.core.cache import cache
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from jobs.models import Attempt, Run, RunEvent, RunKind, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from tenants.models import AuditEvent
from tenants.services.tokens import api_token_create
from tests.workspace_support import launch_workspace, workspace_running

pytestmark = pytest.mark.django_db
PROXY = "https://ws.gantry.example.org"
LIST = "/api/v1/workspaces/"


@pytest.fixture(autouse=True)
def _fresh(settings):
    settings.GANTRY_WORKSPACE_URL = PROXY
    cache.clear()  # the token endpoint's throttle
    yield
    cache.clear()


def client_for(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def body(world, **overrides) -> dict:
    values = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "flavor": "a100-80gb",
        "gpus": 1,
        "name": "api-notebook",
        "hours": 2,
    }
    values.update(overrides)
    return values


def launch(world, user=None) -> Run:
    return launch_workspace(world, user=user, name="debug-loader", hours=4)


def test_the_endpoints_are_in_the_openapi_schema_without_warnings(tmp_path):
    path = tmp_path / "schema.yaml"
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(path))
    paths = yaml.safe_load(path.read_text())["paths"]
    assert set(paths[LIST]) == {"get", "post"}
    assert set(paths[LIST + "{id}/"]) == {"get"}
    assert set(paths[LIST + "{id}/extend/"]) == {"post"}
    assert set(paths[LIST + "{id}/stop/"]) == {"post"}
    created = paths[LIST]["post"]
    assert [parameter["name"] for parameter in created["parameters"]] == ["Idempotency-Key"]
    assert set(created["responses"]) == {"201", "400", "401"}


def test_launch_answers_201_with_the_card_and_its_location(world):
    response = client_for(world.researcher_a).post(LIST, body(world), format="json")

    assert response.status_code == 201, response.json()
    run = Run.objects.get(kind=RunKind.INTERACTIVE)
    card = response.json()
    assert response["Location"] == f"http://testserver{LIST}{run.pk}/"
    assert {key: card[key] for key in ("id", "name", "tenant", "project", "owner")} == {
        "id": run.pk,
        "name": "api-notebook",
        "tenant": "vision",
        "project": "detection",
        "owner": "alice",
    }
    assert (card["state"], card["phase"], card["server"], card["gpus"]) == (
        "QUEUED",
        "queued",
        "jupyter",
        1,
    )
    assert (card["limit_minutes"], card["extended_minutes"], card["time_left_s"], card["url"]) == (
        120,
        0,
        None,
        "",
    )
    assert [step["key"] for step in card["steps"]] == [
        "queued",
        "admitted",
        "submitted",
        "job_running",
        "server_ready",
        "ended",
    ]
    assert (card["can_extend"], card["can_stop"]) == (True, True)


def test_the_same_idempotency_key_launches_one_workspace(world):
    client = client_for(world.researcher_a)
    key = str(uuid.uuid4())
    first = client.post(LIST, body(world), format="json", headers={"Idempotency-Key": key})
    again = client.post(LIST, body(world), format="json", headers={"Idempotency-Key": key})
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.filter(kind=RunKind.INTERACTIVE).count() == 1
    assert Workspace.objects.count() == 1


def test_an_idempotency_key_that_is_no_uuid_is_refused(world):
    response = client_for(world.researcher_a).post(
        LIST, body(world), format="json", headers={"Idempotency-Key": "again"}
    )
    assert response.status_code == 400
    assert response.json() == {"Idempotency-Key": ["Idempotency-Key must be a UUID."]}
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "errors"),
    [
        (
            {"hours": 13},
            {"hours": ["Tenant vision allows a workspace at most 12 hours (extensions included)."]},
        ),
        ({"hours": 0}, {"hours": ["Ensure this value is greater than or equal to 1."]}),
        ({"server": "emacs"}, {"server": ['"emacs" is not a valid choice.']}),
        ({"gpus": "two"}, {"gpus": ["A valid integer is required."]}),
        ({"shell": "bash"}, {"shell": ["Unknown field."]}),
    ],
)
def test_bad_input_is_400_naming_the_field_and_records_nothing(world, overrides, errors):
    response = client_for(world.researcher_a).post(LIST, body(world, **overrides), format="json")
    assert response.status_code == 400
    assert response.json() == errors
    assert not Run.objects.exists()


def test_another_tenant_is_refused_like_one_that_does_not_exist(world):
    client = client_for(world.researcher_b)
    other = client.post(LIST, body(world), format="json")
    missing = client.post(LIST, body(world, tenant="nowhere"), format="json")
    assert (other.status_code, missing.status_code) == (400, 400)
    assert other.json()["tenant"] == [
        m.replace("nowhere", "vision") for m in missing.json()["tenant"]
    ]
    assert not Run.objects.exists()


def test_the_list_is_scoped_like_the_pages(world):
    alices = launch(world)
    arthurs = launch(world, user=world.researcher_a2)

    def ids(user) -> list[int]:
        response = client_for(user).get(LIST)
        assert response.status_code == 200
        return [card["id"] for card in response.json()["results"]]

    assert ids(world.researcher_a) == [alices.pk]
    assert ids(world.researcher_a2) == [arthurs.pk]
    assert ids(world.tenant_admin_a) == [arthurs.pk, alices.pk]
    assert ids(world.researcher_b) == []
    assert APIClient().get(LIST).status_code == 401


@pytest.mark.parametrize("persona", ["researcher_a2", "researcher_b", "finance"])
def test_outsiders_get_the_404_of_a_missing_workspace_and_change_nothing(world, persona):
    run = launch(world)
    client = client_for(getattr(world, persona))
    for path, method in (("", "get"), ("extend/", "post"), ("stop/", "post")):
        hidden = getattr(client, method)(f"{LIST}{run.pk}/{path}", {"hours": 1}, format="json")
        missing = getattr(client, method)(
            f"{LIST}{run.pk + 99}/{path}", {"hours": 1}, format="json"
        )
        assert (hidden.status_code, hidden.json()) == (404, missing.json())
    assert Run.objects.get(pk=run.pk).state == RunState.QUEUED
    assert Workspace.objects.get(run=run).extended_minutes == 0


def test_a_batch_run_is_404_here(world):
    from jobs.services.submission import run_submit
    from tests.conftest import experiment_input

    batch = run_submit(user=world.researcher_a, data=experiment_input(world))
    assert client_for(world.researcher_a).get(f"{LIST}{batch.pk}/").status_code == 404


def test_the_owner_gets_the_url_once_its_server_answers_and_the_time_left(world):
    run = launch(world)
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    Workspace.objects.filter(run=run).update(
        attempt=attempt, host="127.0.0.1", port=8888, ready_at=run.started_at
    )
    with time_machine.travel(run.started_at + timedelta(minutes=10), tick=False):
        owner = client_for(world.researcher_a).get(f"{LIST}{run.pk}/").json()
        admin = client_for(world.tenant_admin_a).get(f"{LIST}{run.pk}/").json()
    assert (owner["phase"], owner["url"], owner["time_left_s"]) == (
        "running",
        f"{PROXY}/w/{run.pk}/lab",
        (4 * 60 - 10) * 60,
    )
    assert (admin["url"], admin["time_left_s"]) == ("", (4 * 60 - 10) * 60)


def test_extend_within_the_maximum_and_past_it(world):
    run = launch(world)
    client = client_for(world.researcher_a)

    extended = client.post(f"{LIST}{run.pk}/extend/", {"hours": 2}, format="json")
    refused = client.post(f"{LIST}{run.pk}/extend/", {"hours": 7}, format="json")
    empty = client.post(f"{LIST}{run.pk}/extend/", {}, format="json")

    assert extended.status_code == 200
    assert (extended.json()["limit_minutes"], extended.json()["extended_minutes"]) == (360, 120)
    assert (refused.status_code, refused.json()) == (
        400,
        {
            "hours": [
                "Tenant vision allows a workspace at most 12 hours (extensions included): it "
                "has 6 h already, it may get 6 more hours."
            ]
        },
    )
    assert (empty.status_code, empty.json()) == (400, {"hours": ["This field is required."]})
    assert Workspace.objects.get(run=run).extended_minutes == 120
    assert AuditEvent.objects.filter(action="workspace.extend").count() == 1


def test_a_platform_admin_sees_and_stops_but_may_not_extend(world):
    run = launch(world)
    client = client_for(world.platform_admin)

    extend = client.post(f"{LIST}{run.pk}/extend/", {"hours": 1}, format="json")
    stop = client.post(f"{LIST}{run.pk}/stop/", format="json")
    again = client.post(f"{LIST}{run.pk}/stop/", format="json")
    ended = client.post(f"{LIST}{run.pk}/extend/", {"hours": 1}, format="json")

    assert (extend.status_code, extend.json()) == (
        403,
        {"detail": "Only the owner of the workspace or a tenant admin of vision can extend it."},
    )
    assert (stop.status_code, stop.json()["state"], stop.json()["phase"]) == (
        202,
        "CANCELLED",
        "ended",
    )
    assert (again.status_code, again.json()) == (409, {"detail": "The run is already cancelled."})
    assert ended.status_code == 403  # whoever may not extend learns nothing more
    owner_on_ended = client_for(world.researcher_a).post(
        f"{LIST}{run.pk}/extend/", {"hours": 1}, format="json"
    )
    assert (owner_on_ended.status_code, owner_on_ended.json()) == (
        409,
        {"detail": "The workspace has ended: launch a new one."},
    )


def test_the_runs_api_cannot_rerun_a_workspace(world):
    run = launch(world)
    response = client_for(world.researcher_a).post(
        reverse("api:experiment-rerun", args=[run.experiment_id])
    )
    assert response.status_code == 400
    assert response.json() == {
        "kind": [
            f"Experiment {run.experiment_id} is a workspace's: launch a new workspace instead."
        ]
    }


def test_the_runs_api_shows_each_runs_kind(world):
    from jobs.services.submission import run_submit
    from tests.conftest import experiment_input

    batch = run_submit(user=world.researcher_a, data=experiment_input(world))
    workspace = launch(world)
    runs = client_for(world.researcher_a).get(reverse("api:run-list")).json()["results"]
    assert [(run["id"], run["kind"]) for run in runs] == [
        (workspace.pk, "interactive"),
        (batch.pk, "batch"),
    ]


def test_a_warned_workspace_says_its_latest_warning_in_the_card_and_the_list(world):
    warned = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=8888)
    quiet = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=8889)
    for message in ("An earlier streak's warning.", "Workspace is idle since 10:05 UTC."):
        RunEvent.objects.create(
            run=warned, from_state="RUNNING", to_state="RUNNING", reason="IDLE_WARNING",
            message=message,
        )  # fmt: skip
    RunEvent.objects.create(run=warned, reason="EXTENDED", message="Extended by 1 hour")
    Workspace.objects.filter(run=warned).update(warned_at=warned.started_at)
    owner = client_for(world.researcher_a)

    card = owner.get(f"{LIST}{warned.pk}/").json()
    listed = {row["id"]: row for row in owner.get(LIST).json()["results"]}
    assert (card["phase"], card["idle_warning"]) == (
        "idle warning",
        "Workspace is idle since 10:05 UTC.",
    )
    assert (listed[warned.pk]["idle_warning"], listed[quiet.pk]["idle_warning"]) == (
        "Workspace is idle since 10:05 UTC.",
        "",
    )
    # Used again: the warning no longer holds, whatever the events say.
    Workspace.objects.filter(run=warned).update(warned_at=None)
    assert owner.get(f"{LIST}{warned.pk}/").json()["idle_warning"] == ""
