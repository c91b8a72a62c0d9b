"""The track record of the full-limits start estimate (issue 31, point 6): a run keeps the
estimate that stood when it was admitted and, at its first start, by how many seconds it
missed it; each flavor's record over the last 7 days is one aggregate query, and every page
that shows the estimate says it is an estimate and how it fared, at no cost per row."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from clusters.backends.base import JobStatus
from gantry_cli.run_status import start_estimate
from jobs.models import Attempt, Run, RunState
from jobs.selectors.estimates import StartRecord, start_records
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_apply_status
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def queued(world, *, full_limits=None, expected=None, **overrides) -> Run:
    """A run submitted at T0, with the estimates the refresh would have written."""
    user = world.researcher_b if overrides.get("tenant") == "nlp" else world.researcher_a
    with time_machine.travel(T0, tick=False):
        run = run_submit(user=user, data=experiment_input(world, **overrides))
    if full_limits is not None:
        Run.objects.filter(pk=run.pk).update(
            start_full_limits_at=full_limits, start_expected_at=expected, start_estimated_at=T0
        )
    return run


def admitted_and_pending(run: Run, *, at: datetime) -> Attempt:
    with time_machine.travel(at, tick=False):
        admission_run_cycle(now=at)
        attempt = run.attempts.order_by("-number").first()
        assert attempt is not None, "not admitted"
        attempt_submit(attempt_id=attempt.pk)
    return Attempt.objects.select_related("run", "cluster").get(pk=attempt.pk)


def report(attempt: Attempt, status: JobStatus, *, now: datetime) -> None:
    attempt = Attempt.objects.select_related("run", "cluster").get(pk=attempt.pk)
    with time_machine.travel(now, tick=False):
        attempt_apply_status(attempt=attempt, status=status, now=now)


def record_of(run: Run) -> tuple:
    run.refresh_from_db()
    return (
        run.start_full_limits_was,
        run.start_expected_was,
        run.start_missed_by_s,
        run.start_full_limits_met,
    )


# --- what a run records --------------------------------------------------------------------


def test_a_run_started_before_its_estimate_is_recorded_as_met_by_the_exact_seconds(world):
    run = queued(world, full_limits=T0 + 30 * MINUTE, expected=T0 + 10 * MINUTE)

    attempt = admitted_and_pending(run, at=T0 + MINUTE)
    # Admission clears the estimates a queued run shows, and keeps them for the record.
    run.refresh_from_db()
    assert (run.state, run.start_full_limits_at, run.start_expected_at) == (
        RunState.PENDING,
        None,
        None,
    )
    assert record_of(run) == (T0 + 30 * MINUTE, T0 + 10 * MINUTE, None, None)

    started = T0 + 19 * MINUTE + timedelta(seconds=47.5)
    report(attempt, JobStatus(state="RUNNING", started_at=started), now=T0 + 20 * MINUTE)

    assert record_of(run) == (T0 + 30 * MINUTE, T0 + 10 * MINUTE, -612.5, True)
    assert run.state == RunState.RUNNING and run.started_at == started


def test_a_run_started_47_6_s_after_its_estimate_is_recorded_as_missed_by_47_6_s(world):
    run = queued(world, full_limits=T0 + 5 * MINUTE, expected=T0 + 2 * MINUTE)
    attempt = admitted_and_pending(run, at=T0 + MINUTE)

    started = T0 + 5 * MINUTE + timedelta(seconds=47.6)
    report(attempt, JobStatus(state="RUNNING", started_at=started), now=T0 + 6 * MINUTE)

    assert record_of(run) == (T0 + 5 * MINUTE, T0 + 2 * MINUTE, 47.6, False)


def test_a_start_exactly_at_the_estimate_meets_it(world):
    run = queued(world, full_limits=T0 + 5 * MINUTE)
    attempt = admitted_and_pending(run, at=T0 + MINUTE)

    report(attempt, JobStatus(state="RUNNING", started_at=T0 + 5 * MINUTE), now=T0 + 6 * MINUTE)

    assert record_of(run) == (T0 + 5 * MINUTE, None, 0.0, True)


def test_a_run_that_started_and_ended_between_two_syncs_is_recorded_from_its_start(world):
    run = queued(world, full_limits=T0 + 5 * MINUTE)
    attempt = admitted_and_pending(run, at=T0 + MINUTE)

    report(
        attempt,
        JobStatus(
            state="SUCCEEDED", started_at=T0 + 7 * MINUTE, finished_at=T0 + 8 * MINUTE, exit_code=0
        ),
        now=T0 + 9 * MINUTE,
    )

    assert record_of(run) == (T0 + 5 * MINUTE, None, 120.0, False)
    assert run.state == RunState.SUCCEEDED


def test_a_run_that_never_had_an_estimate_records_nothing(world):
    run = queued(world)  # admitted by the first cycle, before any refresh estimated it
    attempt = admitted_and_pending(run, at=T0 + MINUTE)

    report(attempt, JobStatus(state="RUNNING", started_at=T0 + 2 * MINUTE), now=T0 + 3 * MINUTE)

    assert record_of(run) == (None, None, None, None)
    assert run.state == RunState.RUNNING
    assert start_records(flavors=["a100-80gb"], now=T0 + 3 * MINUTE) == {
        "a100-80gb": StartRecord("a100-80gb", started=0, met=0, worst_miss_s=None, last_met_at=None)
    }


def test_a_restart_keeps_the_record_of_the_first_start(world):
    run = queued(world, full_limits=T0 + 5 * MINUTE, max_restarts=1)
    attempt = admitted_and_pending(run, at=T0 + MINUTE)
    report(attempt, JobStatus(state="RUNNING", started_at=T0 + 6 * MINUTE), now=T0 + 6 * MINUTE)
    report(
        attempt,
        JobStatus(
            state="FAILED", started_at=T0 + 6 * MINUTE, finished_at=T0 + 9 * MINUTE, exit_code=1
        ),
        now=T0 + 9 * MINUTE,
    )
    run.refresh_from_db()
    assert (run.state, run.restarts) == (RunState.QUEUED, 1)

    # Queued again with a new estimate, admitted and started far after it.
    Run.objects.filter(pk=run.pk).update(start_full_limits_at=T0 + 10 * MINUTE)
    second = admitted_and_pending(run, at=T0 + 10 * MINUTE)
    assert second.number == 2
    report(second, JobStatus(state="RUNNING", started_at=T0 + 30 * MINUTE), now=T0 + 30 * MINUTE)

    assert record_of(run) == (T0 + 5 * MINUTE, None, 60.0, False)
    assert run.started_at == T0 + 6 * MINUTE


# --- the record of a flavor ----------------------------------------------------------------


def started_with_estimate(world, *, started: datetime, missed_by_s: float, **overrides) -> Run:
    """A run as the services leave one that first started at ``started``, ``missed_by_s``
    after the full-limits estimate it was admitted with."""
    run = queued(world, **overrides)
    estimate = started - timedelta(seconds=missed_by_s)
    Run.objects.filter(pk=run.pk).update(
        state=RunState.RUNNING,
        started_at=started,
        start_full_limits_was=estimate,
        start_missed_by_s=missed_by_s,
    )
    return run


def a_week_of_starts(world) -> None:
    """a100-80gb: within the last 7 days of T0 + 7 d, three met (the latest at T0 + 6 d 22 h,
    10:00 on the day of T0 + 7 d),
    two missed (47.6 s, 30 s), across both tenants; one older than the window, one with no
    estimate, one that ran on h100-80gb."""
    nlp = {"tenant": "nlp", "project": "llm", "name": "llm-pretrain"}
    for started, missed in (
        (T0 + timedelta(days=1), -600.0),
        (T0 + timedelta(days=6, hours=22), 0.0),
        (T0 + timedelta(days=3), -5.5),
        (T0 + timedelta(days=2), 47.6),
        (T0 + timedelta(days=6, hours=23), 30.0),
    ):
        started_with_estimate(world, started=started, missed_by_s=missed, **nlp)
    started_with_estimate(world, started=T0 - timedelta(hours=1), missed_by_s=900.0)
    no_estimate = queued(world)
    Run.objects.filter(pk=no_estimate.pk).update(
        state=RunState.RUNNING, started_at=T0 + timedelta(days=5)
    )
    started_with_estimate(
        world, started=T0 + timedelta(days=4), missed_by_s=-1.0, flavor="h100-80gb"
    )


def test_the_record_counts_the_last_7_days_of_starts_per_flavor(world):
    a_week_of_starts(world)
    week_later = T0 + timedelta(days=7)

    with CaptureQueriesContext(connection) as queries:
        records = start_records(flavors=["a100-80gb", "h100-80gb", "a100-80gb"], now=week_later)
    assert len(queries.captured_queries) == 1

    assert records == {
        "a100-80gb": StartRecord(
            "a100-80gb",
            started=5,
            met=3,
            worst_miss_s=47.6,
            last_met_at=T0 + timedelta(days=6, hours=22),
        ),
        "h100-80gb": StartRecord(
            "h100-80gb",
            started=1,
            met=1,
            worst_miss_s=None,
            last_met_at=T0 + timedelta(days=4),
        ),
    }
    # At T0 + 6 d 22 h the run started an hour before T0 is in the window, the start of
    # T0 + 6 d 23 h not yet.
    earlier = start_records(flavors=["a100-80gb"], now=T0 + timedelta(days=6, hours=22))
    assert earlier["a100-80gb"] == StartRecord(
        "a100-80gb",
        started=5,
        met=3,
        worst_miss_s=900.0,
        last_met_at=T0 + timedelta(days=6, hours=22),
    )
    # Two days and an hour on, the three latest starts are left: two met, one 30 s late.
    later = start_records(flavors=["a100-80gb"], now=T0 + timedelta(days=9, hours=1))
    assert later["a100-80gb"] == StartRecord(
        "a100-80gb",
        started=3,
        met=2,
        worst_miss_s=30.0,
        last_met_at=T0 + timedelta(days=6, hours=22),
    )
    # No flavor asked: no query.
    with CaptureQueriesContext(connection) as queries:
        assert start_records(flavors=[], now=week_later) == {}
    assert queries.captured_queries == []


def test_the_record_in_words(world):
    now = T0 + timedelta(days=7)
    none = StartRecord("a100-80gb", started=0, met=0, worst_miss_s=None, last_met_at=None)
    never_met = StartRecord("a100-80gb", started=1, met=0, worst_miss_s=47.6, last_met_at=None)
    mixed = StartRecord(
        "a100-80gb", started=5, met=3, worst_miss_s=47.6, last_met_at=T0 + timedelta(days=6)
    )
    always = StartRecord("a100-80gb", started=2, met=2, worst_miss_s=None, last_met_at=now)

    assert none.summary(now=now) == (
        "an estimate, not a promise: no a100-80gb run has started with one in the last 7 days"
    )
    assert never_met.summary(now=now) == (
        "an estimate, not a promise: met by 0 of 1 a100-80gb run started in the last 7 days; "
        "at worst 48 s late"
    )
    assert mixed.summary(now=now) == (
        "an estimate, not a promise: met by 3 of 5 a100-80gb runs started in the last 7 days, "
        "last at Mon 12:00; at worst 48 s late"
    )
    assert always.summary(now=now) == (
        "an estimate, not a promise: met by 2 of 2 a100-80gb runs started in the last 7 days, "
        "last at 12:00"
    )
    assert mixed.sentence(now=now) == (
        "The start time if every run ahead uses its full time limit is an estimate, not a "
        "promise: met by 3 of 5 a100-80gb runs started in the last 7 days, last at Mon 12:00; "
        "at worst 48 s late."
    )


# --- where people read it ------------------------------------------------------------------

RECORD = (
    "an estimate, not a promise: met by 3 of 5 a100-80gb runs started in the last 7 days, "
    "last at 10:00; at worst 48 s late"
)


def waiting_with_estimate(world, count: int) -> list[Run]:
    """``count`` runs of alice's queued on the full cluster at T0 + 7 d with estimates."""
    now = T0 + timedelta(days=7)
    runs = []
    for _ in range(count):
        run = queued(world, full_limits=now + 3 * 60 * MINUTE, expected=now + 60 * MINUTE)
        Run.objects.filter(pk=run.pk).update(submitted_at=now - MINUTE)
        runs.append(run)
    return runs


