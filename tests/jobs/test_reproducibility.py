"""The reproducibility record: re-run exactly, clone and edit, the side-by-side diff, and
the runtime report a job sends with its per-attempt token (which is never stored)."""

import base64
import hashlib
import hmac
import io
import json
import logging
import re
from dataclasses import replace

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from images.models import Image
from jobs.models import (
    ENDED_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    AttemptToken,
    Experiment,
    Run,
    RunEvent,
    RunState,
)
from jobs.reproducibility import (
    DiffRow,
    attempt_id_of_token,
    attempt_token_digest,
    attempt_token_matches,
    attempt_token_new,
    experiment_diff,
    flatten_params,
)
from jobs.selectors.experiments import experiment_record
from jobs.selectors.logs import run_logs
from jobs.selectors.runs import attempt_get_for_work
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit, attempt_token_issue, job_spec_for
from jobs.services.backend_sync import attempt_report_runtime, cluster_sync
from jobs.services.submission import run_rerun, run_submit
from tenants.models import Membership, Quota
from tenants.services.tokens import api_token_create
from tests.conftest import COMMIT, experiment_input

pytestmark = pytest.mark.django_db

OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
REPORT_URL = reverse("api:attempt-report")
FULL_REPORT = {
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "cudnn_version": "9.1.0",
    "nccl_version": "2.21.5",
    "python_version": "3.11.9",
    "framework": {"torch": "2.4.0", "transformers": "4.44.2"},
    "hostname": "gpu-node-07",
    "kernel_version": "5.15.0-105-generic",
    "node_list": ["gpu-node-07", "gpu-node-08"],
    "gpu_uuids": [
        "GPU-3b1e5f0c-8d3a-4b7e-9f60-0a1b2c3d4e5f",
        "GPU-7c2d6e1f-9e4b-4c8f-a071-1b2c3d4e5f60",
    ],
}


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def api_client(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def job_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Attempt " + token)
    return client


def submitted_attempt(world, **overrides) -> Attempt:
    """An attempt admitted and handed to the simulator: what a job holds a token for."""
    run = submit(world, **overrides)
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    return attempt


def token_of(attempt: Attempt) -> str:
    """A token for the attempt's job, as a submit issues one."""
    return attempt_token_issue(attempt=attempt)


def rerun_url(experiment_id: int) -> str:
    return reverse("jobs:experiment_rerun", args=[experiment_id])


def api_rerun_url(experiment_id: int) -> str:
    return reverse("api:experiment-rerun", args=[experiment_id])


def diff_url(a: int, b: int) -> str:
    return f"{reverse('jobs:experiment_diff')}?a={a}&b={b}"


def counts() -> tuple[int, int, int]:
    return Experiment.objects.count(), Run.objects.count(), RunEvent.objects.count()


# --- per-attempt tokens (pure) ------------------------------------------------------------


def test_attempt_tokens_are_random_and_name_their_attempt():
    tokens = {attempt_token_new(attempt_id=42) for _ in range(100)}

    assert len(tokens) == 100
    for token in tokens:
        assert re.fullmatch(r"gat_42\.[A-Za-z0-9_-]{43}", token)
        assert attempt_id_of_token(token) == 42


def test_only_a_tokens_shape_names_an_attempt():
    random_part = attempt_token_new(attempt_id=42).partition(".")[2]

    assert attempt_id_of_token(f"gat_43.{random_part}") == 43
    assert attempt_id_of_token(f"gat_{2**63 - 1}.{random_part}") == 2**63 - 1
    assert attempt_id_of_token(f"gat_{2**63}.{random_part}") is None
    assert attempt_id_of_token(f"gat_042.{random_part}") is None
    assert attempt_id_of_token(f"gat_+42.{random_part}") is None
    assert attempt_id_of_token(f"gat_٤٢.{random_part}") is None
    assert attempt_id_of_token(f"gat_42.{random_part[:-1]}") is None  # truncated
    assert attempt_id_of_token(f"gat_42.{random_part}x") is None
    assert attempt_id_of_token(f"gat_42.{random_part[:-1]}=") is None
    assert attempt_id_of_token(f"gty_42.{random_part}") is None
    assert attempt_id_of_token("gat_42") is None
    assert attempt_id_of_token("") is None


def test_a_token_matches_only_its_own_digest():
    token, other = attempt_token_new(attempt_id=42), attempt_token_new(attempt_id=42)

    assert attempt_token_digest(token) == hashlib.sha256(token.encode()).hexdigest()
    assert attempt_token_matches(token, [attempt_token_digest(other), attempt_token_digest(token)])
    assert not attempt_token_matches(token, [attempt_token_digest(other)])
    assert not attempt_token_matches(token, [])
    assert not attempt_token_matches(token[:-1], [attempt_token_digest(token)])


# --- diff (pure) ----------------------------------------------------------------------------


def test_params_are_flattened_with_dots_and_leaves_kept_as_json():
    params = {"lr": 0.1, "tag": "1", "steps": 1, "optimizer": {"name": "sgd", "betas": [0.9]}}

    assert flatten_params(params | {"empty": {}}) == {
        "lr": "0.1",
        "tag": '"1"',
        "steps": "1",
        "optimizer.name": '"sgd"',
        "optimizer.betas": "[0.9]",
        "empty": "{}",
    }


def test_diff_of_plain_records_marks_absent_keys_as_none():
    a = {"image": "r@sha256:1", "env": {"A": "1"}, "params": {"x": 1}, "nodes": 1}
    b = {"image": "r@sha256:1", "env": {}, "params": {"x": "1", "y": None}, "nodes": 2}

    rows = experiment_diff(a, b)

    assert [row for row in rows if row.differs] == [
        DiffRow("env.A", "1", None, True),
        DiffRow("params.x", "1", '"1"', True),
        DiffRow("params.y", None, "null", True),
        DiffRow("nodes", "1", "2", True),
    ]
    assert rows[0] == DiffRow("image", "r@sha256:1", "r@sha256:1", False)
    assert [row.label for row in rows[:3]] == ["Image", "Command", "Environment A"]


# --- re-run exactly --------------------------------------------------------------------------


def test_rerun_queues_a_second_run_of_the_same_experiment_record(world):
    first = submit(world)
    experiment = first.experiment
    record_before = experiment_record(experiment)

    second = run_rerun(experiment=experiment, user=world.researcher_a2)

    assert Experiment.objects.count() == 1
    assert list(experiment.runs.order_by("pk")) == [first, second]
    assert second.experiment_id == experiment.pk
    assert (second.state, second.submitted_by, second.gpus, second.priority) == (
        RunState.QUEUED,
        world.researcher_a2,
        2,
        50,
    )
    assert (second.tenant_id, second.flavor_id) == (world.vision.pk, world.a100.pk)
    experiment.refresh_from_db()
    assert experiment_record(experiment) == record_before
    assert list(second.events.values_list("to_state", "reason", "message", "actor")) == [
        ("QUEUED", "RERUN", f"Re-run of experiment {experiment.pk} (exact)", world.researcher_a2.pk)
    ]


def test_rerun_of_a_blocked_image_is_refused_and_creates_nothing(world):
    run = submit(world)
    Image.objects.filter(pk=world.image.pk).update(status=Image.Status.BLOCKED)
    before = counts()

    with pytest.raises(ValidationError) as caught:
        run_rerun(experiment=Experiment.objects.get(pk=run.experiment_id), user=run.submitted_by)

    assert caught.value.message_dict == {
        "image": [
            f"The image {world.image.reference} is blocked, so this experiment cannot run "
            "again exactly. Clone and edit it to choose another image."
        ]
    }
    assert counts() == before


def test_rerun_of_an_image_no_longer_visible_to_the_tenant_is_refused(world):
    run = submit(world)
    Image.objects.filter(pk=world.image.pk).update(visible_to_all=False)
    before = counts()

    with pytest.raises(ValidationError) as caught:
        run_rerun(experiment=Experiment.objects.get(pk=run.experiment_id), user=run.submitted_by)

    assert caught.value.message_dict == {
        "image": [
            f"The image {world.image.reference} is no longer available to tenant vision. "
            "Clone and edit it to choose another image."
        ]
    }
    assert counts() == before


def test_rerun_that_the_quota_could_never_admit_is_refused(world):
    run = submit(world, gpus_per_node=8)
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(guaranteed_gpus=4)
    before = counts()

    with pytest.raises(ValidationError) as caught:
        run_rerun(experiment=run.experiment, user=world.researcher_a)

    assert caught.value.message_dict == {
        "gpus_per_node": [
            "This run asks for 8 GPUs and could never start: tenant vision may hold at most 4 "
            "a100-80gb GPUs (4 guaranteed + 0 borrowed). "
            "The largest a100-80gb run that"
            " could ever start for tenant vision: 4 GPUs (1 node × 4)."
        ]
    }
    assert counts() == before


@pytest.mark.parametrize("persona", ["finance", "platform_admin"])
def test_readers_without_membership_may_not_rerun(world, persona):
    run = submit(world)
    before = counts()

    with pytest.raises(PermissionDenied) as caught:
        run_rerun(experiment=run.experiment, user=getattr(world, persona))

    assert str(caught.value) == "Only members of tenant vision can run its experiments."
    assert counts() == before


def test_rerun_button_posts_and_opens_the_new_run(client, world):
    run = submit(world)
    client.force_login(world.researcher_a2)
    page = client.get(reverse("jobs:experiment_detail", args=[run.experiment_id])).content.decode()
    assert f'<form method="post" action="{rerun_url(run.experiment_id)}"' in page
    assert ">Re-run exactly</button>" in page
    assert f'href="/runs/new/?from={run.experiment_id}">Clone and edit…</a>' in page

    response = client.post(rerun_url(run.experiment_id))

    rerun = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302
    assert response.url == reverse("jobs:run_detail", args=[rerun.pk])
    assert rerun.experiment_id == run.experiment_id
    run_page = client.get(response.url).content.decode()
    assert f"Run {rerun.pk} re-runs experiment {run.experiment_id} exactly." in run_page
    assert f'<form method="post" action="{rerun_url(run.experiment_id)}"' in run_page


def test_rerun_button_of_a_blocked_image_explains_and_creates_nothing(client, world):
    run = submit(world)
    Image.objects.filter(pk=world.image.pk).update(status=Image.Status.BLOCKED)
    client.force_login(world.researcher_a)
    before = counts()

    response = client.post(rerun_url(run.experiment_id), follow=True)

    assert response.redirect_chain == [
        (reverse("jobs:experiment_detail", args=[run.experiment_id]), 302)
    ]
    assert (
        f"Not re-run: The image {world.image.reference} is blocked, so this experiment cannot "
        "run again exactly."
    ) in response.content.decode()
    assert counts() == before


def test_rerun_by_another_tenant_is_404_and_creates_nothing(client, world):
    run = submit(world)
    client.force_login(world.researcher_b)
    before = counts()

    assert client.post(rerun_url(run.experiment_id)).status_code == 404
    assert client.post(rerun_url(run.experiment_id + 1000)).status_code == 404
    assert api_client(world.researcher_b).post(api_rerun_url(run.experiment_id)).status_code == 404
    assert counts() == before


@pytest.mark.parametrize("persona", ["finance", "platform_admin"])
def test_rerun_by_a_reader_without_membership_is_403_and_creates_nothing(client, world, persona):
    run = submit(world)
    user = getattr(world, persona)
    client.force_login(user)
    before = counts()

    page = client.get(reverse("jobs:experiment_detail", args=[run.experiment_id]))
    web = client.post(rerun_url(run.experiment_id))
    api = api_client(user).post(api_rerun_url(run.experiment_id))

    assert page.status_code == 200
    assert "Re-run exactly" not in page.content.decode()
    assert web.status_code == 403
    assert "Only members of tenant vision can run its experiments." in web.content.decode()
    assert api.status_code == 403
    assert api.json() == {"detail": "Only members of tenant vision can run its experiments."}
    assert counts() == before


def test_rerun_is_post_only(client, world):
    run = submit(world)
    client.force_login(world.researcher_a)

    assert client.get(rerun_url(run.experiment_id)).status_code == 405
    assert Run.objects.count() == 1


def test_api_rerun_returns_the_new_run(world):
    run = submit(world)

    response = api_client(world.researcher_a2).post(api_rerun_url(run.experiment_id))

    rerun = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 201
    assert response["Location"] == f"http://testserver/api/v1/runs/{rerun.pk}/"
    data = response.json()
    assert (data["id"], data["experiment"], data["state"], data["submitted_by"]) == (
        rerun.pk,
        run.experiment_id,
        "QUEUED",
        "arthur",
    )
    assert [(e["reason"], e["message"]) for e in data["events"]] == [
        ("RERUN", f"Re-run of experiment {run.experiment_id} (exact)")
    ]


def test_api_rerun_of_a_blocked_image_is_400_naming_the_image(world):
    run = submit(world)
    Image.objects.filter(pk=world.image.pk).update(status=Image.Status.BLOCKED)

    response = api_client(world.researcher_a).post(api_rerun_url(run.experiment_id))

    assert response.status_code == 400
    assert response.json() == {
        "image": [
            f"The image {world.image.reference} is blocked, so this experiment cannot run "
            "again exactly. Clone and edit it to choose another image."
        ]
    }
    assert Run.objects.count() == 1


# --- clone and edit ------------------------------------------------------------------------------


def test_clone_prefills_the_form_and_records_where_it_came_from(client, world):
    source = submit(world, params={"lr": 0.1}).experiment
    client.force_login(world.researcher_a2)

    form_page = client.get(reverse("jobs:run_submit"), {"from": source.pk})
    form = form_page.context["form"]
    data = {name: form[name].value() for name in form.fields}
    data["params"] = '{"lr": 0.05}'
    response = client.post(reverse("jobs:run_submit"), data)

    assert f'<input type="hidden" name="cloned_from" value="{source.pk}"' in (
        form_page.content.decode()
    )
    assert response.status_code == 302
    clone = Experiment.objects.exclude(pk=source.pk).get()
    assert (clone.cloned_from_id, clone.owner, clone.params) == (
        source.pk,
        world.researcher_a2,
        {"lr": 0.05},
    )
    page = client.get(reverse("jobs:experiment_detail", args=[clone.pk])).content.decode()
    assert (
        f'<a href="{diff_url(source.pk, clone.pk).replace("&", "&amp;")}">compare with it</a>'
        in (page)
    )


def test_submit_without_clone_records_no_source(client, world):
    run = submit(world)

    assert run.experiment.cloned_from_id is None


def test_api_submit_accepts_cloned_from(world):
    source = submit(world).experiment
    body = json.loads(json.dumps(experiment_input(world).__dict__)) | {"cloned_from": source.pk}

    response = api_client(world.researcher_a).post(reverse("api:run-list"), body, format="json")

    assert response.status_code == 201
    clone = Experiment.objects.get(pk=Run.objects.get(pk=response.json()["id"]).experiment_id)
    assert clone.cloned_from_id == source.pk
    detail = api_client(world.researcher_a).get(reverse("api:experiment-detail", args=[clone.pk]))
    assert detail.json()["cloned_from"] == source.pk


def test_clone_of_another_tenants_experiment_is_rejected_and_saves_nothing(world):
    nlp_source = submit(world, user=world.researcher_b, tenant="nlp", project="llm").experiment
    # A member of both tenants can read the source, but a clone stays within its tenant.
    Membership.objects.create(user=world.researcher_a, tenant=world.nlp, role="researcher")
    before = counts()

    for user in (world.researcher_a, world.researcher_a2):
        with pytest.raises(ValidationError) as caught:
            submit(world, user=user, cloned_from=nlp_source.pk)
        assert caught.value.message_dict == {
            "cloned_from": [
                f"Experiment {nlp_source.pk} is not an experiment of tenant vision you can read."
            ]
        }
    assert counts() == before


def test_a_tampered_clone_source_on_the_form_is_shown_as_an_error(client, world):
    nlp_source = submit(world, user=world.researcher_b, tenant="nlp", project="llm").experiment
    vision_source = submit(world).experiment
    client.force_login(world.researcher_a)
    form = client.get(reverse("jobs:run_submit"), {"from": vision_source.pk}).context["form"]
    data = {name: form[name].value() for name in form.fields} | {"cloned_from": nlp_source.pk}
    before = counts()

    response = client.post(reverse("jobs:run_submit"), data)

    assert response.status_code == 400
    content = response.content.decode()
    assert '<div class="field field-invalid" data-field="cloned_from">' in content
    assert (
        f"Experiment {nlp_source.pk} is not an experiment of tenant vision you can read." in content
    )
    assert "Cloned from experiment" not in content  # the source is not readable: no notice
    assert counts() == before


def test_clone_of_a_missing_experiment_gets_the_same_answer_over_the_api(world):
    body = json.loads(json.dumps(experiment_input(world).__dict__)) | {"cloned_from": 999_999}

    response = api_client(world.researcher_a).post(reverse("api:run-list"), body, format="json")

    assert response.status_code == 400
    assert response.json() == {
        "cloned_from": ["Experiment 999999 is not an experiment of tenant vision you can read."]
    }
    assert counts() == (0, 0, 0)


def test_the_job_reporting_variables_are_reserved(world):
    for name in ("GANTRY_ATTEMPT_TOKEN", "GANTRY_API_URL"):
        with pytest.raises(ValidationError) as caught:
            submit(world, env={name: "x"})
        assert caught.value.message_dict["env"][0].startswith(f"{name} is set by Gantry itself (")
    assert counts() == (0, 0, 0)


# --- diff page ------------------------------------------------------------------------------


def two_experiments(world) -> tuple[Experiment, Experiment]:
    a = submit(
        world,
        params={"lr": 0.1, "batch_size": 256, "optimizer": {"name": "sgd", "momentum": 0.9}},
    ).experiment
    b = submit(
        world,
        user=world.researcher_a2,
        params={"lr": 0.05, "batch_size": 256, "optimizer": {"name": "sgd", "momentum": 0.95}},
        env={"GANTRY_SIM_DURATION_S": "600", "NCCL_DEBUG": "INFO"},
        code_commit=OTHER_COMMIT,
        cloned_from=a.pk,
    ).experiment
    return a, b


def test_diff_rows_show_every_field_params_and_env_key_by_key(world):
    a, b = two_experiments(world)
    version = a.gantry_version
    repository = "https://git.example.org/vision/detection.git"

    rows = experiment_diff(experiment_record(a), experiment_record(b))

    assert rows == [
        ("image", world.image.reference, world.image.reference, False),
        ("command", "python train.py --epochs 3", "python train.py --epochs 3", False),
        ("env.GANTRY_SIM_DURATION_S", "600", "600", False),
        ("env.NCCL_DEBUG", None, "INFO", True),
        ("code_repository", repository, repository, False),
        ("code_commit", COMMIT, OTHER_COMMIT, True),
        ("dataset_uri", "s3://datasets/imagenet", "s3://datasets/imagenet", False),
        ("dataset_version", "2024-01", "2024-01", False),
        ("params.batch_size", "256", "256", False),
        ("params.lr", "0.1", "0.05", True),
        ("params.optimizer.momentum", "0.9", "0.95", True),
        ("params.optimizer.name", '"sgd"', '"sgd"', False),
        ("flavor", "a100-80gb", "a100-80gb", False),
        ("nodes", "1", "1", False),
        ("gpus_per_node", "2", "2", False),
        ("topology_level", "", "", False),
        ("topology_mode", "preferred", "preferred", False),
        ("priority", "50", "50", False),
        ("max_runtime_minutes", "1440", "1440", False),
        ("max_restarts", "0", "0", False),
        ("checkpoint_dir", "", "", False),
        ("gantry_version", version, version, False),
    ]


def test_diff_page_highlights_the_differing_rows(client, world):
    a, b = two_experiments(world)
    client.force_login(world.tenant_admin_a)

    response = client.get(diff_url(a.pk, b.pk))

    assert response.status_code == 200
    content = response.content.decode()
    assert response.context["rows"] == experiment_diff(experiment_record(a), experiment_record(b))
    assert content.count('<tr class="diff-row diff-differs"') == 4
    assert content.count('<tr class="diff-row"') == 18
    assert "4 of 22 fields differ." in content
    for field in ("env.NCCL_DEBUG", "code_commit", "params.lr", "params.optimizer.momentum"):
        assert f'<tr class="diff-row diff-differs" data-field="{field}">' in content
    assert '<tr class="diff-row" data-field="params.optimizer.name">' in content
    assert " style=" not in content


def test_diff_page_can_show_only_the_differences(client, world):
    a, b = two_experiments(world)
    client.force_login(world.researcher_a)

    response = client.get(diff_url(a.pk, b.pk) + "&only=changed")

    assert [row.field for row in response.context["rows"]] == [
        "env.NCCL_DEBUG",
        "code_commit",
        "params.lr",
        "params.optimizer.momentum",
    ]


def test_experiment_page_links_to_compare(client, world):
    a, b = two_experiments(world)
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:experiment_detail", args=[b.pk])).content.decode()

    assert f'<form method="get" action="{reverse("jobs:experiment_diff")}"' in content
    assert f'<input type="hidden" name="a" value="{b.pk}">' in content
    # Picked from a list, the experiment it was cloned from chosen already.
    run_a = Run.objects.get(experiment=a)
    assert '<select name="b" id="compare-b" required>' in content
    assert (
        f'<option value="{a.pk}" selected>#{a.pk} resnet-baseline · 1 run, latest #{run_a.pk} · '
        f"{a.created_at:%Y-%m-%d} (cloned from)</option>"
    ) in content


def test_diff_across_tenants_is_404_even_for_who_may_read_both(client, world):
    vision = submit(world).experiment
    nlp = submit(world, user=world.researcher_b, tenant="nlp", project="llm").experiment

    for user in (world.platform_admin, world.finance, world.researcher_a, world.researcher_b):
        client.force_login(user)
        assert client.get(diff_url(vision.pk, nlp.pk)).status_code == 404, user
        assert client.get(diff_url(nlp.pk, vision.pk)).status_code == 404, user


@pytest.mark.parametrize(
    "query", ["", "?a=1", "?a=x&b=1", "?a=1&b=-1", "?a=1&b=99999999999999999999"]
)
def test_diff_with_missing_or_malformed_ids_is_404(client, world, query):
    submit(world)
    client.force_login(world.researcher_a)

    assert client.get(reverse("jobs:experiment_diff") + query).status_code == 404


def test_diff_of_another_tenants_pair_is_404(client, world):
    a, b = two_experiments(world)
    client.force_login(world.researcher_b)

    assert client.get(diff_url(a.pk, b.pk)).status_code == 404


def test_diff_page_needs_login(client, world):
    a, b = two_experiments(world)

    response = client.get(diff_url(a.pk, b.pk))

    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


# --- what the backend receives ------------------------------------------------------------------


def test_a_submit_issues_one_token_stored_as_a_digest_and_the_stored_spec_is_redacted(
    world, settings
):
    settings.GANTRY_PUBLIC_URL = "https://gantry.example.org"
    attempt = submitted_attempt(world)

    spec = job_spec_for(attempt_get_for_work(attempt.pk))

    # The spec built from the record carries no token: only the submit's copy does.
    assert spec.attempt_token == ""
    assert spec.env == {"GANTRY_SIM_DURATION_S": "600"}
    assert spec.api_url == "https://gantry.example.org/api/v1"
    assert json.loads(attempt.rendered_spec)["env"] == {
        "GANTRY_SIM_DURATION_S": "600",
        "GANTRY_API_URL": "https://gantry.example.org/api/v1",
        "GANTRY_IMAGE": world.image.reference,
        "GANTRY_ATTEMPT_TOKEN": "<redacted>",
    }
    assert "gat_" not in attempt.rendered_spec
    digests = list(AttemptToken.objects.filter(attempt=attempt).values_list("digest", flat=True))
    assert len(digests) == 1
    assert re.fullmatch(r"[0-9a-f]{64}", digests[0])
    token = token_of(attempt)
    assert token not in repr(replace(spec, attempt_token=token))


# --- the runtime report -----------------------------------------------------------------------


@pytest.fixture
def attempts(world) -> tuple[Attempt, Attempt]:
    a = submitted_attempt(world)
    b = submitted_attempt(world, name="second")
    return a, b


def test_a_job_reports_its_runtime_with_its_token(world, attempts):
    a, b = attempts

    response = job_client(token_of(a)).post(REPORT_URL, FULL_REPORT, format="json")

    assert response.status_code == 200
    a.refresh_from_db()
    expected_env = {k: v for k, v in FULL_REPORT.items() if k not in ("node_list", "gpu_uuids")}
    assert a.runtime_env == expected_env
    assert a.node_list == ["gpu-node-07", "gpu-node-08"]
    assert a.gpu_uuids == FULL_REPORT["gpu_uuids"]
    assert a.runtime_reported_at is not None
    assert response.json() == {
        "attempt": a.pk,
        "run": a.run_id,
        "changed": True,
        "runtime_env": expected_env,
        "node_list": FULL_REPORT["node_list"],
        "gpu_uuids": FULL_REPORT["gpu_uuids"],
        "runtime_reported_at": response.json()["runtime_reported_at"],
    }
    event = RunEvent.objects.get(run=a.run, reason="RUNTIME_REPORTED")
    assert (event.attempt_id, event.from_state, event.to_state, event.actor) == (
        a.pk,
        "PENDING",
        "PENDING",
        None,
    )
    assert event.message == (
        "Attempt 1 reported Driver 550.54.15, CUDA 12.4, cuDNN 9.1.0, NCCL 2.21.5, "
        "Python 3.11.9, torch 2.4.0, transformers 4.44.2 on 2 nodes with 2 GPUs"
    )
    b.refresh_from_db()
    assert (b.runtime_env, b.node_list, b.gpu_uuids, b.runtime_reported_at) == ({}, [], [], None)


def test_reporting_the_same_again_changes_nothing_and_a_new_report_replaces_it(world, attempts):
    a, _ = attempts
    client = job_client(token_of(a))
    client.post(REPORT_URL, FULL_REPORT, format="json")
    a.refresh_from_db()
    first_at = a.runtime_reported_at

    again = client.post(REPORT_URL, FULL_REPORT, format="json")
    a.refresh_from_db()
    assert again.status_code == 200
    assert again.json()["changed"] is False
    assert a.runtime_reported_at == first_at
    assert RunEvent.objects.filter(reason="RUNTIME_REPORTED").count() == 1

    newer = client.post(
        REPORT_URL, {"driver_version": "555.42.02", "cuda_version": "12.5"}, format="json"
    )
    a.refresh_from_db()
    assert newer.json()["changed"] is True
    assert a.runtime_env == {"driver_version": "555.42.02", "cuda_version": "12.5"}
    assert a.node_list == ["gpu-node-07", "gpu-node-08"]  # not in the new report: kept
    assert a.runtime_reported_at > first_at
    assert RunEvent.objects.filter(reason="RUNTIME_REPORTED").count() == 2


def test_a_token_can_only_write_its_own_attempt(world, attempts):
    a, b = attempts
    mac_of_a = token_of(a).partition(".")[2]

    forged = job_client(f"gat_{b.pk}.{mac_of_a}").post(REPORT_URL, FULL_REPORT, format="json")
    own = job_client(token_of(b)).post(REPORT_URL, {"cuda_version": "12.4"}, format="json")

    assert forged.status_code == 401
    assert own.json()["attempt"] == b.pk
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.runtime_env == {}
    assert b.runtime_env == {"cuda_version": "12.4"}


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Attempt gat_1.not-a-signature",
        "Attempt garbage",
        "Attempt",
        "Attempt a b",
        "Attempt gat_999999.O0-XIyl_M4dGVRCHGfg1kxGEyxALFl8LuVxG80S_0oE",
        "Attempt gat_99999999999999999999.O0-XIyl_M4dGVRCHGfg1kxGEyxALFl8LuVxG80S_0oE",
        "Attempt gat_9223372036854775807.O0-XIyl_M4dGVRCHGfg1kxGEyxALFl8LuVxG80S_0oE",
    ],
    ids=[
        "none",
        "bad-signature",
        "garbage",
        "no-token",
        "two-tokens",
        "foreign",
        "beyond-bigint",
        "largest-bigint",
    ],
)
def test_no_or_an_invalid_token_is_401_and_changes_nothing(world, attempts, authorization):
    client = APIClient()
    if authorization is not None:
        client.credentials(HTTP_AUTHORIZATION=authorization)

    response = client.post(REPORT_URL, FULL_REPORT, format="json")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Attempt realm="api"'
    assert not Attempt.objects.exclude(runtime_env={}).exists()


