"""The Node health pages (platform admins only), their figures and the two acts, and the
ETTR shown to researchers on their run and tenant pages.

Every row is written with the ORM at fixed times, so each figure is known exactly. The
clock stands at NOW; the window is the 30 days before it.
"""

import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import strip_tags

from clusters.models import ClusterNode, NodeHealthEvent
from jobs.models import Attempt, AttemptState, Run, RunState
from jobs.services.submission import run_submit
from telemetry import node_views
from telemetry.accounting import WASTE
from telemetry.models import AttemptAccounting
from tests.conftest import experiment_input

NOW = datetime(2026, 3, 31, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def text(html: str) -> str:
    """The words of ``html``, cells apart (a space for every tag)."""
    return " ".join(strip_tags(html.replace("<", " <")).split())


def event(world, node: str, at: datetime, **fields) -> NodeHealthEvent:
    values = {
        "cluster": world.cluster,
        "node": node,
        "source": "dcgm",
        "signal": "nvlink",
        "observed_at": at,
        "last_observed_at": at,
        "recorded_at": at,
    }
    values.update(fields)
    return NodeHealthEvent.objects.create(**values)


def attempt(run, number, *, created, finished, cause="", node="", lost=0, startup=0, alloc=0):
    row = Attempt.objects.create(
        run=run,
        number=number,
        cluster=run.cluster,
        state=AttemptState.FAILED if cause else AttemptState.SUCCEEDED,
        started_at=created,
        finished_at=finished,
        cause_class=cause,
        cause_evidence={"node": node, "signal": "ecc_uncorrectable", "code": "48"} if node else {},
        node_list=[node] if node else [],
    )
    Attempt.objects.filter(pk=row.pk).update(created_at=created)
    waste = dict.fromkeys(WASTE, 0)
    waste.update(lost=lost, startup=startup)
    AttemptAccounting.objects.create(
        attempt=row,
        allocated_gpu_s=alloc,
        effective_gpu_s=alloc - lost - startup,
        **{f"{name}_gpu_s": value for name, value in waste.items()},
        activity_weighted_gpu_s=0.0,
        computed_at=finished,
        # What finance's accounting stores (docs/node-health.md, Credits): lost + startup
        # for a hardware or platform end.
        cause_class=cause,
        credited_gpu_s=lost + startup if cause in ("hardware", "platform") else 0,
    )
    return row


@pytest.fixture
def nodes(world) -> list[str]:
    return list(
        ClusterNode.objects.filter(cluster=world.cluster)
        .order_by("name")
        .values_list("name", flat=True)
    )


@pytest.fixture
def health_world(world, nodes):
    """Node A: an NVLink fault, a person's quarantine 90 s later, a release, then a
    double-bit ECC error that quarantined it 30 s after it was seen. Node B: suspect from a
    thermal throttle. Two runs, one per tenant, with attempts ended on node A."""
    a, b = nodes[0], nodes[1]
    event(world, a, NOW - 10 * DAY, action="warn", code="74", gpu="3")
    event(
        world,
        a,
        NOW - 10 * DAY + timedelta(seconds=90),
        source="person",
        signal="quarantine",
        action="quarantine",
        actor=world.platform_admin,
        note="XID 74 <twice>",
    )
    event(
        world,
        a,
        NOW - 8 * DAY,
        source="person",
        signal="release",
        action="release",
        actor=world.platform_admin,
        note="reseated the NVLink bridge",
    )
    event(
        world,
        a,
        NOW - 2 * DAY,
        signal="ecc_uncorrectable",
        code="48",
        gpu="5",
        recorded_at=NOW - 2 * DAY + timedelta(seconds=30),
        action="quarantine",
        detail="XID 48 Double Bit ECC Error",
    )
    event(world, b, NOW - DAY, signal="thermal_throttle", action="warn", gpu="0", code="0x40")
    ClusterNode.objects.filter(cluster=world.cluster, name=a).update(
        health="quarantined",
        health_reason="ecc_uncorrectable on GPU 5",
        fence_error="scontrol: Access/permission denied",
    )
    ClusterNode.objects.filter(cluster=world.cluster, name=b).update(
        health="suspect", health_reason="thermal throttling"
    )
    vision = run_submit(user=world.researcher_a, data=experiment_input(world))
    nlp = run_submit(
        user=world.researcher_b,
        data=experiment_input(world, tenant="nlp", project="llm", name="llm", gpus_per_node=1),
    )
    for run, finished in ((vision, NOW - DAY), (nlp, NOW - 3 * DAY)):
        Run.objects.filter(pk=run.pk).update(
            state=RunState.SUCCEEDED, finished_at=finished, cluster=world.cluster
        )
        run.refresh_from_db()
    attempt(vision, 1, created=NOW - 3 * DAY, finished=NOW - 2 * DAY, cause="hardware", node=a,
            lost=7200, startup=600, alloc=172_800)  # fmt: skip
    attempt(vision, 2, created=NOW - 2 * DAY + timedelta(hours=1), finished=NOW - DAY,
            alloc=165_600)  # fmt: skip
    attempt(nlp, 1, created=NOW - 5 * DAY, finished=NOW - 4 * DAY, cause="platform", node=a,
            lost=1800, startup=300, alloc=86_400)  # fmt: skip
    attempt(nlp, 2, created=NOW - 4 * DAY, finished=NOW - 3 * DAY, cause="user", node=a,
            lost=3600, alloc=86_400)  # fmt: skip
    return SimpleNamespace(a=a, b=b, vision=vision, nlp=nlp)


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False):
        yield


