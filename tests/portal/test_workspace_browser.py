"""A workspace in a real browser (headless Debian Chromium): launched from the form on the
simulator, whose launcher starts a real JupyterLab; opened through Gantry's proxy by its
owner, who runs a cell over the kernel's WebSocket; refused to another tenant's user and
to another user of the same tenant (the same 404 as a missing workspace), and to a page of
another origin driving the owner's kernel (issue 37, points 3 and 6, and its bad input)."""

import time
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from jobs.models import Attempt, Run, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from tests.browser_support import screenshot
from tests.workspace_support import jupyter_api, proxy_serving

pytest_plugins = ["tests.browser_support"]
pytestmark = pytest.mark.django_db(transaction=True)

# Runs in the page, on the proxy's origin: a kernel started and a cell run over its
# WebSocket, as JupyterLab does; what the cell printed.
RUN_A_CELL = """async () => {
  const base = location.pathname.replace(/lab.*$/, "");
  const started = await fetch(base + "api/kernels", {
    method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({name: "python3"}),
  });
  const kernel = await started.json();
  const ws = new WebSocket(`ws://${location.host}${base}api/kernels/${kernel.id}/channels`);
  return await new Promise((resolve, reject) => {
    let printed = "";
    ws.onerror = () => reject(new Error("the kernel's WebSocket failed"));
    ws.onopen = () => ws.send(JSON.stringify({
      header: {msg_id: "cell-1", username: "alice", session: "browser-1",
               msg_type: "execute_request", version: "5.3"},
      parent_header: {}, metadata: {}, channel: "shell",
      content: {code: "print(6*7)", silent: false, store_history: false},
    }));
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.parent_header.msg_id !== "cell-1") return;
      if (message.msg_type === "stream") printed += message.content.text;
      // Idle again on IOPub: every output came before (the reply, on another channel,
      // may come first).
      if (message.msg_type === "status" && message.content.execution_state === "idle") {
        ws.close();
        resolve(printed);
      }
    };
  });
}"""

# Runs in a page of the portal's origin (another port, so another origin): what a hostile
# page could try against the owner's workspace with her cookies.
FOREIGN_PAGE = """async (proxy) => {
  const socket = await new Promise((resolve) => {
    const ws = new WebSocket(proxy.replace("http", "ws") + "api/events/subscribe");
    ws.onopen = () => { ws.close(); resolve("opened"); };
    ws.onerror = () => resolve("refused");
  });
  let post = "sent";
  try {
    await fetch(proxy + "api/kernels", {method: "POST", credentials: "include",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify({name: "python3"})});
  } catch (error) { post = "blocked"; }
  return [socket, post];
}"""


def server_ready(world, run: Run, timeout_s: float = 120) -> Workspace:
    """The sync until the launcher, started on the simulator, reported its server's port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster_sync(cluster=world.cluster)
        workspace = Workspace.objects.get(run=run)
        if workspace.ready_at is not None:
            return workspace
        time.sleep(0.5)
    raise AssertionError(f"the workspace's server did not answer in {timeout_s:g} s")


def test_a_workspace_launched_opened_and_used_only_by_its_owner(
    persona_page, live_server, world, settings, tmp_path
):
    settings.GANTRY_PUBLIC_URL = live_server.url  # where the launcher reports its port
    # On the live server's host name: a browser sends the portal's cookie to any port of it.
    with proxy_serving(host=urlsplit(live_server.url).hostname) as proxy:
        settings.GANTRY_WORKSPACE_URL = proxy
        owner = persona_page(world.researcher_a)
        owner.goto("/workspaces/new/")
        owner.select_option("select[name=tenant]", "vision")
        owner.select_option("select[name=project]", "detection")
        owner.fill("input[name=name]", "browser-notebook")
        owner.select_option("select[name=image]", world.image.reference)
        owner.select_option("select[name=flavor]", "a100-80gb")
        with owner.expect_navigation():
            owner.click("form[data-submit-once] button[type=submit]")
        launched = Run.objects.filter(experiment__name="browser-notebook").first()
        assert launched is not None, owner.inner_text("main")
        run = launched
        expect(owner.locator("#workspace-card")).to_have_attribute("data-phase", "queued")

        admission_run_cycle()
        attempt_submit(attempt_id=Attempt.objects.get(run=run).pk)
        workspace = server_ready(world, run)
        owner.reload()
        expect(owner.locator("#workspace-card")).to_have_attribute("data-phase", "running")
        screenshot(owner, "workspace-card", tmp_path)
        with owner.context.expect_page() as opened:
            owner.click("#workspace-open")
        lab = opened.value
        lab.wait_for_load_state()
        assert lab.url == f"{proxy}/w/{run.pk}/lab"
        expect(lab).to_have_title("JupyterLab", timeout=60_000)
        assert lab.evaluate(RUN_A_CELL) == "42\n"

        base = f"{proxy}/w/{run.pk}/"
        kernels = len(jupyter_api(run, workspace.port, "GET", "api/kernels").json())
        # Another page of the owner's, on the portal's origin: refused, nothing started.
        assert owner.evaluate(FOREIGN_PAGE, base) == ["refused", "blocked"]
        assert len(jupyter_api(run, workspace.port, "GET", "api/kernels").json()) == kernels

        # Nobody else opens it: the same 404 as for a workspace that does not exist.
        for outsider in (world.researcher_b, world.researcher_a2):
            page = persona_page(outsider)
            answer = page.goto(f"{base}lab")
            seen = (answer.status, answer.text())
            missing = page.goto(f"{proxy}/w/999999/lab")
            assert seen == (404, missing.text())
            assert missing.status == 404