def page_queries(client: Client, url: str) -> tuple[str, int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return response.content.decode(), len(queries.captured_queries)


def test_the_run_list_home_and_run_page_show_the_record_beside_the_estimate(world):
    a_week_of_starts(world)
    (waiting,) = waiting_with_estimate(world, 1)
    client = Client()

    with time_machine.travel(T0 + timedelta(days=7), tick=False):
        client.force_login(world.researcher_a)
        listing = client.get(reverse("jobs:run_list")).content.decode()
        home = client.get("/").content.decode()
        page = client.get(reverse("jobs:run_detail", args=[waiting.pk])).content.decode()
        api = client.get(reverse("api:run-detail", args=[waiting.pk])).json()
        listed = client.get(reverse("api:run-list")).json()["results"]

    shown = (
        "Starts about 13:00; about 15:00 if every run ahead uses its full time limit "
        f'<span class="start-record muted" data-start-record>({RECORD})</span>'
    )
    assert shown in listing
    assert (
        "at about 13:00; about 15:00 if every run ahead uses its full time limit "
        f'<span class="start-record muted" data-start-record>({RECORD})</span>'
    ) in home
    assert (
        '<p class="start-record muted" data-start-record>The start time if every run ahead '
        f"uses its full time limit is {RECORD}.</p>"
    ) in page
    assert api["start_record"] == {
        "flavor": "a100-80gb",
        "days": 7,
        "started": 5,
        "met": 3,
        "worst_miss_s": 47.6,
        "last_met_at": "2026-03-17T10:00:00Z",
    }
    # The list's API shows the estimates, not their record (a page of runs, no query more).
    assert "start_record" not in listed[0]
    # The CLI says it as the pages do, in its own time zone.
    local = datetime.fromisoformat(api["start_record"]["last_met_at"]).astimezone()
    assert start_estimate(api).endswith(
        "if every run ahead uses its full time limit (an estimate, not a promise: met by 3 of "
        f"5 a100-80gb runs started in the last 7 days, last at {local:%Y-%m-%d %H:%M:%S}; at "
        "worst 48 s late)"
    )


def test_a_run_that_started_since_shows_no_record(world):
    a_week_of_starts(world)
    run = started_with_estimate(world, started=T0 + timedelta(days=6), missed_by_s=5.0)
    client = Client()
    with time_machine.travel(T0 + timedelta(days=7), tick=False):
        client.force_login(world.researcher_a)
        listing = client.get(reverse("jobs:run_list")).content.decode()
        api = client.get(reverse("api:run-detail", args=[run.pk])).json()
    assert "data-start-record" not in listing
    assert api["start_record"] is None


def test_the_record_costs_one_query_per_page_whatever_the_number_of_rows(world):
    a_week_of_starts(world)
    client = Client()
    url = reverse("jobs:run_list")
    with time_machine.travel(T0 + timedelta(days=7), tick=False):
        client.force_login(world.researcher_a)
        # No row shows an estimate: the list costs what it did before, and reads no record.
        _, without = page_queries(client, url)
        _, home_without = page_queries(client, "/")
        waiting_with_estimate(world, 1)
        one_html, one = page_queries(client, url)
        _, home_one = page_queries(client, "/")
        waiting_with_estimate(world, 14)
        many_html, many = page_queries(client, url)
        home_html, home_many = page_queries(client, "/")

    assert one_html.count("data-start-record") == 1
    assert many_html.count("data-start-record") == 15
    assert home_html.count("data-start-record") == 10  # the first ten in line
    # Rows with an estimate add the record's one query, whatever their number.
    assert (without, one, many) == (9, 10, 10)
    # Home: a waiting list adds its places in line and the record, one query each.
    assert (home_without, home_one, home_many) == (6, 8, 8)