def get(client, user, url: str, status: int = 200):
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == status, url
    return response


# --- who may see them -------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["researcher_a", "tenant_admin_a", "finance", "researcher_b"])
def test_only_platform_admins_see_or_act(client, world, health_world, who):
    user = getattr(world, who)
    client.force_login(user)
    a = health_world.a
    for url in (
        reverse("telemetry:node_health"),
        reverse("telemetry:node_detail", args=["sim-1", a]),
    ):
        assert client.get(url).status_code == 404
    for name in ("telemetry:node_quarantine", "telemetry:node_release"):
        response = client.post(reverse(name, args=["sim-1", a]), {"note": "mine now"})
        assert response.status_code == 404
    assert NodeHealthEvent.objects.count() == 5


def test_anonymous_is_sent_to_login(client, health_world):
    response = client.get(reverse("telemetry:node_health"))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_unknown_node_is_404(client, world, health_world):
    get(client, world.platform_admin, reverse("telemetry:node_detail", args=["sim-1", "x"]), 404)
    get(client, world.platform_admin, reverse("telemetry:node_detail", args=["nope", "x"]), 404)


# --- the overview -----------------------------------------------------------------------------


def test_overview_figures(client, world, health_world, clock):
    html = get(client, world.platform_admin, reverse("telemetry:node_health")).content.decode()
    page = text(html)
    assert "6 nodes" not in page  # the figure is per health state
    by_health = re.search(r'data-figure="by-health">(.*?)</td>', html).group(1)
    assert text(by_health) == "4 healthy · 1 suspect · 1 quarantined"
    # Node A: 2 faults; quarantined (10 d - 90 s … 8 d) and (2 d - 30 s … now): 4 d - 120 s.
    # In service: 26 d + 120 s on A, 30 d on each of the other five 8-GPU nodes.
    assert text(re.search(r'data-figure="mtbf">(.*?)</td>', html).group(1)) == (
        "2112.0 h (2 faults)"  # (176 d + 120 s) ÷ 2
    )
    per = re.search(r'data-figure="per-gpu-days">(.*?)</td>', html).group(1)
    assert per == "1.42"  # 2 * 1000 * 86400 ÷ (8 * (176 d + 120 s))
    latency = text(re.search(r'data-figure="latency">(.*?)</td>', html).group(1))
    assert latency == "p50 30 s · p95 1 min 30 s (2 quarantines)"
    # ETTR: vision 330,600 of 2 * 172,800; nlp 167,100 of 172,800; together 497,700 of 518,400.
    assert text(re.search(r'data-figure="ettr">(.*?)</td>', html).group(1)) == "96.0 %"
    assert 'data-tenant="nlp"><th scope="row">nlp</th><td class="num">96.7 %' in html
    assert 'data-tenant="vision"><th scope="row">vision</th><td class="num">95.7 %' in html


