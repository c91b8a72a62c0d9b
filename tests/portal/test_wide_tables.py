"""Wide tables fit the window: on the demo of `make run`, the pages with the widest tables
(runs, experiments, audit, and the run, KPI, nodes and home pages beside them) at 1280 and
1440 px wide in headless Chromium: the page never scrolls sideways, no table is wider than
the card it sits in, and no cell cuts its text (no cell's content is wider than the cell)."""

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser

from clusters.models import Cluster
from jobs.models import Attempt, AttemptState, Run
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from portal.demo import DEMO_PASSWORD, demo_seed
from tests.browser_support import DEFAULT_TIMEOUT_MS, login

pytest_plugins = ["tests.browser_support"]

WIDTHS = (1280, 1440)

# What overflows: the page sideways, a table beyond its container, a cell's content beyond
# the cell (text cut or hidden). Each as a short description, for the failure message.
OVERFLOWS = """() => {
  const found = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth) {
    found.push(`page ${root.scrollWidth} > ${root.clientWidth}`);
  }
  document.querySelectorAll("table").forEach((table, index) => {
    const box = table.parentElement;
    if (table.offsetWidth > box.clientWidth + 1) {
      // Each column's width and its widest cell's text: what to shorten or let wrap.
      const columns = Array.from(table.querySelectorAll("tr:first-child th")).map((th, i) => {
        const cells = Array.from(table.querySelectorAll(`tr > :nth-child(${i + 1})`));
        const widest = cells.reduce((a, b) => (b.scrollWidth > a.scrollWidth ? b : a), th);
        return `${th.innerText}: ${th.offsetWidth} (${widest.innerText.slice(0, 60)})`;
      });
      found.push(
        `table ${table.dataset.table || index} ${table.offsetWidth} > ${box.clientWidth}; ` +
          columns.join("; "),
      );
    }
    table.querySelectorAll("th, td").forEach((cell) => {
      if (cell.scrollWidth > cell.clientWidth + 1) {
        const text = cell.innerText.slice(0, 40);
        found.push(`cell "${text}" ${cell.scrollWidth} > ${cell.clientWidth}`);
      }
    });
  });
  return found;
}"""


@pytest.fixture
def demo(transactional_db):
    demo_seed()
    admission_run_cycle()
    for attempt in Attempt.objects.filter(state=AttemptState.CREATED):
        attempt_submit(attempt_id=attempt.pk)
    for cluster in Cluster.objects.all():
        cluster_sync(cluster=cluster)


def pages() -> dict[str, str]:
    run = Run.objects.order_by("-pk").first()
    return {
        "runs": "/runs/",
        "experiments": "/experiments/",
        "audit": "/audit/",
        "run": f"/runs/{run.pk}/",
        "home": "/",
        "nodes": "/clusters/nodes/",
        "kpis": "/platform/kpis/",
        "quotas": "/quotas/",
    }


@pytest.mark.parametrize("width", WIDTHS)
def test_wide_tables_fit_the_window_without_cutting_text(
    demo, browser: Browser, live_server, width
):
    admin = User.objects.get(username="admin")
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": 900}
    )
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    try:
        page = context.new_page()
        login(page, admin.username, DEMO_PASSWORD)
        overflows = {}
        for name, url in pages().items():
            page.goto(url)
            page.wait_for_load_state("networkidle")
            found = page.evaluate(OVERFLOWS)
            if found:
                overflows[name] = found
        assert overflows == {}
    finally:
        context.close()
