"""The what-if pages: who may open which (platform admins act; finance and the admins of the
tenants a shared report concerns read it, their rows only; everybody else 404), the figures
they show, the new-report form, the live progress, and applying a proposal."""

import json
import re
from datetime import timedelta

import pytest
import time_machine
from django.test import Client
from django.urls import reverse

from policy.models import ReplayReport
from policy.proposals import proposal_from_json
from policy.services.replaying import replay_report_run
from tenants.models import AuditEvent, Membership, Quota
from tests.conftest import make_user
from tests.html_support import post_form
from tests.policy.support import NOW, T0, WINDOW, ask, record_history, submit, text_of

pytestmark = pytest.mark.django_db

SWAP = {
    "quotas": [
        {"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24},
        {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8},
    ]
}
VISION_ONLY = {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 8}]}


def client_of(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def people(world):
    """The personas, and nora: the admin of nlp, a tenant the vision-only report does not
    concern."""
    nora = make_user("nora")
    Membership.objects.create(user=nora, tenant=world.nlp, role="tenant_admin")
    return {
        "anonymous": None,
        "alice": world.researcher_a,
        "bob": world.researcher_b,
        "tara": world.tenant_admin_a,
        "nora": nora,
        "fiona": world.finance,
        "paul": world.platform_admin,
    }


@pytest.fixture
def vision_report(world):
    """A shared report concerning vision alone: its runs only in the window, its quota only."""
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        submit(world, "vision", work_s=300)
    return ask(world, VISION_ONLY, confirm_warnings=True, share=True)


# persona: anonymous alice bob tara nora fiona paul
MATRIX = {
    ("report_list", "GET"): (302, 404, 404, 200, 200, 200, 200),
    ("report_new", "GET"): (302, 404, 404, 404, 404, 404, 200),
    ("report_new", "POST"): (302, 404, 404, 404, 404, 404, 400),
    ("report_detail", "GET"): (302, 404, 404, 200, 404, 200, 200),
    ("report_cancel", "POST"): (302, 404, 404, 403, 404, 403, 302),
    ("report_rerun", "POST"): (302, 404, 404, 403, 404, 403, 302),
    ("report_share", "POST"): (302, 404, 404, 403, 404, 403, 302),
    ("report_apply", "GET"): (302, 404, 404, 403, 404, 403, 200),
    ("report_apply", "POST"): (302, 404, 404, 403, 404, 403, 400),
}
PERSONAS = ("anonymous", "alice", "bob", "tara", "nora", "fiona", "paul")


@pytest.mark.parametrize(("name", "method"), list(MATRIX))
def test_who_may_open_which_page(world, people, vision_report, name, method):
    args = [] if name in ("report_list", "report_new") else [vision_report.pk]
    url = reverse(f"policy:{name}", args=args)
    answers = []
    for persona in PERSONAS:
        client = client_of(people[persona])
        response = client.get(url) if method == "GET" else client.post(url, {})
        answers.append(response.status_code)
    assert tuple(answers) == MATRIX[(name, method)]


def test_a_report_not_shared_is_for_platform_admins_alone(world, people, vision_report):
    ReplayReport.objects.filter(pk=vision_report.pk).update(shared=False)
    url = reverse("policy:report_detail", args=[vision_report.pk])
    answers = {p: client_of(people[p]).get(url).status_code for p in PERSONAS[1:]}
    assert answers == {
        "alice": 404, "bob": 404, "tara": 404, "nora": 404, "fiona": 404, "paul": 200,
    }  # fmt: skip
    listed = client_of(people["tara"]).get(reverse("policy:report_list"))
    assert f'data-report="{vision_report.pk}"' not in listed.content.decode()


def test_a_denied_act_changes_nothing(world, people, vision_report):
    before = (AuditEvent.objects.count(), list(ReplayReport.objects.values()))
    for persona in ("tara", "fiona", "nora", "alice"):
        client = client_of(people[persona])
        for name in ("report_cancel", "report_share", "report_apply"):
            client.post(
                reverse(f"policy:{name}", args=[vision_report.pk]),
                {"shared": "on", "confirm": "on", "confirm_overcommit": "on"},
            )
    assert (AuditEvent.objects.count(), list(ReplayReport.objects.values())) == before


def test_cancelling_needs_the_csrf_token(world, people, vision_report):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.platform_admin)
    response = client.post(reverse("policy:report_cancel", args=[vision_report.pk]))
    assert response.status_code == 403
    assert ReplayReport.objects.get(pk=vision_report.pk).status == "queued"


