"""Finance at scale (issue 8, acceptance 6): a year of accounting, its statements and export.

One year (2025, UTC) of finished attempts — 1,000,000 of them, 800,000 runs (every fourth
run preempted once and run again), 100 tenants of very different sizes, 3 projects and 4
users each, 2 flavors, 2 clusters — with their ``AttemptAccounting`` (every category filled,
``effective + Σ waste == allocated``), and rate cards that change on 1 July. The bulk rows
are written by PostgreSQL itself (``INSERT … SELECT`` over ``generate_series``, the random
draws are hashes of the row ids, so every run seeds the same data); ``DailyUsage`` is then
filled by the real ``finance.services.daily_usage_rebuild``, one month at a time.

Measured, each beside a baseline in the same run:
- the monthly statement page (``GET /finance/<tenant>/<yyyy>-<mm>/`` through Django's test
  client, logged in as finance) over random tenant-months, against a straightforward SQL
  query that computes the same totals from the attempts and their accounting; the
  GPU-seconds of both are compared;
- the CSV export of 100,000 rows, streamed: Python's peak memory (tracemalloc) at 10,000
  and at 100,000 rows, and rows per second, against writing the same CSV into memory from
  a list.
"""

import csv
import functools
import gc
import hashlib
import io
import itertools
import multiprocessing
import os
import random
import resource
import statistics
import time
import tracemalloc
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.db.models import Count, Max, Sum
from django.test import Client
from django.urls import reverse
from psycopg import sql

from bench.cycle import QueryCounter, truncate, vacuum
from bench.report import Section, best_of, ms, ratio, timed
from clusters.models import Cluster, ClusterFlavor
from finance.models import DailyUsage, UsageRollupState
from finance.selectors.exports import EXPORT_COLUMNS, export_rows
from finance.selectors.rate_cards import platform_currency
from finance.selectors.statements import statement_month
from finance.services import daily_usage_rebuild, rate_card_add
from images.models import Image
from jobs.models import Attempt, Experiment, Run
from telemetry.accounting import CATEGORIES
from telemetry.models import AttemptAccounting
from tenants.models import GlobalRole, GpuFlavor, Project, Tenant

YEAR = 2025
START = datetime(YEAR, 1, 1, tzinfo=UTC)
END = datetime(YEAR + 1, 1, 1, tzinfo=UTC)
TENANTS, PROJECTS, USERS = 100, 3, 4  # projects and users per tenant
VARIANTS = (1, 2, 4, 8, 16)  # GPUs of a tenant's experiments (16: 2 nodes of 8)
RUNS = 800_000
# Rate cards: a price from 1 January and another from 1 July, per flavor.
RATES = {
    "a100-80gb": (Decimal("2.1000"), Decimal("1.8500")),
    "h100-80gb": (Decimal("3.9000"), Decimal("4.2500")),
}
RATE_CHANGE = date(YEAR, 7, 1)
FLAVORS = len(RATES)
SLOTS = PROJECTS * USERS * FLAVORS * len(VARIANTS)  # a tenant's experiments
CLUSTERS = ("bench-slurm", "bench-k8s")
STATEMENTS = 60  # statement renders measured (random tenant-months)
TARGET_P95_S = 0.3
EXPORT_ROWS = (10_000, 100_000)


# --- seeding -------------------------------------------------------------------------------

# h(x, k): a uniform integer in [0, 2^31) drawn from row id x, stream k (PostgreSQL's own
# 64-bit hash, seeded): the same rows on every run, no state between rows. u(x, k): the
# same draw as a float in [0, 1).
_H = "(hashint8extended(({x})::bigint, {k}) & 2147483647)"
_U = "(" + _H + " / 2147483648.0::float8)"


def h(x: str, k: int) -> str:
    return _H.format(x=x, k=k)


def u(x: str, k: int) -> str:
    return _U.format(x=x, k=k)


def _log_uniform_seconds(x: str, k: int) -> str:
    """5 minutes to 3 days, log-uniform: a median of 2 hours, one in ten over 32 hours."""
    return f"floor(exp(ln(300) + {u(x, k)} * ln(864)))::int"


