"""REST API /api/v1: tokens, submitting, listing, reading and cancelling runs, experiments."""

import dataclasses
from datetime import timedelta

import pytest
import time_machine
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import Attempt, Experiment, Run, RunState
from jobs.serializers.experiments import ExperimentInputSerializer
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import ExperimentInput, run_submit
from tenants.models import ApiToken
from tenants.services.tokens import api_token_create, api_token_revoke
from tests.conftest import COMMIT, PASSWORD, experiment_input

RUNS = reverse("api:run-list")
EXPERIMENTS = reverse("api:experiment-list")
TOKENS = reverse("api:token-create")
CURRENT_TOKEN = reverse("api:token-revoke")

LARGEST_VISION = (
    "The largest a100-80gb run that could ever start for tenant vision: 16 GPUs (2 nodes × 8)."
)


@pytest.fixture(autouse=True)
def _fresh_throttle(db):  # the throttle counts in the database cache when embedded
    cache.clear()
    yield
    cache.clear()


def client_for(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def run_url(run_id: int) -> str:
    return reverse("api:run-detail", args=[run_id])


def cancel_url(run_id: int) -> str:
    return reverse("api:run-cancel", args=[run_id])


def body(world, **overrides) -> dict:
    values = dataclasses.asdict(experiment_input(world))
    values.update(overrides)
    return values


def submit(world, user, **overrides) -> Run:
    return run_submit(user=user, data=experiment_input(world, **overrides))


def counts() -> tuple[int, int]:
    return Run.objects.count(), Experiment.objects.count()


# --- tokens -----------------------------------------------------------------------------


def test_token_create_returns_a_working_secret_stored_only_as_hash(world):
    before = timezone.now()

    response = APIClient().post(
        TOKENS, {"username": "alice", "password": PASSWORD, "name": "laptop"}, format="json"
    )

    assert response.status_code == 201
    data = response.json()
    assert set(data) == {"token", "prefix", "expires_at"}
    token = ApiToken.objects.get()
    assert token.user == world.researcher_a
    assert token.name == "laptop"
    assert token.key_hash == ApiToken.hash_secret(data["token"])
    assert data["token"] not in (token.key_hash, token.prefix)
    assert data["prefix"] == token.prefix == data["token"][4:12]
    assert before + timedelta(days=90) <= token.expires_at <= timezone.now() + timedelta(days=90)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + data["token"])
    assert client.get(RUNS).status_code == 200


def test_token_create_honours_expires_in_days(world):
    before = timezone.now()

    response = APIClient().post(
        TOKENS, {"username": "alice", "password": PASSWORD, "expires_in_days": 7}, format="json"
    )

    assert response.status_code == 201
    token = ApiToken.objects.get()
    assert token.name == "api"
    assert before + timedelta(days=7) <= token.expires_at <= timezone.now() + timedelta(days=7)


@pytest.mark.parametrize(
    ("username", "password"),
    [("alice", "wrong-password"), ("nobody", PASSWORD)],
    ids=["wrong-password", "unknown-user"],
)
def test_token_create_with_wrong_credentials_is_400_and_creates_nothing(world, username, password):
    response = APIClient().post(TOKENS, {"username": username, "password": password}, format="json")

    assert response.status_code == 400
    assert response.json() == {"non_field_errors": ["Wrong username or password."]}
    assert ApiToken.objects.count() == 0


def test_token_create_for_inactive_user_is_400(world):
    world.researcher_a.is_active = False
    world.researcher_a.save(update_fields=["is_active"])

    response = APIClient().post(TOKENS, {"username": "alice", "password": PASSWORD}, format="json")

    assert response.status_code == 400
    assert ApiToken.objects.count() == 0


@pytest.mark.parametrize("days", [0, 366])
def test_token_create_rejects_lifetime_out_of_range(world, days):
    response = APIClient().post(
        TOKENS,
        {"username": "alice", "password": PASSWORD, "expires_in_days": days},
        format="json",
    )

    assert response.status_code == 400
    assert set(response.json()) == {"expires_in_days"}
    assert ApiToken.objects.count() == 0


