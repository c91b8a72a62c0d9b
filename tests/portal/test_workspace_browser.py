"""A workspace in a real browser (headless Debian Chromium): launched from the form on the
simulator, whose launcher starts a real JupyterLab; opened through Gantry's proxy by its
owner, who runs a cell over the kernel's WebSocket; refused to another tenant's user and
to another user of the same tenant (the same 404 as a missing workspace), and to a page of
another origin driving the owner's kernel; stopped from its card (issue 37, points 3 and 6,
and its bad input). The same journey on the real Slurm test cluster:
tests/clusters/backends/test_slurm_workspace.py."""

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from jobs.models import Attempt, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from tests.browser_support import screenshot
from tests.workspace_browser_support import (
    PRINT_42,
    RUN_A_CELL,
    launch_from_form,
    open_lab,
    outsiders_see,
    server_ready,
    stop_from_card,
)
from tests.workspace_support import jupyter_api, proxy_serving, refuses

pytest_plugins = ["tests.browser_support"]
pytestmark = pytest.mark.django_db(transaction=True)

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


def test_a_workspace_launched_opened_and_used_only_by_its_owner(
    persona_page, live_server, world, settings, tmp_path
):
    settings.GANTRY_PUBLIC_URL = live_server.url  # where the launcher reports its port
    # On the live server's host name: a browser sends the portal's cookie to any port of it.
    with proxy_serving(host=urlsplit(live_server.url).hostname) as proxy:
        settings.GANTRY_WORKSPACE_URL = proxy
        owner = persona_page(world.researcher_a)
        run = launch_from_form(owner, name="browser-notebook", image=world.image.reference)

        admission_run_cycle()
        attempt_submit(attempt_id=Attempt.objects.get(run=run).pk)
        workspace = server_ready(world.cluster, run)
        owner.reload()
        expect(owner.locator("#workspace-card")).to_have_attribute("data-phase", "running")
        screenshot(owner, "workspace-card", tmp_path)
        lab = open_lab(owner, proxy=proxy, run=run)
        assert lab.evaluate(RUN_A_CELL, PRINT_42) == "42\n"

        base = f"{proxy}/w/{run.pk}/"
        kernels = len(jupyter_api(run, workspace.port, "GET", "api/kernels").json())
        # Another page of the owner's, on the portal's origin: refused, nothing started.
        assert owner.evaluate(FOREIGN_PAGE, base) == ["refused", "blocked"]
        assert len(jupyter_api(run, workspace.port, "GET", "api/kernels").json()) == kernels

        # Nobody else opens it: the same 404 as for a workspace that does not exist.
        outsiders = (world.researcher_b, world.researcher_a2)
        seen = outsiders_see(persona_page, outsiders, proxy=proxy, run=run)
        assert [answer for answer, _ in seen] == [missing for _, missing in seen]
        assert [missing[0] for _, missing in seen] == [404, 404]

        # Stop: the job is cancelled and its server gone.
        assert stop_from_card(owner, cluster=world.cluster, run=run).state == RunState.CANCELLED
        expect(owner.locator("#workspace-card")).to_have_attribute("data-phase", "ended")
        assert refuses(workspace.port)