# One row per run, from which runs, attempts and accounting are written. Run r: tenant t
# drawn with a skew (the largest tenant has ~10 % of all runs, the smallest ~0.5 %), one of
# the tenant's experiments (project, user, flavor, GPU count), a cluster, a submission
# time; attempts last from 5 minutes to 3 days, some across midnights, month ends and the
# rate change. Attempt 1 of every fourth run is preempted half-way through its time and
# attempt 2 queues again after it.
_PLAN = f"""
CREATE TEMP TABLE seed_run ON COMMIT DROP AS
SELECT r, t, t * {SLOTS} + slot + 1 AS experiment_id, gpus, c, submitted, started,
       started + make_interval(secs => CASE WHEN twice THEN seconds / 2 ELSE seconds END)
           AS finished,
       CASE WHEN twice THEN 'PREEMPTED' WHEN {h("r", 7)} %% 10 = 0 THEN 'FAILED'
            ELSE 'SUCCEEDED' END AS state,
       CASE WHEN twice THEN started + make_interval(secs => seconds / 2 + {h("r", 8)} %% 900)
       END AS restarted,
       {_log_uniform_seconds("r", 9)} AS seconds2,
       CASE WHEN {h("r", 10)} %% 10 = 0 THEN 'FAILED' ELSE 'SUCCEEDED' END AS state2
FROM (
    SELECT *, submitted + make_interval(secs => {h("r", 5)} %% 1800) AS started
    FROM (
        SELECT r, floor({TENANTS} * {u("r", 1)} * {u("r", 1)})::int AS t,
               {h("r", 2)} %% {SLOTS} AS slot,
               (%(gpus)s::int[])[{h("r", 2)} %% {SLOTS} %% {len(VARIANTS)} + 1] AS gpus,
               {h("r", 3)} %% 2 AS c,
               %(start)s::timestamptz + make_interval(secs => {h("r", 4)} %% %(span)s)
                   AS submitted,
               {_log_uniform_seconds("r", 6)} AS seconds,
               r %% 4 = 0 AS twice
        FROM generate_series(1, {RUNS}) AS r
    ) AS drawn
) AS timed
"""  # noqa: S608 (constants and placeholders only)
_PLAN_ATTEMPTS = f"""
CREATE TEMP TABLE seed_attempt ON COMMIT DROP AS
SELECT r AS id, r AS run_id, 1 AS number, gpus, c, submitted, started, finished, state
FROM seed_run
UNION ALL
SELECT {RUNS} + r / 4, r, 2, gpus, c, submitted, restarted,
       restarted + make_interval(secs => seconds2), state2
FROM seed_run WHERE restarted IS NOT NULL
"""  # noqa: S608 (constants and placeholders only)

_EXPERIMENTS = f"""
INSERT INTO jobs_experiment (
    id, tenant_id, project_id, owner_id, flavor_id, nodes, gpus_per_node, name, image_id,
    image_reference, command, env, code_repository, code_commit, dataset_uri,
    dataset_version, params, priority, max_runtime_minutes, max_restarts, checkpoint_dir,
    gantry_version, created_at, topology_level, topology_mode)
SELECT e + 1, (%(tenants)s::bigint[])[t + 1],
       (%(projects)s::bigint[])[t * {PROJECTS} + slot / {USERS * FLAVORS * len(VARIANTS)} + 1],
       (%(users)s::int[])[t * {USERS} + slot / {FLAVORS * len(VARIANTS)} %% {USERS} + 1],
       (%(flavors)s::bigint[])[slot / {len(VARIANTS)} %% {FLAVORS} + 1],
       (gpus + 7) / 8, least(gpus, 8), 'bench-' || e, %(image)s, %(reference)s,
       'python train.py', '{{}}', '', '', '', '', '{{}}', 50, 4320, 1, '', 'bench', %(start)s,
       '', 'preferred'
FROM (
    SELECT e, e / {SLOTS} AS t, e %% {SLOTS} AS slot,
           (%(gpus)s::int[])[e %% {SLOTS} %% {len(VARIANTS)} + 1] AS gpus
    FROM generate_series(0, {TENANTS * SLOTS - 1}) AS e
) AS parts
"""  # noqa: S608 (constants and placeholders only)

_RUNS = """
INSERT INTO jobs_run (
    id, experiment_id, tenant_id, flavor_id, gpus, priority, submitted_by_id, state,
    cluster_id, borrowed, over_budget, wait_reason, wait_message, failure_reason, restarts,
    submitted_at, admitted_at, started_at, finished_at, start_note, start_nodes, start_behind)
SELECT r, e.id, e.tenant_id, e.flavor_id, gpus, 50, e.owner_id, last.state,
       (%(clusters)s::bigint[])[c + 1], false, false, '', '',
       CASE WHEN last.state = 'FAILED' THEN 'USER_EXIT' ELSE '' END,
       (restarted IS NOT NULL)::int, submitted, submitted, started, last.finished,
       '', '[]', '[]'
FROM seed_run
JOIN jobs_experiment AS e ON e.id = experiment_id,
LATERAL (
    SELECT CASE WHEN restarted IS NULL THEN state ELSE state2 END AS state,
           CASE WHEN restarted IS NULL THEN finished
                ELSE restarted + make_interval(secs => seconds2) END AS finished
) AS last
"""

