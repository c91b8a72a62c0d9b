"""Error texts say what is wrong with what was typed (issue 31.7): an empty image, a run
larger than could ever start, a spec with several bad fields, a missing object, the API's
root. The CLI's side (no doubled full stops, logs of a queued run) is in
tests/gantry_cli/test_cli.py."""

import copy

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from rest_framework.test import APIClient

from jobs.models import Experiment, Run
from jobs.services.submission import run_submit
from tenants.services.tokens import api_token_create
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

LARGEST = (
    "The largest a100-80gb run that could ever start for tenant vision: 16 GPUs (2 nodes × 8)."
)


def refusal(world, **overrides) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as excinfo:
        run_submit(user=world.researcher_a, data=experiment_input(world, **overrides))
    assert (Run.objects.count(), Experiment.objects.count()) == (0, 0)
    return excinfo.value.message_dict


def test_an_empty_image_is_asked_for_not_explained(world):
    assert refusal(world, image="") == {"image": ["Choose an image."]}
    assert refusal(world, image="   ") == {"image": ["Choose an image."]}


@pytest.mark.parametrize(
    ("nodes", "gpus_per_node", "field", "message"),
    [
        # 1000 GPUs however they are asked for: each says the largest run that could start.
        (1, 1000, "gpus_per_node", f"A a100-80gb node has at most 8 GPUs. {LARGEST}"),
        (125, 8, "nodes", f"At most 4 nodes of a100-80gb. {LARGEST}"),
        (
            3,
            8,
            "gpus_per_node",
            "This run asks for 24 GPUs and could never start: tenant vision may hold at most "
            f"16 a100-80gb GPUs (16 guaranteed + 0 borrowed). {LARGEST}",
        ),
    ],
)
def test_a_run_too_large_says_the_largest_that_could_ever_start(
    world, nodes, gpus_per_node, field, message
):
    assert refusal(world, nodes=nodes, gpus_per_node=gpus_per_node) == {field: [message]}


def test_the_largest_run_per_run_maximum_counts_too(world):
    world.vision.quotas.filter(flavor=world.a100).update(max_gpus_per_run=12)

    assert refusal(world, nodes=2, gpus_per_node=8) == {
        "gpus_per_node": [
            "This run asks for 16 GPUs; tenant vision may use at most 12 a100-80gb GPUs per "
            "run. The largest a100-80gb run that could ever start for tenant vision: 12 GPUs "
            "(2 nodes × 6)."
        ]
    }


def api_for(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def test_a_rejected_spec_names_every_failing_field_at_once(world, tmp_path):
    """A type error no longer hides the rule errors of the other fields until the next try."""
    document = {
        "version": 1,
        "kind": "experiment",
        "tenant": "vision",
        "project": "nope",
        "image": "",
        "command": "python train.py",
        "resources": {"flavor": "a100-80gb", "nodes": 125, "gpus_per_node": "8"},
        "priority": 500,
    }

    response = api_for(world.researcher_a).post(
        reverse("api:spec-submit"), copy.deepcopy(document), format="json"
    )

    assert response.status_code == 400
    assert response.json() == {
        "resources.gpus_per_node": ["Expected an integer, got a string."],
        "project": ["Unknown project for this tenant."],
        "image": ["Choose an image."],
        "resources.nodes": [f"At most 4 nodes of a100-80gb. {LARGEST}"],
        "priority": ["Between 0 and 100."],
    }
    assert (Run.objects.count(), Experiment.objects.count()) == (0, 0)


def test_a_missing_run_is_named_in_words_not_by_the_orm(world):
    response = api_for(world.researcher_a).get(reverse("api:run-detail", args=[999999]))

    assert (response.status_code, response.json()) == (404, {"detail": "No such run."})


def test_another_tenants_run_reads_the_same(world):
    run = run_submit(
        user=world.researcher_b, data=experiment_input(world, tenant="nlp", project="llm")
    )

    response = api_for(world.researcher_a).get(reverse("api:run-detail", args=[run.pk]))

    assert (response.status_code, response.json()) == (404, {"detail": "No such run."})


def test_the_api_root_answers_an_index_of_its_resources(world):
    # Signed in, as everywhere in the API (the browser's session will do).
    assert APIClient().get("/api/v1/").status_code == 401
    client = api_for(world.researcher_a)
    response = client.get("/api/v1/")

    assert response.status_code == 200
    body = response.json()
    base = "http://testserver/api/v1/"
    assert body["resources"] == {
        "token-create": base + "tokens/",
        "token-revoke": base + "tokens/current/",
        "image-list": base + "images/",
        "attempt-report": base + "attempts/report/",
        "attempt-rank-report": base + "attempts/rank-report/",
        "quota-list": base + "quotas/",
        "spec-submit": base + "specs/",
        "run-simulate": base + "runs/simulate/",
        "spec-schema": base + "spec/schema/",
        "template-list": base + "templates/",
        "run-list": base + "runs/",
        "experiment-list": base + "experiments/",
        "workspace-list": base + "workspaces/",
        "attempt-events": base + "attempts/events/",
        "attempt-workspace-address": base + "attempts/workspace/",
        "replay-list": base + "replays/",
    }
    assert (body["schema"], body["docs"]) == (
        "http://testserver/api/schema/",
        "http://testserver/api/docs/",
    )
    # Every resource it lists exists: none answers 404 to the index's own client.
    for url in body["resources"].values():
        assert client.get(url).status_code != 404, url
