"""The run list's page in one SQL statement (jobs/selectors/run_page_sql.py) is the page the
ORM built before (kept below as ``orm_page``, the query it replaced): the same runs in the
same order, the same cursors and count, the same columns loaded of the run and of each
related row, and the same row view-model and API output, for a researcher, a tenant admin
and a platform admin, every filter of the list, and every kind of cursor. Neither page
costs a query more once loaded.
"""

from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Run, RunState
from jobs.run_rows import RUN_ROW_FIELDS, run_row
from jobs.selectors.estimates import start_records_shown
from jobs.selectors.paging import keyset_page
from jobs.selectors.runs import (
    RUN_LIST_DEFERRED,
    RunCount,
    RunPage,
    run_page_viewable,
    runs_place_in_line,
    runs_usage,
)
from jobs.serializers.runs import RUN_COLUMNS, RunSerializer
from tenants.access import tenant_list_viewable
from tests.conftest import make_user
from tests.jobs.test_run_list_queries import runs_of_the_list, submit_runs
from tests.jobs.test_run_rows import NOW, runs_in_every_state

pytestmark = pytest.mark.django_db

PERSONAS = ("researcher_a", "tenant_admin_a", "platform_admin")
FILTERS = (
    {},
    {"states": [RunState.QUEUED]},
    {"states": [RunState.SUCCEEDED, RunState.CANCELLED, RunState.RUNNING]},
    {"tenant_slug": "vision"},
    {"tenant_slug": "nlp"},
    {"tenant_slug": "no-such-tenant"},
    {"mine": True},
    {"mine": True, "states": [RunState.QUEUED], "tenant_slug": "vision"},
)
# The columns each caller loads, and what it reads: the web list its row view-models, the
# API its serializer; without columns, both.
COLUMNS = {
    "rows": (RUN_ROW_FIELDS, {"row"}),
    "api": (RUN_COLUMNS, {"api"}),
    "all": ((), {"row", "api"}),
}
SIZE = 4


def orm_page(
    *,
    user,
    size,
    states=(),
    tenant_slug="",
    submitted_by=None,
    before=None,
    after=None,
    count_up_to=None,
    columns=(),
) -> RunPage:
    """The page as the ORM built it before the statement: its reference."""
    tenants = list(tenant_list_viewable(user=user))
    tenant_ids = [t.pk for t in tenants if not tenant_slug or t.slug == tenant_slug]
    runs = Run.objects.filter(tenant_id__in=tenant_ids)
    if states:
        runs = runs.filter(state__in=states)
    if submitted_by is not None:
        runs = runs.filter(submitted_by=submitted_by)
    listed = runs.select_related("experiment__project", "flavor", "cluster").prefetch_related(
        "submitted_by"
    )
    listed = listed.only(*columns) if columns else listed.defer(*RUN_LIST_DEFERRED)
    rows, has_newer, has_older = keyset_page(
        listed,
        readable=Run.objects.filter(tenant_id__in=[t.pk for t in tenants]),
        field="submitted_at",
        size=size,
        before=before,
        after=after,
    )
    by_id = {tenant.pk: tenant for tenant in tenants}
    for run in rows:
        run.tenant = by_id[run.tenant_id]
    runs_place_in_line(rows)
    count = None
    if count_up_to is not None:
        found = runs.order_by().values("pk")[: count_up_to + 1].count()
        count = RunCount(value=min(found, count_up_to), capped=found > count_up_to)
    return RunPage(
        runs=rows,
        newer=rows[0].pk if rows and has_newer else None,
        older=rows[-1].pk if rows and has_older else None,
        tenants=tenants,
        count=count,
    )


@pytest.fixture
def runs_of_two_tenants(world):
    """Runs in every state (vision, alice), runs of three submitters in two tenants, some
    admitted to a cluster, one cancelled, and three runs submitted at the same instant
    (the id breaks their tie)."""
    runs_in_every_state(world)
    with time_machine.travel(NOW + timedelta(minutes=5), tick=False):
        submit_runs(world, 9)
    runs_of_the_list(world)
    tied = list(Run.objects.order_by("id").values_list("pk", flat=True)[3:6])
    Run.objects.filter(pk__in=tied).update(submitted_at=NOW - timedelta(minutes=2))
    return world


def loaded(instance: Model | None) -> dict[str, object] | None:
    """The values of the columns loaded of ``instance``, by name."""
    if instance is None:
        return None
    deferred = instance.get_deferred_fields()
    return {
        field.attname: getattr(instance, field.attname)
        for field in instance._meta.concrete_fields
        if field.attname not in deferred
    }


def shown(page: RunPage, reads: set[str]) -> list[dict[str, object]]:
    """Everything the callers read of each run: the row view-model, the API output (as
    ``reads`` says), and the columns loaded of the run and its related rows, all read
    without a query."""
    runs_usage(page.runs, now=NOW)
    records = start_records_shown(page.runs, flavor_of=lambda run: run.flavor.slug, now=NOW)
    with CaptureQueriesContext(connection) as queries, timezone.override("Europe/Berlin"):
        seen = [
            {
                "run": loaded(run),
                "experiment": loaded(run.experiment),
                "project": loaded(run.experiment.project),
                "flavor": loaded(run.flavor),
                "cluster": loaded(run.cluster),
                "tenant": loaded(run.tenant),
                "submitter": run.submitted_by.get_username(),
                "submitter_id": run.submitted_by.pk,
                "queue_position": run.queue_position,
                "row": run_row(run, now=NOW, records=records) if "row" in reads else None,
                "api": RunSerializer(run).data if "api" in reads else None,
            }
            for run in page.runs
        ]
    assert queries.captured_queries == []
    return seen