def test_a_users_api_token_or_session_cannot_report(client, world, attempts):
    client.force_login(world.researcher_a)

    bearer = api_client(world.researcher_a).post(REPORT_URL, FULL_REPORT, format="json")
    session = client.post(REPORT_URL, FULL_REPORT, content_type="application/json")

    assert bearer.status_code == session.status_code == 401
    assert not Attempt.objects.exclude(runtime_env={}).exists()


def test_a_token_does_not_depend_on_the_secret_key(world, attempts, settings):
    a, _ = attempts
    token = token_of(a)
    settings.SECRET_KEY = "a-new-secret-key-after-rotation"

    response = job_client(token).post(REPORT_URL, {"cuda_version": "12.4"}, format="json")

    assert response.status_code == 200
    assert response.json()["attempt"] == a.pk


def test_a_token_made_with_the_old_hmac_scheme_is_refused(world, attempts, settings):
    # Given the token the old scheme derived from the secret key and the attempt id
    a, _ = attempts
    token_of(a)  # the attempt has a genuine token too
    mac = hmac.new(
        settings.SECRET_KEY.encode(), f"gantry-attempt:{a.pk}".encode(), hashlib.sha256
    ).digest()
    forged = f"gat_{a.pk}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"

    # When a report is posted with it
    response = job_client(forged).post(REPORT_URL, FULL_REPORT, format="json")

    # Then it is refused and nothing is recorded
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid attempt token."}
    a.refresh_from_db()
    assert (a.runtime_env, a.runtime_reported_at) == ({}, None)
    assert not RunEvent.objects.filter(reason="RUNTIME_REPORTED").exists()