def test_token_create_is_throttled_per_client_and_username(world):
    client = APIClient()
    wrong = {"username": "alice", "password": "guess"}
    statuses = [client.post(TOKENS, wrong, format="json").status_code for _ in range(11)]

    # The login lockout (5 failures per username, tenants/authentication.py) comes first.
    assert statuses == [400] * 5 + [429] * 6
    right = {"username": "alice", "password": PASSWORD}
    assert client.post(TOKENS, right, format="json").status_code == 429
    other_user = {"username": "bob", "password": PASSWORD}
    assert client.post(TOKENS, other_user, format="json").status_code == 201


def test_revoke_current_token_then_it_gets_401(world):
    token, secret = api_token_create(user=world.researcher_a)
    other, other_secret = api_token_create(user=world.researcher_a)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)

    response = client.delete(CURRENT_TOKEN)

    assert response.status_code == 204
    token.refresh_from_db()
    other.refresh_from_db()
    assert token.revoked_at is not None
    assert other.revoked_at is None
    assert client.get(RUNS).status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Bearer " + other_secret)
    assert client.get(RUNS).status_code == 200


def test_revoke_without_token_is_401(world):
    assert APIClient().delete(CURRENT_TOKEN).status_code == 401


def test_revoke_with_a_browser_session_is_401_and_revokes_nothing(world):
    token, _ = api_token_create(user=world.researcher_a)
    client = APIClient()
    client.force_login(world.researcher_a)

    assert client.delete(CURRENT_TOKEN).status_code == 401
    token.refresh_from_db()
    assert token.revoked_at is None


def test_expired_token_is_401(world):
    _, secret = api_token_create(
        user=world.researcher_a, expires_at=timezone.now() - timedelta(seconds=1)
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)

    response = client.get(RUNS)

    assert response.status_code == 401
    assert response.json() == {"detail": "Token expired."}


def test_revoked_token_is_401(world):
    token, secret = api_token_create(user=world.researcher_a)
    api_token_revoke(token=token)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)

    response = client.get(RUNS)

    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or revoked token."}


def test_unknown_token_is_401(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer gty_not-a-token")

    assert client.get(RUNS).status_code == 401


def test_no_token_is_401_with_bearer_challenge(world):
    response = APIClient().get(RUNS)

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'


def test_last_used_at_is_recorded_to_the_minute(world):
    token, secret = api_token_create(user=world.researcher_a)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + secret)
    first = timezone.now().replace(microsecond=0) + timedelta(hours=1)

    def used_at(moment):
        with time_machine.travel(moment, tick=False):
            assert client.get(RUNS).status_code == 200
        token.refresh_from_db()
        return token.last_used_at

    assert used_at(first) == first
    # Within the minute the row is not written again (one write a minute, not a request).
    assert used_at(first + timedelta(seconds=59)) == first
    assert used_at(first + timedelta(seconds=60)) == first + timedelta(seconds=60)


# --- submit -----------------------------------------------------------------------------


def test_input_fields_are_exactly_those_of_experiment_input():
    assert set(ExperimentInputSerializer().fields) == {
        f.name for f in dataclasses.fields(ExperimentInput)
    }


def test_submit_queues_one_run_and_records_the_experiment(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, body(world, nodes=2, gpus_per_node=4), format="json")

    assert response.status_code == 201
    run = Run.objects.get()
    assert run.state == RunState.QUEUED
    assert run.gpus == 8
    assert run.submitted_by == world.researcher_a
    assert run.tenant == world.vision
    experiment = run.experiment
    assert experiment.image == world.image
    assert experiment.image_reference == world.image.reference
    assert experiment.params == {"lr": 0.1, "batch_size": 256}
    assert experiment.env == {"GANTRY_SIM_DURATION_S": "600"}
    assert experiment.code_commit == COMMIT
    assert experiment.command == "python train.py --epochs 3"
    assert (experiment.priority, experiment.max_runtime_minutes, experiment.max_restarts) == (
        50,
        24 * 60,
        0,
    )
    assert response["Location"] == f"http://testserver/api/v1/runs/{run.pk}/"
    data = response.json()
    assert data["id"] == run.pk
    assert data["experiment"] == experiment.pk
    assert data["experiment_name"] == "resnet-baseline"
    assert data["tenant"] == "vision"
    assert data["project"] == "detection"
    assert data["flavor"] == "a100-80gb"
    assert data["image"] == world.image.reference
    assert data["gpus"] == 8
    assert data["state"] == "QUEUED"
    assert data["submitted_by"] == "alice"
    assert data["cluster"] is None
    assert data["attempts"] == []
    assert [
        (e["from_state"], e["to_state"], e["reason"], e["message"], e["actor"])
        for e in data["events"]
    ] == [("", "QUEUED", "SUBMITTED", "Submitted", "alice")]