def test_overview_worst_offenders_and_node_rows(client, world, health_world, clock):
    html = get(client, world.platform_admin, reverse("telemetry:node_health")).content.decode()
    a, b = health_world.a, health_world.b
    worst_faults = re.search(r'data-table="worst-faults">(.*?)</table>', html, re.S).group(1)
    assert text(worst_faults) == (
        f"Most hardware faults Node Faults MTBF Health sim-1/{a} 2 312.0 h quarantined"
    )
    worst_lost = re.search(r'data-table="worst-lost">(.*?)</table>', html, re.S).group(1)
    assert f"sim-1/{a} 2.50 GPU-h 2 quarantined" in text(worst_lost)  # 7,200 + 1,800 GPU-s
    row_a = re.search(rf'<tr data-node="sim-1/{a}" class="node-health-quarantined">(.*?)</tr>',
                      html, re.S).group(1)  # fmt: skip
    assert text(row_a) == (
        f"sim-1/{a} 8 × a100-80gb quarantined ecc_uncorrectable on GPU 5 not fenced: "
        "scontrol: Access/permission denied takes work ecc_uncorrectable 48 GPU 5 "
        "2026-03-29 12:00 UTC 2 312.0 h 2.50 GPU-h none"
    )
    row_b = re.search(rf'<tr data-node="sim-1/{b}" class="node-health-suspect">(.*?)</tr>',
                      html, re.S).group(1)  # fmt: skip
    assert "suspect thermal throttling" in text(row_b)
    assert "thermal_throttle 0x40 GPU 0" in text(row_b)
    assert text(row_b).endswith("0 — 0 GPU-h none")


def test_overview_lost_and_credited_by_cause_and_month(client, world, health_world, clock):
    html = get(client, world.platform_admin, reverse("telemetry:node_health")).content.decode()
    by_cause = re.search(r'data-table="by-cause">(.*?)</table>', html, re.S).group(1)
    rows = re.findall(r"<tr data-cause=\"(\w+)\">(.*?)</tr>", by_cause, re.S)
    assert [(cause, text(cells)) for cause, cells in rows] == [
        ("user", "user 1 1.00 GPU-h 0 GPU-h"),
        ("platform", "platform 1 0.50 GPU-h 0.58 GPU-h"),  # 1,800 + 300 GPU-s
        ("hardware", "hardware 1 2.00 GPU-h 2.17 GPU-h"),  # 7,200 + 600 GPU-s
    ]
    by_month = re.search(r'data-table="by-month">(.*?)</table>', html, re.S).group(1)
    months = re.findall(r'<tr data-month="([\d-]+)">(.*?)</tr>', by_month, re.S)
    assert [(month, text(cells)) for month, cells in months] == [
        ("2025-10", "2025-10 0 0 0"),
        ("2025-11", "2025-11 0 0 0"),
        ("2025-12", "2025-12 0 0 0"),
        ("2026-01", "2026-01 0 0 0"),
        ("2026-02", "2026-02 0 0 0"),
        ("2026-03", "2026-03 1 1 1"),
    ]


def test_credited_is_finances_stored_credit_under_the_cause_it_was_computed_with(
    world, health_world
):
    from telemetry.kpis.reliability_reads import CauseHours, lost_and_credited_by_cause

    since, until = NOW - 30 * DAY, NOW
    vision_first = AttemptAccounting.objects.get(
        attempt__run=health_world.vision, attempt__number=1
    )
    nlp_first = AttemptAccounting.objects.get(attempt__run=health_world.nlp, attempt__number=1)
    # The stored credit is read, not recomputed; an accounting computed before
    # the cause was known (cause_class "") counts once it is computed again.
    AttemptAccounting.objects.filter(pk=vision_first.pk).update(credited_gpu_s=1234)
    AttemptAccounting.objects.filter(pk=nlp_first.pk).update(cause_class="", credited_gpu_s=0)
    assert lost_and_credited_by_cause(since=since, until=until) == [
        CauseHours("user", 1, 3600, 0),
        CauseHours("platform", 0, 0, 0),
        CauseHours("hardware", 1, 7200, 1234),
    ]


