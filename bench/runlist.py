"""The run list at a million runs (issue 10, acceptance 6).

1,000,000 runs of 100,000 experiments over two years, 12 tenants of very different sizes
(the largest has ~29 % of the runs, the smallest ~4 %), 3 projects and 20 users each,
3 flavors, 3 clusters. Runs are submitted about a minute apart with up to five minutes of
jitter (so ids and submission times disagree locally, as with clock skew between web
processes); the last 600 are queued, admitted, pending or running, the rest succeeded
(78 %), failed (12 %, with a reason) or were cancelled. The rows are written by PostgreSQL
itself (``INSERT … SELECT`` over ``generate_series``; the random draws are hashes of the
row ids, so every run seeds the same data), then ``VACUUM ANALYZE``.

Measured for three personas, a researcher of the largest tenant, a tenant admin of a
middle one and a platform admin (every tenant), on the newest page and on a page half-way
down the list (``before=`` the run just above it):
- the run list page (``GET /``, HTML) and the API list (``GET /api/v1/runs/``, token)
  through Django's test client, 50 requests each after 5 to warm up, with the queries
  each request made;
- the list's own queries (``run_page_viewable``: the readable tenants, the keyset page and
  the count capped at 10,000), beside the baseline: the same page the straightforward
  way, as the list did before, Django's ``Paginator`` over the scoped queryset, i.e.
  ``COUNT(*)`` of every matching run and ``OFFSET`` to the page. Both list the same runs
  (asserted).
"""

import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group
from django.core.paginator import Paginator
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from psycopg import sql

from bench.cpu import cpu_seconds
from bench.cycle import QueryCounter, truncate, vacuum
from bench.report import Section, ms, ratio, timed
from clusters.models import Cluster, ClusterFlavor
from images.models import Image
from jobs.access import run_list_viewable
from jobs.models import Experiment, Run
from jobs.selectors.runs import RUN_LIST_DEFERRED, run_page_viewable
from jobs.views.runs import RUN_COUNT_LIMIT, RUNS_PER_PAGE
from tenants.models import GlobalRole, GpuFlavor, Membership, Project, Tenant
from tenants.services.tokens import api_token_create

RUNS = 1_000_000
TENANTS, PROJECTS, USERS = 12, 3, 20  # projects and users per tenant
FLAVORS = ("a100-80gb", "h100-80gb", "a100-1g.10gb")
CLUSTERS = ("sim-east", "sim-west", "sim-north")
LIVE = 600  # the newest runs are still queued, admitted, pending or running
SPAN = timedelta(days=730)
REQUESTS, WARM_UP = 50, 3
BASELINE_REQUESTS = 5  # a COUNT(*) and a deep OFFSET over a million rows: fewer will do
API_PAGE = 50
TARGET_P95_S = 0.1

# h(x, k): a uniform integer in [0, 2^31) drawn from row id x, stream k (PostgreSQL's own
# 64-bit hash, seeded). u(x, k): the same as a float in [0, 1).
_H = "(hashint8extended(({x})::bigint, {k}) & 2147483647)"


def h(x: str, k: int) -> str:
    return _H.format(x=x, k=k)


def u(x: str, k: int) -> str:
    return f"({h(x, k)} / 2147483648.0::float8)"


# Experiment e: tenant floor(T u²) of the T tenants (tenant 0 the largest), one of its
# projects and users, a flavor, 1 to 16 GPUs; created ten runs apart.
_EXPERIMENTS = """
INSERT INTO jobs_experiment (
    id, tenant_id, project_id, owner_id, flavor_id, nodes, gpus_per_node, name, image_id,
    image_reference, command, env, code_repository, code_commit, dataset_uri,
    dataset_version, params, priority, max_runtime_minutes, max_restarts, checkpoint_dir,
    gantry_version, created_at, topology_level, topology_mode)
SELECT e + 1, (%(tenants)s::bigint[])[t + 1],
       (%(projects)s::bigint[])[t * {projects} + {h2} %% {projects} + 1],
       (%(users)s::int[])[t * {users} + {h3} %% {users} + 1],
       (%(flavors)s::bigint[])[{h4} %% {flavors} + 1],
       CASE WHEN gpus > 8 THEN 2 ELSE 1 END, least(gpus, 8), 'experiment-' || e, %(image)s,
       %(reference)s, 'python train.py', '{{}}', '', '', '', '', '{{}}', 50, 1440, 0, '',
       'bench', %(start)s::timestamptz + make_interval(secs => e * %(step)s * {per}),
       '', 'preferred'
FROM (
    SELECT e, floor({tenants} * {u1} * {u1})::int AS t,
           (ARRAY[1, 1, 2, 4, 8, 8, 16])[{h5} %% 7 + 1] AS gpus
    FROM generate_series(0, {experiments} - 1) AS e
) AS drawn
"""

