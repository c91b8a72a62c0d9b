"""Restarting a running run without one of its nodes (issue 36, point 4): the service, the
run page's one-click form, the API action; each refusal changes nothing.

The run runs on the world's simulated cluster (4 nodes × 8 A100); its job is taken off as
the sync takes it off, and the next admission cycle places it again."""

import pytest
from django.contrib.auth.models import AnonymousUser
from django.contrib.messages import get_messages
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.template.loader import render_to_string
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import ClusterNode
from jobs.models import Attempt, AttemptState, Checkpoint, Run, RunEvent, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_sync import attempt_cancel
from jobs.services.lifecycle import run_cancel
from jobs.services.restart import run_restart_excluding
from tenants.models import AuditEvent, Quota
from tenants.services.tokens import api_token_create
from tests.jobs.test_failure_attribution import running

OTHER_NODES = ["sim-1-a100-80gb-01", "sim-1-a100-80gb-02", "sim-1-a100-80gb-03"]


@pytest.fixture
def attempt(world) -> Attempt:
    """Alice's run of 1 node × 2 GPUs, running on sim-1-a100-80gb-00, its checkpoint at step
    500 saved."""
    attempt = running(world, nodes=1, gpus_per_node=2)
    assert attempt.node_list == ["sim-1-a100-80gb-00"]
    Checkpoint.objects.create(
        run=attempt.run, attempt=attempt, step=500, uri="s3://ck/500", saved_at=timezone.now()
    )
    return attempt


def state(run: Run) -> tuple:
    """Everything a refusal must leave as it was."""
    run = Run.objects.get(pk=run.pk)
    return (
        run.state,
        run.excluded_nodes,
        run.restarts,
        run.platform_retries,
        run.cancel_requested_at,
        list(run.attempts.values_list("number", "state", "cause_class", "cause_evidence")),
        RunEvent.objects.filter(run=run).count(),
        AuditEvent.objects.count(),
    )


def test_the_run_resumes_from_its_checkpoint_without_the_node(world, attempt):
    run = attempt.run
    node = "sim-1-a100-80gb-00"

    restarted = run_restart_excluding(run=run, node=node, actor=world.researcher_a)

    assert (restarted.state, restarted.excluded_nodes) == (RunState.PREEMPTED, [node])
    event = RunEvent.objects.filter(run=run).order_by("-id").first()
    assert (event.to_state, event.reason, event.actor, event.message) == (
        RunState.PREEMPTED,
        "PREEMPTED",
        world.researcher_a,
        "Restarted by alice without node sim-1-a100-80gb-00: it leaves its nodes and resumes "
        "from checkpoint step 500 on other nodes, not counted against your restarts",
    )
    audit = AuditEvent.objects.get(action="run.restart_excluding")
    assert (audit.actor, audit.tenant, audit.target, audit.before, audit.after) == (
        world.researcher_a,
        world.vision,
        f"run {run.pk}",
        {"state": "RUNNING", "excluded_nodes": []},
        {"state": "PREEMPTED", "excluded_nodes": [node], "node": node},
    )
    attempt.refresh_from_db()
    assert (attempt.cause_class, attempt.cause_evidence["signal"]) == (
        "platform",
        "restart_excluding",
    )
    assert attempt.cause_evidence["detail"] == "restarted by alice without sim-1-a100-80gb-00"

    attempt_cancel(attempt_id=attempt.pk)  # the job is taken off: back in the queue
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state, run.restarts, run.platform_retries) == (
        RunState.QUEUED,
        AttemptState.PREEMPTED,
        0,
        0,
    )
    admission_run_cycle()
    second = run.attempts.get(number=2)
    assert node not in second.placement and len(second.placement) == 1
    assert second.resumed_from.step == 500


def test_a_tenant_admin_and_a_platform_admin_may_too(world):
    for actor in (world.tenant_admin_a, world.platform_admin):
        attempt = running(world, nodes=1, gpus_per_node=8)
        node = attempt.node_list[0]
        run = run_restart_excluding(run=attempt.run, node=node, actor=actor)
        assert (run.state, run.excluded_nodes) == (RunState.PREEMPTED, [node])
        attempt_cancel(attempt_id=attempt.pk)  # its job leaves the node


def test_who_may_not_cancel_may_not_restart_and_nothing_changes(world, attempt):
    before = state(attempt.run)
    for outsider in (world.finance, world.researcher_a2, world.researcher_b):
        with pytest.raises(PermissionDenied):
            run_restart_excluding(run=attempt.run, node="sim-1-a100-80gb-00", actor=outsider)
    assert state(attempt.run) == before