def test_submit_uses_a_fixed_number_of_queries(world, django_assert_num_queries):
    client = client_for(world.researcher_a)
    client.get(RUNS)  # the token's last_used_at is written on its first use in a minute

    # token; a savepoint (set, released) around roles, the submit context (tenant, project,
    # image, flavor, quota, node limits: one query), the nodes a placement needs and the
    # experiment, run and event inserts; then the run as the response shows it, its place in
    # line, attempts and events. No topology level asked for: the levels are not read.
    with django_assert_num_queries(13):
        response = client.post(RUNS, body(world), format="json")

    assert response.status_code == 201
    # The run the submit answers with reads only the columns it shows: the same as its page.
    assert response.json() == client.get(run_url(response.json()["id"])).json()


def test_submit_with_only_required_fields_uses_the_defaults(world):
    client = client_for(world.researcher_a)
    minimal = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "command": "python train.py",
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 1,
    }

    response = client.post(RUNS, minimal, format="json")

    assert response.status_code == 201
    experiment = Experiment.objects.get()
    assert experiment.params == {}
    assert experiment.env == {}
    assert experiment.code_commit == ""
    assert experiment.priority == 50
    assert experiment.name.startswith("detection-")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("image", "registry.example.org/ml/pytorch@sha256:xyz"),
        ("image", "registry.example.org/ml/pytorch:latest"),
        ("nodes", 0),
        ("gpus_per_node", 9),
        ("nodes", 5),
        ("nodes", "two"),
        ("params", "[1]"),
        ("params", [1]),
        ("params", {"blob": "x" * (64 * 1024)}),
        ("env", {"1BAD": "x"}),
        ("env", ["A=1"]),
        ("command", "x" * (16 * 1024 + 1)),
        ("command", ""),
        ("tenant", "no-such-tenant"),
        ("tenant", "nlp"),
        ("project", "no-such-project"),
        ("flavor", "b200"),
        ("code_commit", "abc123"),
        ("code_commit", "G" * 40),
        ("priority", 101),
        ("max_restarts", 21),
    ],
    ids=lambda v: str(v)[:24],
)
def test_bad_submit_is_400_naming_the_field_and_saves_nothing(world, field, value):
    client = client_for(world.researcher_a)
    before = counts()

    response = client.post(RUNS, body(world, **{field: value}), format="json")

    assert response.status_code == 400
    assert set(response.json()) == {field}
    assert counts() == before


def test_image_allowed_only_for_another_tenant_is_rejected(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, body(world, image=world.nlp_only_image.reference), format="json")

    assert response.status_code == 400
    assert response.json() == {"image": ["This image is not approved for this tenant."]}
    assert counts() == (0, 0)


def test_the_same_image_is_accepted_for_the_tenant_it_is_allowed_for(world):
    client = client_for(world.researcher_b)
    nlp_body = body(world, tenant="nlp", project="llm", image=world.nlp_only_image.reference)

    response = client.post(RUNS, nlp_body, format="json")

    assert response.status_code == 201
    assert Experiment.objects.get().image == world.nlp_only_image


def test_blocked_image_is_rejected(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, body(world, image=world.blocked_image.reference), format="json")

    assert response.status_code == 400
    assert response.json() == {"image": ["This image is not approved for this tenant."]}
    assert counts() == (0, 0)


def test_too_many_nodes_names_the_limit(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, body(world, nodes=5), format="json")

    assert response.status_code == 400
    assert response.json() == {"nodes": [f"At most 4 nodes of a100-80gb. {LARGEST_VISION}"]}


def test_tenant_of_which_the_user_is_no_member_is_rejected(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, body(world, tenant="nlp", project="llm"), format="json")

    assert response.status_code == 400
    assert response.json() == {"tenant": ["Unknown tenant, or you are not a member."]}
    assert counts() == (0, 0)


def test_unknown_keys_are_rejected_by_name(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, {**body(world), "gpu_type": "h100", "cpus": 8}, format="json")

    assert response.status_code == 400
    assert response.json() == {"cpus": ["Unknown field."], "gpu_type": ["Unknown field."]}
    assert counts() == (0, 0)