def test_a_truncated_or_extended_token_is_refused(world, attempts):
    a, _ = attempts
    token = token_of(a)

    for bad in (token[:-1], token[:20], token + "A", token.upper()):
        response = job_client(bad).post(REPORT_URL, FULL_REPORT, format="json")
        assert (response.status_code, response.json()) == (
            401,
            {"detail": "Invalid attempt token."},
        )
    a.refresh_from_db()
    assert a.runtime_env == {}


@pytest.mark.parametrize(
    ("report", "errors"),
    [
        ({"gpu_model": "H100"}, {"gpu_model": ["Unknown field."]}),
        ({}, {"non_field_errors": ["The report names no field."]}),
        (
            {"cuda_version": "1" * 201},
            {"cuda_version": ["Ensure this field has no more than 200 characters."]},
        ),
        (
            {"node_list": ["n"] * 1025},
            {"node_list": ["Ensure this field has no more than 1024 elements."]},
        ),
        ({"gpu_uuids": "GPU-1"}, {"gpu_uuids": ['Expected a list of items but got type "str".']}),
        (
            {"framework": {f"lib{i}": "1" for i in range(65)}},
            {"framework": ["At most 64 frameworks."]},
        ),
        ({"framework": {"torch": 2.4}}, {"framework": {"torch": ["Not a valid string."]}}),
        ({"node_list": [1]}, {"node_list": {"0": ["Not a valid string."]}}),
        (["cuda_version"], None),
    ],
    ids=[
        "unknown",
        "empty",
        "long-text",
        "long-list",
        "not-a-list",
        "many-frameworks",
        "number",
        "number-in-list",
        "not-an-object",
    ],
)
def test_bad_reports_are_400_and_store_nothing(world, attempts, report, errors):
    a, _ = attempts

    response = job_client(token_of(a)).post(REPORT_URL, report, format="json")

    assert response.status_code == 400
    if errors is not None:
        assert response.json() == errors
    a.refresh_from_db()
    assert (a.runtime_env, a.runtime_reported_at) == ({}, None)