def refused(world, run: Run, node: str) -> str:
    before = state(run)
    with pytest.raises(ValidationError) as error:
        run_restart_excluding(run=run, node=node, actor=world.researcher_a)
    assert state(run) == before
    return " ".join(error.value.messages)


def test_a_node_the_run_is_not_on_is_refused(world, attempt):
    assert refused(world, attempt.run, "sim-1-a100-80gb-02") == (
        f"sim-1-a100-80gb-02 is not one of the nodes run {attempt.run_id} runs on "
        "(sim-1-a100-80gb-00)."
    )
    assert refused(world, attempt.run, "") == (
        f"That is not one of the nodes run {attempt.run_id} runs on (sim-1-a100-80gb-00)."
    )


def test_a_node_excluded_already_is_refused(world, attempt):
    Run.objects.filter(pk=attempt.run_id).update(excluded_nodes=["sim-1-a100-80gb-00"])
    assert refused(world, attempt.run, "sim-1-a100-80gb-00") == (
        f"sim-1-a100-80gb-00 is excluded from run {attempt.run_id} already."
    )


def test_a_run_that_is_not_on_its_nodes_is_refused(world, attempt):
    run = attempt.run
    run_cancel(run=run, actor=world.researcher_a)
    assert refused(world, run, "sim-1-a100-80gb-00") == (
        f"Run {run.pk} is not running on a cluster (a cancel was requested): only a run on "
        "its nodes can be restarted without one of them."
    )
    attempt_cancel(attempt_id=attempt.pk)
    assert Run.objects.get(pk=run.pk).state == RunState.CANCELLED
    assert refused(world, run, "sim-1-a100-80gb-00") == (
        f"Run {run.pk} is not running on a cluster (cancelled): only a run on its nodes can "
        "be restarted without one of them."
    )


def test_a_restart_that_would_leave_no_node_is_refused(world, attempt):
    ClusterNode.objects.filter(cluster=world.cluster, name__in=OTHER_NODES[:2]).update(
        health="quarantined", health_reason="XID 79"
    )
    ClusterNode.objects.filter(cluster=world.cluster, name=OTHER_NODES[2]).update(
        schedulable=False, reason="drained: bad DIMM"
    )
    assert refused(world, attempt.run, "sim-1-a100-80gb-00") == (
        f"Without sim-1-a100-80gb-00, run {attempt.run_id} could not be placed anywhere: it "
        "needs 1 × 2 a100-80gb GPUs, and the nodes of that size that take work and are not "
        "excluded are 0 on sim-1."
    )
    # One node back: it may go there (busy or not).
    ClusterNode.objects.filter(name=OTHER_NODES[2]).update(schedulable=True, gpus_used=8)
    run = run_restart_excluding(
        run=attempt.run, node="sim-1-a100-80gb-00", actor=world.platform_admin
    )
    assert run.state == RunState.PREEMPTED


def test_a_flavor_no_other_node_has_is_refused(world):
    Quota.objects.filter(tenant=world.vision, flavor=world.h100).update(guaranteed_gpus=16)
    attempt = running(world, flavor="h100-80gb", nodes=2, gpus_per_node=8)  # both h100 nodes
    node = attempt.node_list[0]
    assert refused(world, attempt.run, node) == (
        f"Without {node}, run {attempt.run_id} could not be placed anywhere: it needs 2 × 8 "
        "h100-80gb GPUs, and the nodes of that size that take work and are not excluded are "
        "1 on sim-1."
    )


# --- the run page's form -----------------------------------------------------------------------


def url(run) -> str:
    return reverse("jobs:run_restart_excluding", args=[run.pk])


def test_the_form_restarts_and_redirects_with_a_message(client, world, attempt):
    client.force_login(world.researcher_a)

    response = client.post(url(attempt.run), {"node": "sim-1-a100-80gb-00"})

    assert response.status_code == 302
    assert response["Location"] == reverse("jobs:run_detail", args=[attempt.run_id])
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"Run {attempt.run_id} leaves its nodes and resumes from its latest checkpoint without "
        "sim-1-a100-80gb-00."
    ]
    assert Run.objects.get(pk=attempt.run_id).excluded_nodes == ["sim-1-a100-80gb-00"]


def test_a_refusal_says_why_and_changes_nothing(client, world, attempt):
    client.force_login(world.researcher_a)
    before = state(attempt.run)

    response = client.post(url(attempt.run), {"node": "sim-1-a100-80gb-03"})

    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"Run {attempt.run_id} was not restarted: sim-1-a100-80gb-03 is not one of the nodes "
        f"run {attempt.run_id} runs on (sim-1-a100-80gb-00)."
    ]
    assert state(attempt.run) == before


