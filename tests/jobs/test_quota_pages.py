"""Quota, flavor, cluster-capacity and audit pages; the submit form's quota check; how runs
show why they wait and whether they borrow."""

import re
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from clusters.models import Cluster, ClusterFlavor
from jobs.calendar import month_start
from jobs.models import Attempt, AttemptState, Run, RunState, TenantMonthUsage, WaitReason
from jobs.selectors.queue import admission_snapshot
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_submit
from jobs.views.quotas import QUOTAS_PER_PAGE
from tenants.models import AuditEvent, GpuFlavor, Quota, Tenant
from tenants.services.audit import audit_record
from tenants.services.quotas import flavor_create, quota_set, quota_update
from tests.conftest import experiment_input, make_user

pytestmark = pytest.mark.django_db

PERSONAS = ["researcher_a", "researcher_a2", "researcher_b", "tenant_admin_a", "finance"]


# --- helpers -------------------------------------------------------------------------------


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def submit_nlp(world, **overrides) -> Run:
    values = {"tenant": "nlp", "project": "llm", "name": "llm-pretrain"} | overrides
    return submit(world, user=world.researcher_b, **values)


def run_everything(world) -> None:
    """Admit, submit and place everything queued, as the workers would."""
    admission_run_cycle()
    for attempt in Attempt.objects.filter(state=AttemptState.CREATED):
        attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)


def quota_values(tenant, flavor) -> dict | None:
    return (
        Quota.objects.filter(tenant=tenant, flavor=flavor)
        .values(
            "guaranteed_gpus",
            "borrow_limit_gpus",
            "max_gpus_per_run",
            "monthly_gpu_hour_budget",
            "budget_mode",
            "fair_share_weight",
        )
        .first()
    )


def quota_form(**overrides) -> dict:
    data = {
        "guaranteed_gpus": "24",
        "borrow_limit_gpus": "8",
        "max_gpus_per_run": "16",
        "monthly_gpu_hour_budget": "500",
        "budget_mode": "soft",
        "fair_share_weight": "2",
    }
    data.update(overrides)
    return data


def edit_url(tenant: str, flavor: str) -> str:
    return f"{reverse('jobs:quota_edit')}?tenant={tenant}&flavor={flavor}"


def field_html(content: str, name: str) -> str:
    start = content.index(f'data-field="{name}"')
    return content[start : content.index("</div>", start)]