def test_a_body_over_64_kib_is_413_unread(world, attempts):
    a, _ = attempts
    report = {"node_list": [f"{i:0200d}" for i in range(400)]}  # valid items, 81 KB in all
    assert len(json.dumps(report)) > 64 * 1024

    response = job_client(token_of(a)).post(REPORT_URL, report, format="json")

    assert response.status_code == 413
    assert response.json() == {"detail": "The body is larger than 64 KiB."}
    a.refresh_from_db()
    assert a.node_list == []


@pytest.mark.parametrize("state", ENDED_ATTEMPT_STATES)
def test_a_report_after_the_attempt_ended_is_refused_with_the_reason(world, attempts, state):
    # Given a job's token, and its attempt ended a moment ago
    a, _ = attempts
    client = job_client(token_of(a))
    Attempt.objects.filter(pk=a.pk).update(state=state, finished_at=timezone.now())

    # When the job reports
    response = client.post(REPORT_URL, {"cuda_version": "12.4"}, format="json")

    # Then its token is dead, it is told why, and nothing is recorded
    label = AttemptState(state).label.lower()
    assert response.status_code == 401
    assert response.json() == {
        "detail": f"Attempt 1 of run {a.run_id} has ended ({label}): its token is no longer valid."
    }
    a.refresh_from_db()
    assert (a.runtime_env, a.runtime_reported_at) == ({}, None)