def both_pages(user, **query) -> tuple[RunPage, RunPage]:
    if query.pop("mine", False):
        query["submitted_by"] = user
    return run_page_viewable(user=user, **query), orm_page(user=user, **query)


def assert_same(new: RunPage, old: RunPage, reads: set[str] = frozenset({"row", "api"})) -> None:
    assert [run.pk for run in new.runs] == [run.pk for run in old.runs]
    assert (new.newer, new.older, new.count) == (old.newer, old.older, old.count)
    assert new.tenants == old.tenants
    assert shown(new, reads) == shown(old, reads)


@pytest.mark.parametrize("caller", COLUMNS)
@pytest.mark.parametrize("persona", PERSONAS)
def test_the_page_is_the_orm_page_for_every_filter_and_cursor(runs_of_two_tenants, persona, caller):
    user = getattr(runs_of_two_tenants, persona)
    columns, reads = COLUMNS[caller]
    for query in FILTERS:
        first, reference = both_pages(user, size=SIZE, columns=columns, count_up_to=1000, **query)
        assert_same(first, reference, reads)
        # The next page's cursor, and runs all down the list (of any tenant and state).
        cursors = [run.pk for run in reference.runs[-1:]] + list(
            Run.objects.order_by("-id").values_list("pk", flat=True)[::6]
        )
        for cursor in cursors:
            for direction in ("before", "after"):
                new, old = both_pages(
                    user, size=SIZE, columns=columns, count_up_to=3, **query, **{direction: cursor}
                )
                assert_same(new, old, reads)


@pytest.mark.parametrize("persona", PERSONAS)
def test_paging_through_the_list_both_ways_meets_every_run_once(runs_of_two_tenants, persona):
    user = getattr(runs_of_two_tenants, persona)
    expected = list(
        Run.objects.filter(tenant__in=tenant_list_viewable(user=user))
        .order_by("-submitted_at", "-id")
        .values_list("pk", flat=True)
    )
    older, seen = None, []
    while True:
        page = run_page_viewable(user=user, size=SIZE, before=older, columns=RUN_ROW_FIELDS)
        seen += [run.pk for run in page.runs]
        if page.older is None:
            break
        older = page.older
    newer, back = page.runs[0].pk, [run.pk for run in page.runs]
    while newer is not None:
        page = run_page_viewable(user=user, size=SIZE, after=newer, columns=RUN_ROW_FIELDS)
        back = [run.pk for run in page.runs] + back
        newer = page.newer
    assert seen == back == expected
    assert len(expected) > 3 * SIZE


def test_a_cursor_run_that_left_the_filter_still_marks_the_position(runs_of_two_tenants):
    world = runs_of_two_tenants
    queued = list(
        Run.objects.filter(tenant=world.vision, state=RunState.QUEUED).values_list("pk", flat=True)
    )
    Run.objects.filter(pk=queued[2]).update(state=RunState.CANCELLED)
    query = {"size": SIZE, "states": [RunState.QUEUED], "columns": RUN_COLUMNS}

    new, old = both_pages(world.researcher_a, before=queued[2], **query)
    newer, older = both_pages(world.researcher_a, after=queued[2], **query)

    assert_same(new, old, {"api"})
    assert_same(newer, older, {"api"})
    assert [run.pk for run in new.runs] == queued[3 : 3 + SIZE]
    assert [run.pk for run in newer.runs] == queued[:2]


def test_a_cursor_of_another_tenant_or_no_run_marks_nothing(runs_of_two_tenants):
    world = runs_of_two_tenants
    nlp_run = Run.objects.filter(tenant=world.nlp).first()
    for cursor in (nlp_run.pk, 10**9):
        for direction in ("before", "after"):
            new, old = both_pages(world.researcher_a, size=SIZE, **{direction: cursor})
            assert_same(new, old)
            assert new.runs == [] and new.newer is None and new.older is None


def test_the_count_stops_at_its_cap(runs_of_two_tenants):
    admin = runs_of_two_tenants.platform_admin
    total = Run.objects.count()
    for cap in (0, 1, total - 1, total, total + 1):
        new, old = both_pages(admin, size=SIZE, count_up_to=cap)
        assert new.count == old.count
        assert new.count == RunCount(value=min(total, cap), capped=total > cap)


def test_a_user_without_tenants_sees_an_empty_page_and_asks_nothing_of_the_runs(world):
    submit_runs(world, 3)
    outsider = make_user("olga")
    with CaptureQueriesContext(connection) as queries:
        page = run_page_viewable(user=outsider, size=SIZE, count_up_to=10)
    assert page == RunPage(runs=[], newer=None, older=None, tenants=[], count=RunCount(0, False))
    assert not any("jobs_run" in query["sql"] for query in queries.captured_queries)