# Run r (1-based): of experiment ceil(r / per), submitted r steps after the start plus up
# to 5 minutes; the newest ``live`` runs are live, the rest ended.
_RUNS = """
INSERT INTO jobs_run (
    id, experiment_id, tenant_id, flavor_id, gpus, priority, submitted_by_id, state,
    cluster_id, borrowed, over_budget, wait_reason, wait_message,
    failure_reason, restarts, submitted_at, admitted_at, started_at, finished_at,
    start_note, start_nodes, start_behind, kind, platform_retries, excluded_nodes)
SELECT r, e.id, e.tenant_id, e.flavor_id, e.nodes * e.gpus_per_node, 50, e.owner_id, state,
       CASE WHEN state <> 'QUEUED' THEN (%(clusters)s::bigint[])[{h7} %% {clusters} + 1] END,
       false, false,
       CASE WHEN state = 'QUEUED' THEN (ARRAY['QUOTA', 'CAPACITY', 'BEHIND_HEAD'])
            [{h8} %% 3 + 1] ELSE '' END,
       '',
       CASE WHEN state = 'FAILED' THEN (ARRAY['OOM_GPU', 'NCCL', 'USER_EXIT', 'NODE_FAILURE'])
            [{h10} %% 4 + 1] ELSE '' END,
       0, submitted,
       CASE WHEN state <> 'QUEUED' THEN submitted + interval '2 minutes' END,
       CASE WHEN state NOT IN ('QUEUED', 'ADMITTED', 'PENDING')
            THEN submitted + interval '4 minutes' END,
       CASE WHEN state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
            THEN submitted + make_interval(secs => 600 + {h11} %% 86400) END,
       '', '[]'::jsonb, '[]'::jsonb, 'batch', 0, '[]'::jsonb
FROM (
    SELECT r, (r + {per} - 1) / {per} AS experiment_id,
           %(start)s::timestamptz + make_interval(secs => r * %(step)s + {h6} %% 300)
               AS submitted,
           CASE WHEN r > {runs} - {live} THEN
                    (ARRAY['QUEUED', 'QUEUED', 'RUNNING', 'RUNNING', 'PENDING', 'ADMITTED'])
                    [{h12} %% 6 + 1]
                ELSE (CASE WHEN {h12} %% 100 < 78 THEN 'SUCCEEDED'
                           WHEN {h12} %% 100 < 90 THEN 'FAILED'
                           ELSE 'CANCELLED' END)
           END AS state
    FROM generate_series(1, {runs}) AS r
) AS drawn
JOIN jobs_experiment AS e ON e.id = drawn.experiment_id
"""
RUNS_PER_EXPERIMENT = 10


