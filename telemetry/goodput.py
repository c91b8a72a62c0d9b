"""The one definition of "goodput over the last N days", read by the goodput pages and the
home page alike, so a figure on one is the figure on the other (issue 31.7).

The last N days are calendar days in the current time zone, today included: from the start
of the day N − 1 days ago to the start of tomorrow. An attempt counts on the day it finished
(``telemetry.selectors.tenant_goodput``: only then is its accounting final).
"""

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.db import connection
from django.utils import timezone

from core.types import UserLike, signed_in
from jobs.models import Attempt, Run
from telemetry.models import AttemptAccounting
from telemetry.selectors.gpu_seconds import RUN_SUM_COLUMNS, RUN_SUM_TYPES, GpuSeconds
from tenants.access import tenant_scope_sql
from tenants.models import Tenant

# The periods the goodput pages offer, and the one shown first (and on the home page).
GOODPUT_DAYS = (7, 30, 90)
DEFAULT_GOODPUT_DAYS = 30


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


def goodput_window(*, days: int, today: date) -> tuple[datetime, datetime]:
    """[since, until) of the last ``days`` calendar days ending with ``today``."""
    return day_start(today - timedelta(days=days - 1)), day_start(today + timedelta(days=1))


@dataclass(frozen=True)
class TenantGoodput:
    """A tenant's goodput over a window (the goodput page's total) and the part of it of
    one user's runs (that page's row of the user)."""

    slug: str
    tenant: GpuSeconds
    mine: GpuSeconds


def goodput_of_my_tenants(
    *, user: UserLike, since: datetime, until: datetime
) -> list[TenantGoodput]:
    """Per active tenant ``user`` is a member of (``tenant_scope_sql``, members only), by
    slug: the accounting of its attempts that finished in [since, until), and of those of
    the runs the user submitted. One query, whatever the number of tenants (the home page
    asks it on every visit)."""
    user_id = signed_in(user).pk
    scope, scope_params = tenant_scope_sql(user=user, tenant="t", members_only=True)
    quote = connection.ops.quote_name
    columns = [f"a.{quote(column)}" for column in RUN_SUM_COLUMNS.values()]
    mine = "r.submitted_by_id = %s"
    sums = ", ".join(
        [f"SUM({column})" for column in columns]
        + ["COUNT(a.id)"]
        + [f"SUM(CASE WHEN {mine} THEN {column} END)" for column in columns]
        + [f"COUNT(CASE WHEN {mine} THEN a.id END)"]
    )
    params = [
        *[user_id] * (len(columns) + 1),
        connection.ops.adapt_datetimefield_value(since),
        connection.ops.adapt_datetimefield_value(until),
        *scope_params,
    ]
    # Identifiers from model metadata (quoted); every value is a parameter.
    sql = (
        f"SELECT t.slug, {sums} FROM {quote(AttemptAccounting._meta.db_table)} a "  # noqa: S608
        f"JOIN {quote(Attempt._meta.db_table)} at ON at.id = a.attempt_id "
        f"JOIN {quote(Run._meta.db_table)} r ON r.id = at.run_id "
        f"JOIN {quote(Tenant._meta.db_table)} t ON t.id = r.tenant_id "
        f"WHERE at.finished_at >= %s AND at.finished_at < %s AND {scope} "
        "GROUP BY t.id, t.slug ORDER BY t.slug"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    names = [*RUN_SUM_COLUMNS, "attempts"]
    found = []
    for slug, *values in rows:
        halves = values[: len(names)], values[len(names) :]
        tenant, own = (
            GpuSeconds.from_sums(
                {
                    name: None if value is None else RUN_SUM_TYPES[name](value)
                    for name, value in zip(names, half, strict=True)
                }
            )
            for half in halves
        )
        found.append(TenantGoodput(slug=slug, tenant=tenant, mine=own))
    return found
