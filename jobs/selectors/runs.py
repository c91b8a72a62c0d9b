"""Reads of runs and attempts, scoped to what the user may see."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import connection
from django.db.models import Exists, OuterRef

from core.types import UserLike, signed_in
from jobs.durations import run_duration
from jobs.models import (
    ENDED_ATTEMPT_STATES,
    Attempt,
    AttemptToken,
    Run,
    RunEvent,
    RunState,
)
from jobs.reproducibility import attempt_id_of_token, attempt_token_matches
from jobs.selectors.run_page_sql import PageFilter, runs_count_sql, runs_page_sql
from jobs.selectors.run_sql import run_attempts_sql, run_events_sql, run_get_sql
from jobs.selectors.sql import placeholders
from tenants.access import is_platform_admin, tenant_ids_viewable, tenant_list_viewable
from tenants.lookups import among_sql
from tenants.models import Tenant

# Large experiment fields no run list shows.
RUN_LIST_DEFERRED = ("experiment__command", "experiment__params", "experiment__env")


@dataclass(frozen=True)
class RunCount:
    """How many runs a list holds, counted no further than a limit: ``capped`` means more
    than ``value`` match. An exact COUNT of a million rows would cost more than the page."""

    value: int
    capped: bool


@dataclass(frozen=True)
class RunPage:
    """One page of a run list, newest first, and where the pages beside it start.

    Pages are found by position (keyset), never by OFFSET, so a page deep in a million runs
    costs what the first one does. ``newer`` and ``older`` are the run ids to page from
    (``after=`` and ``before=``), None where no newer or older runs match.
    """

    runs: list[Run]
    newer: int | None
    older: int | None
    tenants: list[Tenant]  # every tenant the list may show, for its tenant filter
    count: RunCount | None = None


def run_page_viewable(
    *,
    user: UserLike,
    size: int,
    states: Collection[str] = (),
    tenant_slug: str = "",
    submitted_by: UserLike | None = None,
    before: int | None = None,
    after: int | None = None,
    count_up_to: int | None = None,
    columns: Collection[str] = (),
) -> RunPage:
    """A page of the runs the user may read, in ``states`` (any if empty), of the tenant
    ``tenant_slug`` if given (none if the user may not read it), submitted by
    ``submitted_by`` if given: the ``size`` runs just older than run ``before``, just newer
    than run ``after``, or the newest ones.

    A cursor run only marks a position: it must be readable by the user but need not match
    the filters (a run that has left the filtered state still marks where a page ends).
    The same queries whatever the page and however many runs match: the readable
    tenants, the page with its related rows and submitters (``runs_page_sql``: one
    statement, none where no tenant matches), the queued runs' places in line (none for an
    empty page), and with ``count_up_to`` a count of the matching runs that stops after
    that many.

    ``columns``, if given, are the only ones loaded (as ``QuerySet.only`` would load them,
    related ones as ``experiment__name``), for a caller that reads no others; else all but
    the large experiment fields. A column read but not loaded costs a query per run. Of
    the submitter, its id and username are loaded.
    """
    tenants = list(tenant_list_viewable(user=user))
    # The ids go into the SQL as values, so PostgreSQL walks the (tenant, submitted_at)
    # index of exactly these tenants instead of guessing from a subquery.
    tenant_ids = [t.pk for t in tenants if not tenant_slug or t.slug == tenant_slug]
    where = PageFilter(
        tenant_ids=tenant_ids,
        readable_tenant_ids=[t.pk for t in tenants],
        states=list(states),
        submitted_by_id=None if submitted_by is None else signed_in(submitted_by).pk,
    )
    rows: list[Run] = []
    has_newer = has_older = False
    if tenant_ids:  # else no run matches, and nothing is asked
        rows, has_newer, has_older = runs_page_sql(
            where=where,
            size=size,
            before=before,
            after=after,
            columns=columns,
            deferred=RUN_LIST_DEFERRED,
        )
    by_id = {tenant.pk: tenant for tenant in tenants}
    for run in rows:
        run.tenant = by_id[run.tenant_id]
    runs_place_in_line(rows)
    count = None
    if count_up_to is not None:
        found = runs_count_sql(where=where, up_to=count_up_to + 1) if tenant_ids else 0
        count = RunCount(value=min(found, count_up_to), capped=found > count_up_to)
    return RunPage(
        runs=rows,
        newer=rows[0].pk if rows and has_newer else None,
        older=rows[-1].pk if rows and has_older else None,
        tenants=tenants,
        count=count,
    )


def runs_place_in_line(runs: Sequence[Run]) -> None:
    """Set ``queue_position`` on the queued ones among ``runs``: 1 + the queued runs of the
    same flavor ahead in line (priority, then submission order; as admission orders them).
    One query for any non-empty list, whatever its states (a list page costs the same
    queries whatever it shows): a window over the queued runs of those flavors."""
    if not runs:
        return
    table = connection.ops.quote_name(Run._meta.db_table)
    flavors = sorted({run.flavor_id for run in runs})
    queued = [run for run in runs if run.state == RunState.QUEUED]
    # The ids are one parameter however many runs there are (the admission cycle asks for
    # every queued run); the flavors are few.
    in_line, ids = among_sql(connection.vendor, "id", [run.pk for run in runs])
    # Identifiers from model metadata (quoted); every value is a parameter.
    sql = (
        "SELECT id, place FROM (SELECT id, row_number() OVER (PARTITION BY flavor_id "  # noqa: S608
        f"ORDER BY priority DESC, submitted_at, id) AS place FROM {table} WHERE state = %s "
        f"AND flavor_id IN ({placeholders(len(flavors))})) AS line WHERE {in_line}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [RunState.QUEUED, *flavors, ids])
        places = dict(cursor.fetchall())
    for run in queued:
        run.queue_position = places.get(run.pk)


def runs_usage(runs: Sequence[Run], *, now: datetime) -> None:
    """Set ``gpu_hours`` and ``duration`` on each of ``runs``, in one query for any
    non-empty list.

    GPU-hours are allocated GPU-hours as everywhere in Gantry (the monthly ledger, budgets,
    the telemetry accounting): the run's GPUs × each attempt's start to end, to ``now``
    for an attempt still running; nothing for an attempt that never started."""
    if not runs:
        return
    held: dict[int, float] = {}
    attempts = (
        Attempt.objects.filter(run__among=[run.pk for run in runs], started_at__isnull=False)
        .values_list("run_id", "started_at", "finished_at")
        .order_by()
    )
    for run_id, started, finished in attempts:
        assert started is not None  # filtered on started_at__isnull=False
        seconds = max(0.0, ((finished or now) - started).total_seconds())
        held[run_id] = held.get(run_id, 0.0) + seconds
    for run in runs:
        run.gpu_hours = run.gpus * held.get(run.pk, 0.0) / 3600
        run.duration = run_duration(
            submitted_at=run.submitted_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            running=run.state == RunState.RUNNING,
            terminal=run.is_terminal,
            now=now,
        )


def run_get_viewable(*, user: UserLike, run_id: int, columns: Collection[str] = ()) -> Run:
    """The run, or DoesNotExist alike for a missing run and another tenant's run; its
    place in line if it is queued (a query only then: other runs have none).

    ``columns``, if given, are the only ones loaded (as ``QuerySet.only`` loads them,
    related ones as ``experiment__name``), for a caller that reads no others. Else whole
    rows, the experiment's image too. A column read but not loaded costs a query. One
    statement (``run_get_sql``), as ``run_list_viewable`` would select the run."""
    run = run_get_sql(run_id=run_id, tenant_ids=tenant_ids_viewable(user), columns=tuple(columns))
    if run is None:
        raise Run.DoesNotExist("Run matching query does not exist.")
    if run.state == RunState.QUEUED:
        runs_place_in_line([run])
    return run


def attempt_get_for_token(*, token: str) -> Attempt | None:
    """The attempt a genuine per-attempt token was issued for, with its run and whether a
    later attempt of that run exists (``superseded``); None for anything not genuine (an
    unknown id, a digest that matches none issued, a token of the old HMAC scheme).

    Genuine is not enough to report: the caller refuses a token whose attempt has ended
    (``jobs.api.AttemptTokenAuthentication``)."""
    attempt_id = attempt_id_of_token(token)
    if attempt_id is None:
        return None
    digests = AttemptToken.objects.filter(attempt_id=attempt_id).values_list("digest", flat=True)
    if not attempt_token_matches(token, digests):
        return None
    later = Attempt.objects.filter(run_id=OuterRef("run_id"), number__gt=OuterRef("number"))
    return (
        Attempt.objects.select_related("run")
        .annotate(superseded=Exists(later))
        .filter(pk=attempt_id)
        .first()
    )


def attempt_token_refusal(attempt: Attempt) -> str | None:
    """Why a genuine token of ``attempt`` may no longer report, or None while it may: the
    attempt ended, or a later attempt of its run replaced it (``superseded``, as
    ``attempt_get_for_token`` annotates it)."""
    if attempt.state in ENDED_ATTEMPT_STATES:
        why = f"has ended ({attempt.get_state_display().lower()})"
    elif getattr(attempt, "superseded", False):
        why = "was replaced by a later attempt"
    else:
        return None
    return f"Attempt {attempt.number} of run {attempt.run_id} {why}: its token is no longer valid."


def run_events(*, run: Run, user: UserLike) -> list[RunEvent]:
    """The run's timeline as ``user`` may read it, with each event's actor: its
    ``shown_message`` is its admin-only detail (which may name other tenants and their runs)
    for platform admins, and the neutral message for everyone else. One statement."""
    return run_events_sql(run=run, admin_detail=is_platform_admin(user))


def run_attempts(*, run: Run) -> list[Attempt]:
    """The run's attempts by number, each with its cluster, in one statement."""
    return run_attempts_sql(run=run)


def run_submitted_with(*, user: UserLike, submission_key: UUID | None) -> Run | None:
    """The run this user already queued with this one-time form key, if any."""
    if submission_key is None:
        return None
    return Run.objects.filter(submitted_by=signed_in(user), submission_key=submission_key).first()


def attempt_get_for_work(attempt_id: int) -> Attempt:
    return Attempt.objects.select_related(
        "cluster",
        "resumed_from",
        "run__tenant",
        "run__experiment__project",
        "run__experiment__flavor",
    ).get(pk=attempt_id)
