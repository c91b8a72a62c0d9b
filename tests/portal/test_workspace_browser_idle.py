"""Scenarios (a)-(e) of issue 37 in a real browser (headless Debian Chromium), on a
workspace the simulator started (Gantry's launcher and a real JupyterLab), opened through
Gantry's proxy: what the owner does happens in the page, the idle scan runs with its clock
moved (``now``) past the tenant's threshold, and the owner reads the outcome on the
workspace's card. tests/telemetry/test_workspace_policy.py holds the scan's exact rules."""

import shutil
import time
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from clusters.backends import sim_workspace
from jobs.models import Attempt, Run, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from portal.workspace_proxy.gate import DECISION_TTL_S
from telemetry.models import GpuMinute
from telemetry.workspace_policy import workspace_idle_scan
from tests.browser_support import screenshot
from tests.workspace_browser_support import RUN_A_CELL, open_lab, server_ready
from tests.workspace_support import jupyter_api, launch_workspace, proxy_serving

pytest_plugins = ["tests.browser_support"]
pytestmark = pytest.mark.django_db(transaction=True)

# A file saved from the page, as JupyterLab saves a notebook; its answer's status.
SAVE_A_FILE = """async ([name, text]) => {
  const base = location.pathname.replace(/lab.*$/, "");
  const saved = await fetch(base + "api/contents/" + name, {
    method: "PUT", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({type: "file", format: "text", content: text}),
  });
  return saved.status;
}"""


@pytest.fixture
def proxy(live_server, settings):
    settings.GANTRY_PUBLIC_URL = live_server.url  # where the launcher reports its port
    # On the live server's host name: a browser sends the portal's cookie to any port of it.
    with proxy_serving(host=urlsplit(live_server.url).hostname) as base:
        settings.GANTRY_WORKSPACE_URL = base
        yield base


def started(world) -> tuple[Run, Workspace]:
    """A workspace of alice's, admitted, submitted and its server answering."""
    run = launch_workspace(world, name="idle-notebook")
    # Run ids start again in each test's database; the simulator's files of a workspace
    # of an earlier test with this id are not this one's.
    shutil.rmtree(sim_workspace.files_of(run.pk), ignore_errors=True)
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=run, number=run.attempts.count()).pk)
    return run, server_ready(world.cluster, run)


def opened(owner, run: Run, proxy: str):
    """JupyterLab, opened from the workspace's card as its owner does."""
    owner.goto(f"/workspaces/{run.pk}/")
    return open_lab(owner, proxy=proxy, run=run)


def card_phase(owner, run: Run) -> str:
    owner.goto(f"/workspaces/{run.pk}/")
    return owner.locator("#workspace-card").get_attribute("data-phase")


