"""The workspace idle scan against a real Jupyter Server: scenarios (a)-(e) of issue 37, with
the clock moved by passing the scan its "now"."""

import time
from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from clusters.backends import JobStatus
from jobs.models import Attempt, AttemptState, Run, RunEvent, RunState, Workspace
from jobs.services.backend_sync import attempt_apply_status
from jobs.services.workspace_lifecycle import workspace_resume, workspace_suspend
from jobs.services.workspaces import workspace_base_path, workspace_server_token
from telemetry.models import GpuMinute, WorkspaceIdleSpan
from telemetry.services import accounting_compute
from telemetry.workspace_policy import workspace_idle_scan
from tenants.models import Notification
from tests.workspace_support import jupyter_api, jupyter_server, kernel_execute, workspace_running

pytestmark = pytest.mark.django_db(transaction=False)


def serve(run: Run, scratch):
    """The server of the run's current attempt, as its launcher starts it, on ``scratch``'s
    files; its workspace points at it."""
    attempt = run.attempts.order_by("-number").first()
    token = workspace_server_token(attempt.pk)
    return jupyter_server(base_url=workspace_base_path(run.pk), token=token, scratch=scratch)


@pytest.fixture
def workspace(world, tmp_path):
    run = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=1)
    with serve(run, tmp_path) as port:
        Workspace.objects.filter(run=run).update(port=port)
        yield run, port


def events(run: Run) -> list[tuple[str, str]]:
    return list(run.events.order_by("at", "id").values_list("reason", "message"))


def test_an_open_tab_with_nothing_running_is_warned_then_suspended(world, workspace):
    # (b): the server has no kernel; the proxy last saw the owner act at ready + 5 min.
    run, _port = workspace
    ws = Workspace.objects.get(run=run)
    ready = ws.ready_at
    Workspace.objects.filter(run=run).update(proxy_activity_at=ready + timedelta(minutes=5))

    assert workspace_idle_scan(now=ready + timedelta(minutes=30)).warned == 0
    summary = workspace_idle_scan(now=ready + timedelta(minutes=55))
    assert (summary.checked, summary.warned, summary.suspended, summary.unanswered) == (1, 1, 0, 0)
    assert workspace_idle_scan(now=ready + timedelta(minutes=56)).warned == 0  # once a streak
    idle_since = f"{ready + timedelta(minutes=5):%Y-%m-%d %H:%M} UTC"
    suspend_at = f"{ready + timedelta(minutes=65):%Y-%m-%d %H:%M} UTC"
    warning = (
        f"Workspace {run.pk} has been idle since {idle_since} (no kernel or terminal ran, "
        "nothing was done through Gantry, its GPUs were idle); it will be suspended at "
        f"{suspend_at} unless it is used. Its files are kept."
    )
    assert list(
        Notification.objects.filter(user=world.researcher_a).values_list("kind", "message")
    ) == [("ws_idle", warning)]

    summary = workspace_idle_scan(now=ready + timedelta(minutes=65))
    assert (summary.warned, summary.suspended) == (0, 1)
    run.refresh_from_db()
    attempt = run.attempts.get()
    assert (run.state, run.cancel_requested_at is not None) == (RunState.RUNNING, True)
    assert events(run)[-2:] == [
        ("IDLE_WARNING", warning),
        (
            "SUSPEND_REQUESTED",
            f"Suspended for being idle since {idle_since} (tenant vision's limit: 60 "
            "minutes): its GPUs are released, its files kept; Resume queues it again",
        ),
    ]
    # The sync sees the job gone: the run waits, holding nothing, for Resume.
    attempt_apply_status(
        attempt=attempt,
        status=JobStatus(state="CANCELLED", failure_reason="CANCELLED"),
        now=ready + timedelta(minutes=66),
    )
    run.refresh_from_db()
    ws.refresh_from_db()
    assert (run.state, run.cancel_requested_at, run.finished_at) == (RunState.SUSPENDED, None, None)
    assert (ws.attempt, ws.address, ws.suspended_at is not None) == (None, None, True)
    # The idle streak from minute 5 is the attempt's interactive idle waste.
    assert list(WorkspaceIdleSpan.objects.values_list("started_at", "ended_at")) == [
        (ready + timedelta(minutes=5), None)
    ]