def test_overview_queries_do_not_grow_with_nodes_or_events(client, world, health_world, clock):
    client.force_login(world.platform_admin)
    url = reverse("telemetry:node_health")
    with CaptureQueriesContext(connection) as before:
        assert client.get(url).status_code == 200
    for hour in range(20):
        for node in (health_world.a, health_world.b, "gone-node"):
            event(world, node, NOW - timedelta(hours=hour), signal="gpu_lost", code="79")
    with CaptureQueriesContext(connection) as after:
        assert client.get(url).status_code == 200
    assert len(after) == len(before)
    own = [q["sql"] for q in after.captured_queries if "nodehealthevent" in q["sql"]]
    assert len(own) == 1
    # Session, user, roles, the notifications badge; nodes, events, lost per node, straggler
    # flags per node, ETTR per tenant, failures per month, lost and credited by cause.
    assert len(after) == 11


# --- one node ---------------------------------------------------------------------------------


def test_node_history_and_attempts(client, world, health_world, clock):
    a = health_world.a
    url = reverse("telemetry:node_detail", args=["sim-1", a])
    html = get(client, world.platform_admin, url).content.decode()
    history = re.search(r'data-table="history">(.*?)</table>', html, re.S).group(1)
    rows = [text(row) for row in re.findall(r"<tr data-event=\"\d+\">(.*?)</tr>", history, re.S)]
    assert rows == [
        "2026-03-29 12:00:00 UTC ecc_uncorrectable 48 5 dcgm quarantine Gantry "
        "XID 48 Double Bit ECC Error",
        "2026-03-23 12:00:00 UTC release — person release paul reseated the NVLink bridge",
        "2026-03-21 12:01:30 UTC quarantine — person quarantine paul XID 74 &lt;twice&gt;",
        "2026-03-21 12:00:00 UTC nvlink 74 3 dcgm warn Gantry",
    ]
    assert "XID 74 &lt;twice&gt;" in history  # escaped
    attempts = re.search(r'data-table="attempts">(.*?)</table>', html, re.S).group(1)
    shown = re.findall(r'<tr data-attempt="(\d+)">(.*?)</tr>', attempts, re.S)
    assert [text(cells) for _, cells in shown] == [
        f"run {health_world.vision.pk} · attempt 1 vision hardware ecc_uncorrectable 48 "
        "2026-03-29 12:00 UTC 2.00 GPU-h",
        f"run {health_world.nlp.pk} · attempt 1 nlp platform ecc_uncorrectable 48 "
        "2026-03-27 12:00 UTC 0.50 GPU-h",
    ]
    figures = text(re.search(r'data-fact="figures">(.*?)</dd>', html, re.S).group(1))
    assert figures == "2 hardware faults; MTBF 312.0 h; 2.50 GPU-h lost in 2 attempts"
    fence = text(re.search(r'data-fact="fence">(.*?)</dd>', html, re.S).group(1))
    assert fence == (
        "not fenced scontrol: Access/permission denied (Gantry still places no work there itself)"
    )
    assert reverse("telemetry:node_release", args=["sim-1", a]) in html  # quarantined: release
    assert 'name="csrfmiddlewaretoken"' in html


def test_node_page_queries_do_not_grow_with_events(client, world, health_world, clock):
    client.force_login(world.platform_admin)
    url = reverse("telemetry:node_detail", args=["sim-1", health_world.a])
    with CaptureQueriesContext(connection) as before:
        assert client.get(url).status_code == 200
    for hour in range(30):
        event(world, health_world.a, NOW - timedelta(hours=hour), signal="gpu_lost",
              source="person" if hour % 2 else "dcgm", actor=world.platform_admin)  # fmt: skip
    with CaptureQueriesContext(connection) as after:
        assert client.get(url).status_code == 200
    assert len(after) == len(before)
    # Session, user, roles, the notifications badge; the node, its events (with who acted),
    # the attempts affected (with their run, tenant and accounting), its health checks.
    assert len(after) == 8


# --- the acts ---------------------------------------------------------------------------------