@pytest.fixture
def done_report(world):
    record_history(world)
    report = ask(world, SWAP, confirm_warnings=True, share=True)
    with time_machine.travel(NOW, tick=False):
        replay_report_run(report_id=report.pk)
    report.refresh_from_db()
    return report


def live_text(html: str) -> str:
    start = html.index('id="report-live"')
    return text_of(html[start:])


def test_the_report_shows_each_tenant_side_by_side_in_figures_and_words(world, done_report):
    html = (
        client_of(world.platform_admin)
        .get(reverse("policy:report_detail", args=[done_report.pk]))
        .content.decode()
    )
    rows = re.findall(r'<tr data-tenant="(\w+)">(.*?)</tr>', html, re.S)
    cells = {tenant: text_of(row).split() for tenant, row in rows}
    assert cells == {
        # p50: happened, proposed, change; p95 alike; GPU-hours; preemptions; lost; not started
        "nlp": ["nlp", "0", "s", "12", "min", "+12", "min", "12", "min", "20", "min", "+8",
                "min", "4.3", "2.7", "−1.6", "0", "0", "±0", "0.0", "0.0", "±0", "0", "1"],
        "vision": ["vision", "0", "s", "0", "s", "±0", "s", "7", "min", "0", "s", "−7", "min",
                   "2.8", "2.8", "±0", "0", "0", "±0", "0.0", "0.0", "±0", "0", "0"],
    }  # fmt: skip
    text = live_text(html)
    assert "Wins (shorter p95 queue time): vision." in text
    assert "Loses (longer p95 queue time): nlp." in text
    assert "nlp: p95 queue time 12 min → 20 min (+67 %); p50 0 s → 12 min" in text
    assert "Utilisation 44.2 % → 34.2 % (−10.0 points)" in text
    assert "utilisation 44.2 % happened, 44.2 % replayed" in text
    chart = json.loads(re.search(r'id="queue-chart-data"[^>]*>(.*?)</script>', html, re.S)[1])
    assert chart["categories"] == ["nlp", "vision"]
    assert [t["values"] for t in chart["traces"]] == [[12.0, 7.0], [20.0, 0.0]]
    # Done, and polled: nothing changes any more.
    assert 'hx-trigger="every 60s"' in html


def test_a_tenant_admin_sees_their_tenant_and_the_platform_totals_only(world, done_report):
    html = (
        client_of(world.tenant_admin_a)
        .get(reverse("policy:report_detail", args=[done_report.pk]))
        .content.decode()
    )
    assert re.findall(r'<tr data-tenant="(\w+)">', html) == ["vision"]
    assert "nlp" not in html
    text = live_text(html)
    assert "Wins (shorter p95 queue time): vision." in text
    assert "Utilisation 44.2 % → 34.2 %" in text
    assert "vision · a100-80gb : 24 guaranteed" in text_of(html)
    finance = client_of(world.finance).get(reverse("policy:report_detail", args=[done_report.pk]))
    assert re.findall(r'<tr data-tenant="(\w+)">', finance.content.decode()) == ["nlp", "vision"]


def test_the_progress_is_live_and_a_poll_of_the_same_version_is_204(world, vision_report):
    client = client_of(world.platform_admin)
    url = reverse("policy:report_detail", args=[vision_report.pk])
    ReplayReport.objects.filter(pk=vision_report.pk).update(
        status="running", progress=0.42, heartbeat_at=NOW, started_at=NOW
    )
    with time_machine.travel(NOW + timedelta(seconds=1), tick=False):
        html = client.get(url).content.decode()
        poll = re.search(r'hx-get="([^"]+)"', html)[1].replace("&amp;", "&")
        assert 'hx-trigger="every 2s"' in html
        assert "Replayed 42 % 42 %" in text_of(html)
        assert client.get(poll).status_code == 204
        ReplayReport.objects.filter(pk=vision_report.pk).update(progress=0.5)
        changed = client.get(poll)
    assert changed.status_code == 200
    assert '<progress id="replay-progress" max="100" value="50">' in changed.content.decode()


