"""The run list costs the same number of queries with 5 runs as with 60: for a researcher,
a tenant admin and a platform admin, as a page and through the API, on the newest page and
on a page deep in the list (``before=`` a run half-way down).

An N+1 (a run's experiment, project, cluster or submitter read one by one) or a count that
grew with the list would show as a different number. The runs are spread over two tenants
and three users; some hold a cluster, one is cancelled. Then what a cursor may be: a run the
user may read marks a position even when it no longer matches the filter; another tenant's
run marks none.
"""

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs.models import Run
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tenants.access import tenant_list_viewable
from tenants.services.tokens import api_token_create
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

PERSONAS = ("researcher_a", "tenant_admin_a", "platform_admin")
HTML_PAGE, API_PAGE = 25, 50


def submit_runs(world, count: int) -> None:
    """``count`` runs, a third each by alice and arthur (vision) and bob (nlp)."""
    submitters = (
        (world.researcher_a, {}),
        (world.researcher_a2, {}),
        (world.researcher_b, {"tenant": "nlp", "project": "llm", "name": "llm-pretrain"}),
    )
    for index in range(count):
        user, overrides = submitters[index % 3]
        run_submit(user=user, data=experiment_input(world, **overrides))


def runs_of_the_list(world) -> None:
    """Cancel the newest queued run of vision, then admit what fits, so that some runs
    hold a cluster."""
    queued = Run.objects.filter(state="QUEUED", tenant=world.vision).first()
    run_cancel(run=queued, actor=queued.submitted_by)
    admission_run_cycle()


def visible_ids(user) -> list[int]:
    runs = Run.objects.filter(tenant__in=tenant_list_viewable(user=user))
    return list(runs.order_by("-submitted_at", "-id").values_list("pk", flat=True))


def client_of(user, kind: str) -> Client:
    if kind == "api":
        _, secret = api_token_create(user=user)
        return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    client = Client()
    client.force_login(user)
    return client


def listed_ids(response, kind: str) -> list[int]:
    if kind == "api":
        return [run["id"] for run in response.json()["results"]]
    return [run.pk for run in response.context["runs"]]


def measured(client: Client, kind: str, query: dict) -> tuple[list[str], list[int]]:
    """The SQL of one request of the list, and the runs it listed. A token's "last used"
    is written on its first use in a minute only (tenants.authentication): that write is the
    token's bookkeeping, not the list's cost."""
    url = reverse("api:run-list" if kind == "api" else "jobs:run_list")
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, query)
    assert response.status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    return [s for s in sql if not s.startswith('UPDATE "tenants_apitoken"')], listed_ids(
        response, kind
    )


def both_pages(world, user, kind: str) -> dict[str, tuple[list[str], list[int]]]:
    """The newest page and the page before the run half-way down, checked for the right
    runs, with the SQL each cost."""
    client = client_of(user, kind)
    size = API_PAGE if kind == "api" else HTML_PAGE
    ids = visible_ids(user)
    middle = len(ids) // 2
    first = measured(client, kind, {})
    deep = measured(client, kind, {"before": ids[middle]})
    assert first[1] == ids[:size]
    assert deep[1] == ids[middle + 1 : middle + 1 + size]
    return {"first": first, "deep": deep}


def run_table_queries(sql: list[str]) -> int:
    return sum('FROM "jobs_run"' in statement for statement in sql)


def every_list(world) -> dict[tuple[str, str, str], list[str]]:
    """(persona, html or api, first or deep page) -> the SQL that request cost."""
    cost = {}
    for persona in PERSONAS:
        for kind in ("html", "api"):
            for page, (sql, _) in both_pages(world, getattr(world, persona), kind).items():
                cost[persona, kind, page] = sql
    return cost


def test_the_run_list_costs_the_same_queries_for_5_and_60_runs(world):
    submit_runs(world, 5)
    runs_of_the_list(world)
    few = every_list(world)

    submit_runs(world, 55)
    runs_of_the_list(world)
    many = every_list(world)

    assert {key: len(sql) for key, sql in many.items()} == {
        key: len(sql) for key, sql in few.items()
    }
    # The page itself (its related rows and submitters joined in), the queued runs' places
    # in line, and on the HTML page the count that stops at 10,000; the cursor run is a
    # subquery of the page's query, not a query of its own.
    assert {key: run_table_queries(sql) for key, sql in many.items()} == {
        (persona, kind, page): 3 if kind == "html" else 2
        for persona in PERSONAS
        for kind in ("html", "api")
        for page in ("first", "deep")
    }
    # A page deep in the list costs what the newest page does.
    for persona in PERSONAS:
        for kind in ("html", "api"):
            assert len(many[persona, kind, "deep"]) == len(many[persona, kind, "first"])


# --- what a cursor may be ----------------------------------------------------------------


def test_a_run_of_another_tenant_marks_no_position_in_the_list(world):
    submit_runs(world, 3)  # alice, arthur (vision), bob (nlp)
    nlp_run = Run.objects.get(tenant=world.nlp)
    page = client_of(world.researcher_a, "html")
    api = client_of(world.researcher_a, "api")

    html = page.get(reverse("jobs:run_list"), {"before": nlp_run.pk})
    body = api.get(reverse("api:run-list"), {"before": nlp_run.pk}).json()

    assert listed_ids(html, "html") == []
    assert "No runs on this page" in html.content.decode()
    assert body == {"next": None, "previous": None, "results": []}


def test_a_run_that_left_the_filtered_state_still_marks_where_a_page_ends(world):
    submit_runs(world, 6)
    vision = visible_ids(world.researcher_a)  # 4 queued runs, newest first
    cursor = Run.objects.get(pk=vision[1])
    run_cancel(run=cursor, actor=cursor.submitted_by)
    client = client_of(world.researcher_a, "api")

    body = client.get(reverse("api:run-list"), {"state": "QUEUED", "before": cursor.pk}).json()

    assert [run["id"] for run in body["results"]] == vision[2:]
    assert body["previous"] == (f"http://testserver/api/v1/runs/?after={vision[2]}&state=QUEUED")


@pytest.mark.parametrize("cursor", ["abc", "²", "0", "-3", str(2**63)])
def test_a_page_that_is_no_run_id_shows_the_newest_runs(world, cursor):
    submit_runs(world, 2)
    client = client_of(world.researcher_a, "html")

    response = client.get(reverse("jobs:run_list"), {"before": cursor, "state": "QUEUED"})

    assert response.status_code == 200
    assert listed_ids(response, "html") == visible_ids(world.researcher_a)
    assert "Newest</a>" not in response.content.decode()
