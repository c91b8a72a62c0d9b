"""Home, Nodes and KPIs refresh themselves like the run list (jobs.live.live_page): each page
polls itself for its live part with the version it shows; an unchanged part is 204, a changed
one comes back whole (and alone, without the navigation), so nothing it showed stays behind.
"""

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
import time_machine
from django.utils import timezone

from clusters.models import ClusterNode
from clusters.services import cluster_refresh_inventory
from jobs.live import LIVE_PAGE_REFRESH_S
from jobs.models import Run, RunState
from jobs.services.submission import run_submit
from telemetry.kpis.views import KPIS_REFRESH_S
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db


def poll_url(html: str, part_id: str, every: int = LIVE_PAGE_REFRESH_S) -> str:
    match = re.search(rf'<div id="{part_id}" hx-get="([^"]+)" hx-trigger="every (\d+)s"', html)
    assert match, part_id
    assert int(match.group(2)) == every
    return unescape(match.group(1))


def follow(client, url: str, part_id: str, *, changed: bool) -> str:
    """One poll; the part it answers (or "" for 204)."""
    answer = client.get(url)
    assert answer.status_code == (200 if changed else 204)
    assert answer["Cache-Control"] == "max-age=0, no-cache, no-store, must-revalidate, private"
    if not changed:
        return ""
    part = answer.content.decode()
    assert part.startswith(f'<div id="{part_id}" ')
    assert "<nav" not in part and "<html" not in part  # the part alone
    return part


def test_home_refreshes_itself(client, world):
    client.force_login(world.researcher_a)
    page = client.get("/").content.decode()
    url = poll_url(page, "home-live")
    follow(client, url, "home-live", changed=False)

    run = run_submit(user=world.researcher_a, data=experiment_input(world, name="fresh"))
    part = follow(client, url, "home-live", changed=True)

    assert f"#{run.pk} fresh" in part
    assert 'Waiting <span class="muted">(1)</span>' in part
    # The part swapped in polls with its own version: unchanged since, 204.
    follow(client, poll_url(part, "home-live"), "home-live", changed=False)


def test_nodes_refresh_themselves(client, world):
    cluster_refresh_inventory(cluster=world.cluster)
    client.force_login(world.platform_admin)
    page = client.get("/clusters/nodes/").content.decode()
    url = poll_url(page, "nodes-live")
    follow(client, url, "nodes-live", changed=False)

    node = ClusterNode.objects.filter(cluster=world.cluster).order_by("name").first()
    node.schedulable, node.reason = False, "drained: fan failure"
    node.save(update_fields=["schedulable", "reason"])
    part = follow(client, url, "nodes-live", changed=True)

    assert "drained: fan failure" in part
    assert "drained: fan failure" not in page


@time_machine.travel(datetime(2026, 12, 6, 3, 30, tzinfo=UTC), tick=False)
def test_kpis_refresh_themselves_and_keep_the_range(client, world):
    """With the clock standing still (a range up to now grows with it), an unchanged range
    answers 204; a run that ends in it comes back."""
    client.force_login(world.platform_admin)
    page = client.get("/platform/kpis/").content.decode()
    url = poll_url(page, "kpis-live", every=KPIS_REFRESH_S)
    assert "partial=kpis-live" in url
    follow(client, url, "kpis-live", changed=False)

    run = run_submit(user=world.researcher_a, data=experiment_input(world, name="ended"))
    Run.objects.filter(pk=run.pk).update(
        state=RunState.SUCCEEDED, finished_at=timezone.now() - timedelta(minutes=1)
    )
    part = follow(client, url, "kpis-live", changed=True)

    assert re.search(r'data-kpi="success">100\.0 % <span class="muted">\(1 of 1 run\)', part)


def test_a_kpi_range_in_the_past_polls_with_its_range(client, world):
    client.force_login(world.platform_admin)
    page = client.get("/platform/kpis/?from=2025-03-01&to=2025-03-31").content.decode()

    url = poll_url(page, "kpis-live", every=KPIS_REFRESH_S)

    assert url.startswith("/platform/kpis/?from=2025-03-01&to=2025-03-31&partial=kpis-live")
