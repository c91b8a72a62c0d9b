"""Issue 21.3: what a tenant reads names no other tenant, project, user or run; platform
admins read the full text."""

import importlib

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from jobs.models import Attempt, Run, RunEvent, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.submission import run_submit
from tenants.models import Quota
from tenants.services.tokens import api_token_create
from tests.conftest import experiment_input, reserved_ending

NEUTRAL = (
    "a tenant within its guarantee reclaimed 8 h100-80gb GPUs on sim-1; this run had borrowed 8"
)


@pytest.fixture
def preempted(world, django_capture_on_commit_callbacks):
    """nlp borrows 8 H100 GPUs beyond its guarantee; vision's run within its guarantee
    reclaims them. Returns (the preempted nlp run, vision's reclaiming run)."""
    Quota.objects.filter(tenant=world.nlp, flavor=world.h100).update(borrow_limit_gpus=8)
    h100 = {"tenant": "nlp", "project": "llm", "flavor": "h100-80gb", "gpus_per_node": 8}
    with django_capture_on_commit_callbacks(execute=False):
        run_submit(user=world.researcher_b, data=experiment_input(world, **h100))
        lent = run_submit(user=world.researcher_b, data=experiment_input(world, **h100))
        admission_run_cycle()
        lent.refresh_from_db()
        assert (lent.state, lent.borrowed) == (RunState.ADMITTED, True)
        reclaimer = run_submit(
            user=world.researcher_a,
            data=experiment_input(world, flavor="h100-80gb", gpus_per_node=8),
        )
        summary = admission_run_cycle()
    assert (summary.admitted, summary.preempted) == (1, 1)
    return lent, reclaimer


def test_the_preemption_event_is_neutral_and_keeps_the_names_for_admins(preempted):
    lent, reclaimer = preempted
    event = RunEvent.objects.get(run=lent, to_state=RunState.PREEMPTED)
    assert event.message == NEUTRAL
    assert event.admin_detail == (
        f"tenant vision reclaimed 8 h100-80gb GPUs of its guarantee on sim-1 for run "
        f"{reclaimer.pk}; this run had borrowed 8"
    )


def _hints(reclaimer: Run) -> tuple[str, ...]:
    """Every name of the reclaiming side a tenant of nlp must not read."""
    return ("vision", "Vision Lab", "detection", "alice", f"run {reclaimer.pk}")


@pytest.mark.parametrize("page", ["jobs:run_detail", "jobs:run_live"])
def test_the_run_page_shows_the_owner_no_other_tenant(world, client, preempted, page):
    lent, reclaimer = preempted
    client.force_login(world.researcher_b)
    response = client.get(reverse(page, args=[lent.pk]))
    assert response.status_code == 200
    text = response.content.decode()
    assert NEUTRAL in text
    assert [hint for hint in _hints(reclaimer) if hint in text] == []


def test_the_run_page_shows_a_platform_admin_who_reclaimed(world, client, preempted):
    lent, reclaimer = preempted
    client.force_login(world.platform_admin)
    text = client.get(reverse("jobs:run_live", args=[lent.pk])).content.decode()
    assert (
        f"tenant vision reclaimed 8 h100-80gb GPUs of its guarantee on sim-1 for run {reclaimer.pk}"
        in text
    )


def test_finance_reads_the_neutral_text_too(world, client, preempted):
    lent, reclaimer = preempted
    client.force_login(world.finance)
    text = client.get(reverse("jobs:run_live", args=[lent.pk])).content.decode()
    assert NEUTRAL in text
    assert f"run {reclaimer.pk}" not in text


def _api_events(user, run: Run) -> list[dict]:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    response = client.get(reverse("api:run-detail", args=[run.pk]))
    assert response.status_code == 200
    return response.json()["events"]


def test_the_api_gives_the_owner_the_neutral_event_and_an_admin_the_full_one(world, preempted):
    lent, reclaimer = preempted
    owner = [
        e["message"] for e in _api_events(world.researcher_b, lent) if e["to_state"] == "PREEMPTED"
    ]
    admin = [
        e["message"]
        for e in _api_events(world.platform_admin, lent)
        if e["to_state"] == "PREEMPTED"
    ]
    assert owner == [NEUTRAL]
    assert admin == [
        f"tenant vision reclaimed 8 h100-80gb GPUs of its guarantee on sim-1 for run "
        f"{reclaimer.pk}; this run had borrowed 8"
    ]


def test_the_requeued_run_waits_with_a_reason_about_its_own_tenant(world, preempted):
    lent, _ = preempted
    admission_run_cycle()
    lent.refresh_from_db()
    assert (lent.state, lent.wait_reason) == (RunState.QUEUED, "NO_IDLE")
    assert lent.wait_message == (
        "tenant nlp uses 8 of 8 guaranteed h100-80gb GPUs; to borrow idle ones, this run "
        "needs 8 h100-80gb GPUs on one node; 0 h100-80gb GPUs are free, at most 0 on any node "
        "(sim-1-h100-80gb-00: 0, sim-1-h100-80gb-01: 0)"
        + reserved_ending([holder_of("sim-1-h100-80gb-00")], ["sim-1-h100-80gb-00"])
    )


def holder_of(node: str) -> Run:
    """The run holding ``node`` (placed there by admission)."""
    (attempt,) = [
        a for a in Attempt.objects.filter(run__state=RunState.ADMITTED) if node in a.placement
    ]
    return attempt.run


def test_events_stored_before_the_fix_are_anonymised_by_the_migration(world):
    from django.apps import apps

    migration = importlib.import_module("jobs.migrations.0010_run_event_admin_detail")
    run = run_submit(
        user=world.researcher_b, data=experiment_input(world, tenant="nlp", project="llm")
    )
    named = (
        "tenant vision reclaimed 8 a100-80gb GPUs of its guarantee on sim-east for run 41; "
        "this run had borrowed 8"
    )
    old = RunEvent.objects.create(run=run, to_state="PREEMPTED", reason="PREEMPTED", message=named)
    other = RunEvent.objects.create(run=run, to_state="PREEMPTED", reason="PREEMPTED", message="x")
    migration.anonymise_preemptions(apps, None)
    old.refresh_from_db()
    other.refresh_from_db()
    assert (old.message, old.admin_detail) == (
        "a tenant within its guarantee reclaimed 8 a100-80gb GPUs on sim-east; this run had "
        "borrowed 8",
        named,
    )
    assert (other.message, other.admin_detail) == ("x", "")