def seed_history(
    *,
    runs: int,
    live: int,
    tenants: list[Tenant],
    projects: list[Project],
    users: list,
    flavors: list[GpuFlavor],
    clusters: list[Cluster],
    image: Image,
    span: timedelta,
) -> dict[str, float]:
    """``runs`` runs (and a tenth as many experiments) over the ``span`` up to now, in SQL;
    ``projects`` and ``users`` are grouped by tenant, the same number for each. Returns the
    seconds each step took."""
    drawn = {f"h{k}": h(x, k) for x, ks in (("e", (2, 3, 4, 5)), ("r", range(6, 13))) for k in ks}
    shape = {
        "tenants": len(tenants),
        "projects": len(projects) // len(tenants),
        "users": len(users) // len(tenants),
        "flavors": len(flavors),
        "clusters": len(clusters),
        "experiments": -(-runs // RUNS_PER_EXPERIMENT),
        "runs": runs,
        "live": live,
        "per": RUNS_PER_EXPERIMENT,
        "u1": u("e", 1),
    }
    now = datetime.now(UTC).replace(microsecond=0)
    params = {
        "tenants": [t.pk for t in tenants],
        "projects": [p.pk for p in projects],
        "users": [user.pk for user in users],
        "flavors": [f.pk for f in flavors],
        "clusters": [c.pk for c in clusters],
        "image": image.pk,
        "reference": image.reference,
        "start": now - span,
        "step": span.total_seconds() / runs,
    }
    seconds = {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('is_superuser') = 'on'")
        if cursor.fetchone()[0]:
            # The rows reference each other correctly by construction; checking a million
            # runs' five foreign keys would add most of a minute.
            cursor.execute("SET LOCAL session_replication_role = replica")
        for name, statement in (("experiments", _EXPERIMENTS), ("runs", _RUNS)):
            text = statement.format(**shape, **drawn)
            seconds[name] = timed(lambda t=text: cursor.execute(t, params))[0]
        for model in (Experiment, Run):
            table = model._meta.db_table
            cursor.execute(
                sql.SQL("SELECT setval(pg_get_serial_sequence(%s, 'id'), max(id)) FROM {}").format(
                    sql.Identifier(table)
                ),
                [table],
            )
    return seconds


@dataclass
class Persona:
    label: str
    user: object
    token: str


def seed() -> tuple[list[Persona], dict[str, float]]:
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    truncate()
    user_model = get_user_model()
    tenants = Tenant.objects.bulk_create(
        [Tenant(slug=f"t{n:02d}", name=f"Tenant {n:02d}") for n in range(TENANTS)]
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
            user_model(username=f"{tenant.slug}-u{n:02d}", password=make_password(None))
            for tenant in tenants
            for n in range(USERS)
        ]
    )
    Membership.objects.bulk_create(
        [Membership(user=user, tenant=tenants[index // USERS]) for index, user in enumerate(users)]
    )
    flavors = [GpuFlavor.objects.create(slug=slug, name=slug, memory_gb=80) for slug in FLAVORS]
    clusters = [
        Cluster.objects.create(name=name, backend=Cluster.Backend.SIMULATOR) for name in CLUSTERS
    ]
    ClusterFlavor.objects.bulk_create(
        [
            ClusterFlavor(cluster=cluster, flavor=flavor, nodes=32, gpus_per_node=8, gpus=256)
            for cluster in clusters
            for flavor in flavors
        ]
    )
    image = Image.objects.create(
        repository="registry.example.org/bench/train",
        digest="sha256:" + "0" * 64,
        status=Image.Status.APPROVED,
    )
    researcher = users[0]  # of t00, the largest tenant
    tenant_admin = user_model.objects.create(username="t03-admin", password=make_password(None))
    Membership.objects.create(
        user=tenant_admin, tenant=tenants[3], role=Membership.Role.TENANT_ADMIN
    )
    platform_admin = user_model.objects.create(username="bench-admin", password=make_password(None))
    platform_admin.groups.add(Group.objects.get_or_create(name=GlobalRole.PLATFORM_ADMIN)[0])
    seconds["dimensions"] = time.perf_counter() - started
    seconds |= seed_history(
        runs=RUNS,
        live=LIVE,
        tenants=tenants,
        projects=projects,
        users=users,
        flavors=flavors,
        clusters=clusters,
        image=image,
        span=SPAN,
    )
    seconds["vacuum"] = timed(vacuum)[0]
    seconds["total"] = time.perf_counter() - started
    personas = [
        Persona(
            f"researcher ({tenants[0].slug})", researcher, api_token_create(user=researcher)[1]
        ),
        Persona(
            f"tenant admin ({tenants[3].slug})",
            tenant_admin,
            api_token_create(user=tenant_admin)[1],
        ),
        Persona("platform admin (all)", platform_admin, api_token_create(user=platform_admin)[1]),
    ]
    return personas, seconds


# --- measuring -----------------------------------------------------------------------------


@dataclass
class Timing:
    p50: float
    p95: float
    queries: int
    cpu: float  # seconds of CPU a call, this process and its PostgreSQL backend together


def measure(fn: Callable[[], object], *, repeat: int, warm_up: int) -> Timing:
    for _ in range(warm_up):
        fn()
    counter = QueryCounter()
    gc.collect()
    samples = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    cpu_before = time.process_time() + cpu_seconds(backend)
    with connection.execute_wrapper(counter):
        for _ in range(repeat):
            samples.append(timed(fn)[0])
    return Timing(
        p50=statistics.median(samples),
        p95=statistics.quantiles(samples, n=20, method="inclusive")[18],
        queries=counter.count // repeat,
        cpu=(time.process_time() + cpu_seconds(backend) - cpu_before) / repeat,
    )


def visible_count(user) -> int:
    return run_list_viewable(user=user).count()


def deep_page(user, size: int) -> tuple[int, int]:
    """(page number, id of the run just above that page) for the page half-way down."""
    number = visible_count(user) // 2 // size + 1
    above = (
        run_list_viewable(user=user)
        .order_by("-submitted_at", "-id")
        .values_list("pk", flat=True)[(number - 1) * size - 1]
    )
    return number, above


def naive_page(user, number: int, size: int) -> list[int]:
    """The page as the list made it before: Paginator over the scoped queryset."""
    runs = run_list_viewable(user=user).defer(*RUN_LIST_DEFERRED)
    page = Paginator(runs, size).page(number)
    return [run.pk for run in page.object_list]


def keyset_page(user, before: int | None, size: int, count: bool) -> list[int]:
    page = run_page_viewable(
        user=user, size=size, before=before, count_up_to=RUN_COUNT_LIMIT if count else None
    )
    return [run.pk for run in page.runs]


def get(client: Client, url: str, query: dict) -> Callable[[], object]:
    def request():
        response = client.get(url, query)
        assert response.status_code == 200, response.status_code

    return request


@dataclass
class Row:
    persona: str
    page: str
    html: Timing
    api: Timing
    keyset: Timing
    naive: Timing


def measure_persona(persona: Persona) -> list[Row]:
    html = Client(HTTP_HOST="localhost")  # an allowed host; the test runner is not set up
    html.force_login(persona.user)
    api = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {persona.token}")
    number, above = deep_page(persona.user, RUNS_PER_PAGE)
    _, api_above = deep_page(persona.user, API_PAGE)
    rows = []
    for label, page, cursor, api_cursor in (
        ("newest", 1, None, None),
        (f"half-way (page {number:,})", number, above, api_above),
    ):
        expected = naive_page(persona.user, page, RUNS_PER_PAGE)
        assert keyset_page(persona.user, cursor, RUNS_PER_PAGE, True) == expected
        html_query = {} if cursor is None else {"before": cursor}
        api_query = {} if api_cursor is None else {"before": api_cursor}
        rows.append(
            Row(
                persona=persona.label,
                page=label,
                html=measure(
                    get(html, reverse("jobs:run_list"), html_query),
                    repeat=REQUESTS,
                    warm_up=WARM_UP,
                ),
                api=measure(
                    get(api, reverse("api:run-list"), api_query),
                    repeat=REQUESTS,
                    warm_up=WARM_UP,
                ),
                keyset=measure(
                    lambda c=cursor: keyset_page(persona.user, c, RUNS_PER_PAGE, True),
                    repeat=REQUESTS,
                    warm_up=WARM_UP,
                ),
                naive=measure(
                    lambda p=page: naive_page(persona.user, p, RUNS_PER_PAGE),
                    repeat=BASELINE_REQUESTS,
                    warm_up=0,  # the check above ran it once
                ),
            )
        )
    return rows


def spread(timing: Timing) -> str:
    return f"{ms(timing.p50)} / {ms(timing.p95)}"


def run() -> list[Section]:
    personas, seconds = seed()
    visible = {persona.label: visible_count(persona.user) for persona in personas}
    rows = [row for persona in personas for row in measure_persona(persona)]
    worst = max(max(row.html.p95, row.api.p95) for row in rows)
    section = Section(
        title="Run list at 1,000,000 runs",
        intro=(
            f"{RUNS:,} runs of {RUNS // RUNS_PER_EXPERIMENT:,} experiments over two years, "
            f"{TENANTS} tenants of very different sizes, seeded by PostgreSQL "
            "(`bench/runlist.py`). Gantry: the run list page (HTML, 25 runs) and the API "
            f"list (50 runs) through Django's test client, {REQUESTS} requests each, and the "
            "list's own queries (keyset page and a count that stops at "
            f"{RUN_COUNT_LIMIT:,}). Baseline, in the same run: the same page of 25 as the list "
            "made it before, `Paginator` over the scoped queryset (`COUNT(*)` and `OFFSET`), "
            f"{BASELINE_REQUESTS} times; both list the same runs (asserted). Times are "
            "p50 / p95."
        ),
        columns=[
            "persona (runs visible)",
            "page",
            "HTML page",
            "API list",
            "CPU a request (HTML / API)",
            "queries (HTML / API)",
            "list SQL: keyset + capped count",
            "baseline SQL: COUNT(*) + OFFSET",
            "speed-up (p50)",
        ],
    )
    for row in rows:
        section.rows.append(
            [
                f"{row.persona} ({visible[row.persona]:,})",
                row.page,
                spread(row.html),
                spread(row.api),
                f"{ms(row.html.cpu)} / {ms(row.api.cpu)}",
                f"{row.html.queries} / {row.api.queries}",
                spread(row.keyset),
                spread(row.naive),
                ratio(row.naive.p50, row.keyset.p50),
            ]
        )
    section.notes.append(
        f"p95 of every page and API list: at most {ms(worst)} "
        f"({'within' if worst < TARGET_P95_S else 'ABOVE'} the {ms(TARGET_P95_S)} target)."
    )
    section.notes.append(
        "CPU a request: of the process serving it and of its PostgreSQL backend, from "
        "/proc, over the 50 requests: what a request costs whatever else the machine does. "
        "Load average of the machine at the end: "
        + " / ".join(f"{value:.1f}" for value in os.getloadavg())
        + " (1 / 5 / 15 min; other work shares its 2 cores and stretches the times)."
    )
    section.notes.append(
        "Seeding: "
        + ", ".join(f"{name} {ms(value)}" for name, value in seconds.items())
        + ". The deep API page is the one half-way down at 50 runs a page."
    )
    return [section]
