"""A replayed submission key, on every submit path: the form (plain and from a template), the
re-run button, the API (runs, re-runs, spec files with and without a template). Each answers
with the run the first request queued and records nothing new; the key is looked up in one
place only (``jobs.services.submission.submission_once``)."""

import ast
import uuid
from pathlib import Path

import pytest
from django.urls import reverse

import jobs
from jobs.models import Experiment, Run, RunEvent
from jobs.services.submission import run_record, run_submit, submission_once
from jobs.services.templates import template_submit
from tenants.models import Quota
from tests.conftest import experiment_input
from tests.jobs.test_api import body, client_for
from tests.jobs.test_spec import FULL_SPEC, SPECS
from tests.jobs.test_templates import _template_post, make_template, template_spec
from tests.jobs.test_web import form_data

pytestmark = pytest.mark.django_db

SUBMIT = reverse("jobs:run_submit")
RUNS = reverse("api:run-list")


def counts() -> tuple[int, int, int]:
    return Run.objects.count(), Experiment.objects.count(), RunEvent.objects.count()


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- the browser ----------------------------------------------------------------------------


def test_the_submit_form_posted_twice_with_one_key_queues_one_run(client, world):
    client.force_login(world.researcher_a)
    key = str(uuid.uuid4())

    first = client.post(SUBMIT, form_data(world, submission_key=key), follow=True)
    run = Run.objects.get()
    again = client.post(SUBMIT, form_data(world, submission_key=key, name="changed"), follow=True)

    assert first.redirect_chain == [(reverse("jobs:run_detail", args=[run.pk]), 302)]
    assert messages_of(first) == [f"Run {run.pk} submitted."]
    assert again.redirect_chain == [(reverse("jobs:run_detail", args=[run.pk]), 302)]
    assert messages_of(again) == [
        f"This form was already submitted as run {run.pk}: nothing new was queued. "
        "Open the submit page again to queue another run."
    ]
    assert counts() == (1, 1, 1)
    assert Experiment.objects.get().name == "resnet-web"
    assert str(run.submission_key) == key


def test_the_submit_form_from_a_template_posted_twice_queues_one_run(client, world):
    template = make_template(world)
    client.force_login(world.researcher_a)
    key = str(uuid.uuid4())

    client.post(SUBMIT, _template_post(world, template, submission_key=key), follow=True)
    run = Run.objects.get()
    # The template now refuses what it accepted: the replay still answers with the first run
    template.ranges = {"resources.gpus_per_node": {"min": 4, "max": 4}}
    template.save(update_fields=["ranges"])
    again = client.post(SUBMIT, _template_post(world, template, submission_key=key), follow=True)

    assert again.redirect_chain == [(reverse("jobs:run_detail", args=[run.pk]), 302)]
    assert messages_of(again) == [
        f"This form was already submitted as run {run.pk}: nothing new was queued. "
        "Open the submit page again to queue another run."
    ]
    assert counts() == (1, 1, 1)
    assert run.experiment.template_id == template.pk


def test_the_rerun_button_posted_twice_with_one_key_queues_one_rerun(client, world):
    first = run_submit(user=world.researcher_a, data=experiment_input(world))
    client.force_login(world.researcher_a)
    url = reverse("jobs:experiment_rerun", args=[first.experiment_id])
    key = str(uuid.uuid4())

    done = client.post(url, {"submission_key": key}, follow=True)
    rerun = Run.objects.exclude(pk=first.pk).get()
    again = client.post(url, {"submission_key": key}, follow=True)

    assert messages_of(done) == [
        f"Run {rerun.pk} re-runs experiment {first.experiment_id} exactly."
    ]
    assert again.redirect_chain == [(reverse("jobs:run_detail", args=[rerun.pk]), 302)]
    assert messages_of(again) == [f"Already re-run as run {rerun.pk}: nothing new was queued."]
    assert counts() == (2, 1, 2)


# --- the API ----------------------------------------------------------------------------------


def test_the_api_submit_with_one_idempotency_key_queues_one_run(world):
    client = client_for(world.researcher_a)
    key = str(uuid.uuid4())

    first = client.post(RUNS, body(world), format="json", HTTP_IDEMPOTENCY_KEY=key)
    again = client.post(RUNS, body(world, name="changed"), format="json", HTTP_IDEMPOTENCY_KEY=key)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"] == Run.objects.get().pk
    assert again.headers["Location"] == first.headers["Location"]
    assert counts() == (1, 1, 1)
    assert str(Run.objects.get().submission_key) == key


def test_the_api_submit_without_a_key_queues_every_time(world):
    client = client_for(world.researcher_a)

    client.post(RUNS, body(world), format="json")
    client.post(RUNS, body(world), format="json")

    assert counts() == (2, 2, 2)
    assert list(Run.objects.values_list("submission_key", flat=True)) == [None, None]


