"""Where a workspace's server answers: the port from its job, the host from its backend, for
the current attempt of a live workspace only (jobs.services.workspace_address and the
endpoint its launcher calls)."""

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.test import Client

from clusters.models import SimulatedJob
from jobs.models import Attempt, AttemptState, Run, RunEvent, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_token_issue
from jobs.services.submission import run_submit
from jobs.services.workspace_address import AddressNotYetKnown, workspace_address_record
from tests.conftest import experiment_input
from tests.workspace_support import launch_workspace

pytestmark = pytest.mark.django_db

URL = "/api/v1/attempts/workspace/"
NOW = datetime(2026, 12, 6, 21, 0, tzinfo=UTC)


def running(world, run: Run, *, job_state: str = "RUNNING") -> Attempt:
    """The run's attempt as running on the simulator, without a process behind it."""
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.RUNNING, backend_job_id="7", submitted_at=NOW, started_at=NOW
    )
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING, started_at=NOW)
    SimulatedJob.objects.create(
        cluster=world.cluster,
        name=attempt.name,
        flavor="a100-80gb",
        nodes=1,
        gpus_per_node=1,
        profile={"workspace": {"server": "jupyter", "base_url": f"/w/{run.pk}/"}},
        max_runtime_s=3600,
        state=job_state,
        submitted_at=NOW,
        started_at=NOW if job_state == "RUNNING" else None,
    )
    attempt.refresh_from_db()
    return attempt


def workspace_run(world) -> Run:
    return launch_workspace(world, name="notebook")


def address(run: Run) -> tuple:
    workspace = Workspace.objects.get(run=run)
    return (workspace.attempt_id, workspace.host, workspace.port, workspace.ready_at)


def refused(**call) -> dict:
    with pytest.raises(ValidationError) as caught:
        workspace_address_record(**call)
    return caught.value.message_dict


def test_the_host_is_the_backends_and_a_repeat_changes_nothing(world):
    run = workspace_run(world)
    attempt = running(world, run)
    workspace_address_record(attempt=attempt, port=8888, now=NOW)
    assert address(run) == (attempt.pk, "127.0.0.1", 8888, NOW)
    later = NOW + timedelta(minutes=5)
    workspace_address_record(attempt=attempt, port=8888, now=later)
    assert address(run) == (attempt.pk, "127.0.0.1", 8888, NOW)
    assert list(
        RunEvent.objects.filter(run=run, reason="WORKSPACE_READY").values_list("message", flat=True)
    ) == ["The workspace's server answers (attempt 1)"]
    # Another port afterwards (code in the workspace holds the token too): refused.
    assert refused(attempt=attempt, port=9999) == {
        "state": ["Attempt 1 already reported port 8888."]
    }
    assert address(run) == (attempt.pk, "127.0.0.1", 8888, NOW)


@pytest.mark.parametrize("port", [0, 80, 1023, 65536, -1, True])
def test_ports_outside_1024_to_65535_are_refused(world, port):
    attempt = running(world, workspace_run(world))
    assert refused(attempt=attempt, port=port) == {"port": ["A port from 1024 to 65535."]}
    assert address(attempt.run) == (None, "", None, None)


def test_only_the_current_attempt_of_a_live_workspace_reports(world):
    batch = run_submit(user=world.researcher_a, data=experiment_input(world))
    batch_attempt = running(world, batch)
    assert refused(attempt=batch_attempt, port=8888) == {
        "state": [f"Run {batch.pk} is not a workspace."]
    }

    run = workspace_run(world)
    first = running(world, run)
    Attempt.objects.create(run=run, number=2, cluster=world.cluster)
    assert refused(attempt=first, port=8888) == {
        "state": [f"Attempt 1 of run {run.pk} is not its current attempt."]
    }

    ended = workspace_run(world)
    attempt = running(world, ended)
    Run.objects.filter(pk=ended.pk).update(state=RunState.FAILED)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.FAILED)
    assert refused(attempt=attempt, port=8888) == {
        "state": [
            f"Run {ended.pk} is failed: only a pending or running workspace reports its address."
        ]
    }
    assert Workspace.objects.exclude(port=None).count() == 0


def test_a_report_before_the_cluster_can_say_where_is_to_be_repeated(world):
    run = workspace_run(world)
    attempt = running(world, run, job_state="PENDING")
    with pytest.raises(AddressNotYetKnown, match="has not started yet"):
        workspace_address_record(attempt=attempt, port=8888)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUBMITTING)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUBMITTING, backend_job_id="")
    with pytest.raises(AddressNotYetKnown, match="attempt 1 is still being submitted"):
        workspace_address_record(attempt=attempt, port=8888)
    assert address(run) == (None, "", None, None)


# --- the endpoint ---------------------------------------------------------------------------


def post(body, token: str) -> tuple[int, dict, str]:
    response = Client().post(
        URL, data=json.dumps(body), content_type="application/json",
        HTTP_AUTHORIZATION=f"Attempt {token}",
    )  # fmt: skip
    return response.status_code, response.json(), response.headers.get("Retry-After", "")


def test_the_launcher_reports_its_port_with_the_attempt_token(world):
    run = workspace_run(world)
    attempt = running(world, run)
    token = attempt_token_issue(attempt=attempt)
    with time_machine.travel(NOW, tick=False):
        assert post({"port": 8888}, token) == (
            200,
            {
                "attempt": attempt.pk,
                "run": run.pk,
                "host": "127.0.0.1",
                "port": 8888,
                "ready_at": "2026-12-06T21:00:00Z",
            },
            "",
        )
    assert post({"port": 9000}, token) == (
        409,
        {"detail": "Attempt 1 already reported port 8888."},
        "",
    )
    assert post({"port": 80}, token)[:2] == (
        400,
        {"port": ["Ensure this value is greater than or equal to 1024."]},
    )
    assert post({"host": "10.0.0.1"}, token)[:2] == (400, {"port": ["This field is required."]})
    assert address(run) == (attempt.pk, "127.0.0.1", 8888, NOW)


def test_not_yet_known_asks_to_come_back_and_a_persons_token_is_refused(world):
    run = workspace_run(world)
    attempt = running(world, run, job_state="PENDING")
    token = attempt_token_issue(attempt=attempt)
    status, body, retry_after = post({"port": 8888}, token)
    assert (status, retry_after) == (503, "2")
    assert body == {
        "detail": "sim-1 could not say where it runs: job "
        f"{attempt.name} has not started yet: report again."
    }
    response = Client().post(
        URL, data={"port": 8888}, content_type="application/json",
        HTTP_AUTHORIZATION="Bearer not-an-attempt-token",
    )  # fmt: skip
    assert response.status_code == 401
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.FAILED)
    assert post({"port": 8888}, token)[:2] == (
        401,
        {"detail": f"Attempt 1 of run {run.pk} has ended (failed): its token is no longer valid."},
    )
    assert address(run) == (None, "", None, None)


def test_the_endpoint_is_in_the_openapi_schema(client):
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"][URL]["post"]
    assert sorted(operation["responses"]) == ["200", "400", "401", "409", "503"]
    assert operation["security"] == [{"attemptToken": []}]