_ATTEMPTS = """
INSERT INTO jobs_attempt (
    id, run_id, number, cluster_id, state, backend_job_id, rendered_spec, created_at,
    submitted_at, started_at, finished_at, last_seen_at, exit_code, failure_reason,
    failure_message, backend_error, node_list, gpu_uuids, runtime_env, placement)
SELECT id, run_id, number, (%(clusters)s::bigint[])[c + 1], state, 'bench-' || id, '',
       submitted, submitted, started, finished, finished,
       CASE state WHEN 'SUCCEEDED' THEN 0 WHEN 'FAILED' THEN 1 END,
       CASE state WHEN 'FAILED' THEN 'USER_EXIT' WHEN 'PREEMPTED' THEN 'PREEMPTED' ELSE ''
       END, '', '', '[]', '[]', '{}', '[]'
FROM seed_attempt
"""

# Design §7's categories, whole GPU-seconds that add up to allocated: startup is the first
# 1 to 10 minutes; a preempted or failed attempt loses up to 40 % of the rest after its last
# checkpoint; of what remains, up to 2 % checkpointing, 20 % idle, 15 % input wait and 10 %
# communication wait (25 % on two nodes); effective is the rest.
_ACCOUNTING = f"""
INSERT INTO telemetry_attemptaccounting (
    attempt_id, allocated_gpu_s, startup_gpu_s, lost_gpu_s, checkpoint_gpu_s, idle_gpu_s,
    input_wait_gpu_s, comm_wait_gpu_s, effective_gpu_s, activity_weighted_gpu_s, queue_s,
    computed_at)
SELECT id, allocated, startup, lost, checkpoint, idle, input_wait, comm_wait, effective,
       effective * 0.8 + (input_wait + comm_wait) * 0.3, queue_s, finished
FROM (
    SELECT *, allocated - startup - lost - checkpoint - idle - input_wait - comm_wait
              AS effective
    FROM (
        SELECT *, floor(rest * 0.02 * {u("id", 13)})::bigint AS checkpoint,
               floor(rest * 0.20 * {u("id", 14)})::bigint AS idle,
               floor(rest * 0.15 * {u("id", 15)})::bigint AS input_wait,
               floor(rest * CASE WHEN gpus > 8 THEN 0.25 ELSE 0.10 END * {u("id", 16)})::bigint
                   AS comm_wait
        FROM (
            SELECT *, allocated - startup - lost AS rest
            FROM (
                SELECT *, CASE WHEN state IN ('PREEMPTED', 'FAILED')
                               THEN floor((allocated - startup) * 0.4 * {u("id", 12)})::bigint
                               ELSE 0 END AS lost
                FROM (
                    SELECT id, state, finished, gpus,
                           gpus * extract(epoch FROM finished - started)::bigint AS allocated,
                           gpus * least(extract(epoch FROM finished - started)::bigint,
                                        60 + {h("id", 11)} %% 540) AS startup,
                           extract(epoch FROM started - submitted) AS queue_s
                    FROM seed_attempt
                ) AS base
            ) AS with_lost
        ) AS with_rest
    ) AS split
) AS whole
"""  # noqa: S608 (constants and placeholders only)


@dataclass
class World:
    tenants: list[Tenant]
    finance_user: object
    seconds: dict[str, float]  # seeding steps