def test_a_token_of_an_attempt_a_later_attempt_replaced_is_refused(world, attempts):
    # Given an attempt still marked live whose run already has a next attempt
    a, _ = attempts
    client = job_client(token_of(a))
    Attempt.objects.create(run=a.run, number=2, cluster=a.cluster)

    response = client.post(REPORT_URL, {"cuda_version": "12.4"}, format="json")

    assert response.status_code == 401
    assert response.json() == {
        "detail": f"Attempt 1 of run {a.run_id} was replaced by a later attempt: its token is "
        "no longer valid."
    }
    a.refresh_from_db()
    assert a.runtime_env == {}


def test_a_report_that_races_the_end_of_its_attempt_is_refused_by_the_service(world, attempts):
    a, _ = attempts
    Attempt.objects.filter(pk=a.pk).update(state="LOST", finished_at=timezone.now())

    with pytest.raises(ValidationError) as refused:
        attempt_report_runtime(attempt=a, report={"cuda_version": "12.4"})

    assert refused.value.message_dict == {
        "state": [f"Attempt 1 of run {a.run_id} has ended (lost): its token is no longer valid."]
    }
    a.refresh_from_db()
    assert a.runtime_env == {}


def test_the_runtime_report_endpoint_is_post_only(world, attempts):
    a, _ = attempts

    assert job_client(token_of(a)).get(REPORT_URL).status_code == 405