@pytest.fixture
def services(monkeypatch):
    calls = []

    def record(name):
        def act(**kwargs):
            calls.append((name, kwargs))
            if kwargs["note"] == "refuse":
                raise ValidationError("no passing health check since the quarantine")

        return act

    monkeypatch.setattr(node_views, "node_quarantine", record("quarantine"))
    monkeypatch.setattr(node_views, "node_release", record("release"))
    return calls


@pytest.mark.parametrize("act", ["quarantine", "release"])
def test_an_act_calls_the_service_with_the_note(client, world, health_world, services, act):
    b = health_world.b
    client.force_login(world.platform_admin)
    url = reverse(f"telemetry:node_{act}", args=["sim-1", b])
    response = client.post(url, {"note": "  fan noise, see ticket 42  "})
    assert response.status_code == 302
    assert response["Location"] == reverse("telemetry:node_detail", args=["sim-1", b])
    assert services == [
        (
            act,
            {
                "cluster": world.cluster,
                "node": b,
                "actor": world.platform_admin,
                "note": "fan noise, see ticket 42",
            },
        )
    ]
    done = "quarantined" if act == "quarantine" else "returned to service"
    assert f"{b} {done}." in text(client.get(response["Location"]).content.decode())


def test_an_act_without_a_note_changes_nothing(client, world, health_world, services):
    client.force_login(world.platform_admin)
    url = reverse("telemetry:node_quarantine", args=["sim-1", health_world.b])
    response = client.post(url, {"note": "   "})
    assert response.status_code == 400
    assert "This field is required." in response.content.decode()
    assert services == []


def test_a_refused_act_says_why(client, world, health_world, services):
    client.force_login(world.platform_admin)
    url = reverse("telemetry:node_release", args=["sim-1", health_world.a])
    response = client.post(url, {"note": "refuse"}, follow=True)
    assert len(services) == 1
    assert (
        f"{health_world.a} was not changed: no passing health check since the quarantine"
        in text(response.content.decode())
    )


def test_acts_need_csrf_and_post(client, world, health_world, services):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.platform_admin)
    url = reverse("telemetry:node_quarantine", args=["sim-1", health_world.b])
    assert strict.post(url, {"note": "x"}).status_code == 403
    client.force_login(world.platform_admin)
    assert client.get(url).status_code == 405
    assert services == []


def test_an_act_on_an_unknown_node_is_404(client, world, health_world, services):
    client.force_login(world.platform_admin)
    url = reverse("telemetry:node_quarantine", args=["sim-1", "nope"])
    assert client.post(url, {"note": "x"}).status_code == 404
    assert services == []


def test_the_acts_go_through_the_clusters_services(client, world, health_world):
    """Without the stand-ins: the quarantine and the release are H1's, audited, recorded as
    the person's acts; a release the policy refuses changes nothing."""
    from tenants.models import AuditEvent

    b = health_world.b
    client.force_login(world.platform_admin)
    quarantine = reverse("telemetry:node_quarantine", args=["sim-1", b])
    release = reverse("telemetry:node_release", args=["sim-1", b])
    assert client.post(quarantine, {"note": "fans"}).status_code == 302
    node = ClusterNode.objects.get(cluster=world.cluster, name=b)
    assert (node.health, node.health_reason) == ("quarantined", "quarantined by paul: fans")
    world.cluster.health_policy = {"release_needs_check": True}
    world.cluster.save(update_fields=["health_policy"])
    response = client.post(release, {"note": "fixed"}, follow=True)
    assert f"{b} was not changed: {b} returns to service only after a health check" in text(
        response.content.decode()
    )
    assert ClusterNode.objects.get(pk=node.pk).health == "quarantined"
    world.cluster.health_policy = {}
    world.cluster.save(update_fields=["health_policy"])
    assert client.post(release, {"note": "fixed"}).status_code == 302
    assert ClusterNode.objects.get(pk=node.pk).health == "healthy"
    acts = NodeHealthEvent.objects.filter(node=b, source="person").order_by("id")
    assert [(e.signal, e.action, e.actor, e.note) for e in acts] == [
        ("quarantine", "quarantine", world.platform_admin, "fans"),
        ("release", "release", world.platform_admin, "fixed"),
    ]
    audited = AuditEvent.objects.filter(target=f"sim-1/{b}").order_by("id")
    assert [a.action for a in audited] == ["node.quarantine", "node.release"]