def seed() -> World:
    """An empty bench database with a year of accounting, rate cards and no DailyUsage."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    truncate()
    user_model = get_user_model()
    finance_user = user_model.objects.create(username="bench-finance", password=make_password(None))
    finance_user.groups.add(Group.objects.get_or_create(name=GlobalRole.FINANCE)[0])
    tenants = Tenant.objects.bulk_create(
        [Tenant(slug=f"t{n:03d}", name=f"Tenant {n:03d}") for n in range(TENANTS)]
    )
    projects = Project.objects.bulk_create(
        [
            Project(tenant=tenant, slug=f"p{p}", name=f"Project {p}")
            for tenant in tenants
            for p in range(PROJECTS)
        ]
    )
    users = user_model.objects.bulk_create(
        [
            user_model(username=f"{tenant.slug}-u{n}", password=make_password(None))
            for tenant in tenants
            for n in range(USERS)
        ]
    )
    flavors = [
        GpuFlavor.objects.create(slug=slug, name=slug.upper(), memory_gb=80) for slug in RATES
    ]
    clusters = [
        Cluster.objects.create(name=name, backend=Cluster.Backend.SIMULATOR) for name in CLUSTERS
    ]
    ClusterFlavor.objects.bulk_create(
        [
            ClusterFlavor(cluster=cluster, flavor=flavor, nodes=64, gpus_per_node=8, gpus=512)
            for cluster in clusters
            for flavor in flavors
        ]
    )
    image = Image.objects.create(
        repository="registry.example.org/bench/train",
        digest="sha256:" + "0" * 64,
        status=Image.Status.APPROVED,
    )
    for flavor in flavors:
        for valid_from, price in zip((START.date(), RATE_CHANGE), RATES[flavor.slug], strict=True):
            rate_card_add(
                flavor=flavor,
                price_per_gpu_hour=price,
                currency="EUR",
                valid_from=valid_from,
                actor=finance_user,
            )
    params = {
        "tenants": [t.pk for t in tenants],
        "projects": [p.pk for p in projects],
        "users": [u.pk for u in users],
        "flavors": [f.pk for f in flavors],
        "clusters": [c.pk for c in clusters],
        "gpus": list(VARIANTS),
        "image": image.pk,
        "reference": image.reference,
        "start": START,
        # submissions end 5 days before the year does: every attempt finishes in it
        "span": int((END - START - timedelta(days=5)).total_seconds()),
    }
    seconds["dimensions"] = time.perf_counter() - started
    steps = (
        ("plan", _PLAN),
        ("plan", _PLAN_ATTEMPTS),
        ("experiments", _EXPERIMENTS),
        ("runs", _RUNS),
        ("attempts", _ATTEMPTS),
        ("accounting", _ACCOUNTING),
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL temp_buffers = '256MB'")  # the plan tables stay in memory
        cursor.execute("SELECT current_setting('is_superuser') = 'on'")
        if cursor.fetchone()[0]:
            # The rows reference each other correctly by construction; checking their
            # 7 million foreign keys would add a minute at commit.
            cursor.execute("SET LOCAL session_replication_role = replica")
        for name, statement in steps:
            took, _ = timed(lambda s=statement: cursor.execute(s, params))
            seconds[name] = seconds.get(name, 0.0) + took
        for model in (Experiment, Run, Attempt, AttemptAccounting):
            table = model._meta.db_table
            cursor.execute(
                sql.SQL("SELECT setval(pg_get_serial_sequence(%s, 'id'), max(id)) FROM {}").format(
                    sql.Identifier(table)
                ),
                [table],
            )
        commit_started = time.perf_counter()
    seconds["commit"] = time.perf_counter() - commit_started
    seconds["vacuum"] = timed(vacuum)[0]
    seconds["total"] = time.perf_counter() - started
    return World(tenants=tenants, finance_user=finance_user, seconds=seconds)


# --- DailyUsage ----------------------------------------------------------------------------


def months() -> list[date]:
    return [date(YEAR, month, 1) for month in range(1, 13)]


def days_of(month: date) -> list[date]:
    following = (month + timedelta(days=32)).replace(day=1)
    return [month + timedelta(days=n) for n in range((following - month).days)]


@dataclass
class MonthRebuilt:
    month: date
    rows: int
    seconds: float
    cpu_seconds: float  # of the Python process that rebuilt it
    peak_rss_mb: float


def rebuild_month(month: date) -> MonthRebuilt:
    """``daily_usage_rebuild`` of one month's days, in a process of its own."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds, rows = timed(lambda: daily_usage_rebuild(days=days_of(month)))
    after = resource.getrusage(resource.RUSAGE_SELF)
    connection.close()
    return MonthRebuilt(
        month=month,
        rows=rows,
        seconds=seconds,
        cpu_seconds=after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        peak_rss_mb=after.ru_maxrss / 1024,
    )


def rebuild(workers: int) -> tuple[float, list[MonthRebuilt]]:
    """DailyUsage of the whole year from the accounting, a month per call of the real
    ``daily_usage_rebuild``, ``workers`` months at a time (forked processes: the months'
    days are disjoint, so their rebuilds do not meet)."""
    connection.close()  # a forked child must not share the parent's connection
    context = multiprocessing.get_context("fork")
    started = time.perf_counter()
    with context.Pool(workers, maxtasksperchild=1) as pool:
        done = pool.map(rebuild_month, months(), chunksize=1)
    took = time.perf_counter() - started
    watermark_set()
    return took, done


def watermark_set() -> None:
    """What ``daily_usage_update`` leaves once it has taken in every accounting row: the
    statements hold every attempt, so the statement page's accrual (``finance.accrual``)
    finds none, as on a site whose rollup has run. Without it every attempt of the year
    reads as not rolled up: the page prices each one again and reads the rate cards."""
    newest = AttemptAccounting.objects.aggregate(newest=Max("computed_at"))["newest"]
    UsageRollupState.objects.update_or_create(
        pk=1, defaults={"accounted_until": newest, "rates_changed_from": None}
    )