# --- the record on the pages ----------------------------------------------------------------


def test_experiment_page_shows_each_attempts_spec_and_runtime(client, world, attempts):
    a, _ = attempts
    job_client(token_of(a)).post(REPORT_URL, FULL_REPORT, format="json")
    client.force_login(world.researcher_a2)

    content = client.get(reverse("jobs:experiment_detail", args=[a.run.experiment_id]))
    page = content.content.decode()

    assert content.status_code == 200
    assert f'<a href="/runs/{a.run_id}/">Run #{a.run_id}</a>' in page
    assert "Backend spec of attempt 1 (sim-1)" in page
    assert "&quot;GANTRY_ATTEMPT_TOKEN&quot;: &quot;&lt;redacted&gt;&quot;" in page
    for label, value in [
        ("Driver", "550.54.15"),
        ("CUDA", "12.4"),
        ("cuDNN", "9.1.0"),
        ("NCCL", "2.21.5"),
        ("Python", "3.11.9"),
        ("Frameworks", "torch 2.4.0, transformers 4.44.2"),
        ("Host", "gpu-node-07"),
        ("Kernel", "5.15.0-105-generic"),
    ]:
        assert f'<dt>{label}</dt><dd class="mono">{value}</dd>' in page
    assert '<dt>Nodes</dt><dd class="mono">gpu-node-07, gpu-node-08</dd>' in page
    assert "<li>GPU-3b1e5f0c-8d3a-4b7e-9f60-0a1b2c3d4e5f</li>" in page
    run_page = client.get(reverse("jobs:run_detail", args=[a.run_id])).content.decode()
    assert '<dt>Driver</dt><dd class="mono">550.54.15</dd>' in run_page
    assert "not yet: the job reports it with its attempt token" not in run_page