def test_an_idempotency_key_that_is_not_a_uuid_is_a_400_and_queues_nothing(world):
    client = client_for(world.researcher_a)

    response = client.post(RUNS, body(world), format="json", HTTP_IDEMPOTENCY_KEY="twice")

    assert response.status_code == 400
    assert response.json() == {"Idempotency-Key": ["Idempotency-Key must be a UUID."]}
    assert counts() == (0, 0, 0)


def test_idempotency_keys_are_per_user_on_the_api(world):
    key = str(uuid.uuid4())

    alice = client_for(world.researcher_a).post(
        RUNS, body(world), format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    arthur = client_for(world.researcher_a2).post(
        RUNS, body(world), format="json", HTTP_IDEMPOTENCY_KEY=key
    )

    assert alice.json()["id"] != arthur.json()["id"]
    assert counts() == (2, 2, 2)


def test_the_api_rerun_with_one_idempotency_key_queues_one_rerun(world):
    first = run_submit(user=world.researcher_a, data=experiment_input(world))
    client = client_for(world.researcher_a)
    url = reverse("api:experiment-rerun", args=[first.experiment_id])
    key = str(uuid.uuid4())

    rerun = client.post(url, HTTP_IDEMPOTENCY_KEY=key)
    again = client.post(url, HTTP_IDEMPOTENCY_KEY=key)

    assert (rerun.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == rerun.json()["id"] != first.pk
    assert counts() == (2, 1, 2)


def test_a_spec_file_posted_twice_with_one_key_queues_one_run(world):
    client = client_for(world.researcher_a)
    key = str(uuid.uuid4())

    first = client.post(SPECS, FULL_SPEC, format="json", HTTP_IDEMPOTENCY_KEY=key)
    again = client.post(SPECS, FULL_SPEC, format="json", HTTP_IDEMPOTENCY_KEY=key)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"] == Run.objects.get().pk
    assert counts() == (1, 1, 1)


def test_a_spec_file_naming_a_template_posted_twice_with_one_key_queues_one_run(world):
    template = make_template(world)
    client = client_for(world.researcher_a)
    key = str(uuid.uuid4())

    first = client.post(SPECS, template_spec(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    template.delete()  # the replay is answered before the template is looked up
    again = client.post(SPECS, template_spec(), format="json", HTTP_IDEMPOTENCY_KEY=key)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"]
    assert counts() == (1, 1, 1)


# --- the service ------------------------------------------------------------------------------


def test_a_template_submit_replayed_after_the_quota_went_returns_the_first_run(world):
    template = make_template(world)
    values = {"tenant": "vision", "project": "detection", "name": "from-template"}
    key = uuid.uuid4()
    first = template_submit(
        user=world.researcher_a, template=template, values=values, submission_key=key
    )
    Quota.objects.filter(tenant=world.vision).delete()  # a new submit is now refused

    again = template_submit(
        user=world.researcher_a, template=template, values=values, submission_key=key
    )

    assert again == first
    assert counts() == (1, 1, 1)


def test_submission_once_says_whether_it_replayed_and_creates_only_the_first_time(world):
    key = uuid.uuid4()
    created = []

    def create() -> Run:
        created.append(1)
        return run_record(
            user=world.researcher_a, data=experiment_input(world), submission_key=key, template=None
        )

    first = submission_once(user=world.researcher_a, submission_key=key, create=create)
    second = submission_once(user=world.researcher_a, submission_key=key, create=create)

    assert (first.replayed, second.replayed) == (False, True)
    assert second.run == first.run
    assert created == [1]


def _lookups(source: str) -> list[str]:
    """The functions that call ``run_submitted_with``, in order of the calls."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and (
                    getattr(node.func, "id", None) == "run_submitted_with"
                    or getattr(node.func, "attr", None) == "run_submitted_with"
                ):
                    found.append(function.name)
    return found


def test_only_submission_once_looks_a_submission_key_up():
    jobs_dir = Path(jobs.__file__).parent
    lookups = {
        str(path.relative_to(jobs_dir.parent)): found
        for path in sorted(jobs_dir.rglob("*.py"))
        if "migrations" not in path.parts and (found := _lookups(path.read_text()))
    }

    # Before and after the insert that may lose a race: both in the one function
    assert lookups == {"jobs/services/submission.py": ["submission_once", "submission_once"]}


def test_the_lookup_finder_sees_a_view_that_checks_the_key_itself():
    view = (
        "def run_submit(request):\n"
        "    earlier = runs.run_submitted_with(user=u, submission_key=k)\n"
    )

    assert _lookups(view) == ["run_submit"]
