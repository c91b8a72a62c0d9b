"""A workspace on the simulator is a real JupyterLab on 127.0.0.1 (docs/workspaces.md,
"Backends"): it reports its port to the live portal, answers only with its secret, stops on
cancel, ends its attempt when it dies, and is ended when it never answers."""

import json
import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path

import time_machine

from clusters.backends import backend_for, sim_workspace
from clusters.models import SimulatedJob
from jobs.models import (
    Attempt,
    AttemptState,
    Run,
    RunEvent,
    RunState,
    TenantMonthUsage,
    Workspace,
)
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.workspace_storage import workspace_storage_release_ended
from jobs.services.workspaces import workspace_server_token
from tests.workspace_support import launch_workspace, refuses, status_code

# Jupyter's first start on a busy two-core machine takes a few seconds; a margin for load.
READY_WITHIN_S = 90


def launch_and_start(world) -> tuple[Run, Attempt]:
    """Launch a workspace, admit it, submit it and let the simulator give it its GPU."""
    run = launch_workspace(world, name="notebook", hours=1)
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state) == (RunState.RUNNING, AttemptState.RUNNING)
    return run, attempt


def wait_for_address(run: Run) -> Workspace:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        workspace = Workspace.objects.get(run=run)
        if workspace.port is not None:
            return workspace
        time.sleep(0.25)
    job = SimulatedJob.objects.get(name=run.attempts.get().name)
    log = "\n".join(sim_workspace.log_tail(job.name, lines=40))
    raise AssertionError(f"no address reported within {READY_WITHIN_S} s:\n{log}")


def process_of(attempt: Attempt) -> dict:
    return SimulatedJob.objects.get(name=attempt.name).profile["workspace"]


def gone(pid: int, *, within: float = 15) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(word) for word in text.split()]


def test_a_real_jupyter_answers_with_its_secret_only_and_cancel_stops_it(
    world, live_server, settings
):
    settings.GANTRY_PUBLIC_URL = live_server.url
    run, attempt = launch_and_start(world)
    workspace = wait_for_address(run)
    assert (workspace.host, workspace.attempt_id, workspace.server) == (
        "127.0.0.1",
        attempt.pk,
        "jupyter",
    )
    assert 1024 <= workspace.port <= 65535
    assert RunEvent.objects.filter(run=run, reason="WORKSPACE_READY").count() == 1

    status_url = f"http://127.0.0.1:{workspace.port}/w/{run.pk}/api/status"
    secret = workspace_server_token(attempt.pk)
    assert status_code(status_url, secret) == 200
    assert status_code(status_url) == 403
    assert status_code(status_url, workspace_server_token(attempt.pk + 1)) == 403

    # The secret is in no stored spec and on no command line (`ps` shows those).
    stored = json.loads(attempt.rendered_spec)
    assert stored["workspace"] == {"server": "jupyter", "base_url": f"/w/{run.pk}/"}
    assert stored["env"]["GANTRY_WORKSPACE_TOKEN"] == "<redacted>"
    assert stored["env"]["GANTRY_WORKSPACE_BASE_URL"] == f"/w/{run.pk}/"
    assert secret not in attempt.rendered_spec
    launcher = process_of(attempt)["pid"]
    for pid in (launcher, *children(launcher)):
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

    run_cancel(run=run, actor=world.researcher_a)
    attempt_cancel(attempt_id=attempt.pk)
    assert gone(launcher)
    assert refuses(workspace.port)
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    # Its files are kept until the sync releases an ended workspace's storage.
    files = sim_workspace.files_of(run.pk)
    assert files.is_dir()
    assert workspace_storage_release_ended(reachable=[world.cluster.pk]) == 1
    assert not files.exists()
    assert Workspace.objects.get(run=run).storage_released_at is not None


def test_a_server_that_dies_mid_session_ends_its_attempt(world, live_server, settings):
    settings.GANTRY_PUBLIC_URL = live_server.url
    run, attempt = launch_and_start(world)
    wait_for_address(run)
    launcher = process_of(attempt)["pid"]
    (server,) = children(launcher)
    os.kill(server, signal.SIGKILL)
    assert gone(launcher)
    deadline = time.monotonic() + 15
    while run.state == RunState.RUNNING and time.monotonic() < deadline:
        cluster_sync(cluster=world.cluster)
        run.refresh_from_db()
        time.sleep(0.1)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.failure_reason, attempt.exit_code) == (
        AttemptState.FAILED,
        "USER_EXIT",
        137,
    )
    assert attempt.failure_message == "the workspace server exited with status 137"
    assert (run.state, run.failure_reason) == (RunState.FAILED, "USER_EXIT")


def test_a_server_that_never_answers_is_ended_after_the_timeout_and_charged_what_it_held(
    world, settings
):
    # Nothing listens where the job reports: its report never arrives.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    settings.GANTRY_PUBLIC_URL = f"http://127.0.0.1:{closed_port}"
    settings.GANTRY_WORKSPACE_START_TIMEOUT_S = 300
    run, attempt = launch_and_start(world)
    launcher = process_of(attempt)["pid"]

    with time_machine.travel(attempt.started_at + timedelta(seconds=300), tick=False):
        cluster_sync(cluster=world.cluster)  # not yet: 300 s is within the limit
        attempt.refresh_from_db()
        assert attempt.state == AttemptState.RUNNING
    ends = attempt.started_at + timedelta(seconds=301)
    with time_machine.travel(ends, tick=False):
        cluster_sync(cluster=world.cluster)

    attempt.refresh_from_db()
    run.refresh_from_db()
    assert (attempt.state, attempt.failure_reason, attempt.finished_at) == (
        AttemptState.FAILED,
        "TIMEOUT",
        ends,
    )
    assert attempt.failure_message == "the workspace server did not answer within 300 s"
    assert (run.state, run.failure_reason) == (RunState.FAILED, "TIMEOUT")
    assert SimulatedJob.objects.get(name=attempt.name).state == "CANCELLED"
    assert gone(launcher)
    # Its GPU is free again, and what it held (one GPU for 301 s) is all it is charged.
    inventory = backend_for(world.cluster).inventory()
    assert sum(node.gpus_used for node in inventory.nodes) == 0
    usage = TenantMonthUsage.objects.get(tenant=world.vision, flavor=world.a100)
    assert usage.gpu_seconds == 301