def kernel_state(run: Run, port: int, kernel_id: str, expected: str) -> str:
    """The kernel's execution state once it is ``expected`` (or after 30 s, whatever it is):
    an interrupt or an execution reaches the kernel a moment after it was asked for."""
    deadline = time.monotonic() + 30
    while True:
        state = jupyter_api(run, port, "GET", f"api/kernels/{kernel_id}").json()["execution_state"]
        if state == expected or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def test_a_busy_kernel_with_output_and_a_gpu_active_one_are_never_suspended(world, workspace):
    run, port = workspace
    kernel = jupyter_api(run, port, "POST", "api/kernels", json={"name": "python3"}).json()
    # (d): a CPU computation printing as it goes, no browser.
    kernel_execute(
        run,
        port,
        kernel["id"],
        "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.2)",
        wait=False,
    )
    Workspace.objects.filter(run=run).update(ready_at=timezone.now() - timedelta(hours=3))
    summary = workspace_idle_scan(now=timezone.now() + timedelta(seconds=1))
    assert (summary.warned, summary.suspended, summary.unanswered) == (0, 0, 0)
    jupyter_api(run, port, "POST", f"api/kernels/{kernel['id']}/interrupt")
    assert kernel_state(run, port, kernel["id"], "idle") == "idle"

    # (a) and (c): a silent busy kernel two hours later; with its GPU active it is in use...
    kernel_execute(run, port, kernel["id"], "import time\ntime.sleep(3600)", wait=False)
    assert kernel_state(run, port, kernel["id"], "busy") == "busy"
    later = timezone.now() + timedelta(hours=2)
    attempt = run.attempts.get()
    GpuMinute.objects.create(
        attempt=attempt,
        host="a100-01",
        gpu="0",
        minute=(later - timedelta(minutes=1)).replace(second=0, microsecond=0),
        activity=0.97,
    )
    summary = workspace_idle_scan(now=later)
    assert (summary.warned, summary.suspended) == (0, 0)
    # ... without GPU use it is warned about, and kept, under the default policy.
    GpuMinute.objects.all().delete()
    for minutes in (0, 60):
        summary = workspace_idle_scan(now=later + timedelta(minutes=minutes))
        assert summary.suspended == 0
    run.refresh_from_db()
    assert (run.state, run.cancel_requested_at) == (RunState.RUNNING, None)
    assert [reason for reason, _ in events(run)].count("IDLE_WARNING") == 1
    assert "has had a kernel busy without output and its GPUs idle" in events(run)[-1][1]
    # A tenant that says so suspends it.
    world.vision.workspace_suspend_silent_busy = True
    world.vision.save(update_fields=["workspace_suspend_silent_busy"])
    assert workspace_idle_scan(now=later + timedelta(minutes=61)).suspended == 1


def test_the_owner_resumes_a_suspended_workspace_and_outsiders_cannot(world, tmp_path):
    run = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=1)
    with serve(run, tmp_path) as port:
        saved = jupyter_api(run, port, "PUT", "api/contents/notes.txt", json={
            "type": "file", "format": "text", "content": "kept across a suspend",
        })  # fmt: skip
        assert (saved.status_code, saved.json()["name"]) == (201, "notes.txt")
        workspace_suspend(run=run, actor=world.researcher_a)
    attempt = run.attempts.get()
    attempt_apply_status(
        attempt=attempt,
        status=JobStatus(state="CANCELLED", failure_reason="CANCELLED"),
        now=timezone.now(),
    )
    run.refresh_from_db()
    assert run.state == RunState.SUSPENDED
    with pytest.raises(PermissionDenied):
        workspace_resume(run=run, actor=world.researcher_b)
    run = workspace_resume(run=run, actor=world.researcher_a)
    assert (run.state, run.cluster_id) == (RunState.QUEUED, None)
    assert Workspace.objects.filter(run=run, attempt=None, suspended_at=None).exists()
    assert events(run)[-1] == ("RESUMED", "Resumed by alice: back in the queue")
    # (e): the next attempt's server, with its own secret, serves the same files.
    second = Attempt.objects.create(
        run=run, number=2, cluster=world.cluster, state=AttemptState.RUNNING,
        started_at=timezone.now(),
    )  # fmt: skip
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING)
    with serve(run, tmp_path) as port:
        Workspace.objects.filter(run=run).update(attempt=second, host="127.0.0.1", port=port)
        notes = jupyter_api(run, port, "GET", "api/contents/notes.txt").json()
        assert notes["content"] == "kept across a suspend"


def test_the_idle_streak_is_charged_as_interactive_idle(world, workspace):
    run, _port = workspace
    ws = Workspace.objects.get(run=run)
    ready = ws.ready_at
    attempt = run.attempts.get()
    Workspace.objects.filter(run=run).update(proxy_activity_at=ready + timedelta(minutes=10))
    workspace_idle_scan(now=ready + timedelta(minutes=20))  # 10 minutes: not yet a streak
    assert WorkspaceIdleSpan.objects.count() == 0
    workspace_idle_scan(now=ready + timedelta(minutes=30))
    Workspace.objects.filter(run=run).update(proxy_activity_at=ready + timedelta(minutes=40))
    workspace_idle_scan(now=ready + timedelta(minutes=41))
    assert list(WorkspaceIdleSpan.objects.values_list("started_at", "ended_at")) == [
        (ready + timedelta(minutes=10), ready + timedelta(minutes=40))
    ]
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.CANCELLED,
        started_at=ready,
        finished_at=ready + timedelta(minutes=60),
    )
    attempt.refresh_from_db()
    row = accounting_compute(attempt=attempt)
    assert (row.allocated_gpu_s, row.interactive_idle_gpu_s, row.effective_gpu_s) == (
        3600,
        1800,
        1800,
    )
    assert RunEvent.objects.filter(run=run, reason="IDLE_WARNING").count() == 0
