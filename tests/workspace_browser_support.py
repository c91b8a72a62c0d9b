"""A workspace's journey in a real browser, the same on every cluster (the simulator's in
tests/portal/test_workspace_browser.py, the Slurm test cluster's in
tests/clusters/backends/test_slurm_workspace.py): launched from the form, its server
awaited, opened through Gantry's proxy by its owner, who runs a cell over the kernel's
WebSocket; refused to everyone else with the 404 of a missing workspace; stopped from its
card.
"""

import time

from playwright.sync_api import Page, expect

from jobs.models import Run, RunState, Workspace
from jobs.services.backend_sync import attempt_cancel, cluster_sync

# Runs in the page, on the proxy's origin: a kernel started and ``code`` run on it over its
# WebSocket, as JupyterLab does. With ``until`` "idle", what the cell printed once it is
# done; with "busy", the kernel's id as soon as it works on the cell (which keeps running).
RUN_A_CELL = """async ({code, until}) => {
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
      content: {code: code, silent: false, store_history: false},
    }));
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.parent_header.msg_id !== "cell-1") return;
      if (message.msg_type === "stream") printed += message.content.text;
      // Idle again on IOPub: every output came before (the reply, on another channel,
      // may come first).
      if (message.msg_type === "status" && message.content.execution_state === until) {
        if (until === "idle") ws.close();
        resolve(until === "idle" ? printed : kernel.id);
      }
    };
  });
}"""
# The cell the browser tests run to see a kernel answer through the proxy.
PRINT_42 = {"code": "print(6*7)", "until": "idle"}
# A workspace no one has: what the proxy answers for it is what outsiders must see.
MISSING_RUN_ID = 999_999
SYNC_EVERY_S = 0.5


def launch_from_form(page: Page, *, name: str, image: str) -> Run:
    """A one-GPU a100 workspace of tenant vision's project detection, launched from the form
    by the page's user: its run, queued (the page shows its card)."""
    page.goto("/workspaces/new/")
    page.select_option("select[name=tenant]", "vision")
    page.select_option("select[name=project]", "detection")
    page.fill("input[name=name]", name)
    page.select_option("select[name=image]", image)
    page.select_option("select[name=flavor]", "a100-80gb")
    with page.expect_navigation():
        page.click("form[data-submit-once] button[type=submit]")
    run = Run.objects.filter(experiment__name=name).first()
    if run is None:
        raise AssertionError(f"nothing launched: {page.inner_text('main')}")
    expect(page.locator("#workspace-card")).to_have_attribute("data-phase", "queued")
    return run


def server_ready(cluster, run: Run, timeout_s: float = 120) -> Workspace:
    """The sync of ``cluster`` until the launcher, started by its job, reported its server's
    port (the workspace is ready then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cluster_sync(cluster=cluster)
        workspace = Workspace.objects.get(run=run)
        if workspace.ready_at is not None:
            return workspace
        time.sleep(SYNC_EVERY_S)
    raise AssertionError(f"the workspace's server did not answer in {timeout_s:g} s")


def open_lab(page: Page, *, proxy: str, run: Run) -> Page:
    """Open on the card of a running workspace: the JupyterLab page it opens, through the
    proxy at ``proxy``."""
    with page.context.expect_page() as opened:
        page.click("#workspace-open")
    lab = opened.value
    lab.wait_for_load_state()
    if lab.url != f"{proxy}/w/{run.pk}/lab":
        raise AssertionError(f"Open went to {lab.url}")
    expect(lab).to_have_title("JupyterLab", timeout=60_000)
    return lab


def outsiders_see(persona_page, outsiders, *, proxy: str, run: Run) -> list[tuple]:
    """What each of ``outsiders`` gets at the workspace's JupyterLab through the proxy, and
    at a workspace that does not exist: (status, body) pairs, one pair of pairs each."""
    seen = []
    for outsider in outsiders:
        page = persona_page(outsider)
        answer = page.goto(f"{proxy}/w/{run.pk}/lab")
        workspace = (answer.status, answer.text())
        missing = page.goto(f"{proxy}/w/{MISSING_RUN_ID}/lab")
        seen.append((workspace, (missing.status, missing.text())))
    return seen


def stop_from_card(page: Page, *, cluster, run: Run) -> Run:
    """Stop on the card (its confirmation accepted); the cancel it enqueued run as the
    worker runs it (no worker runs here); the sync until the run ended: the run, and the
    page shows its card again."""
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.click("#workspace-stop-button")
    expect(page.locator(".messages")).to_have_text(
        f"Workspace {run.pk} is stopping: its job is being cancelled."
    )
    attempt_cancel(attempt_id=run.attempts.get().pk)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        cluster_sync(cluster=cluster)
        run.refresh_from_db()
        if run.is_terminal:
            break
        time.sleep(SYNC_EVERY_S)
    if run.state != RunState.CANCELLED:
        raise AssertionError(f"run {run.pk} is {run.state} after Stop")
    page.reload()
    return run