def test_runtime_values_are_escaped(client, world, attempts):
    a, _ = attempts
    job_client(token_of(a)).post(
        REPORT_URL, {"hostname": "<script>alert(1)</script>"}, format="json"
    )
    client.force_login(world.researcher_a)

    for url in (
        reverse("jobs:experiment_detail", args=[a.run.experiment_id]),
        reverse("jobs:run_detail", args=[a.run_id]),
    ):
        page = client.get(url).content.decode()
        assert "<script>alert" not in page, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, url


def test_experiment_page_uses_a_fixed_number_of_queries(
    client, world, django_assert_max_num_queries
):
    run = submit(world)
    client.force_login(world.researcher_a)
    for _ in range(3):
        run_rerun(experiment=run.experiment, user=world.researcher_a)
    admission_run_cycle()
    for attempt in Attempt.objects.all():
        attempt_submit(attempt_id=attempt.pk)
    assert Attempt.objects.count() == 4
    url = reverse("jobs:experiment_detail", args=[run.experiment_id])

    # The runs table is paginated: one COUNT more than an unpaginated list; the experiments
    # to compare with, with their runs, are one query more.
    with django_assert_max_num_queries(11):
        response = client.get(url)

    assert response.status_code == 200
    assert response.content.decode().count('<div class="attempt-record">') == 4