def test_busy_kernels_with_the_browser_closed_are_never_culled(
    persona_page, world, proxy, tmp_path
):
    run, workspace = started(world)
    owner = persona_page(world.researcher_a)
    lab = opened(owner, run, proxy)
    # (d): a CPU-only computation printing as it goes, started in the page, the tab closed.
    kernel_id = lab.evaluate(
        RUN_A_CELL,
        {
            "code": "import time\nfor i in range(3000):\n    print(i, flush=True)\n"
            "    time.sleep(0.2)",
            "until": "busy",
        },
    )
    lab.close()
    # Its output is now, as Jupyter tells; everything else is moved three hours back: the
    # server started then, the owner last did something through Gantry two hours ago.
    earlier = timezone.now() - timedelta(hours=3)
    Workspace.objects.filter(run=run).update(
        ready_at=earlier, proxy_activity_at=earlier + timedelta(hours=1)
    )
    summary = workspace_idle_scan(now=timezone.now())
    assert (summary.checked, summary.warned, summary.suspended) == (1, 0, 0)
    assert card_phase(owner, run) == "running"

    # (a): a GPU cell, started from a new tab, which is closed; the scan two hours on finds
    # the kernel silent since, and its GPU busy (DCGM).
    jupyter_api(run, workspace.port, "POST", f"api/kernels/{kernel_id}/interrupt")
    lab = opened(owner, run, proxy)
    lab.evaluate(RUN_A_CELL, {"code": "import time\ntime.sleep(3 * 3600)", "until": "busy"})
    lab.close()
    attempt = Attempt.objects.get(run=run)
    later = timezone.now() + timedelta(hours=2)
    GpuMinute.objects.create(
        attempt=attempt,
        host=attempt.node_list[0],
        gpu="0",
        minute=(later - timedelta(minutes=1)).replace(second=0, microsecond=0),
        activity=0.97,
    )
    summary = workspace_idle_scan(now=later)
    assert (summary.warned, summary.suspended) == (0, 0)
    assert card_phase(owner, run) == "running"

    # (c): the same cell with its GPU idle: silent and busy for hours. The owner is warned,
    # on the card, and it keeps its GPUs under tenant vision's policy (the default).
    GpuMinute.objects.all().delete()
    summary = workspace_idle_scan(now=later)
    assert (summary.warned, summary.suspended) == (1, 0)
    assert card_phase(owner, run) == "idle warning"
    warning = owner.locator("[data-idle-warning]").inner_text()
    assert warning.startswith(f"Workspace {run.pk} has had a kernel busy without output")
    assert warning.endswith("it keeps its GPUs. Stop it if the kernel is stuck.")
    screenshot(owner, "workspace-idle-warning", tmp_path)
    assert workspace_idle_scan(now=later + timedelta(hours=1)).suspended == 0
    run.refresh_from_db()
    assert (run.state, run.cancel_requested_at) == (RunState.RUNNING, None)


def test_an_idle_open_tab_is_suspended_and_resume_restores_its_files(
    persona_page, world, proxy, settings
):
    run, _workspace = started(world)
    owner = persona_page(world.researcher_a)
    lab = opened(owner, run, proxy)
    assert lab.evaluate(SAVE_A_FILE, ["notes.txt", "kept across a suspend"]) == 201
    # (b): the tab stays open; nothing runs. The scan, an hour on, warns and then suspends.
    now = timezone.now()
    assert workspace_idle_scan(now=now + timedelta(minutes=55)).warned == 1
    assert card_phase(owner, run) == "idle warning"
    expect(owner.locator("[data-idle-warning]")).to_contain_text("it will be suspended at")
    assert workspace_idle_scan(now=now + timedelta(minutes=65)).suspended == 1
    attempt_cancel(attempt_id=Attempt.objects.get(run=run).pk)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert run.state == RunState.SUSPENDED
    assert card_phase(owner, run) == "suspended"
    expect(owner.locator("#workspace-open")).to_have_count(0)
    # The open tab's next request is told where its workspace stands (once the proxy's
    # kept decision, made while the server ran, is older than its second).
    time.sleep(DECISION_TTL_S + 0.1)
    answer = lab.context.request.get(f"{proxy}/w/{run.pk}/api/contents/notes.txt")
    assert (answer.status, answer.text()) == (
        409,
        f"Workspace {run.pk} is suspended: its GPUs were released and its files kept. Resume "
        f"it from {settings.GANTRY_PUBLIC_URL}/workspaces/{run.pk}/\n",
    )
    # The owner closes it (JupyterLab would move a second tab of hers to another layout).
    lab.close()

    # (e): the owner resumes it from the card; it queues, starts again, and has its files.
    with owner.expect_navigation():
        owner.click("#workspace-resume-button")
    expect(owner.locator("#workspace-card")).to_have_attribute("data-phase", "queued")
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=run, number=2).pk)
    server_ready(world.cluster, run)
    lab = opened(owner, run, proxy)
    notes = lab.context.request.get(f"{proxy}/w/{run.pk}/api/contents/notes.txt")
    assert (notes.status, notes.json()["content"]) == (200, "kept across a suspend")