def test_several_bad_fields_are_reported_together(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, {**body(world, nodes=0, params=[1]), "extra": True}, format="json")

    assert response.status_code == 400
    assert set(response.json()) == {"params", "extra"}
    assert counts() == (0, 0)


def test_body_that_is_not_an_object_is_400(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, [1, 2], format="json")

    assert response.status_code == 400
    assert set(response.json()) == {"non_field_errors"}
    assert counts() == (0, 0)


def test_form_encoded_submit_is_415(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, {"tenant": "vision"})

    assert response.status_code == 415
    assert counts() == (0, 0)


# --- list -------------------------------------------------------------------------------


@pytest.fixture
def runs(world):
    """Two runs of vision (one cancelled) and one of nlp."""
    queued = submit(world, world.researcher_a, name="queued")
    cancelled = submit(world, world.researcher_a2, name="cancelled")
    run_cancel(run=cancelled, actor=world.researcher_a2)
    nlp = submit(
        world,
        world.researcher_b,
        tenant="nlp",
        project="llm",
        name="nlp",
        image=world.nlp_only_image.reference,
    )
    return {"queued": queued, "cancelled": cancelled, "nlp": nlp}


def ids(response) -> list[int]:
    return [r["id"] for r in response.json()["results"]]


def test_list_shows_only_runs_of_the_users_tenants_newest_first(world, runs):
    response = client_for(world.researcher_a).get(RUNS)

    assert response.status_code == 200
    assert (response.json()["next"], response.json()["previous"]) == (None, None)
    assert ids(response) == [runs["cancelled"].pk, runs["queued"].pk]
    first = response.json()["results"][1]
    assert first["experiment_name"] == "queued"
    assert first["tenant"] == "vision"
    assert first["state"] == "QUEUED"
    assert first["wait_reason"] == ""
    assert first["failure_reason"] == ""
    assert "events" not in first


def test_list_of_the_other_tenant(world, runs):
    response = client_for(world.researcher_b).get(RUNS)

    assert ids(response) == [runs["nlp"].pk]


def test_list_filters_by_state(world, runs):
    client = client_for(world.researcher_a)

    assert ids(client.get(RUNS, {"state": "QUEUED"})) == [runs["queued"].pk]
    assert ids(client.get(RUNS, {"state": "CANCELLED"})) == [runs["cancelled"].pk]
    assert ids(client.get(RUNS, {"state": "RUNNING"})) == []
    both = client.get(RUNS + "?state=QUEUED&state=CANCELLED")
    assert ids(both) == [runs["cancelled"].pk, runs["queued"].pk]


def test_list_rejects_an_unknown_state(world, runs):
    response = client_for(world.researcher_a).get(RUNS, {"state": "queued"})

    assert response.status_code == 400
    assert set(response.json()) == {"state"}


def test_list_filters_by_tenant_within_what_the_user_may_see(world, runs):
    alice = client_for(world.researcher_a)
    finance = client_for(world.finance)

    assert ids(alice.get(RUNS, {"tenant": "nlp"})) == []
    assert ids(alice.get(RUNS, {"tenant": "vision"})) == [
        runs["cancelled"].pk,
        runs["queued"].pk,
    ]
    assert ids(finance.get(RUNS)) == [runs["nlp"].pk, runs["cancelled"].pk, runs["queued"].pk]
    assert ids(finance.get(RUNS, {"tenant": "nlp"})) == [runs["nlp"].pk]


def test_list_pages_by_older_and_newer_links(world):
    runs = [submit(world, world.researcher_a, name=f"run-{i}") for i in range(52)]
    client = client_for(world.researcher_a)

    first = client.get(RUNS, {"state": "QUEUED"}).json()
    second = client.get(first["next"]).json()
    back = client.get(second["previous"]).json()

    assert len(first["results"]) == 50
    assert first["previous"] is None
    assert first["next"] == f"http://testserver/api/v1/runs/?before={runs[2].pk}&state=QUEUED"
    assert [r["experiment_name"] for r in second["results"]] == ["run-1", "run-0"]
    assert second["next"] is None
    assert second["previous"] == f"http://testserver/api/v1/runs/?after={runs[1].pk}&state=QUEUED"
    assert back == first