# --- the monthly statement: the page, and a straightforward query over attempts ------------

# The statement's figures straight from the attempts: every attempt of the tenant that
# overlaps the month, clipped to it, GPU-seconds = GPUs x seconds in the month, effective in
# proportion, priced at the rate in force when the attempt started. Totals and one line per
# project, user, flavor and cluster, as the statement shows them.
_NAIVE_STATEMENT = """
WITH clipped AS (
    SELECT p.slug AS project, u.username AS "user", f.slug AS flavor, c.name AS cluster,
           r.gpus * extract(epoch FROM least(a.finished_at, %(hi)s)
                                       - greatest(a.started_at, %(lo)s))::bigint AS allocated,
           acc.effective_gpu_s * extract(epoch FROM least(a.finished_at, %(hi)s)
                                                    - greatest(a.started_at, %(lo)s))
               / extract(epoch FROM a.finished_at - a.started_at) AS effective,
           rate.price_per_gpu_hour AS price,
           (a.started_at < %(lo)s OR a.finished_at > %(hi)s)::int AS crosses
    FROM jobs_attempt AS a
    JOIN jobs_run AS r ON r.id = a.run_id
    JOIN jobs_experiment AS e ON e.id = r.experiment_id
    JOIN telemetry_attemptaccounting AS acc ON acc.attempt_id = a.id
    JOIN tenants_project AS p ON p.id = e.project_id
    JOIN auth_user AS u ON u.id = r.submitted_by_id
    JOIN tenants_gpuflavor AS f ON f.id = r.flavor_id
    JOIN jobs_cluster AS c ON c.id = a.cluster_id
    LEFT JOIN telemetry_ratecard AS rate
        ON rate.flavor_id = r.flavor_id AND rate.valid_from <= a.started_at::date
           AND (rate.valid_to IS NULL OR a.started_at::date < rate.valid_to)
    WHERE r.tenant_id = %(tenant)s AND a.started_at < %(hi)s AND a.finished_at > %(lo)s
)
SELECT CASE WHEN GROUPING(project) = 0 THEN 'project' WHEN GROUPING("user") = 0 THEN 'user'
            WHEN GROUPING(flavor) = 0 THEN 'flavor' WHEN GROUPING(cluster) = 0 THEN 'cluster'
            ELSE 'total' END,
       coalesce(project, "user", flavor, cluster, ''),
       sum(allocated), round(sum(effective)), round(sum(allocated * price / 3600), 2),
       sum(crosses)
FROM clipped
GROUP BY GROUPING SETS ((), (project), ("user"), (flavor), (cluster))
"""

# (dimension, key): allocated and effective GPU-seconds, cost[, attempts over the edges]
Lines = dict[tuple[str, str], tuple]


def naive_statement(tenant: Tenant, month: date) -> Lines:
    lo = datetime.combine(month, datetime.min.time(), tzinfo=UTC)
    hi = datetime.combine(days_of(month)[-1] + timedelta(days=1), lo.timetz())
    with connection.cursor() as cursor:
        cursor.execute(_NAIVE_STATEMENT, {"tenant": tenant.pk, "lo": lo, "hi": hi})
        return {
            (dimension, key): (int(allocated), int(effective), cost, crossing)
            for dimension, key, allocated, effective, cost, crossing in cursor.fetchall()
        }


def statement_figures(tenant: Tenant, month: date) -> Lines:
    """What the statement page shows, through the selector the page calls."""
    report = statement_month(tenant=tenant, month=month)
    lines = {
        ("total", ""): (
            report.total.allocated_gpu_s,
            report.total.effective_gpu_s,
            report.total.cost,
        )
    }
    for dimension, found in report.breakdowns.items():
        for line in found:
            lines[(dimension, line.key)] = (
                line.usage.allocated_gpu_s,
                line.usage.effective_gpu_s,
                line.usage.cost,
            )
    return lines