def text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def table_rows(content: str, attribute: str) -> dict[str, list[str]]:
    """Rows marked with ``attribute="key"`` -> the text of each of their cells."""
    rows = {}
    for key, body in re.findall(rf'<tr {attribute}="([^"]+)">(.*?)</tr>', content, re.S):
        rows[key] = [text(cell) for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", body, re.S)]
    return rows


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- quotas overview -----------------------------------------------------------------------


@pytest.fixture
def busy_world(world):
    """vision runs 8 a100 GPUs within its guarantee and may borrow 8 more on a soft budget
    it has used 25 of 100 GPU-hours of; nlp runs 8 h100 GPUs."""
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(
        borrow_limit_gpus=8, max_gpus_per_run=16, monthly_gpu_hour_budget=100, budget_mode="soft"
    )
    TenantMonthUsage.objects.create(
        tenant=world.vision,
        flavor=world.a100,
        month=month_start(timezone.now()).date(),
        gpu_seconds=25 * 3600,
    )
    submit(world, gpus_per_node=8)
    submit_nlp(world, flavor="h100-80gb", gpus_per_node=8)
    run_everything(world)
    assert set(Run.objects.values_list("state", flat=True)) == {RunState.RUNNING}
    return world


VISION_ROWS = {
    "vision:a100-80gb": [
        "Vision Lab (vision)",
        "a100-80gb",
        "16",
        "8",
        "8",
        "8",
        "16",
        "25 % 25.0 of 100 GPU-hours (25 %) Soft: runs start and are flagged",
    ],
    "vision:h100-80gb": [
        "Vision Lab",  # repeated for screen readers only (visually hidden)
        "h100-80gb",
        "8",
        "0",
        "0",
        "0",
        "no limit",
        "No budget · 0.0 GPU-hours used",
    ],
}
NLP_ROWS = {
    "nlp:a100-80gb": [
        "NLP Group (nlp)",
        "a100-80gb",
        "16",
        "0",
        "0",
        "0",
        "no limit",
        "No budget · 0.0 GPU-hours used",
    ],
    "nlp:h100-80gb": [
        "NLP Group",
        "h100-80gb",
        "8",
        "0",
        "8",
        "0",
        "no limit",
        "No budget · 0.0 GPU-hours used",
    ],
}


@pytest.mark.parametrize(
    ("persona", "expected"),
    [
        ("researcher_a", VISION_ROWS),
        ("researcher_a2", VISION_ROWS),
        ("tenant_admin_a", VISION_ROWS),
        ("researcher_b", NLP_ROWS),
        ("finance", NLP_ROWS | VISION_ROWS),
    ],
)
def test_quota_page_shows_each_persona_exactly_its_tenants(client, busy_world, persona, expected):
    client.force_login(getattr(busy_world, persona))

    response = client.get(reverse("jobs:quota_list"))

    assert response.status_code == 200
    content = response.content.decode()
    assert table_rows(content, "data-quota") == expected
    assert list(table_rows(content, "data-quota")) == sorted(expected)  # tenant, then flavor
    assert reverse("jobs:quota_edit") not in content
    assert '<a href="/quotas/" aria-current="page">Quotas</a>' in content


def test_platform_admin_sees_every_quota_with_edit_links(client, busy_world):
    client.force_login(busy_world.platform_admin)

    content = client.get(reverse("jobs:quota_list")).content.decode()

    rows = table_rows(content, "data-quota")
    assert {key: cells[:-1] for key, cells in rows.items()} == NLP_ROWS | VISION_ROWS
    assert {cells[-1] for cells in rows.values()} == {"Edit"}
    assert 'href="/quotas/edit/?tenant=vision&amp;flavor=a100-80gb">Edit</a>' in content
    assert '<form method="get" action="/quotas/edit/"' in content


def test_quota_page_marks_use_beyond_the_guarantee(client, busy_world):
    Quota.objects.filter(tenant=busy_world.vision, flavor=busy_world.a100).update(guaranteed_gpus=4)
    client.force_login(busy_world.researcher_a)

    content = client.get(reverse("jobs:quota_list")).content.decode()

    assert table_rows(content, "data-quota")["vision:a100-80gb"][2:6] == [
        "4",
        "8",
        "8 4 beyond guarantee",
        "4",
    ]


def test_quota_page_filter_never_shows_another_tenant(client, busy_world):
    client.force_login(busy_world.researcher_a)

    response = client.get(reverse("jobs:quota_list"), {"tenant": "nlp"})

    assert response.status_code == 200
    content = response.content.decode()
    assert table_rows(content, "data-quota") == {}
    assert "NLP Group" not in content
    assert "No quotas for this tenant" in content


def test_finance_filters_the_quota_page_by_tenant(client, busy_world):
    client.force_login(busy_world.finance)

    content = client.get(reverse("jobs:quota_list"), {"tenant": "nlp"}).content.decode()

    assert table_rows(content, "data-quota") == NLP_ROWS


def test_quota_page_for_a_user_without_tenants(client, world):
    client.force_login(make_user("nobody"))

    response = client.get(reverse("jobs:quota_list"))

    assert response.status_code == 200
    assert table_rows(response.content.decode(), "data-quota") == {}
    assert "You are not a member of any tenant" in response.content.decode()


def test_quota_page_needs_a_login(client, world):
    url = reverse("jobs:quota_list")

    response = client.get(url)

    assert (response.status_code, response.url) == (302, f"{reverse('login')}?next={url}")


def test_quota_page_uses_the_same_queries_for_2_or_60_tenants(client, busy_world):
    client.force_login(busy_world.finance)
    client.get(reverse("jobs:quota_list"))  # warm up sessions and caches
    with CaptureQueriesContext(connection) as small:
        client.get(reverse("jobs:quota_list"))
    for i in range(58):
        tenant = Tenant.objects.create(slug=f"t{i:02d}", name=f"Tenant {i}")
        Quota.objects.create(tenant=tenant, flavor=busy_world.a100, guaranteed_gpus=1)
        Quota.objects.create(tenant=tenant, flavor=busy_world.h100, guaranteed_gpus=1)

    with CaptureQueriesContext(connection) as large:
        response = client.get(reverse("jobs:quota_list"))

    assert len(response.context["usages"]) == 50  # one page
    # A first page with room to spare is its own count; a full one counts (one query more).
    assert len(large.captured_queries) == len(small.captured_queries) + 1 <= 12
    assert "Page 1 of 3 · 120 quotas" in response.content.decode()


@pytest.mark.parametrize(
    ("quotas", "page", "shown", "footer"),
    [
        (49, None, 49, None),
        (50, None, 50, None),
        (50, "1", 50, None),
        (51, None, 50, "Page 1 of 2 · 51 quotas"),
        (51, "2", 1, "Page 2 of 2 · 51 quotas"),
        (51, "9", 1, "Page 2 of 2 · 51 quotas"),
        (51, "x", 50, "Page 1 of 2 · 51 quotas"),
        (100, "", 50, "Page 1 of 2 · 100 quotas"),
    ],
)
def test_quota_pages_are_the_paginators_pages(client, world, quotas, page, shown, footer):
    Quota.objects.all().delete()
    for i in range(quotas):
        tenant = Tenant.objects.create(slug=f"t{i:03d}", name=f"Tenant {i}")
        Quota.objects.create(tenant=tenant, flavor=world.a100, guaranteed_gpus=1)
    client.force_login(world.finance)
    expected = Paginator(
        Quota.objects.order_by("tenant__slug", "flavor__slug"), QUOTAS_PER_PAGE
    ).get_page(page)

    response = client.get(reverse("jobs:quota_list"), {"page": page} if page is not None else {})

    got = response.context["page_obj"]
    assert [u.quota.pk for u in response.context["usages"]] == [q.pk for q in expected]
    assert len(got.object_list) == shown
    assert (got.number, got.paginator.count, got.paginator.num_pages) == (
        expected.number,
        expected.paginator.count,
        expected.paginator.num_pages,
    )
    content = response.content.decode()
    if footer is None:
        assert 'class="pagination"' not in content
    else:
        assert footer in content


# --- editing a quota -----------------------------------------------------------------------


def test_platform_admin_edits_a_quota_and_it_is_audited(client, world):
    # 24 guaranteed to vision and 8 to nlp: the cluster's 32 A100 GPUs, no overcommit.
    Quota.objects.filter(tenant=world.nlp, flavor=world.a100).update(guaranteed_gpus=8)
    client.force_login(world.platform_admin)

    response = client.post(edit_url("vision", "a100-80gb"), quota_form())

    assert response.status_code == 302
    assert response.url == "/quotas/?tenant=vision"
    after = {
        "guaranteed_gpus": 24,
        "borrow_limit_gpus": 8,
        "max_gpus_per_run": 16,
        "monthly_gpu_hour_budget": 500,
        "budget_mode": "soft",
        "fair_share_weight": 2,
    }
    assert quota_values(world.vision, world.a100) == after
    event = AuditEvent.objects.get()
    assert (event.actor, event.tenant, event.action, event.target) == (
        world.platform_admin,
        world.vision,
        "quota.update",
        "vision:a100-80gb",
    )
    assert event.before == {
        "guaranteed_gpus": 16,
        "borrow_limit_gpus": 0,
        "max_gpus_per_run": None,
        "monthly_gpu_hour_budget": None,
        "budget_mode": "hard",
        "fair_share_weight": 1,
    }
    assert event.after == after
    assert messages_of(client.get(response.url)) == ["Saved the a100-80gb quota of vision."]


def test_empty_optional_fields_mean_no_limit_and_no_budget(client, world):
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(
        max_gpus_per_run=4, monthly_gpu_hour_budget=10
    )
    client.force_login(world.platform_admin)

    response = client.post(
        edit_url("vision", "a100-80gb"),
        quota_form(guaranteed_gpus="16", max_gpus_per_run="", monthly_gpu_hour_budget=""),
    )

    assert response.status_code == 302
    values = quota_values(world.vision, world.a100)
    assert (values["max_gpus_per_run"], values["monthly_gpu_hour_budget"]) == (None, None)


def test_saving_an_unchanged_quota_writes_no_audit_event(client, world):
    client.force_login(world.platform_admin)
    unchanged = quota_form(
        guaranteed_gpus="16",
        borrow_limit_gpus="0",
        max_gpus_per_run="",
        monthly_gpu_hour_budget="",
        budget_mode="hard",
        fair_share_weight="1",
    )

    response = client.post(edit_url("vision", "a100-80gb"), unchanged)

    assert response.status_code == 302
    assert AuditEvent.objects.count() == 0


def test_platform_admin_creates_a_quota_the_tenant_did_not_have(client, world):
    climate = Tenant.objects.create(slug="climate", name="Climate")
    client.force_login(world.platform_admin)

    page = client.get(edit_url("climate", "h100-80gb"))
    response = client.post(
        edit_url("climate", "h100-80gb"), quota_form(guaranteed_gpus="0", borrow_limit_gpus="8")
    )

    assert page.status_code == 200
    assert "climate has no h100-80gb quota yet: saving creates it." in page.content.decode()
    assert page.context["form"]["guaranteed_gpus"].value() == 0
    assert page.context["form"]["fair_share_weight"].value() == 1
    assert response.status_code == 302
    assert quota_values(climate, world.h100)["borrow_limit_gpus"] == 8
    event = AuditEvent.objects.get()
    assert (event.tenant, event.before, event.after["borrow_limit_gpus"]) == (climate, None, 8)


def test_edit_page_shows_current_values_and_use(client, busy_world):
    client.force_login(busy_world.platform_admin)

    response = client.get(edit_url("vision", "a100-80gb"))

    assert response.status_code == 200
    form = response.context["form"]
    assert [form[name].value() for name in form.fields] == [16, 8, 16, 100, "soft", 1, None]
    assert "<dt>In use</dt><dd>8 of 16 guaranteed GPUs</dd>" in response.content.decode()


def test_lowering_the_guarantee_below_use_is_saved_with_a_warning(client, busy_world):
    client.force_login(busy_world.platform_admin)

    response = client.post(
        edit_url("vision", "a100-80gb"), quota_form(guaranteed_gpus="4"), follow=True
    )

    assert quota_values(busy_world.vision, busy_world.a100)["guaranteed_gpus"] == 4
    assert messages_of(response) == [
        "Saved the a100-80gb quota of vision.",
        "vision now uses 8 of 4 guaranteed a100-80gb GPUs: 4 beyond the guarantee. Running "
        "runs keep their GPUs; new runs can only borrow until use drops below it.",
    ]
    content = response.content.decode()
    assert '<li class="message message-warning">vision now uses 8 of 4 guaranteed' in content
    assert Run.objects.filter(state=RunState.RUNNING).count() == 2


def make_unoffered_flavor() -> GpuFlavor:
    return GpuFlavor.objects.create(slug="v100-32gb", name="NVIDIA V100 32GB", memory_gb=32)


BAD_QUOTAS = [
    pytest.param(
        {"guaranteed_gpus": "-1"}, "guaranteed_gpus", "Must be at least 0.", id="negative"
    ),
    pytest.param(
        {"guaranteed_gpus": "1.5"}, "guaranteed_gpus", "Enter a whole number.", id="fraction"
    ),
    pytest.param({"guaranteed_gpus": ""}, "guaranteed_gpus", "This field is required.", id="empty"),
    pytest.param(
        {"borrow_limit_gpus": "-8"},
        "borrow_limit_gpus",
        "Must be at least 0.",
        id="negative-borrow",
    ),
    pytest.param(
        {"borrow_limit_gpus": "two"}, "borrow_limit_gpus", "Enter a whole number.", id="text"
    ),
    pytest.param(
        {"fair_share_weight": "0"}, "fair_share_weight", "Must be at least 1.", id="weight-0"
    ),
    pytest.param({"max_gpus_per_run": "0"}, "max_gpus_per_run", "Must be at least 1.", id="max-0"),
    pytest.param(
        {"monthly_gpu_hour_budget": "-5"},
        "monthly_gpu_hour_budget",
        "Must be at least 0.",
        id="negative-budget",
    ),
    pytest.param(
        {"guaranteed_gpus": "2147483648"}, "guaranteed_gpus", "At most 2147483647.", id="overflow"
    ),
    pytest.param(
        {"budget_mode": "maybe"},
        "budget_mode",
        "Select a valid choice. maybe is not one of the available choices.",
        id="mode",
    ),
]


@pytest.mark.parametrize(("overrides", "field", "message"), BAD_QUOTAS)
def test_invalid_quota_is_refused_next_to_its_field_and_changes_nothing(
    client, world, overrides, field, message
):
    before = quota_values(world.vision, world.a100)
    client.force_login(world.platform_admin)

    response = client.post(edit_url("vision", "a100-80gb"), quota_form(**overrides))

    assert response.status_code == 400
    assert response.context["form"].errors == {field: [message]}
    assert f"<li>{escape(message)}</li>" in field_html(response.content.decode(), field)
    assert "The quota was not saved" in response.content.decode()
    assert quota_values(world.vision, world.a100) == before
    assert AuditEvent.objects.count() == 0


def test_borrow_limit_on_a_flavor_no_cluster_offers_is_refused(client, world):
    v100 = make_unoffered_flavor()
    client.force_login(world.platform_admin)

    response = client.post(edit_url("vision", "v100-32gb"), quota_form(borrow_limit_gpus="4"))

    assert response.status_code == 400
    assert response.context["form"].errors == {
        "borrow_limit_gpus": [
            "No enabled cluster offers v100-32gb: there are no idle GPUs to borrow."
        ]
    }
    assert quota_values(world.vision, v100) is None
    assert AuditEvent.objects.count() == 0
    # A guarantee alone is fine, once confirmed: capacity may come later.
    ok = client.post(
        edit_url("vision", "v100-32gb"),
        quota_form(borrow_limit_gpus="0", confirm_overcommit="on"),
    )
    assert ok.status_code == 302
    assert quota_values(world.vision, v100)["guaranteed_gpus"] == 24


def test_borrow_limit_on_a_flavor_only_a_disabled_cluster_offers_is_refused(client, world):
    Cluster.objects.filter(pk=world.cluster.pk).update(enabled=False)
    before = quota_values(world.vision, world.a100)
    client.force_login(world.platform_admin)

    response = client.post(edit_url("vision", "a100-80gb"), quota_form())

    assert response.status_code == 400
    assert list(response.context["form"].errors) == ["borrow_limit_gpus"]
    assert quota_values(world.vision, world.a100) == before


def test_service_names_every_bad_field_and_changes_nothing(world):
    before = quota_values(world.vision, world.a100)
    with pytest.raises(ValidationError) as excinfo:
        quota_update(
            tenant=world.vision,
            flavor=world.a100,
            guaranteed_gpus=1.5,
            borrow_limit_gpus=-1,
            max_gpus_per_run=0,
            monthly_gpu_hour_budget=True,
            budget_mode="sometimes",
            fair_share_weight=0,
            offered_flavors=frozenset(),
            actor=world.platform_admin,
        )
    assert excinfo.value.message_dict == {
        "guaranteed_gpus": ["Enter a whole number."],
        "borrow_limit_gpus": ["Must be at least 0."],
        "max_gpus_per_run": ["Must be at least 1."],
        "monthly_gpu_hour_budget": ["Enter a whole number."],
        "budget_mode": ["Choose one of: hard, soft."],
        "fair_share_weight": ["Must be at least 1."],
    }
    assert quota_values(world.vision, world.a100) == before
    assert AuditEvent.objects.count() == 0


def test_quota_set_changes_only_the_guarantee_and_is_audited(world):
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(borrow_limit_gpus=4)

    quota_set(
        tenant=world.vision, flavor=world.a100, guaranteed_gpus=20, actor=world.platform_admin
    )

    values = quota_values(world.vision, world.a100)
    assert (values["guaranteed_gpus"], values["borrow_limit_gpus"]) == (20, 4)
    event = AuditEvent.objects.get()
    assert (event.action, event.before["guaranteed_gpus"], event.after["guaranteed_gpus"]) == (
        "quota.update",
        16,
        20,
    )


@pytest.mark.parametrize("persona", PERSONAS)
def test_only_platform_admins_reach_the_quota_editor(client, world, persona):
    before = quota_values(world.vision, world.a100)
    client.force_login(getattr(world, persona))

    assert client.get(edit_url("vision", "a100-80gb")).status_code == 404
    assert client.post(edit_url("vision", "a100-80gb"), quota_form()).status_code == 404
    assert quota_values(world.vision, world.a100) == before
    assert AuditEvent.objects.count() == 0


def test_quota_editor_is_404_for_unknown_tenants_and_flavors(client, world):
    client.force_login(world.platform_admin)

    assert client.get(edit_url("nope", "a100-80gb")).status_code == 404
    assert client.get(edit_url("vision", "nope")).status_code == 404
    assert client.get(reverse("jobs:quota_edit")).status_code == 404


# --- flavors -------------------------------------------------------------------------------


def flavor_form(**overrides) -> dict:
    data = {"slug": "a100-1g.10gb", "name": "A100 MIG 1g.10gb", "memory_gb": "10"}
    data["gpu_fraction"] = "0.1429"
    data.update(overrides)
    return data


def test_platform_admin_lists_and_creates_a_flavor(client, world):
    client.force_login(world.platform_admin)

    listing = client.get(reverse("tenants:flavor_list"))
    response = client.post(reverse("tenants:flavor_create"), flavor_form())

    assert [f.slug for f in listing.context["flavors"]] == ["a100-80gb", "h100-80gb"]
    assert '<a href="/flavors/h100-80gb/edit/">Edit</a>' in listing.content.decode()
    assert response.status_code == 302
    assert response.url == reverse("tenants:flavor_list")
    flavor = GpuFlavor.objects.get(slug="a100-1g.10gb")
    assert (flavor.name, flavor.memory_gb, flavor.gpu_fraction) == (
        "A100 MIG 1g.10gb",
        10,
        Decimal("0.1429"),
    )
    event = AuditEvent.objects.get()
    assert (event.action, event.target, event.tenant, event.before) == (
        "flavor.create",
        "a100-1g.10gb",
        None,
        None,
    )
    assert event.after == {
        "slug": "a100-1g.10gb",
        "name": "A100 MIG 1g.10gb",
        "memory_gb": 10,
        "gpu_fraction": "0.1429",
    }
    assert messages_of(client.get(response.url)) == ["Created the GPU flavor a100-1g.10gb."]


BAD_FLAVORS = [
    pytest.param(
        {"slug": "A100!"},
        "slug",
        "Use 1-63 lowercase letters, digits, dots and dashes, starting and ending with "
        "a letter or digit.",
        id="bad-slug",
    ),
    pytest.param(
        {"slug": "a100-80gb"}, "slug", "A flavor with this slug exists already.", id="dup"
    ),
    pytest.param({"name": " "}, "name", "A name is required.", id="no-name"),
    pytest.param({"memory_gb": "0"}, "memory_gb", "Must be at least 1.", id="no-memory"),
    pytest.param({"memory_gb": "1.5"}, "memory_gb", "Enter a whole number.", id="memory-fraction"),
    pytest.param(
        {"gpu_fraction": "0"},
        "gpu_fraction",
        "A fraction of a full GPU: more than 0 and at most 1.",
        id="fraction-0",
    ),
    pytest.param(
        {"gpu_fraction": "1.5"},
        "gpu_fraction",
        "A fraction of a full GPU: more than 0 and at most 1.",
        id="fraction-big",
    ),
    pytest.param(
        {"gpu_fraction": "0.12345"},
        "gpu_fraction",
        "At most 4 decimal places.",
        id="fraction-precise",
    ),
    pytest.param({"gpu_fraction": "NaN"}, "gpu_fraction", "Enter a number.", id="fraction-nan"),
]


@pytest.mark.parametrize(("overrides", "field", "message"), BAD_FLAVORS)
def test_invalid_flavor_is_refused_and_nothing_is_created(client, world, overrides, field, message):
    client.force_login(world.platform_admin)

    response = client.post(reverse("tenants:flavor_create"), flavor_form(**overrides))

    assert response.status_code == 400
    assert response.context["form"].errors == {field: [message]}
    assert f"<li>{escape(message)}</li>" in field_html(response.content.decode(), field)
    assert GpuFlavor.objects.count() == 2
    assert AuditEvent.objects.count() == 0


def test_platform_admin_edits_a_flavor_but_not_its_slug(client, world):
    client.force_login(world.platform_admin)
    url = reverse("tenants:flavor_edit", args=["h100-80gb"])

    page = client.get(url)
    response = client.post(
        url, {"slug": "renamed", "name": "H100 SXM", "memory_gb": "80", "gpu_fraction": "1"}
    )

    assert 'name="slug"' not in page.content.decode()
    assert page.context["form"]["name"].value() == "NVIDIA H100 80GB"
    assert response.status_code == 302
    world.h100.refresh_from_db()
    assert (world.h100.slug, world.h100.name) == ("h100-80gb", "H100 SXM")
    event = AuditEvent.objects.get()
    assert (event.action, event.target) == ("flavor.update", "h100-80gb")
    assert event.before == {"name": "NVIDIA H100 80GB", "memory_gb": 80, "gpu_fraction": "1.0000"}
    assert event.after == {"name": "H100 SXM", "memory_gb": 80, "gpu_fraction": "1.0000"}


def test_invalid_flavor_edit_changes_nothing(client, world):
    client.force_login(world.platform_admin)

    response = client.post(
        reverse("tenants:flavor_edit", args=["h100-80gb"]),
        {"name": "H100", "memory_gb": "-80", "gpu_fraction": "2"},
    )

    assert response.status_code == 400
    assert response.context["form"].errors == {
        "memory_gb": ["Must be at least 1."],
        "gpu_fraction": ["A fraction of a full GPU: more than 0 and at most 1."],
    }
    world.h100.refresh_from_db()
    assert (world.h100.name, world.h100.memory_gb) == ("NVIDIA H100 80GB", 80)
    assert AuditEvent.objects.count() == 0


@pytest.mark.parametrize("persona", PERSONAS)
def test_flavor_pages_are_404_for_everyone_but_platform_admins(client, world, persona):
    client.force_login(getattr(world, persona))
    edit = reverse("tenants:flavor_edit", args=["h100-80gb"])

    assert client.get(reverse("tenants:flavor_list")).status_code == 404
    assert client.get(reverse("tenants:flavor_create")).status_code == 404
    assert client.post(reverse("tenants:flavor_create"), flavor_form()).status_code == 404
    assert client.get(edit).status_code == 404
    assert client.post(edit, flavor_form(name="hacked")).status_code == 404
    assert GpuFlavor.objects.count() == 2
    assert GpuFlavor.objects.get(slug="h100-80gb").name == "NVIDIA H100 80GB"
    assert AuditEvent.objects.count() == 0


# --- cluster capacity ----------------------------------------------------------------------


def capacity_url(name: str = "sim-1") -> str:
    return reverse("jobs:cluster_capacity", args=[name])


def pools(cluster) -> dict[str, tuple[int, int]]:
    return {
        cf.flavor.slug: (cf.nodes, cf.gpus_per_node)
        for cf in ClusterFlavor.objects.filter(cluster=cluster).select_related("flavor")
    }


def test_cluster_list_shows_capacity_and_what_runs_hold(client, busy_world):
    client.force_login(busy_world.platform_admin)

    content = client.get(reverse("jobs:cluster_list")).content.decode()

    section = content[content.index('data-cluster="sim-1"') :]
    rows = [
        [text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", section, re.S)[1:]
    ]
    assert rows == [
        ["a100-80gb", "4", "8", "32", "8", "Edit"],
        ["h100-80gb", "2", "8", "16", "8", "Edit"],
    ]
    assert '<a href="/clusters/sim-1/capacity/?flavor=a100-80gb">Edit</a>' in section


def test_platform_admin_changes_simulator_capacity_and_admission_uses_it(client, world):
    client.force_login(world.platform_admin)

    response = client.post(
        capacity_url(), {"flavor": "a100-80gb", "nodes": "2", "gpus_per_node": "4"}
    )

    assert response.status_code == 302
    assert response.url == reverse("jobs:cluster_list")
    assert pools(world.cluster) == {"a100-80gb": (2, 4), "h100-80gb": (2, 8)}
    world.cluster.refresh_from_db()
    assert world.cluster.settings["pools"][0] == {
        "flavor": "a100-80gb",
        "nodes": 2,
        "gpus_per_node": 4,
    }
    assert world.cluster.settings["speedup"] == 1000
    event = AuditEvent.objects.get()
    assert (event.action, event.target, event.tenant) == (
        "cluster.capacity",
        "sim-1:a100-80gb",
        None,
    )
    assert (event.before, event.after) == (
        {"nodes": 4, "gpus_per_node": 8},
        {"nodes": 2, "gpus_per_node": 4},
    )
    assert messages_of(client.get(response.url)) == [
        "sim-1 now has 2 × 4 a100-80gb GPUs (8 in all)."
    ]
    snapshot, _ = admission_snapshot()
    assert sorted((n.flavor, n.name, n.gpus) for n in snapshot.nodes) == [
        ("a100-80gb", "sim-1-a100-80gb-00", 4),
        ("a100-80gb", "sim-1-a100-80gb-01", 4),
        ("h100-80gb", "sim-1-h100-80gb-00", 8),
        ("h100-80gb", "sim-1-h100-80gb-01", 8),
    ]
    with pytest.raises(ValidationError) as excinfo:
        submit(world, gpus_per_node=8)
    assert excinfo.value.message_dict["gpus_per_node"] == [
        "A a100-80gb node has at most 4 GPUs. The largest a100-80gb run that"
        " could ever start for tenant vision: "
        "8 GPUs (2 nodes × 4)."
    ]


def test_adding_a_flavor_to_a_simulator_lets_tenants_borrow_it(client, world):
    v100 = make_unoffered_flavor()
    client.force_login(world.platform_admin)

    response = client.post(
        capacity_url(), {"flavor": "v100-32gb", "nodes": "1", "gpus_per_node": "4"}
    )
    quota = client.post(
        edit_url("vision", "v100-32gb"), quota_form(guaranteed_gpus="4", borrow_limit_gpus="4")
    )

    assert response.status_code == 302
    assert pools(world.cluster)["v100-32gb"] == (1, 4)
    assert quota.status_code == 302
    assert quota_values(world.vision, v100)["borrow_limit_gpus"] == 4
    first = AuditEvent.objects.get(action="cluster.capacity")
    assert (first.before, first.after) == (None, {"nodes": 1, "gpus_per_node": 4})


BAD_CAPACITY = [
    pytest.param({"nodes": "0"}, "nodes", "Must be at least 1.", id="zero-nodes"),
    pytest.param({"gpus_per_node": "-8"}, "gpus_per_node", "Must be at least 1.", id="negative"),
    pytest.param({"gpus_per_node": "x"}, "gpus_per_node", "Enter a whole number.", id="text"),
    pytest.param({"flavor": "nope"}, "flavor",
                 "Select a valid choice. That choice is not one of the available choices.",
                 id="unknown-flavor"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "field", "message"), BAD_CAPACITY)
def test_invalid_capacity_is_refused_and_changes_nothing(client, world, overrides, field, message):
    client.force_login(world.platform_admin)
    data = {"flavor": "a100-80gb", "nodes": "2", "gpus_per_node": "4"} | overrides

    response = client.post(capacity_url(), data)

    assert response.status_code == 400
    assert response.context["form"].errors == {field: [message]}
    assert pools(world.cluster) == {"a100-80gb": (4, 8), "h100-80gb": (2, 8)}
    assert AuditEvent.objects.count() == 0


def test_capacity_of_other_backends_is_read_only(client, world):
    k8s = Cluster.objects.create(name="k8s-1", backend=Cluster.Backend.KUBERNETES)
    ClusterFlavor.objects.create(cluster=k8s, flavor=world.h100, nodes=3, gpus_per_node=8, gpus=24)
    client.force_login(world.platform_admin)

    listing = client.get(reverse("jobs:cluster_list")).content.decode()
    page = client.get(capacity_url("k8s-1"))
    response = client.post(
        capacity_url("k8s-1"), {"flavor": "h100-80gb", "nodes": "1", "gpus_per_node": "1"}
    )

    assert "Capacity from inventory (read-only)" in listing
    assert "/clusters/k8s-1/capacity/" not in listing
    assert page.status_code == 200
    assert 'name="nodes"' not in page.content.decode()
    assert "its capacity comes from the cluster's inventory and is read-only" in (
        page.content.decode()
    )
    assert response.status_code == 400
    assert response.context["form"].non_field_errors() == [
        "k8s-1 is a Kubernetes cluster: its capacity comes from the cluster's inventory and "
        "cannot be edited here."
    ]
    assert pools(k8s) == {"h100-80gb": (3, 8)}
    assert AuditEvent.objects.count() == 0


@pytest.mark.parametrize("persona", PERSONAS)
def test_cluster_pages_are_404_for_everyone_but_platform_admins(client, world, persona):
    client.force_login(getattr(world, persona))

    assert client.get(reverse("jobs:cluster_list")).status_code == 404
    assert client.get(capacity_url()).status_code == 404
    data = {"flavor": "a100-80gb", "nodes": "1", "gpus_per_node": "1"}
    assert client.post(capacity_url(), data).status_code == 404
    assert pools(world.cluster) == {"a100-80gb": (4, 8), "h100-80gb": (2, 8)}
    assert AuditEvent.objects.count() == 0


def test_capacity_page_of_an_unknown_cluster_is_404(client, world):
    client.force_login(world.platform_admin)

    assert client.get(capacity_url("nope")).status_code == 404


# --- audit log -----------------------------------------------------------------------------


@pytest.fixture
def audited(world):
    """Three admin changes: a vision quota, an nlp quota, a new flavor (no tenant)."""
    admin = world.platform_admin
    quota_set(tenant=world.vision, flavor=world.a100, guaranteed_gpus=24, actor=admin)
    quota_set(tenant=world.nlp, flavor=world.h100, guaranteed_gpus=4, actor=admin)
    flavor_create(
        slug="l4-24gb", name="NVIDIA L4", memory_gb=24, gpu_fraction=Decimal(1), actor=admin
    )
    return world


def audit_targets(response) -> list[str]:
    return [event.target for event, _ in response.context["rows"]]


def test_platform_admin_reads_the_whole_audit_log(client, audited):
    client.force_login(audited.platform_admin)

    response = client.get(reverse("tenants:audit_list"))

    assert response.status_code == 200
    assert audit_targets(response) == ["l4-24gb", "nlp:h100-80gb", "vision:a100-80gb"]
    content = response.content.decode()
    vision = content[content.index("vision:a100-80gb") :]
    assert (
        '<li><span class="mono">guaranteed_gpus</span>: <del>16</del> → <ins>24</ins></li>'
    ) in vision
    assert "borrow_limit_gpus" not in vision[: vision.index("</tr>")]  # unchanged: not shown
    assert "<td>paul</td>" in content
    assert '<span class="mono">memory_gb</span>: <del>—</del> → <ins>24</ins>' in content
    assert '<a href="/audit/" aria-current="page">Audit</a>' in content


def test_tenant_admin_reads_only_their_tenants_audit_events(client, audited):
    client.force_login(audited.tenant_admin_a)

    response = client.get(reverse("tenants:audit_list"))
    other = client.get(reverse("tenants:audit_list"), {"tenant": "nlp"})

    assert response.status_code == 200
    assert audit_targets(response) == ["vision:a100-80gb"]
    assert [t.slug for t in response.context["tenants"]] == ["vision"]
    assert response.context["actions"] == ["quota.update"]
    assert audit_targets(other) == []
    assert "nlp:h100-80gb" not in other.content.decode()


@pytest.mark.parametrize("persona", ["researcher_a", "researcher_a2", "researcher_b", "finance"])
def test_audit_log_is_404_for_everyone_else(client, audited, persona):
    client.force_login(getattr(audited, persona))

    response = client.get(reverse("tenants:audit_list"))

    assert response.status_code == 404
    assert 'href="/audit/"' not in client.get(reverse("jobs:run_list")).content.decode()


def test_audit_log_filters_by_action_and_tenant(client, audited):
    client.force_login(audited.platform_admin)
    url = reverse("tenants:audit_list")

    assert audit_targets(client.get(url, {"action": "flavor.create"})) == ["l4-24gb"]
    assert audit_targets(client.get(url, {"tenant": "nlp"})) == ["nlp:h100-80gb"]
    assert audit_targets(client.get(url, {"action": "quota.update", "tenant": "vision"})) == [
        "vision:a100-80gb"
    ]
    empty = client.get(url, {"action": "<b>nope</b>"})
    assert audit_targets(empty) == []
    assert "No events match these filters" in empty.content.decode()
    assert "<b>nope</b>" not in empty.content.decode()


def test_audit_log_is_paginated_by_50_and_append_only(client, audited):
    for i in range(48):
        audit_record(actor=audited.platform_admin, action="test.bulk", target=f"t{i:02d}")
    client.force_login(audited.platform_admin)
    url = reverse("tenants:audit_list")

    first = client.get(url)
    second = client.get(url, {"page": "2"})

    assert len(first.context["rows"]) == 50
    assert audit_targets(second) == ["vision:a100-80gb"]
    assert "Page 2 of 2 · 51 events" in second.content.decode()
    assert client.post(url).status_code == 405
    assert AuditEvent.objects.count() == 51


def test_audit_log_uses_a_fixed_number_of_queries(client, audited):
    client.force_login(audited.platform_admin)
    url = reverse("tenants:audit_list")
    client.get(url)
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    for i in range(60):
        audit_record(
            actor=make_user(f"actor{i}"), action=f"test.{i % 3}", target=f"t{i}", tenant=audited.nlp
        )

    with CaptureQueriesContext(connection) as many:
        client.get(url)

    assert len(many.captured_queries) == len(few.captured_queries) <= 10


def test_audit_log_escapes_what_it_shows(client, world):
    audit_record(
        actor=world.platform_admin,
        action="test.escape",
        target="<script>alert(1)</script>",
        before={"note": "<b>old</b>"},
        after={"note": "<i>new</i>"},
    )
    client.force_login(world.platform_admin)

    content = client.get(reverse("tenants:audit_list")).content.decode()

    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content
    assert "<del>&lt;b&gt;old&lt;/b&gt;</del> → <ins>&lt;i&gt;new&lt;/i&gt;</ins>" in content


# --- submit form: quota check --------------------------------------------------------------


def preview(client, **params):
    values = {"tenant": "vision", "flavor": "h100-80gb", "nodes": "1", "gpus_per_node": "8"}
    return client.get(reverse("jobs:run_preview"), values | params)


def facts(content: str) -> dict[str, str]:
    return {
        text(term): text(value)
        for term, value in re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", content, re.S)
    }


@pytest.fixture
def lending_world(world):
    """vision may borrow 8 h100 GPUs beyond its 8 guaranteed, on a hard 100 GPU-hour budget."""
    Quota.objects.filter(tenant=world.vision, flavor=world.h100).update(
        borrow_limit_gpus=8, monthly_gpu_hour_budget=100
    )
    return world


def test_preview_says_a_run_within_the_guarantee_would_start_now(client, lending_world):
    client.force_login(lending_world.researcher_a)

    response = preview(client)

    assert response.status_code == 200
    content = response.content.decode()
    assert "<html" not in content
    assert 'data-verdict="start"' in content
    assert '<span class="badge badge-verdict-start">Would start now</span>' in content
    assert (
        escape("Would start now on sim-1 (sim-1-h100-80gb-00), within the tenant's guarantee")
        in content
    )
    assert facts(content) == {
        "This run": "8 h100-80gb GPUs of vision",
        "Guaranteed": "8 GPUs",
        "In use": "0 GPUs",
        "Borrowable now": "8 GPUs (borrow limit 8, 16 idle)",
        "Budget left this month": "100.0 of 100 GPU-hours (hard)",
    }
    assert "no-cache" in response["Cache-Control"]


def test_preview_says_borrow_then_wait_once_the_guarantee_is_used(client, lending_world):
    submit(lending_world, flavor="h100-80gb", gpus_per_node=8)
    run_everything(lending_world)
    client.force_login(lending_world.researcher_a2)

    borrow = preview(client).content.decode()
    wait = preview(client, nodes="2").content.decode()

    assert '<span class="badge badge-verdict-borrow">Would borrow</span>' in borrow
    assert (
        "Would start now on sim-1 (sim-1-h100-80gb-01), borrowing idle GPUs (preemptible)"
    ) in borrow
    assert facts(borrow)["In use"] == "8 GPUs"
    assert facts(borrow)["Borrowable now"] == "8 GPUs (borrow limit 8, 8 idle)"
    assert '<span class="badge badge-verdict-wait">Would wait</span>' in wait
    assert (
        "Would wait: tenant vision uses 8 of 8 guaranteed + 8 borrowable h100-80gb GPUs; "
        "this run needs 16 (position 1)"
    ) in wait
    assert facts(wait)["This run"] == "16 h100-80gb GPUs of vision"
    assert Run.objects.count() == 1


def test_preview_says_a_run_waits_when_the_hard_budget_is_spent(client, lending_world):
    TenantMonthUsage.objects.create(
        tenant=lending_world.vision,
        flavor=lending_world.h100,
        month=month_start(timezone.now()).date(),
        gpu_seconds=100 * 3600,
    )
    client.force_login(lending_world.researcher_a)

    content = preview(client).content.decode()

    assert 'data-verdict="wait"' in content
    assert (
        "Would wait: tenant vision has used 100 of its 100 h100-80gb GPU-hour budget this month "
        "(hard limit) (position 1)"
    ) in content
    assert facts(content)["Budget left this month"] == "0.0 of 100 GPU-hours (hard)"


BAD_PREVIEWS = [
    pytest.param(
        {"tenant": "", "flavor": "", "nodes": "", "gpus_per_node": ""},
        [
            "Choose a tenant.",
            "Choose a GPU flavor.",
            "Enter the number of nodes.",
            "Enter the GPUs per node.",
        ],
        id="nothing-chosen",
    ),
    pytest.param({"nodes": "two"}, ["Nodes: enter a whole number."], id="nodes-text"),
    pytest.param({"gpus_per_node": "0"}, ["GPUs per node: at least 1."], id="zero-gpus"),
    pytest.param({"priority": "500"}, ["Priority is a whole number from 0 to 100."], id="priority"),
    pytest.param(
        {"tenant": "nlp"}, ["Unknown tenant, or you are not a member."], id="other-tenant"
    ),
    pytest.param({"tenant": "nope"}, ["Unknown tenant, or you are not a member."], id="no-tenant"),
    pytest.param({"flavor": "<b>v100</b>"}, ["Unknown GPU flavor."], id="unknown-flavor"),
]


@pytest.mark.parametrize(("params", "problems"), BAD_PREVIEWS)
def test_preview_of_incomplete_or_invalid_values_says_what_is_missing(
    client, world, params, problems
):
    client.force_login(world.researcher_a)

    response = preview(client, **params)

    assert response.status_code == 400
    assert response.context["preview_problems"] == problems
    content = response.content.decode()
    for problem in problems:
        assert f"<li>{escape(problem)}</li>" in content
    assert "data-verdict" not in content
    assert "NLP" not in content and "<b>" not in content


def test_preview_needs_a_login(client, world):
    response = preview(client)

    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_submit_page_renders_the_quota_check_with_its_initial_values(client, lending_world):
    client.force_login(lending_world.researcher_a)

    blank = client.get(reverse("jobs:run_submit")).content.decode()
    run = submit(lending_world, flavor="h100-80gb", gpus_per_node=4)
    again = client.get(reverse("jobs:run_submit"), {"from": run.experiment_id}).content.decode()

    assert '<div data-preview-url="/runs/preview/" aria-live="polite" aria-busy="false">' in blank
    assert "<li>Choose a GPU flavor.</li>" in blank
    assert "<li>Choose a tenant.</li>" not in blank  # alice has one tenant: it is preselected
    assert '<span class="badge badge-verdict-start">Would start now</span>' in again
    assert facts(again)["This run"] == "4 h100-80gb GPUs of vision"


def test_submit_page_with_errors_keeps_the_quota_check_of_the_posted_values(client, world):
    client.force_login(world.researcher_a)

    response = client.post(
        reverse("jobs:run_submit"),
        {"tenant": "vision", "flavor": "a100-80gb", "nodes": "1", "gpus_per_node": "2"},
    )

    assert response.status_code == 400
    assert response.context["preview"].verdict == "start"
    assert response.context["preview"].gpus == 2


# --- runs: why they wait, whether they borrow ----------------------------------------------


@pytest.mark.parametrize("reason", WaitReason)
def test_every_wait_reason_reads_well_on_the_run_page(client, world, reason):
    submit(world, name="ahead")  # one run ahead of it in line: it is second
    run = submit(world)
    Run.objects.filter(pk=run.pk).update(
        wait_reason=reason, wait_message="tenant vision uses 16 of 16"
    )
    client.force_login(world.researcher_a)

    status = client.get(reverse("jobs:run_live", args=[run.pk])).content.decode()
    listing = client.get(reverse("jobs:run_list")).content.decode()

    assert (
        f"<strong>{escape(reason.label)}</strong>: tenant vision uses 16 of 16 · position 2 in "
        'the queue · <a href="/quotas/?tenant=vision">quotas of vision</a>'
    ) in status
    assert f'<span class="wait-reason">{escape(reason.label)}</span> · #2 in queue' in listing
    assert '<div class="wait-message">tenant vision uses 16 of 16</div>' in listing


def test_borrowed_and_over_budget_runs_are_tagged(client, world):
    tagged = submit(world, name="tagged")
    plain = submit(world, name="plain")
    Run.objects.filter(pk=tagged.pk).update(
        state=RunState.RUNNING, borrowed=True, over_budget=True, cluster=world.cluster
    )
    client.force_login(world.researcher_a)

    detail = client.get(reverse("jobs:run_detail", args=[tagged.pk])).content.decode()
    plain_detail = client.get(reverse("jobs:run_detail", args=[plain.pk])).content.decode()
    listing = client.get(reverse("jobs:run_list")).content.decode()

    for content in (detail, listing):
        assert ">borrowed (preemptible)</span>" in content
        assert ">over budget</span>" in content
    assert listing.count(">borrowed (preemptible)</span>") == 1
    assert "borrowed (preemptible)" not in plain_detail
    assert "over budget" not in plain_detail


# --- all pages -----------------------------------------------------------------------------


def test_new_pages_have_no_inline_scripts_styles_or_handlers(client, busy_world):
    quota_set(
        tenant=busy_world.vision,
        flavor=busy_world.a100,
        guaranteed_gpus=8,
        actor=busy_world.platform_admin,
    )
    client.force_login(busy_world.platform_admin)
    urls = [
        reverse("jobs:quota_list"),
        edit_url("vision", "a100-80gb"),
        reverse("jobs:cluster_list"),
        capacity_url(),
        reverse("tenants:flavor_list"),
        reverse("tenants:flavor_create"),
        reverse("tenants:flavor_edit", args=["a100-80gb"]),
        reverse("tenants:audit_list"),
    ]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        content = response.content.decode()
        assert re.findall(r"<script[^>]*>", content) == [
            '<script src="/static/vendor/htmx/htmx-2.0.11.min.js" defer>',
            '<script src="/static/gantry/gantry.js" defer>',
        ], url
        assert " style=" not in content, url
        assert re.search(r"\son[a-z]+=", content) is None, url
    client.force_login(busy_world.researcher_a)
    fragment = preview(client).content.decode()
    assert "<script" not in fragment and " style=" not in fragment


def test_quota_page_escapes_tenant_names(client, world):
    Tenant.objects.filter(pk=world.vision.pk).update(name="<script>alert(1)</script>")
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:quota_list")).content.decode()

    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt; <span" in content


def test_navigation_shows_platform_pages_only_to_platform_admins(client, world):
    client.force_login(world.platform_admin)
    admin_nav = client.get(reverse("jobs:run_list")).content.decode()
    client.force_login(world.tenant_admin_a)
    tenant_admin_nav = client.get(reverse("jobs:run_list")).content.decode()
    client.force_login(world.researcher_a)
    researcher_nav = client.get(reverse("jobs:run_list")).content.decode()

    for link in ('<a href="/clusters/">Clusters</a>', '<a href="/flavors/">Flavors</a>'):
        assert link in admin_nav
        assert link not in tenant_admin_nav
    assert '<a href="/audit/">Audit</a>' in admin_nav
    assert '<a href="/audit/">Audit</a>' in tenant_admin_nav
    assert '<a href="/quotas/">Quotas</a>' in researcher_nav
    assert 'href="/audit/"' not in researcher_nav