def test_list_refuses_page_numbers_and_two_cursors(world):
    client = client_for(world.researcher_a)

    numbered = client.get(RUNS, {"page": 2})
    both = client.get(RUNS, {"before": 5, "after": 3})

    assert numbered.status_code == 400
    assert numbered.json() == {
        "page": [
            "The run list has no page numbers: follow its next and previous links "
            "(before= and after= a run id)."
        ]
    }
    assert both.status_code == 400
    assert both.json() == {"after": ["Give before or after, not both."]}


def test_lists_use_a_fixed_number_of_queries(world, django_assert_num_queries):
    client = client_for(world.researcher_a)
    for _ in range(11):
        submit(world, world.researcher_a)
    admission_run_cycle()  # some runs get a cluster, which the list shows

    # token, its last_used_at (the first use in a minute only), roles (global ones and
    # memberships, one query), then tenants, page (its submitters joined in) and the queued
    # ones' places in line for runs, count and page for experiments
    with django_assert_num_queries(6):
        runs_page = client.get(RUNS)
    with django_assert_num_queries(4):
        experiments_page = client.get(EXPERIMENTS)

    assert len(runs_page.json()["results"]) == experiments_page.json()["count"] == 11
    assert {r["cluster"] for r in runs_page.json()["results"]} == {"sim-1", None}


# --- detail -----------------------------------------------------------------------------


def test_detail_shows_attempts_and_the_timeline(world):
    run = submit(world, world.researcher_a)
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()

    response = client_for(world.researcher_a).get(run_url(run.pk))

    assert response.status_code == 200
    data = response.json()
    assert data["state"] == "PENDING"
    assert data["cluster"] == "sim-1"
    assert data["borrowed"] is False
    assert data["queue_position"] is None
    assert data["admitted_at"] is not None
    assert data["experiment"] == run.experiment_id
    [shown] = data["attempts"]
    assert shown["id"] == attempt.pk
    assert shown["number"] == 1
    assert shown["state"] == "PENDING"
    assert shown["cluster"] == "sim-1"
    assert shown["backend_job_id"] == attempt.backend_job_id != ""
    assert shown["rendered_spec"] == attempt.rendered_spec
    assert f'"name": "gantry-a{attempt.pk}"' in shown["rendered_spec"]
    assert shown["exit_code"] is None
    assert shown["failure_reason"] == ""
    assert shown["node_list"] == []
    assert [(e["from_state"], e["to_state"], e["reason"], e["actor"]) for e in data["events"]] == [
        ("", "QUEUED", "SUBMITTED", "alice"),
        ("QUEUED", "ADMITTED", "ADMITTED", None),
        ("ADMITTED", "SUBMITTING", "SUBMITTING", None),
        ("SUBMITTING", "PENDING", "SUBMITTED", None),
    ]


def test_detail_of_another_tenants_run_is_404_like_a_missing_one(world, runs):
    bob = client_for(world.researcher_b)

    other = bob.get(run_url(runs["queued"].pk))
    missing = bob.get(run_url(999_999))

    assert other.status_code == missing.status_code == 404
    assert other.json() == missing.json()


def test_detail_with_an_id_out_of_range_is_404(world):
    client = client_for(world.researcher_a)

    assert client.get(run_url(10**20)).status_code == 404
    assert client.get("/api/v1/runs/abc/").status_code == 404


def test_tenant_admin_and_finance_can_read_a_researchers_run(world, runs):
    for user in (world.tenant_admin_a, world.finance, world.platform_admin):
        assert client_for(user).get(run_url(runs["queued"].pk)).status_code == 200


# --- experiments ------------------------------------------------------------------------


def test_experiment_list_and_detail_show_the_reproducibility_record(world, runs):
    client = client_for(world.researcher_a)
    experiment = runs["queued"].experiment

    listed = client.get(EXPERIMENTS)
    detail = client.get(reverse("api:experiment-detail", args=[experiment.pk]))

    assert listed.status_code == 200
    assert [e["name"] for e in listed.json()["results"]] == ["cancelled", "queued"]
    assert detail.status_code == 200
    assert detail.json() == {
        "id": experiment.pk,
        "tenant": "vision",
        "project": "detection",
        "owner": "alice",
        "name": "queued",
        "image": world.image.reference,
        "command": "python train.py --epochs 3",
        "env": {"GANTRY_SIM_DURATION_S": "600"},
        "code_repository": "https://git.example.org/vision/detection.git",
        "code_commit": COMMIT,
        "dataset_uri": "s3://datasets/imagenet",
        "dataset_version": "2024-01",
        "params": {"lr": 0.1, "batch_size": 256},
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 2,
        "total_gpus": 2,
        "topology_level": "",
        "topology_mode": "preferred",
        "priority": 50,
        "max_runtime_minutes": 1440,
        "max_restarts": 0,
        "checkpoint_dir": "",
        "cloned_from": None,
        "gantry_version": experiment.gantry_version,
        "created_at": detail.json()["created_at"],
    }