def percentile(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


@dataclass
class StatementRuns:
    label: str
    samples: list[tuple[Tenant, date]]
    page: list[float]
    queries: int
    naive: list[float]
    usage_rows: list[int]  # DailyUsage rows behind each statement


def measure_statements(
    world: World, label: str, samples: list[tuple[Tenant, date]]
) -> StatementRuns:
    client = Client(HTTP_HOST="localhost")  # an allowed host; the test runner is not set up
    client.force_login(world.finance_user)
    client.get(reverse("finance:statement", args=[world.tenants[0].slug, months()[0]]))
    page, naive, rows, queries = [], [], [], 0
    for tenant, month in samples:
        url = reverse("finance:statement", args=[tenant.slug, month])
        counter = QueryCounter()
        gc.collect()
        with connection.execute_wrapper(counter):
            seconds, response = timed(lambda url=url: client.get(url))
        assert response.status_code == 200, (url, response.status_code)
        page.append(seconds)
        queries = max(queries, counter.count)
        naive.append(timed(lambda t=tenant, m=month: naive_statement(t, m))[0])
        rows.append(
            DailyUsage.objects.filter(
                tenant=tenant, date__gte=month, date__lte=days_of(month)[-1]
            ).count()
        )
    return StatementRuns(label, samples, page, queries, naive, rows)


@dataclass
class Reconciled:
    statements: int
    lines: int
    allocated_equal: int
    largest_allocated_gap: int  # GPU-seconds, statement - naive, the largest in size
    cost_gap: Decimal  # Σ |statement - naive| over the statements' totals
    cost_total: Decimal


def reconcile(samples: list[tuple[Tenant, date]]) -> Reconciled:
    """The statements' GPU-seconds against the naive query's, line by line.

    The rollup gives each day of an attempt exactly GPUs × its seconds (the attempts here
    start and end on whole seconds), so every line must be equal. Asserted.
    """
    result = Reconciled(len(samples), 0, 0, 0, Decimal(0), Decimal(0))
    for tenant, month in samples:
        ours, theirs = statement_figures(tenant, month), naive_statement(tenant, month)
        assert ours.keys() == theirs.keys(), (tenant.slug, month, ours.keys() ^ theirs.keys())
        for key, (allocated, _, cost) in ours.items():
            naive_allocated, _, naive_cost, crossing = theirs[key]
            gap = allocated - naive_allocated
            assert gap == 0, (tenant.slug, month, key, gap, crossing)
            result.lines += 1
            result.allocated_equal += gap == 0
            if abs(gap) > abs(result.largest_allocated_gap):
                result.largest_allocated_gap = gap
            if key == ("total", ""):
                result.cost_gap += abs(cost - naive_cost)
                result.cost_total += cost
    return result


def check_year_totals() -> int:
    """Every tenant's year in DailyUsage equals its attempts' accounting, to the GPU-second
    in every category, with no unpriced GPU-seconds (the rate cards cover the year)."""
    names = ("allocated", *CATEGORIES)
    rolled = {
        row["tenant_id"]: row
        for row in DailyUsage.objects.values("tenant_id")
        .annotate(**{name: Sum(f"{name}_gpu_s") for name in names}, unpriced=Sum("unpriced_gpu_s"))
        .order_by()
    }
    accounted = {
        row["attempt__run__tenant_id"]: row
        for row in AttemptAccounting.objects.values("attempt__run__tenant_id")
        .annotate(**{name: Sum(f"{name}_gpu_s") for name in names})
        .order_by()
    }
    assert rolled.keys() == accounted.keys()
    for tenant_id, row in rolled.items():
        assert row["unpriced"] == 0, tenant_id
        for name in names:
            assert row[name] == accounted[tenant_id][name], (tenant_id, name)
    return len(rolled)


# --- the CSV export: streamed, against a CSV built in memory ------------------------------


def export_range(rows: int) -> tuple[date, date]:
    """The shortest range from the year's first day with at least ``rows`` rows of every
    tenant: the export reads (and sorts) no more than it sends."""
    per_day = dict(DailyUsage.objects.values_list("date").annotate(n=Count("id")).order_by("date"))
    total = 0
    for day in sorted(per_day):
        total += per_day[day]
        if total >= rows:
            return START.date(), day
    raise AssertionError(f"the year has only {total:,} DailyUsage rows")


def streamed(client: Client, rows: int, first: date, last: date) -> tuple[bytes, int]:
    """The first ``rows`` rows (and the header) of the CSV export of [first, last], as the
    browser would read them, keeping only their bytes; the response is closed after them."""
    response = client.get(reverse("finance:export_csv") + f"?tenant=&from={first}&to={last}")
    assert response.status_code == 200 and response.streaming, response.status_code
    digest, size = hashlib.sha256(), 0
    for line in itertools.islice(response.streaming_content, rows + 1):
        digest.update(line)
        size += len(line)
    response.close()
    return digest.digest(), size


def in_memory(rows: int, first: date, last: date) -> tuple[bytes, int]:
    """The baseline: the same rows read into a list, written into one CSV text in memory."""
    data = list(
        itertools.islice(
            export_rows(
                tenant=None, first_day=first, last_day=last, currency=platform_currency() or ""
            ),
            rows,
        )
    )
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(EXPORT_COLUMNS)
    writer.writerows(data)
    body = buffer.getvalue().encode()
    return hashlib.sha256(body).digest(), len(body)


@dataclass
class Exported:
    rows: int
    bytes: int
    streamed_peak: int  # bytes, tracemalloc
    streamed_s: float
    memory_peak: int
    memory_s: float


def peak_of(fn) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        result = fn()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def measure_export_of(client: Client, rows: int) -> Exported:
    first, last = export_range(rows)
    stream = functools.partial(streamed, client, rows, first, last)
    build = functools.partial(in_memory, rows, first, last)
    stream()  # warm: the same rows in PostgreSQL's cache
    streamed_peak, (digest, size) = peak_of(stream)
    memory_peak, (memory_digest, _) = peak_of(build)
    assert digest == memory_digest, f"the streamed CSV of {rows:,} rows differs"
    return Exported(
        rows=rows,
        bytes=size,
        streamed_peak=streamed_peak,
        streamed_s=best_of(stream, repeat=2),
        memory_peak=memory_peak,
        memory_s=best_of(build, repeat=2),
    )


def measure_export(world: World) -> list[Exported]:
    client = Client(HTTP_HOST="localhost")
    client.force_login(world.finance_user)
    return [measure_export_of(client, rows) for rows in EXPORT_ROWS]


# --- the report ----------------------------------------------------------------------------


def mb(size: float) -> str:
    return f"{size / 2**20:,.1f} MB"


def run() -> list[Section]:
    world = seed()
    workers = max(1, min(os.cpu_count() or 1, 4))
    rebuild_s, rebuilt = rebuild(workers)
    tenants_checked = check_year_totals()
    rng = random.Random(2025)
    samples = [(rng.choice(world.tenants), rng.choice(months())) for _ in range(STATEMENTS)]
    largest = max(world.tenants, key=lambda t: DailyUsage.objects.filter(tenant=t).count())
    measured = [
        measure_statements(world, f"{STATEMENTS} random tenant-months", samples),
        measure_statements(world, f"largest tenant ({largest.slug}), 12 months",
                           [(largest, month) for month in months()]),
    ]  # fmt: skip
    reconciled = reconcile(samples + measured[1].samples)
    exported = measure_export(world)
    return [
        data_section(world, rebuild_s, rebuilt, workers, tenants_checked),
        statement_section(measured, reconciled),
        export_section(exported),
    ]


def data_section(world, rebuild_s, rebuilt, workers, tenants_checked) -> Section:
    attempts = AttemptAccounting.objects.count()
    rows = DailyUsage.objects.count()
    cpu = sum(m.cpu_seconds for m in rebuilt)
    section = Section(
        title="Finance data: a year of accounting and its DailyUsage (issue 8)",
        intro=(
            f"{attempts:,} finished attempts of {RUNS:,} runs in {YEAR} (every fourth run "
            f"preempted once and run again), {TENANTS} tenants of very different sizes with "
            f"{PROJECTS} projects and {USERS} users each, 2 flavors, 2 clusters; attempts of "
            "5 minutes to 3 days (log-uniform), 1 to 16 GPUs, every accounting category "
            "filled; a new price for each flavor from 1 July. Seeded by PostgreSQL "
            "(`INSERT … SELECT` over `generate_series`, `bench/finance.py`). DailyUsage: the "
            "real `finance.services.daily_usage_rebuild`, one call per month, "
            f"{workers} months at a time in forked processes."
        ),
        columns=["step", "rows", "time", "per attempt"],
    )
    seconds = world.seconds
    section.rows += [
        ["seed: dimensions, rate cards", f"{TENANTS * (PROJECTS + USERS) + 8:,}",
         ms(seconds["dimensions"]), ""],
        ["seed: plan (temporary tables)", f"{attempts:,}", ms(seconds["plan"]), ""],
        ["seed: experiments", f"{TENANTS * SLOTS:,}", ms(seconds["experiments"]), ""],
        ["seed: runs", f"{RUNS:,}", ms(seconds["runs"]), ""],
        ["seed: attempts", f"{attempts:,}", ms(seconds["attempts"]), ""],
        ["seed: accounting", f"{attempts:,}", ms(seconds["accounting"]), ""],
        ["seed: commit, VACUUM ANALYZE", "", ms(seconds["commit"] + seconds["vacuum"]), ""],
        ["seed: total", "", ms(seconds["total"]), f"{seconds['total'] / attempts * 1e6:.0f} µs"],
        [f"DailyUsage rebuild, 12 months ({workers} at a time)", f"{rows:,}", ms(rebuild_s),
         f"{cpu / attempts * 1e3:.2f} ms CPU"],
    ]  # fmt: skip
    slowest = max(rebuilt, key=lambda m: m.seconds)
    section.notes += [
        "Rebuild per month: "
        + ", ".join(f"{m.month:%b} {m.seconds:.0f} s" for m in rebuilt)
        + f"; {cpu:,.0f} CPU-seconds of Python in all ({cpu / 12:.0f} s a month), peak RSS "
        f"{max(m.peak_rss_mb for m in rebuilt):.0f} MB per process (slowest: "
        f"{slowest.month:%B}, {slowest.rows:,} rows).",
        f"Checked: every tenant's year in DailyUsage ({tenants_checked} tenants) equals its "
        "attempts' accounting to the GPU-second in every category, with no unpriced time.",
    ]
    return section


def statement_section(measured: list[StatementRuns], reconciled: Reconciled) -> Section:
    section = Section(
        title="Monthly statement page vs a straightforward SQL query (issue 8)",
        intro=(
            "`GET /finance/<tenant>/<yyyy>-<mm>/` through Django's test client, logged in as "
            "finance: totals, the breakdowns by project, user, flavor and cluster, the "
            "12-month trend and the budget burn-down, from DailyUsage. Baseline: one SQL "
            "query over the tenant's attempts, runs, experiments and accounting that computes "
            "the totals and breakdowns (GPU-seconds and cost) for the month directly, "
            "clipping attempts to it and pricing them at the rate in force at their start. "
            "Same tenant-months, same run."
        ),
        columns=[
            "statements", "DailyUsage rows (median)", "page p50", "page p95", "queries",
            "naive query p50", "naive query p95", "naive ÷ page (p95)",
        ],
    )  # fmt: skip
    for m in measured:
        section.rows.append(
            [
                m.label,
                f"{statistics.median(m.usage_rows):,.0f}",
                ms(percentile(m.page, 50)),
                ms(percentile(m.page, 95)),
                str(m.queries),
                ms(percentile(m.naive, 50)),
                ms(percentile(m.naive, 95)),
                ratio(percentile(m.naive, 95), percentile(m.page, 95)),
            ]
        )
    p95 = percentile(measured[0].page, 95)
    section.notes += [
        f"Target: p95 < {TARGET_P95_S * 1000:.0f} ms over random tenant-months: "
        f"{ms(p95)} — {'met' if p95 < TARGET_P95_S else 'missed'}.",
        f"GPU-seconds, statement vs naive query, {reconciled.lines:,} lines of "
        f"{reconciled.statements} statements: {reconciled.allocated_equal:,} equal, the "
        f"largest gap {reconciled.largest_allocated_gap:+,} GPU-seconds (asserted: all equal). "
        "The rollup gives every day of an attempt exactly GPUs × its seconds, so month "
        "lines match the naive clipping even for attempts that cross the month's edges.",
        f"Cost, statement vs naive query: Σ |difference| {reconciled.cost_gap:,.2f} over "
        f"{reconciled.cost_total:,.2f} of statements "
        f"({reconciled.cost_gap / reconciled.cost_total * 100:.4f} %): the naive query prices "
        "a whole attempt at its start's rate; the rollup splits attempts that cross the "
        "1 July rate change.",
    ]
    return section


def export_section(exported: list[Exported]) -> Section:
    small, large = exported[0], exported[-1]
    section = Section(
        title="CSV export: streamed vs built in memory (issue 8)",
        intro=(
            "`GET /finance/export.csv?tenant=&from=…&to=…` (every tenant, from 1 January "
            "until the range holds enough rows), the response's `streaming_content` read "
            "as a client would, keeping nothing; peak Python memory by tracemalloc over the "
            "whole request. Baseline: the same rows (`finance.selectors.exports.export_rows`) read "
            "into a list and written into one CSV string; both CSVs are asserted "
            "byte-identical. Times: best of 2, without tracemalloc."
        ),
        columns=[
            "rows", "CSV size", "streamed: peak memory", "streamed: rows/s",
            "in memory: peak memory", "in memory: rows/s",
        ],
    )  # fmt: skip
    for e in exported:
        section.rows.append(
            [
                f"{e.rows:,}",
                mb(e.bytes),
                mb(e.streamed_peak),
                f"{e.rows / e.streamed_s:,.0f}",
                mb(e.memory_peak),
                f"{e.rows / e.memory_s:,.0f}",
            ]
        )
    section.notes.append(
        f"Peak memory, {large.rows:,} ÷ {small.rows:,} rows: streamed "
        f"{large.streamed_peak / small.streamed_peak:.2f}× (flat), in memory "
        f"{large.memory_peak / small.memory_peak:.1f}×."
    )
    return section