def filled(client: Client, **changes: str) -> dict[str, str]:
    """The new-report form as its page fills it (today's values), with ``changes``."""
    url = reverse("policy:report_new")
    return post_form(client.get(url).content.decode(), url).values | changes


def test_the_form_proposes_what_differs_from_today(world):
    with time_machine.travel(NOW - timedelta(days=2), tick=False):
        submit(world, "nlp", work_s=300)
    client = client_of(world.platform_admin)
    with time_machine.travel(NOW, tick=False):
        page = client.get(reverse("policy:report_new")).content.decode()
        response = client.post(
            reverse("policy:report_new"),
            filled(
                client,
                **{
                    "q:nlp:a100-80gb:guaranteed": "8",
                    "q:nlp:a100-80gb:weight": "3",
                    "n:sim-1:h100-80gb": "2",
                    "preemption": "off",
                    "starvation_after_min": "45",
                    "share": "on",
                },
            ),
        )
    assert 'data-quota="vision:a100-80gb"' in page
    assert "16 guaranteed · 0 borrow · weight 1 · no budget" in text_of(page)
    report = ReplayReport.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("policy:report_detail", args=[report.pk])
    assert (report.window_start, report.window_end, report.shared) == (
        NOW - timedelta(days=30),
        NOW,
        True,
    )
    assert report.proposal == {
        "quotas": [
            {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8, "borrow_limit": 0,
             "max_gpus_per_run": None, "budget_gpu_hours": None, "budget_hard": True,
             "weight": 3},
        ],
        "nodes": [{"cluster": "sim-1", "flavor": "h100-80gb", "count": 2, "gpus_per_node": 0}],
        "preemption": False,
        "starvation_after_s": 2700.0,
        "queueing": {},
        "tenant_queueing": {},
        "fair_share_half_life_s": None,
    }  # fmt: skip


def test_an_overcommit_is_shown_on_the_form_and_replayed_once_confirmed(world):
    with time_machine.travel(NOW - timedelta(days=2), tick=False):
        submit(world, "nlp", work_s=300)
    client = client_of(world.platform_admin)
    with time_machine.travel(NOW, tick=False):
        raised = filled(client, **{"q:vision:a100-80gb:guaranteed": "24"})
        refused = client.post(reverse("policy:report_new"), raised)
        assert refused.status_code == 400
        assert ReplayReport.objects.count() == 0
        text = text_of(refused.content.decode())
        assert "Nothing was replayed: confirm the warning below, or change the proposal." in text
        assert "The a100-80gb guarantees of all tenants add up to 40 GPUs" in text
        confirmed = client.post(reverse("policy:report_new"), raised | {"confirm_warnings": "on"})
    assert confirmed.status_code == 302
    assert (
        ReplayReport.objects.get()
        .confirmed_warnings[0]
        .startswith("The a100-80gb guarantees of all tenants add up to 40 GPUs")
    )


def test_a_form_with_no_history_or_a_negative_quota_stores_nothing(world):
    client = client_of(world.platform_admin)
    with time_machine.travel(NOW, tick=False):
        empty = client.post(reverse("policy:report_new"), filled(client))
        negative = client.post(
            reverse("policy:report_new"),
            filled(client, **{"window": "custom", "from": "2026-05-04", "to": "2026-05-04",
                              "q:nlp:h100-80gb:guaranteed": "-1"}),
        )  # fmt: skip
    assert (empty.status_code, negative.status_code) == (400, 400)
    assert "there is no history to replay." in text_of(empty.content.decode())
    assert "Ensure this value is greater than or equal to 0." not in text_of(
        negative.content.decode()
    )
    assert "nlp h100-80gb: the guarantee cannot be -1 GPUs (0 at least)." in text_of(
        negative.content.decode()
    )
    assert ReplayReport.objects.count() == 0