# --- the token is never stored -----------------------------------------------------------------


def test_the_token_appears_nowhere_in_the_database_or_the_logs(client, world, caplog):
    caplog.set_level(logging.DEBUG)
    attempt = submitted_attempt(world)
    token = token_of(attempt)
    cluster_sync(cluster=world.cluster)
    job_client(token).post(REPORT_URL, FULL_REPORT, format="json")
    run_rerun(experiment=attempt.run.experiment, user=world.researcher_a)
    client.force_login(world.researcher_a)
    pages = [
        client.get(reverse("jobs:run_detail", args=[attempt.run_id])).content.decode(),
        client.get(
            reverse("jobs:experiment_detail", args=[attempt.run.experiment_id])
        ).content.decode(),
        json.dumps(
            api_client(world.researcher_a)
            .get(reverse("api:run-detail", args=[attempt.run_id]))
            .json()
        ),
    ]
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)

    attempt.refresh_from_db()
    assert attempt.runtime_env["driver_version"] == "550.54.15"  # the flow did happen
    assert token not in attempt.rendered_spec
    assert '"GANTRY_ATTEMPT_TOKEN": "<redacted>"' in attempt.rendered_spec
    assert token not in dump.getvalue()
    mac = token.partition(".")[2]
    assert mac not in dump.getvalue()
    assert mac not in caplog.text
    assert mac not in run_logs(run=attempt.run)
    for page in pages:
        assert mac not in page
