"""Home and Nodes refresh themselves in a real browser (headless Chromium), as the run pages
do: what changes in the database shows up without a reload, and what no longer holds goes."""

from playwright.sync_api import expect

from clusters.models import ClusterNode
from clusters.services import cluster_refresh_inventory
from jobs import live
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from portal.celery import app as celery_app
from tests.conftest import experiment_input

pytest_plugins = ["tests.browser_support"]

NO_RELOAD = "window.__gantry_no_reload"


def test_home_and_nodes_follow_the_database_without_reloading(world, persona_page, monkeypatch):
    monkeypatch.setattr(live, "LIVE_PAGE_REFRESH_S", 1)
    cluster_refresh_inventory(cluster=world.cluster)
    page = persona_page(world.researcher_a)  # lands on the home page
    page.evaluate(f"{NO_RELOAD} = 1")
    home = page.locator("[data-home=researcher]")
    expect(home).to_contain_text("No run of yours waits.")

    run = run_submit(user=world.researcher_a, data=experiment_input(world, name="fresh"))
    row = page.locator(f"[data-table=my-waiting] tr[data-run='{run.pk}']")
    expect(row).to_contain_text(f"#{run.pk} fresh")
    run_cancel(run=run, actor=world.researcher_a)
    expect(row).to_have_count(0)
    expect(home).to_contain_text("No run of yours waits.")
    assert page.evaluate(NO_RELOAD) == 1, "the page was reloaded instead of updated"

    page.goto("/clusters/nodes/")
    page.evaluate(f"{NO_RELOAD} = 1")
    node = ClusterNode.objects.filter(cluster=world.cluster).order_by("name").first()
    shown = page.locator(f"[data-node='{node.name}'] .node-state")
    expect(shown).to_contain_text("takes work")
    ClusterNode.objects.filter(pk=node.pk).update(schedulable=False, reason="drained: fan failure")
    expect(shown).to_have_text("drained: fan failure")
    assert page.evaluate(NO_RELOAD) == 1, "the page was reloaded instead of updated"
    celery_app.control.purge()  # what run_submit and run_cancel sent to a broker no worker reads