# --- what researchers see ---------------------------------------------------------------------


def ettr_shown(html: str) -> str:
    return text(re.search(r'data-kpi="ettr">(.*?)</dd>', html, re.S).group(1))


def test_run_page_shows_the_runs_ettr_to_its_tenant_only(client, world, health_world, clock):
    vision, nlp = health_world.vision, health_world.nlp
    url = reverse("telemetry:run_telemetry", args=[vision.pk])
    # 330,600 effective GPU-s over 2 GPUs x 2 days from attempt 1's admission to the end.
    assert ettr_shown(get(client, world.researcher_a, url).content.decode()) == "95.7 %"
    get(client, world.researcher_b, url, 404)
    nlp_url = reverse("telemetry:run_telemetry", args=[nlp.pk])
    assert ettr_shown(get(client, world.researcher_b, nlp_url).content.decode()) == "96.7 %"


def test_a_run_still_going_counts_to_now(client, world, health_world, clock):
    Run.objects.filter(pk=health_world.vision.pk).update(finished_at=None, state=RunState.RUNNING)
    url = reverse("telemetry:run_telemetry", args=[health_world.vision.pk])
    # 330,600 of 2 GPUs x 3 days (attempt 1 was admitted 3 days before now).
    assert ettr_shown(get(client, world.researcher_a, url).content.decode()) == "63.8 % so far"


def test_tenant_usage_page_shows_the_tenants_ettr(client, world, health_world, clock):
    url = reverse("telemetry:tenant_goodput", args=["vision"]) + "?days=30"
    html = get(client, world.researcher_a, url).content.decode()
    assert ettr_shown(html) == "95.7 %"  # vision's run only, not nlp's
    assert "96.7" not in html and "96.0" not in html
    get(client, world.researcher_a, reverse("telemetry:tenant_goodput", args=["nlp"]), 404)


# --- the cluster map --------------------------------------------------------------------------


def map_node(html: str, node: str) -> str:
    return re.search(rf'<li class="[^"]*" data-node="{node}">.*?</li>', html, re.S).group(0)


def test_the_cluster_map_marks_quarantined_and_suspect_nodes(client, world, health_world):
    a, b = health_world.a, health_world.b
    url = reverse("jobs:cluster_nodes")
    admin_html = get(client, world.platform_admin, url).content.decode()
    row = map_node(admin_html, a)
    # Quarantined: it takes no work from Gantry's placement (jobs.selectors.queue), and says why.
    assert row.startswith(f'<li class="node node-off node-quarantined" data-node="{a}">')
    assert row.endswith(
        '<span class="node-state">quarantined by Gantry: ecc_uncorrectable on GPU 5</span></li>'
    )
    assert (
        '<span class="tag tag-health-quarantined" data-health="quarantined" '
        'title="ecc_uncorrectable on GPU 5">quarantined</span>'
    ) in row
    assert (
        '<span class="tag tag-health-suspect" data-health="suspect" title="thermal throttling">'
        in map_node(admin_html, b)
    )
    healthy = map_node(admin_html, "sim-1-a100-80gb-02")
    assert "data-health" not in healthy and "node-healthy" not in healthy
    # A researcher sees the state, not the reason.
    member_row = map_node(get(client, world.researcher_a, url).content.decode(), a)
    assert '<span class="tag tag-health-quarantined" data-health="quarantined">' in member_row
    assert "ecc_uncorrectable" not in member_row
    assert member_row.endswith('<span class="node-state">quarantined by Gantry</span></li>')


def test_platform_kpis_link_to_node_health_for_platform_admins_only(client, world):
    url = reverse("telemetry:platform_kpis")
    link = f'<a href="{reverse("telemetry:node_health")}" data-link="node-health">Node health</a>'
    assert link in get(client, world.platform_admin, url).content.decode()
    assert link not in get(client, world.finance, url).content.decode()
