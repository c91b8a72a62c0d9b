"""The active health check on demand, end to end on the simulator: a platform admin asks
for one, the periodic sync submits it and follows it, its verdict is recorded on the node
(a failure quarantines, a pass lets a quarantined node return to service where the policy
asks for one)."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.urls import reverse

from clusters.backends.simulator import HEALTH_CHECK_S
from clusters.models import ClusterNode, NodeHealthCheck, NodeHealthEvent
from clusters.services.health import node_quarantine, node_release
from clusters.services.health_checks import node_health_check_request, node_health_checks_follow
from clusters.sim_faults import XID_HOLD_S, fault_settings, faults_between
from tenants.access import NotVisible
from tenants.models import AuditEvent

T = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
LEMON, HEALTHY = "sim-1-a100-80gb-01", "sim-1-a100-80gb-02"
DONE = timedelta(seconds=HEALTH_CHECK_S / 1000 + 1)  # the world's cluster runs 1000x


@pytest.fixture
def lemon_world(world):
    world.cluster.settings = {
        **world.cluster.settings,
        "faults": {"seed": 3, "lemons": {LEMON: {"class": "gpu_lost", "every_s": 14400, "gpu": 3}}},
    }
    world.cluster.save(update_fields=["settings"])
    return world


def state(check: NodeHealthCheck) -> tuple:
    check.refresh_from_db()
    return (check.state, check.job_name, check.detail)


def test_only_platform_admins_ask_and_one_at_a_time(lemon_world):
    with pytest.raises(NotVisible):
        node_health_check_request(
            cluster=lemon_world.cluster, node=HEALTHY, actor=lemon_world.researcher_a
        )
    with pytest.raises(ClusterNode.DoesNotExist):
        node_health_check_request(
            cluster=lemon_world.cluster, node="nope", actor=lemon_world.platform_admin
        )
    check = node_health_check_request(
        cluster=lemon_world.cluster, node=HEALTHY, actor=lemon_world.platform_admin
    )
    with pytest.raises(ValidationError, match=f"a health check of {HEALTHY} is under way already"):
        node_health_check_request(
            cluster=lemon_world.cluster, node=HEALTHY, actor=lemon_world.platform_admin
        )
    assert NodeHealthCheck.objects.count() == 1
    [audit] = AuditEvent.objects.filter(action="node.health_check")
    assert (audit.target, audit.after) == (f"sim-1/{HEALTHY}", {"check": check.pk})


def test_a_lemon_fails_and_is_quarantined_a_healthy_node_passes(lemon_world):
    cluster, admin = lemon_world.cluster, lemon_world.platform_admin
    with time_machine.travel(T, tick=False):
        bad = node_health_check_request(cluster=cluster, node=LEMON, actor=admin)
        good = node_health_check_request(cluster=cluster, node=HEALTHY, actor=admin)
        assert node_health_checks_follow(cluster=cluster) == 2  # both submitted
        assert node_health_checks_follow(cluster=cluster) == 0  # running: nothing new
    assert state(bad) == ("running", f"gantry-hc{bad.pk}", "")
    with time_machine.travel(T + DONE, tick=False):
        assert node_health_checks_follow(cluster=cluster) == 2
    end = T.timestamp() + HEALTH_CHECK_S / 1000
    settings = fault_settings(cluster.settings["faults"], nodes={LEMON: 8})
    last = faults_between({LEMON: 8}, settings, start=end - XID_HOLD_S, end=end)[-1]
    detail = (
        "a dcgmi diag test failed (DCGM_ST_NVVS_ERROR): dcgmi diag -r 1 on "
        f"{LEMON}: XID 79 (GPU has fallen off the bus) on GPU 3"
    )
    assert last.gpu == 3
    assert state(bad) == ("failed", f"gantry-hc{bad.pk}", detail)
    assert state(good) == ("passed", f"gantry-hc{good.pk}", "the health check passed (exit 0)")
    lemon = ClusterNode.objects.get(cluster=cluster, name=LEMON)
    assert (lemon.health, lemon.health_reason) == ("quarantined", detail)
    rows = NodeHealthEvent.objects.filter(cluster=cluster).order_by("node", "id")
    assert [(e.node, e.source, e.signal, e.action) for e in rows] == [
        (LEMON, "health_check", "health_check_failed", "quarantine"),
        (HEALTHY, "health_check", "health_check_passed", "observe"),
    ]


def test_release_waits_for_a_passing_check_when_the_policy_says_so(lemon_world):
    cluster, admin = lemon_world.cluster, lemon_world.platform_admin
    cluster.health_policy = {"release_needs_check": True}
    cluster.save(update_fields=["health_policy"])
    with time_machine.travel(T, tick=False):
        node_quarantine(cluster=cluster, node=HEALTHY, actor=admin, note="fans")
    with time_machine.travel(T + timedelta(minutes=1), tick=False):
        with pytest.raises(ValidationError, match="only after a health check passes"):
            node_release(cluster=cluster, node=HEALTHY, actor=admin, note="fixed")
        node_health_check_request(cluster=cluster, node=HEALTHY, actor=admin)
        node_health_checks_follow(cluster=cluster)
    with time_machine.travel(T + timedelta(minutes=1) + DONE, tick=False):
        node_health_checks_follow(cluster=cluster)
        node_release(cluster=cluster, node=HEALTHY, actor=admin, note="fixed")
    assert ClusterNode.objects.get(cluster=cluster, name=HEALTHY).health == "healthy"


def test_the_periodic_sync_follows_checks(lemon_world):
    from jobs.tasks import sync_all_clusters

    check = node_health_check_request(
        cluster=lemon_world.cluster, node=HEALTHY, actor=lemon_world.platform_admin
    )
    sync_all_clusters()
    assert state(check)[0] == "running"


def test_the_node_page_asks_for_a_check_and_shows_the_last_ones(client, lemon_world):
    client.force_login(lemon_world.platform_admin)
    url = reverse("telemetry:node_health_check", args=["sim-1", LEMON])
    page = reverse("telemetry:node_detail", args=["sim-1", LEMON])
    assert client.get(url).status_code == 405
    response = client.post(url, follow=True)
    check = NodeHealthCheck.objects.get()
    html = response.content.decode()
    assert f"A health check of {LEMON} was asked for; the next sync runs it." in html
    assert f'<tr data-check="{check.pk}">' in html
    assert '<span class="tag tag-check-pending">pending</span>' in html
    assert f'action="{url}"' in client.get(page).content.decode()
    again = client.post(url, follow=True).content.decode()
    assert f"No health check asked for: a health check of {LEMON} is under way already" in again
    client.force_login(lemon_world.researcher_a)
    assert client.post(url).status_code == 404
    assert NodeHealthCheck.objects.count() == 1
