"""The home page picks its sections by the user's roles (portal/home.py), on the demo world
at a fixed instant; and no page shows a persona an action it cannot take."""

import contextlib
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import urljoin, urlsplit

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.test import Client
from django.urls import Resolver404, resolve, reverse

from images.models import Image
from jobs.models import Attempt, AttemptState, Run
from jobs.services.submission import ExperimentInput, run_submit
from portal.demo import DEMO_PASSWORD, demo_seed
from tenants.models import GlobalRole, Membership, Tenant
from tests.conftest import make_user
from tests.html_support import page_actions, post_form, texts

pytestmark = pytest.mark.django_db

# A Wednesday morning in the middle of a month: February is the last closed month.
INSTANT = datetime(2027, 3, 10, 9, 0, tzinfo=UTC)
PERSONAS = ("alice", "tara", "admin", "fiona")


@pytest.fixture(scope="module")
def demo(django_db_setup, django_db_blocker):
    """The demo seeded once for the module at INSTANT, the clock standing still there for
    every test; rolled back at the end."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(time_machine.travel(INSTANT, tick=False))
        with django_db_blocker.unblock(), transaction.atomic():
            demo_seed(speedup=30)
            yield
            transaction.set_rollback(True)


def client_of(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=DEMO_PASSWORD)
    return client


def home_html(username: str) -> str:
    response = client_of(username).get("/")
    assert response.status_code == 200
    return response.content.decode()


def sections(html: str) -> list[str]:
    return re.findall(r'data-home="([\w-]+)"', html)


def run_id(name: str) -> int:
    return Run.objects.get(experiment__name=name).pk


def test_each_persona_gets_the_sections_of_its_roles(demo):
    found = {username: sections(home_html(username)) for username in PERSONAS}

    assert found == {
        "alice": ["researcher"],
        "tara": ["researcher", "tenant-admin"],
        "admin": ["platform", "kpis", "backends"],
        "fiona": ["finance"],
    }


def test_a_person_with_several_roles_gets_every_section(demo):
    boss = User.objects.get(username="admin")
    Membership.objects.create(
        user=boss, tenant=Tenant.objects.get(slug="nlp"), role=Membership.Role.TENANT_ADMIN
    )
    fiona = User.objects.get(username="fiona")
    fiona.groups.add(Group.objects.get(name=GlobalRole.PLATFORM_ADMIN))

    assert sections(home_html("admin")) == [
        "researcher",
        "tenant-admin",
        "platform",
        "kpis",
        "backends",
    ]
    assert sections(home_html("fiona")) == ["platform", "kpis", "backends", "finance"]
    nobody = make_user("nobody")
    nobody.set_password(DEMO_PASSWORD)
    nobody.save()
    assert sections(home_html("nobody")) == ["none"]


def test_the_researcher_sees_their_runs_the_waiting_one_with_its_estimate_and_goodput(demo):
    html = home_html("alice")

    # Her tenant's figure and her own, each as the goodput page shows it (its total, and
    # her row): tara's idle notebook is in the first and not in the second. Her
    # segformer-b5 counts with both its attempts: the one the lemon's fault ended (its lost
    # GPU-hours are waste here, whatever finance credits) and the retry.
    assert texts(html, data_home_figure="goodput") == [
        "Goodput over the last 30 days (since 9 Feb, as on the goodput page): vision : 53.9 % "
        "of all its runs (88.1 of 163.4 GPU-hours effective, 6 attempts) ; your runs: 71.4 % "
        "(88.1 of 123.4 GPU-hours, 5 attempts) , their waste is mostly input wait."
    ]
    page = client_of("alice").get(reverse("telemetry:tenant_goodput", args=["vision"]))
    page_html = page.content.decode()
    assert "Last 30 days" in page_html
    assert texts(page_html, data_kpi="goodput") == ["53.9 %"]
    assert texts(page_html, data_kpi="attempts") == ["6"]
    alice_row = texts(page_html, data_row="alice")[0]
    assert alice_row.startswith("alice 5 123.39 88.10"), alice_row
    assert " 71.4 % " in alice_row, alice_row
    waiting = run_id("yolo-xl")
    assert texts(html, data_table="my-waiting") == [
        f"Run GPUs Why it waits Should start #{waiting} yolo-xl 2×8 a100-80gb Borrow limit "
        "reached · #1 in queue at about 09:13; about Thu 10:00 if every run ahead uses its full "
        "time limit (an estimate, not a promise: no a100-80gb run has started with one in the "
        "last 7 days)"
    ]
    recent = texts(html, data_table="my-recent")[0]
    assert re.findall(r"#\d+ [\w-]+", recent) == [
        f"#{run_id('yolo-xl')} yolo-xl",
        f"#{run_id('unet-sweep-2')} unet-sweep-2",
        f"#{run_id('yolo-large')} yolo-large",
        # Her latest finished runs, 2 and 4 days back (the last five: older ones drop out).
        f"#{run_id('segformer-b5')} segformer-b5",
        f"#{run_id('vit-gang')} vit-gang",
    ]


def test_the_tenant_admin_sees_quota_and_budget_use_members_and_waiting_runs(demo):
    html = home_html("tara")

    assert texts(html, data_tenant="vision", data_home="tenant-admin") == [
        "Vision Lab (vision), your tenant Quotas 2 members · 1 run waiting · Goodput "
        "Quota and budget use of vision GPU flavor In use now Guaranteed Borrow limit "
        "Budget this month a100-80gb 16 16 8 1 % 62.6 of 5000 GPU-hours (1 %) "
        "Hard: runs wait when the budget is spent h100-80gb 0 8 0 No budget · 0.0 GPU-hours "
        f"used #{run_id('yolo-xl')} yolo-xl by alice, 2×8 a100-80gb: Borrow limit reached "
        "· #1 in queue"
    ]
    assert 'href="/tenants/vision/members/"' in html


def test_the_platform_admin_sees_occupancy_fragmentation_kpis_and_backends(demo):
    html = home_html("admin")

    assert texts(html, data_table="occupancy") == [
        "Cluster · flavor GPUs Held by runs now (% of the GPUs taking work) Outside Gantry "
        "Taking no work Free Largest gang "
        "that could start now (nodes × GPUs) "
        "sim-east · a100-80gb 48 32 (94 %) 6 8 2 1 × 1–2; none with 3–8 "
        "sim-east · h100-80gb 16 4 (25 %) 0 0 12 1 × 5–8, 2 × 1–4"
    ]
    # The KPI page's default range, the last 30 days: the history runs, 10 of 11 succeeded
    # (segformer-b5 too, on its retry); the attempt the lemon's fault ended is the third
    # unsuccessful one. vit-gang's start-up took 45 s, its gang slowed by its straggler.
    assert texts(html, data_home="kpis") == [
        "KPIs of the last 30 days, 2027-02-09 through 2027-03-10 All KPIs Queue time p50 / p95 "
        "6 min 00 s / 6 min 00 s Startup time p50 / p95 30 s / 45 s Success rate 90.9 % Goodput "
        "60.1 % Cluster allocation (30-day average) 0.9 % Unsuccessful attempts 3 Every KPI here "
        "covers the 30 days, not this moment: cluster allocation is the GPU-hours runs held over "
        "them ÷ the GPU-hours the clusters offered, so it differs from the share held now in "
        "“GPUs now” above."
    ]
    kpi_page = client_of("admin").get(reverse("telemetry:platform_kpis")).content.decode()
    assert texts(kpi_page, data_kpi="success")[0].startswith("90.9 % (10 of 11 runs)")
    assert texts(kpi_page, data_kpi="goodput")[0].startswith("60.1 % (243.53 of 405.39 GPU-hours)")
    assert texts(html, data_table="backends") == [
        "Cluster Backend Last sync Health sim-east Simulator never Healthy"
    ]


def test_finance_sees_last_months_statements_and_what_is_still_open(demo):
    html = home_html("fiona")

    # February at the A100 rate before March's rise (2.10 EUR; H100 3.90), March to date at
    # 2.40: vision's segformer-b5 (8 GPUs, 141,944 GPU-seconds) less the 2,744 credited for
    # the lemon's fault is 139,200 GPU-seconds, 38.67 GPU-hours, 92.80 EUR; vit-gang's 16 GPUs
    # for 3,630 s x 1.485 (its straggler's pace) are 23.96 GPU-hours, 57.50 EUR.
    assert texts(html, data_table="statements") == [
        "Tenant Feb 2027 GPU-hours Feb 2027 cost Mar 2027 so far, accrued (still open) "
        "Climate Modeling (climate) 36.00 75.60 EUR 105.60 EUR "
        "NLP Group (nlp) 96.00 201.60 EUR 158.40 EUR "
        "Vision Lab (vision) 140.00 330.00 EUR 150.30 EUR"
    ]
    assert page_actions(html).links.count("/finance/vision/2027-02/") == 1


def test_finances_open_month_accrues_the_attempts_still_running(demo):
    """Vision's two admitted 8-GPU runs start at the seed's instant (as the simulator starts
    them); an hour later they have cost 16 GPU-hours at March's 2.40 EUR, and the open month
    reads that on top of segformer-b5's charged 92.80 and vit-gang's 57.50, and says where it
    comes from."""
    with transaction.atomic():
        started = Attempt.objects.filter(run__tenant__slug="vision", started_at__isnull=True)
        assert sorted(attempt.run.gpus for attempt in started) == [8, 8]
        started.update(state=AttemptState.RUNNING, started_at=INSTANT)

        with time_machine.travel(INSTANT + timedelta(hours=1), tick=False):
            html = home_html("fiona")
        transaction.set_rollback(True)

    vision = [row for row in texts(html, data_tenant="vision") if "Vision Lab" in row]
    assert vision == [
        "Vision Lab (vision) 140.00 330.00 EUR 188.70 EUR incl. 38.40 of 2 attempts running or "
        "not yet rolled up"
    ]


# Queries of the home page: the request's own (session, user, roles, notification badge)
# plus each section's, at most this many whatever the number of runs, tenants and clusters
# (a list of waiting runs shorter than a full one is its own count: no COUNT query then).
# The platform admin's cluster map reads its suspect and quarantined nodes in one query more.
HOME_QUERIES = {"alice": 9, "tara": 18, "admin": 17, "fiona": 9}


@pytest.mark.parametrize("username", PERSONAS)
def test_the_home_page_costs_a_fixed_number_of_queries(
    demo, username, django_assert_max_num_queries
):
    client = client_of(username)
    with django_assert_max_num_queries(HOME_QUERIES[username]):
        assert client.get("/").status_code == 200
    alice = User.objects.get(username="alice")
    for number in range(15):
        run_submit(
            user=alice,
            data=ExperimentInput(
                tenant="vision",
                project="detection",
                image="registry.gantry.example/ml/pytorch:2.4-cuda12.4",
                command="python train.py",
                flavor="h100-80gb",
                nodes=1,
                gpus_per_node=8,
                name=f"more-{number}",
            ),
        )
    with django_assert_max_num_queries(HOME_QUERIES[username]):
        assert client.get("/").status_code == 200


# --- no persona sees an action it cannot take -------------------------------------------

# Views that are actions in themselves: forms that change something.
ACTION_VIEWS = {
    "jobs:run_submit",
    "jobs:quota_edit",
    "jobs:template_create",
    "jobs:template_edit",
    "jobs:cluster_capacity",
    "images:image_import",
    "images:registry_create",
    "images:registry_edit",
    "tenants:flavor_create",
    "tenants:flavor_edit",
}


def view_name(url: str) -> str | None:
    path = urlsplit(url).path
    if not path.startswith("/"):
        return None
    try:
        return resolve(path).view_name
    except Resolver404:
        return None


def actions_on(html: str, page: str) -> list[str]:
    """The actions a page offers: its POST forms (by view) and its links to action pages."""
    found = page_actions(html)
    posts = {f"POST {view_name(urljoin(page, action))}" for action in found.posts}
    links = {name for name in map(view_name, found.links) if name in ACTION_VIEWS}
    return sorted((posts | links) - {"POST logout"})


def pages_of_the_demo() -> dict[str, str]:
    waiting = Run.objects.get(experiment__name="yolo-xl")
    pytorch = Image.objects.get(repository="registry.gantry.example/ml/pytorch")
    return {
        "home": "/",
        "runs": reverse("jobs:run_list"),
        "run": reverse("jobs:run_detail", args=[waiting.pk]),
        "experiment": reverse("jobs:experiment_detail", args=[waiting.experiment_id]),
        "quotas": reverse("jobs:quota_list"),
        "images": reverse("images:image_list"),
        "image": reverse("images:image_detail", args=[pytorch.pk]),
        "idle policy": reverse("tenants:idle_policy", args=["vision"]),
        "templates": reverse("jobs:template_list"),
        "rate cards": reverse("finance:rate_cards"),
    }


def test_each_persona_sees_exactly_the_actions_it_may_take(demo):
    pages = pages_of_the_demo()
    seen = {}
    for username in PERSONAS:
        client = client_of(username)
        for page, url in pages.items():
            response = client.get(url)
            if response.status_code == 200:
                seen[(username, page)] = actions_on(response.content.decode(), url)
            else:
                seen[(username, page)] = response.status_code

    # The navigation's Submit link is on every page of the members, and only theirs.
    submit = "jobs:run_submit"
    assert seen == {
        ("alice", "home"): [submit],
        ("alice", "runs"): [submit],
        ("alice", "run"): ["POST jobs:experiment_rerun", "POST jobs:run_cancel", submit],
        ("alice", "experiment"): ["POST jobs:experiment_rerun", submit],
        ("alice", "quotas"): [submit],
        ("alice", "images"): [submit],
        ("alice", "image"): [submit],
        ("alice", "idle policy"): [submit],
        ("alice", "templates"): 404,
        ("alice", "rate cards"): 404,
        ("tara", "home"): [submit],
        ("tara", "runs"): [submit],
        ("tara", "run"): ["POST jobs:experiment_rerun", "POST jobs:run_cancel", submit],
        ("tara", "experiment"): ["POST jobs:experiment_rerun", submit],
        ("tara", "quotas"): [submit],
        ("tara", "images"): [submit],
        ("tara", "image"): [submit],
        ("tara", "idle policy"): ["POST tenants:idle_policy", submit],
        ("tara", "templates"): [
            "POST jobs:template_delete",
            submit,
            "jobs:template_create",
            "jobs:template_edit",
        ],
        ("tara", "rate cards"): [submit],
        ("admin", "home"): [],
        ("admin", "runs"): [],
        ("admin", "run"): ["POST jobs:run_cancel"],
        ("admin", "experiment"): [],
        ("admin", "quotas"): ["jobs:quota_edit"],
        ("admin", "images"): ["images:image_import"],
        ("admin", "image"): [
            "POST images:image_recheck",
            "POST images:image_status",
            "POST images:image_visibility",
            "images:registry_edit",  # the demo registry the image was imported from
        ],
        ("admin", "idle policy"): ["POST tenants:idle_policy"],
        ("admin", "templates"): [
            "POST jobs:template_delete",
            "jobs:template_create",
            "jobs:template_edit",
        ],
        # Each rate card's credit policy is theirs to set, as its prices are.
        ("admin", "rate cards"): [
            "POST finance:rate_card_credit_policy",
            "POST finance:rate_cards",
        ],
        ("fiona", "home"): [],
        ("fiona", "runs"): [],
        ("fiona", "run"): [],
        ("fiona", "experiment"): [],
        ("fiona", "quotas"): [],
        ("fiona", "images"): [],
        ("fiona", "image"): [],
        ("fiona", "idle policy"): [],
        ("fiona", "templates"): 404,
        ("fiona", "rate cards"): [
            "POST finance:rate_card_credit_policy",
            "POST finance:rate_cards",
        ],
    }


def test_finance_and_platform_admins_without_a_tenant_see_no_submit_button(demo):
    for username in ("fiona", "admin"):
        client = client_of(username)
        for url in ("/", reverse("jobs:run_list")):
            html = client.get(url).content.decode()
            assert "Submit an experiment" not in html, (username, url)
            assert reverse("jobs:run_submit") not in page_actions(html).links, (username, url)
    runs = client_of("alice").get(reverse("jobs:run_list")).content.decode()
    assert texts(runs, **{"class": "button button-primary"}) == ["Submit an experiment"]


def shape(url: str) -> str:
    """A URL with its numbers and query left out: one page of each kind is enough."""
    return re.sub(r"\d+", "N", urlsplit(url).path)


# Not crawled: Django's own admin, the API browser, and leaving.
NOT_CRAWLED = ("/admin/", "/api/", "/static/", "/accounts/logout/")


def test_every_link_and_form_a_persona_sees_it_may_use(demo):
    """From the home page, every page a persona reaches by links (one of each kind): each
    link answers without an error, and each POST form, sent as the browser would, is not
    refused (403), hidden (404) or the wrong method (405). The forms are sent inside a
    transaction that is rolled back, so no action stays done."""
    refused = []
    for username in PERSONAS:
        client = client_of(username)
        queue, seen = ["/"], {shape("/")}
        while queue:
            url = queue.pop(0)
            response = client.get(url)
            if response.status_code >= 400:
                refused.append((username, "GET", url, response.status_code))
                continue
            if not response.get("Content-Type", "").startswith("text/html"):
                continue
            html = response.content.decode()
            found = page_actions(html)
            for action in dict.fromkeys(found.posts):
                target = urljoin(url, action)
                if target.startswith(NOT_CRAWLED):
                    continue
                with transaction.atomic():
                    status = client.post(target, post_form(html, action).values).status_code
                    transaction.set_rollback(True)
                if status in (403, 404, 405):
                    refused.append((username, "POST", target, status))
            for link in found.links:
                target = urljoin(url, link)
                if urlsplit(target).netloc or target.startswith(NOT_CRAWLED):
                    continue
                if shape(target) not in seen and target.startswith("/"):
                    seen.add(shape(target))
                    queue.append(target)
        assert len(seen) > 10, (username, sorted(seen))

    assert refused == []