def test_experiments_of_another_tenant_are_invisible(world, runs):
    bob = client_for(world.researcher_b)
    vision_experiment = runs["queued"].experiment

    listed = bob.get(EXPERIMENTS)
    other = bob.get(reverse("api:experiment-detail", args=[vision_experiment.pk]))
    missing = bob.get(reverse("api:experiment-detail", args=[999_999]))

    assert [e["name"] for e in listed.json()["results"]] == ["nlp"]
    assert bob.get(EXPERIMENTS, {"tenant": "vision"}).json()["results"] == []
    assert other.status_code == missing.status_code == 404


# --- cancel -----------------------------------------------------------------------------


def test_owner_cancels_a_queued_run(world):
    run = submit(world, world.researcher_a)

    response = client_for(world.researcher_a).post(cancel_url(run.pk))

    assert response.status_code == 202
    assert response.json()["state"] == "CANCELLED"
    assert response.json()["failure_reason"] == "CANCELLED"
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert run.events.last().actor == world.researcher_a


def test_tenant_admin_cancels_a_researchers_run(world):
    run = submit(world, world.researcher_a)

    response = client_for(world.tenant_admin_a).post(cancel_url(run.pk))

    assert response.status_code == 202
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED


def test_cancel_by_another_tenant_is_404_and_changes_nothing(world):
    run = submit(world, world.researcher_a)

    response = client_for(world.researcher_b).post(cancel_url(run.pk))

    assert response.status_code == 404
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    assert run.cancel_requested_at is None
    assert run.events.count() == 1


@pytest.mark.parametrize("persona", ["researcher_a2", "finance"])
def test_cancel_by_a_reader_who_is_not_owner_or_admin_is_403_and_changes_nothing(world, persona):
    run = submit(world, world.researcher_a)

    response = client_for(getattr(world, persona)).post(cancel_url(run.pk))

    assert response.status_code == 403
    assert response.json() == {
        "detail": "Only the submitter, a tenant admin or a platform admin can cancel."
    }
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    assert run.cancel_requested_at is None
    assert run.events.count() == 1


def test_cancel_of_a_finished_run_is_409(world):
    run = submit(world, world.researcher_a)
    run_cancel(run=run, actor=world.researcher_a)

    response = client_for(world.researcher_a).post(cancel_url(run.pk))

    assert response.status_code == 409
    assert response.json() == {"detail": "The run is already cancelled."}
    assert run.events.count() == 2


def test_cancel_of_a_running_run_is_requested_from_the_backend(world):
    run = submit(world, world.researcher_a)
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=run).pk)

    response = client_for(world.researcher_a).post(cancel_url(run.pk))

    assert response.status_code == 202
    assert response.json()["state"] == "PENDING"
    assert response.json()["cancel_requested_at"] is not None
    assert response.json()["events"][-1]["reason"] == "CANCEL_REQUESTED"


def test_cancel_without_token_is_401(world):
    run = submit(world, world.researcher_a)

    assert APIClient().post(cancel_url(run.pk)).status_code == 401
    run.refresh_from_db()
    assert run.state == RunState.QUEUED


# --- schema and docs --------------------------------------------------------------------


def test_schema_lists_the_api(client):
    response = client.get(reverse("api-schema"))

    assert response.status_code == 200
    schema = response.content.decode()
    for path in ("/api/v1/runs/", "/api/v1/runs/{id}/cancel/", "/api/v1/tokens/"):
        assert path in schema


def test_swagger_ui_is_served_without_a_cdn(client):
    response = client.get(reverse("api-docs"))

    assert response.status_code == 200
    page = response.content.decode()
    assert "swagger-ui" in page
    assert "cdn.jsdelivr.net" not in page