def test_applying_goes_through_the_quota_service_with_confirmation_and_audit(world, done_report):
    client = client_of(world.platform_admin)
    url = reverse("policy:report_apply", args=[done_report.pk])
    page = client.get(url).content.decode()
    assert re.findall(r'data-apply="([^"]+)"', page) == ["nlp:a100-80gb", "vision:a100-80gb"]
    quotas = lambda: sorted(  # noqa: E731
        Quota.objects.filter(flavor=world.a100).values_list("tenant__slug", "guaranteed_gpus")
    )

    unconfirmed = client.post(url, {})
    assert unconfirmed.status_code == 400
    assert quotas() == [("nlp", 16), ("vision", 16)]

    with time_machine.travel(NOW + timedelta(minutes=5), tick=False):
        applied = client.post(url, {"confirm": "on"})
    assert applied.status_code == 302
    assert quotas() == [("nlp", 8), ("vision", 24)]
    assert list(
        AuditEvent.objects.filter(action__in=["quota.update", "replay.apply"])
        .order_by("id")
        .values_list("action", "target", "actor__username")
    ) == [
        ("quota.update", "nlp:a100-80gb", "paul"),
        ("quota.update", "vision:a100-80gb", "paul"),
        ("replay.apply", f"replay {done_report.pk}", "paul"),
    ]


def test_applying_an_overcommit_needs_its_own_confirmation(world, done_report):
    vision_24 = {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24}]}
    ReplayReport.objects.filter(pk=done_report.pk).update(
        proposal=proposal_from_json(vision_24).to_json()
    )
    client = client_of(world.platform_admin)
    url = reverse("policy:report_apply", args=[done_report.pk])
    refused = client.post(url, {"confirm": "on"})
    assert refused.status_code == 400
    assert "vision a100-80gb: The a100-80gb guarantees of all tenants add up to 40 GPUs" in (
        text_of(refused.content.decode())
    )
    assert Quota.objects.get(tenant=world.vision, flavor=world.a100).guaranteed_gpus == 16
    assert client.post(url, {"confirm": "on", "confirm_overcommit": "on"}).status_code == 302
    assert Quota.objects.get(tenant=world.vision, flavor=world.a100).guaranteed_gpus == 24
    assert AuditEvent.objects.filter(action="quota.overcommit").count() == 1


def test_a_proposal_naming_a_tenant_gone_since_is_not_applied(world, done_report):
    world.nlp.active = False
    world.nlp.save(update_fields=["active"])
    client = client_of(world.platform_admin)
    url = reverse("policy:report_apply", args=[done_report.pk])
    quotas = Quota.objects.values_list("id", "guaranteed_gpus")
    before = (AuditEvent.objects.count(), sorted(quotas))
    page = client.get(url).content.decode()
    assert (
        "There is no tenant nlp any more (deleted or deactivated since the report): nothing was "
        "applied." in text_of(page)
    )
    assert client.post(url, {"confirm": "on"}).status_code == 400
    assert before == (AuditEvent.objects.count(), sorted(quotas))


def test_the_list_and_a_report_read_a_fixed_number_of_queries(
    world, done_report, django_assert_max_num_queries
):
    ReplayReport.objects.bulk_create(
        ReplayReport(
            requested_by=world.platform_admin,
            created_at=NOW,
            window_start=T0,
            window_end=T0 + WINDOW,
            proposal={},
            submissions=1,
            estimate_s=0.01,
            shared=True,
        )
        for _ in range(30)
    )
    for user in (world.platform_admin, world.tenant_admin_a):
        client = client_of(user)
        client.get(reverse("policy:report_list"))  # the session, warmed
        with django_assert_max_num_queries(6):
            assert client.get(reverse("policy:report_list")).status_code == 200
        with django_assert_max_num_queries(9):
            url = reverse("policy:report_detail", args=[done_report.pk])
            assert client.get(url).status_code == 200