@pytest.mark.parametrize(("who", "status"), [("researcher_b", 404), ("finance", 403)])
def test_outsiders_get_404_and_readers_403_and_nothing_changes(client, world, attempt, who, status):
    client.force_login(getattr(world, who))
    before = state(attempt.run)

    response = client.post(url(attempt.run), {"node": "sim-1-a100-80gb-00"})

    assert response.status_code == status
    assert state(attempt.run) == before


def test_the_form_needs_csrf_and_post(world, attempt):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.researcher_a)
    before = state(attempt.run)

    assert client.post(url(attempt.run), {"node": "sim-1-a100-80gb-00"}).status_code == 403
    assert client.get(url(attempt.run)).status_code == 405
    assert state(attempt.run) == before


def include(run, node, user, **more) -> str:
    context = {"run": run, "node": node, "user": user, **more}
    return render_to_string("jobs/_restart_excluding.html", context)


def test_the_include_is_a_form_for_whoever_may_cancel(world, attempt):
    run = Run.objects.get(pk=attempt.run_id)
    for user in (world.researcher_a, world.tenant_admin_a, world.platform_admin):
        html = include(run, "sim-1-a100-80gb-00", user, csrf_token="t0k3n")
        assert f'action="{url(run)}"' in html
        assert '<input type="hidden" name="node" value="sim-1-a100-80gb-00">' in html
        assert 'name="csrfmiddlewaretoken" value="t0k3n"' in html
        assert "Restart excluding sim-1-a100-80gb-00</button>" in html
    for user in (world.finance, world.researcher_a2, AnonymousUser()):
        assert "<form" not in include(run, "sim-1-a100-80gb-00", user)
    assert "<form" not in include(run, "", world.researcher_a)
    run.state = RunState.QUEUED
    assert "<form" not in include(run, "sim-1-a100-80gb-00", world.researcher_a)
    run.state, run.cancel_requested_at = RunState.RUNNING, timezone.now()
    assert "<form" not in include(run, "sim-1-a100-80gb-00", world.researcher_a)


def test_a_node_name_is_escaped_in_the_include(world, attempt):
    html = include(attempt.run, '"><script>x</script>', world.researcher_a)
    assert "<script>" not in html
    assert "&quot;&gt;&lt;script&gt;" in html


# --- the API -----------------------------------------------------------------------------------


def api_url(run) -> str:
    return reverse("api:run-restart-excluding", args=[run.pk])


@pytest.fixture(autouse=True)
def _fresh_throttle(db):  # the API's throttle counts in the cache, which outlives tests
    cache.clear()
    yield
    cache.clear()


def api(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def test_the_api_restarts_the_run(world, attempt):
    response = api(world.researcher_a).post(
        api_url(attempt.run), {"node": "sim-1-a100-80gb-00"}, format="json"
    )

    assert response.status_code == 202
    assert (response.json()["id"], response.json()["state"]) == (attempt.run_id, "PREEMPTED")
    assert Run.objects.get(pk=attempt.run_id).excluded_nodes == ["sim-1-a100-80gb-00"]


def test_the_api_refuses_with_409_and_bad_input_with_400(world, attempt):
    client = api(world.researcher_a)
    before = state(attempt.run)

    conflict = client.post(api_url(attempt.run), {"node": "sim-1-a100-80gb-01"}, format="json")
    missing = client.post(api_url(attempt.run), {}, format="json")
    too_long = client.post(api_url(attempt.run), {"node": "n" * 254}, format="json")

    assert (conflict.status_code, conflict.json()) == (
        409,
        {
            "detail": f"sim-1-a100-80gb-01 is not one of the nodes run {attempt.run_id} runs on "
            "(sim-1-a100-80gb-00)."
        },
    )
    assert (missing.status_code, missing.json()) == (400, {"node": ["This field is required."]})
    assert (too_long.status_code, too_long.json()) == (
        400,
        {"node": ["Ensure this field has no more than 253 characters."]},
    )
    assert state(attempt.run) == before


@pytest.mark.parametrize(("who", "status"), [("researcher_b", 404), ("finance", 403)])
def test_the_api_answers_outsiders_404_and_readers_403(world, attempt, who, status):
    client = api(getattr(world, who))
    before = state(attempt.run)

    response = client.post(api_url(attempt.run), {"node": "sim-1-a100-80gb-00"}, format="json")

    assert response.status_code == status
    assert state(attempt.run) == before
