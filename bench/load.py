"""The portal under load (issue 10, acceptance 6; issue 20, point 4): 100 people at once
for 60 seconds, and a flood of clients that never pause, on the code before and after issue
20.4's work, in the same run.

The stack as production runs it (docker-compose.yml): gunicorn as ``portal/gunicorn_conf.py``
sets it up (sync workers, one per core plus one) in front of PostgreSQL, a Celery worker and
beat on Redis running admission every second, and the simulator cluster, so that submitted
runs are really admitted, started and finished. *Before*: the code of main at ``BEFORE_REF``
(taken out of this repository with ``git archive``: the benchmark needs its history);
*after*: this checkout. Both stacks run side by side and take turns (the people on before,
then on after; the flood in rounds, before, after, after, before), so that a machine whose
speed drifts (other guests of its host) weighs on both alike; while one is measured, the
other's Celery worker and beat are paused, so that its background work (runs that end,
a queue that drains) does not weigh on the stack measured. Each has a Redis database of
its own (broker and cache) and a PostgreSQL database seeded alike by this checkout's code
(the schema is the same), ``<DATABASE_URL's name>_load_<before|after>``: 4 tenants with a
guarantee and a borrow limit on two flavors that fill a 96-GPU cluster exactly, 13
researchers (password and API token) and a tenant admin each, and 20,000 finished runs of
history. Settings are the tests' (``tests.settings``) with DEBUG off; they differ from
production only in the development secret key, plain HTTP (no HTTPS redirect, no
secure-only cookies) and a fast password hasher, so that 100 logins do not cost a minute of
CPU; the cache is on Redis, as in docker-compose.yml.

Locust (``bench/locustfile.py``) drives it over HTTP on 127.0.0.1.

- *People*: ``--users 100 --spawn-rate 20 --run-time 60s``, spread over each second (Locust
  starts the 20 users of a second at one instant; a person waits a moment of that second
  first, as people arriving at that rate do, not all at once): 40 researchers' scripts submit
  runs and list and read them with a token, 50 researchers and 10 tenant admins log in and
  browse their home page, the run list (and older pages), run pages, quotas and run telemetry,
  2 to 8 s apart (from the home page their log-in leads to as well); a run page or run
  list they open polls its live parts as the browser does;
  2 health probes ask ``/healthz`` every second. Their pace, not the portal, sets how many
  requests a second they make: what this measures is how long each request waits.
- *Flood*: ``FLOOD_USERS`` of the same people (4 scripts, 5 researchers and a tenant admin,
  as the people's proportions) without any pause, ``FLOOD_S`` seconds in rounds of
  ``FLOOD_ROUND_S``: the requests a second the stack serves when it, not the people, is the
  limit. This is the throughput compared.
- *Alone* (after only, before its load): one such client for 20 s: what each request costs
  with nobody else around.

Checked: no 5xx answer (gunicorn's access log, besides Locust's count) and no
over-admission, sampled every 2 s during the run and after it: for every cluster and flavor,
GPUs held by runs (admitted to running) at most its capacity; for every tenant and flavor, at
most guarantee + borrow limit.
"""

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.core.management import call_command
from django.db import connection
from django.db.models import Count, Max, Sum

from bench.cpu import cpu_seconds, machine_busy_seconds
from bench.cycle import truncate, vacuum
from bench.db import ensure_database
from bench.report import Section
from bench.runlist import seed_history
from clusters.models import Cluster, ClusterFlavor
from clusters.services import cluster_refresh_inventory
from images.models import Image
from jobs.models import HOLDING_STATES, Run, RunEvent
from jobs.selectors.capacity import held_gpus_by_pool
from portal.process_priority import niceness_of
from tenants.models import GpuFlavor, Membership, Project, Quota, Tenant
from tenants.services.tokens import api_token_create

ROOT = Path(__file__).resolve().parent.parent
USERS, SPAWN_RATE, DURATION_S = 100, 20, 60
BASELINE_S = 20
WARM_UP_S = 5
SAMPLE_EVERY_S = 2
TENANTS = ("vision", "nlp", "speech", "robotics")
RESEARCHERS = 13  # per tenant, each with a password and an API token
HISTORY_RUNS = 20_000
POOLS = {"a100-80gb": (8, 8), "h100-80gb": (4, 8)}  # flavor: nodes, GPUs per node
QUOTA = {"a100-80gb": (16, 16), "h100-80gb": (8, 8)}  # flavor: guaranteed, borrow limit
PASSWORD = "load-bench-password"  # noqa: S105 (a throwaway account of a throwaway database)
LOAD_CLASSES = ("ApiResearcher", "BrowserResearcher", "TenantAdmin", "HealthProbe")
FLOOD_CLASSES = ("ApiFlood", "BrowserFlood", "AdminFlood")  # the people's, without pauses
FLOOD_USERS = 10
# The flood in rounds, the stacks taking turns (before, after, after, before): 30 s each.
FLOOD_ORDER = ("before", "after", "after", "before")
FLOOD_ROUND_S = 15
FLOOD_S = FLOOD_ROUND_S * FLOOD_ORDER.count("after")
SETTLE_S = 20  # after a stack's people: its runs (5 to 20 s) end before the next phase
RESUME_S = 5  # a stack whose background work was paused catches up before it is measured
WARM_UP = ["SequentialClient"]
# main before issue 39, point 4 (the Celery worker and beat at a lower CPU priority): the
# code the benchmark measures this checkout against. Both stacks' databases are migrated and
# seeded by this checkout, so the before code must run on its schema: a commit before jobs
# 0019 (runs' NOT NULL kind, platform_retries and excluded_nodes) cannot. Until 2026-12-07 it
# was bd21112 (main before issues 31-33), and before 2026-12-06 284ad1e (issue 20.4's start):
# issue 20.4's doubled flood throughput against that code is in docs/benchmarks-notes.md.
BEFORE_REF = "3f98c972597e0936cea709fba09c4cade21d6110"


# --- the world ------------------------------------------------------------------------------


def seed(directory: Path) -> Path:
    """Tenants, quotas, the cluster, people and history; returns the credentials file the
    Locust users read."""
    truncate()
    flavors = [GpuFlavor.objects.create(slug=slug, name=slug, memory_gb=80) for slug in POOLS]
    cluster = Cluster.objects.create(
        name="sim-load",
        backend=Cluster.Backend.SIMULATOR,
        settings={
            "speedup": 60,
            "pools": [
                {"flavor": slug, "nodes": nodes, "gpus_per_node": gpus}
                for slug, (nodes, gpus) in POOLS.items()
            ],
        },
    )
    cluster_refresh_inventory(cluster=cluster)
    image = Image.objects.create(
        repository="registry.example.org/load/train",
        digest="sha256:" + "1" * 64,
        status=Image.Status.APPROVED,
    )
    tenants = Tenant.objects.bulk_create([Tenant(slug=slug, name=slug) for slug in TENANTS])
    projects = Project.objects.bulk_create(
        [Project(tenant=t, slug=slug, name=slug) for t in tenants for slug in ("train", "eval")]
    )
    Quota.objects.bulk_create(
        [
            Quota(
                tenant=t,
                flavor=f,
                guaranteed_gpus=QUOTA[f.slug][0],
                borrow_limit_gpus=QUOTA[f.slug][1],
            )
            for t in tenants
            for f in flavors
        ]
    )
    user_model = get_user_model()
    password = make_password(PASSWORD)
    researchers = user_model.objects.bulk_create(
        [
            user_model(username=f"{t.slug}-{n:02d}", password=password)
            for t in tenants
            for n in range(RESEARCHERS)
        ]
    )
    admins = user_model.objects.bulk_create(
        [user_model(username=f"{t.slug}-admin", password=password) for t in tenants]
    )
    Membership.objects.bulk_create(
        [Membership(user=u, tenant=tenants[i // RESEARCHERS]) for i, u in enumerate(researchers)]
        + [
            Membership(user=u, tenant=t, role=Membership.Role.TENANT_ADMIN)
            for u, t in zip(admins, tenants, strict=True)
        ]
    )
    seed_history(
        runs=HISTORY_RUNS,
        live=0,
        tenants=tenants,
        projects=projects,
        users=researchers,
        flavors=flavors,
        clusters=[cluster],
        image=image,
        span=timedelta(days=90),
    )
    vacuum()
    api = [
        {
            "token": api_token_create(user=user, name="load")[1],
            "tenant": tenants[index // RESEARCHERS].slug,
            "project": "train",
            "image": image.reference,
            "flavors": list(POOLS),
        }
        for index, user in enumerate(researchers)
    ]
    people = {
        "api": api,
        # The browsing researchers start half-way through the list: other people than
        # the first scripts, as far as there are enough.
        "browser": [
            {"username": u.username, "password": PASSWORD}
            for u in researchers[len(researchers) // 2 :] + researchers[: len(researchers) // 2]
        ],
        "admin": [{"username": u.username, "password": PASSWORD} for u in admins],
    }
    path = directory / "people.json"  # in a directory only we may read (mkdtemp)
    path.write_text(json.dumps(people))
    return path


# --- the processes --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args: list[str], env: dict, log: Path, *, cwd: Path = ROOT) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 (our own fixed commands)
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def source_tree(ref: str, directory: Path) -> Path:
    """The files of commit ``ref`` of this repository, in ``directory``/tree."""
    archive = subprocess.run(  # noqa: S603 (a fixed command; ref is a constant of ours)
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref],  # noqa: S607
        check=True,
        capture_output=True,
    ).stdout
    tree = directory / "tree"
    with tarfile.open(fileobj=io.BytesIO(archive)) as files:
        files.extractall(tree, filter="data")
    return tree


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, then after 15 s SIGKILL to its process group (it started its own)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_ready(base: str, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:  # noqa: S310
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("gunicorn did not become ready in time")


@dataclass
class Kind:
    name: str
    requests: int
    failures: int
    p50_ms: float | None
    p95_ms: float | None
    per_second: float


def locust(
    base: str, people: Path, directory: Path, label: str, *, users: int, seconds: int, classes
) -> tuple[subprocess.Popen, Path]:
    """Start Locust headless; returns the process and the prefix of the CSV files it
    writes when it ends."""
    prefix = directory / label
    args = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py"),
        "--headless", "--host", base, "--users", str(users),
        "--spawn-rate", str(min(users, SPAWN_RATE)), "--run-time", f"{seconds}s",
        "--stop-timeout", "5", "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING",
        *classes,
    ]  # fmt: skip
    env = os.environ | {"GANTRY_LOAD_USERS": str(people)}
    process = start(args, env, directory / f"{label}.log")
    return process, prefix


def read_stats(prefix: Path) -> tuple[dict[str, Kind], dict[str, int]]:
    """Locust's statistics per request name (and "Aggregated"), and its failures by
    request name and message."""

    def number(value: str) -> float | None:
        return None if value in ("", "N/A") else float(value)

    kinds = {}
    with Path(f"{prefix}_stats.csv").open() as stats:
        for row in csv.DictReader(stats):
            kinds[row["Name"]] = Kind(
                name=row["Name"],
                requests=int(row["Request Count"]),
                failures=int(row["Failure Count"]),
                p50_ms=number(row["50%"]),
                p95_ms=number(row["95%"]),
                per_second=float(row["Requests/s"]),
            )
    failures: dict[str, int] = {}
    with Path(f"{prefix}_failures.csv").open() as rows:
        for row in csv.DictReader(rows):
            key = f"{row['Name']}: {row['Error']}"
            failures[key] = failures.get(key, 0) + int(row["Occurrences"])
    return kinds, failures


def database_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving this database now (the server runs
    on this machine): the portal's connections live on (CONN_MAX_AGE), so the difference
    over the load is the database's share of the work."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return {pid: cpu_seconds(pid) for (pid,) in cursor.fetchall()}


def server_errors(access_log: Path) -> int:
    """5xx answers in gunicorn's access log (format: status first)."""
    return sum(1 for line in access_log.read_text().splitlines() if line[:1] == "5")


# --- admission checks -----------------------------------------------------------------------


@dataclass
class Admission:
    samples: int = 0
    violations: list[str] = field(default_factory=list)
    peak_held: int = 0


def check_admission(admission: Admission) -> None:
    """GPUs held per cluster and flavor within capacity, per tenant and flavor within
    guarantee + borrow limit (design §5), as the database says right now."""
    capacity = {
        (cf.cluster_id, cf.flavor_id): cf.capacity_gpus for cf in ClusterFlavor.objects.all()
    }
    ceiling = {
        (q.tenant_id, q.flavor_id): q.guaranteed_gpus + q.borrow_limit_gpus
        for q in Quota.objects.all()
    }
    per_pool = held_gpus_by_pool(clusters=list(Cluster.objects.all()))
    per_tenant = (
        Run.objects.filter(state__in=HOLDING_STATES)
        .values_list("tenant_id", "flavor_id")
        .annotate(gpus=Sum("gpus"))
    )
    admission.samples += 1
    admission.peak_held = max(admission.peak_held, sum(per_pool.values()))
    for pool, gpus in per_pool.items():
        if gpus > capacity.get(pool, 0):
            admission.violations.append(f"pool {pool} holds {gpus} of {capacity.get(pool, 0)}")
    for tenant_id, flavor_id, gpus in per_tenant:
        limit = ceiling.get((tenant_id, flavor_id), 0)
        if gpus > limit:
            admission.violations.append(f"tenant {tenant_id} holds {gpus} > {limit} GPUs")


def run_outcomes(first_run_id: int) -> dict[str, int]:
    """What became of the runs submitted during the benchmark."""
    runs = Run.objects.filter(pk__gt=first_run_id)
    events = dict(
        RunEvent.objects.filter(run__in=runs)
        .values_list("to_state")
        .annotate(n=Count("run_id", distinct=True))
    )
    return {
        "submitted": runs.count(),
        "admitted": events.get("ADMITTED", 0),
        "started": events.get("RUNNING", 0),
        "succeeded": events.get("SUCCEEDED", 0),
        "preempted": events.get("PREEMPTED", 0),
    }


# --- the benchmark --------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    label: str
    ref: str | None  # a commit of this repository, or None for this checkout


BEFORE = Stack("before", BEFORE_REF)
AFTER = Stack("after", None)
# gunicorn's arguments after the application, besides the bind address: as docker-compose.yml
# runs it, at both commits.
WEB = ["--config", "python:portal.gunicorn_conf"]


def run() -> list[Section]:
    """Both stacks run side by side, each on a database of its own, and take turns: the
    people on before, then on after; then the flood in rounds, before, after, after, before.
    A machine whose speed drifts (other guests of its host) then weighs on both alike."""
    stacks: dict[str, Live] = {}
    try:
        for stack in (BEFORE, AFTER):
            sys.stderr.write(f"bench: load: starting the {stack.label} stack…\n")
            stacks[stack.label] = stack_start(stack)
        for live in stacks.values():
            stack_measured_alone(live, stacks.values())
            people_phase(live, alone=live.stack is AFTER)
        sys.stderr.write(
            f"bench: load: a flood of {FLOOD_USERS} clients, {len(FLOOD_ORDER)} rounds of "
            f"{FLOOD_ROUND_S} s…\n"
        )
        for label in FLOOD_ORDER:
            stack_measured_alone(stacks[label], stacks.values())
            flood_round(stacks[label])
        for live in stacks.values():
            background_resume(live)
        results = {label: stack_finish(live) for label, live in stacks.items()}
    finally:
        for live in stacks.values():
            background_resume(live)  # a stopped process would not see SIGTERM
            for process in reversed(live.processes):
                stop(process)
            live.people.unlink(missing_ok=True)  # API tokens; the logs stay on failure
        connection.close()
    before, after = results["before"], results["after"]
    section = report(before, after)
    cpu_section = cpu_report(before, after)
    problems = [f"{label}: {problem}" for label, r in results.items() for problem in r.problems()]
    if any(not r.ok() for r in results.values()):
        sys.stderr.write(section.markdown())
        raise AssertionError(f"load: {'; '.join(problems)}")
    for r in results.values():
        shutil.rmtree(r.directory)
    section.notes += [f"Missed: {problem}." for problem in after.targets_missed()]
    return [section, cpu_section]


@dataclass
class Live:
    """A started stack and what its phases measured so far."""

    stack: Stack
    directory: Path
    database: str
    people: Path
    first_run_id: int
    base: str
    web: subprocess.Popen
    worker: subprocess.Popen
    beat: subprocess.Popen
    processes: list[subprocess.Popen]
    admission: Admission = field(default_factory=Admission)
    baseline: dict[str, Kind] = field(default_factory=dict)
    loaded: dict[str, Kind] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    flood_rounds: list[dict[str, Kind]] = field(default_factory=list)
    flood_seconds: float = 0.0
    flood_cpu: dict[str, float] = field(default_factory=dict)
    paused: bool = False  # its Celery worker and beat, while another stack is measured
    niceness: dict[str, int] = field(default_factory=dict)  # gunicorn, worker, beat


def stack_measured_alone(live: Live, stacks) -> None:
    """Only ``live``'s background work runs: the other stacks' Celery worker and beat are
    paused (SIGSTOP), as if each stack had the machine to itself, as in production. Their
    gunicorn is left running: it serves nobody meanwhile, and its arbiter would take workers
    it found silent after a pause for hung ones. A stack resumed here first catches up on
    what its beat and worker missed, before it is measured."""
    for other in stacks:
        if other is not live:
            background_pause(other)
    if live.paused:
        background_resume(live)
        time.sleep(RESUME_S)


def background_pause(live: Live) -> None:
    if not live.paused:
        for process in (live.worker, live.beat):
            os.killpg(process.pid, signal.SIGSTOP)  # each leads a process group of its own
        live.paused = True


def background_resume(live: Live) -> None:
    if live.paused:
        for process in (live.worker, live.beat):
            os.killpg(process.pid, signal.SIGCONT)
        live.paused = False


def use_database(name: str) -> None:
    """Point this process's connection at ``name`` (it reads the settings' dict)."""
    connection.close()
    settings.DATABASES["default"]["NAME"] = name


def stack_start(stack: Stack) -> Live:
    """Its own database (``<name>_<label>``, migrated and seeded afresh), its processes,
    warmed up."""
    directory = Path(tempfile.mkdtemp(prefix=f"gantry-load-{stack.label}-"))
    tree = source_tree(stack.ref, directory) if stack.ref else ROOT
    given = urlsplit(os.environ["DATABASE_URL"])
    database = f"{given.path.lstrip('/')}_{stack.label}"
    url = urlunsplit(given._replace(path=f"/{database}"))
    ensure_database(url)
    use_database(database)
    call_command("migrate", verbosity=0)
    people = seed(directory)
    broker = os.environ.get("CELERY_BROKER_URL", settings.CELERY_BROKER_URL)
    first_run_id = Run.objects.aggregate(last=Max("id"))["last"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = os.environ | {
        "DATABASE_URL": url,
        # The environment's, not settings': an earlier benchmark of the same run set up
        # Django with the in-memory broker, which no other process can reach. Each stack
        # has a Redis database of its own (the next one after the given), for its tasks
        # and its cache (throttles, lockouts), as docker-compose.yml has it on Redis.
        "CELERY_BROKER_URL": _redis_database(broker, offset=1 if stack is AFTER else 0),
        "GANTRY_CACHE_URL": (
            _redis_database(broker, offset=1 if stack is AFTER else 0)
            if broker.startswith("redis://")
            else "db://"
        ),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "GANTRY_DEBUG": "0",
        "GANTRY_DATA_DIR": str(directory),
        "GANTRY_LOG_LEVEL": "WARNING",
        "GANTRY_ADMISSION_INTERVAL_S": "1",
        "GANTRY_SYNC_INTERVAL_S": "1",
        "GANTRY_WEB_BIND": f"127.0.0.1:{port}",
        "GANTRY_WEB_ACCESS_LOG": str(directory / "access.log"),
        # The stack's own code first, whatever this environment installed in editable mode.
        "PYTHONPATH": str(tree),
    }
    connection.close()  # the children get their own; this one waits idle otherwise
    processes: list[subprocess.Popen] = []
    live = None
    try:
        web = start(
            [
                sys.executable, "-m", "gunicorn", "portal.wsgi:application", *WEB,
                "--bind", f"127.0.0.1:{port}", "--access-logfile",
                str(directory / "access.log"), "--access-logformat", "%(s)s %(m)s %(U)s",
            ],
            env,
            directory / "gunicorn.log",
            cwd=tree,
        )  # fmt: skip
        processes.append(web)
        worker = start(
            [
                sys.executable, "-m", "celery", "-A", "portal", "worker", "--loglevel", "WARNING",
                "--concurrency", "2", "--without-mingle", "--without-gossip",
            ],
            env,
            directory / "celery.log",
            cwd=tree,
        )  # fmt: skip
        processes.append(worker)
        beat = start(
            [
                sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "WARNING",
            ],
            env,
            directory / "celery.log",
            cwd=tree,
        )  # fmt: skip
        processes.append(beat)
        live = Live(
            stack=stack, directory=directory, database=database, people=people,
            first_run_id=first_run_id, base=base, web=web, worker=worker, beat=beat,
            processes=processes,
        )  # fmt: skip
        wait_ready(base, web)
        # Every gunicorn worker loads views and templates on its first requests.
        drive(live, "warm-up", users=3, seconds=WARM_UP_S, classes=WARM_UP)
        # As each set itself up: the after stack's worker and beat lower their own CPU
        # priority (GANTRY_WORKER_NICE), the before code's do not.
        live.niceness = {
            name: niceness_of(process.pid)
            for name, process in (("gunicorn", web), ("worker", worker), ("beat", beat))
        }
        return live
    except BaseException:
        for process in reversed(processes):
            stop(process)
        raise


def _redis_database(url: str, *, offset: int) -> str:
    """``url`` with its Redis database number moved up by ``offset`` (others as they are)."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or not offset:
        return url
    number = (int(parts.path.lstrip("/") or 0) + offset) % 16  # Redis has 16 by default
    return urlunsplit(parts._replace(path=f"/{number}"))


def drive(
    live: Live, label: str, *, users: int, seconds: int, classes
) -> tuple[dict[str, Kind], dict[str, int], float, dict[str, float]]:
    """Locust against the stack, its admission checked as it goes: its statistics and
    failures, how long it took, and the CPU seconds each process used meanwhile (as last
    sampled while Locust ran: afterwards the workers' CPU is no longer the load's)."""
    use_database(live.database)
    locust_process, prefix = locust(
        live.base, live.people, live.directory, label, users=users, seconds=seconds,
        classes=classes,
    )  # fmt: skip
    live.processes.append(locust_process)
    measured = {
        "web": live.web, "celery": live.worker, "beat": live.beat, "locust": locust_process,
    }  # fmt: skip
    started = time.monotonic()
    cpu_before = {name: cpu_seconds(p.pid) for name, p in measured.items()}
    cpu_before["machine"] = machine_busy_seconds()
    database_before = database_cpu()
    cpu_now, database_now = dict(cpu_before), dict(database_before)
    while locust_process.poll() is None:
        cpu_now = {name: cpu_seconds(p.pid) for name, p in measured.items()}
        cpu_now["machine"] = machine_busy_seconds()
        database_now = database_cpu()
        check_admission(live.admission)
        time.sleep(SAMPLE_EVERY_S)
    elapsed = time.monotonic() - started
    cpu = {name: cpu_now[name] - cpu_before[name] for name in cpu_before}
    cpu["database"] = sum(
        seconds - database_before.get(pid, 0.0) for pid, seconds in database_now.items()
    )
    kinds, failures = read_stats(prefix)
    return kinds, failures, elapsed, cpu


def people_phase(live: Live, *, alone: bool) -> None:
    if alone:
        sys.stderr.write(f"bench: load: {live.stack.label}: one client alone for {BASELINE_S} s…\n")
        live.baseline, failures, _, _ = drive(
            live, "baseline", users=1, seconds=BASELINE_S, classes=WARM_UP
        )
        live.failures |= {f"alone, {key}": n for key, n in failures.items()}
    sys.stderr.write(f"bench: load: {live.stack.label}: {USERS} people for {DURATION_S} s…\n")
    live.loaded, failures, live.seconds, live.cpu = drive(
        live, "load", users=USERS, seconds=DURATION_S, classes=LOAD_CLASSES
    )
    live.failures |= failures
    live.load_average = os.getloadavg()
    # Its runs end and its queue drains before the other stack is measured.
    time.sleep(SETTLE_S)
    check_admission(live.admission)


def flood_round(live: Live) -> None:
    label = f"flood-{len(live.flood_rounds) + 1}"
    kinds, failures, seconds, cpu = drive(
        live, label, users=FLOOD_USERS, seconds=FLOOD_ROUND_S, classes=FLOOD_CLASSES
    )
    live.flood_rounds.append(kinds)
    live.flood_seconds += seconds
    for name, used in cpu.items():
        live.flood_cpu[name] = live.flood_cpu.get(name, 0.0) + used
    for key, n in failures.items():
        live.failures[f"flood, {key}"] = live.failures.get(f"flood, {key}", 0) + n


def stack_finish(live: Live) -> "Result":
    """A few more admission checks with runs ending and the queue draining; then what
    became of the runs submitted, and whether every process lived through it."""
    use_database(live.database)
    for _ in range(3):
        time.sleep(SAMPLE_EVERY_S)
        check_admission(live.admission)
    outcomes = run_outcomes(live.first_run_id)
    alive = {
        name: p.poll() is None
        for name, p in (("gunicorn", live.web), ("worker", live.worker), ("beat", live.beat))
    }
    connection.close()
    return Result(
        stack=live.stack,
        directory=live.directory,
        baseline=live.baseline,
        loaded=live.loaded,
        failures=live.failures,
        flood=_rounds_together(live.flood_rounds),
        flood_seconds=live.flood_seconds,
        flood_cpu=live.flood_cpu,
        errors_5xx=server_errors(live.directory / "access.log"),
        admission=live.admission,
        outcomes=outcomes,
        alive=alive,
        seconds=live.seconds,
        cpu=live.cpu,
        load_average=live.load_average,
        niceness=live.niceness,
    )


def _rounds_together(rounds: list[dict[str, Kind]]) -> dict[str, Kind]:
    """The flood's rounds as one: requests and failures added up; p50 and p95 those of the
    slowest round (percentiles of parts do not add up)."""
    together: dict[str, Kind] = {}
    for kinds in rounds:
        for name, kind in kinds.items():
            seen = together.get(name)
            if seen is None:
                together[name] = kind
                continue
            together[name] = Kind(
                name=name,
                requests=seen.requests + kind.requests,
                failures=seen.failures + kind.failures,
                p50_ms=max(seen.p50_ms or 0, kind.p50_ms or 0) or None,
                p95_ms=max(seen.p95_ms or 0, kind.p95_ms or 0) or None,
                per_second=seen.per_second + kind.per_second,
            )
    return together


@dataclass
class Result:
    stack: Stack
    directory: Path
    baseline: dict[str, Kind]  # one client alone (measured on one stack only)
    loaded: dict[str, Kind]
    failures: dict[str, int]
    flood: dict[str, Kind]
    flood_seconds: float
    # CPU seconds during the flood: gunicorn ("web"), Celery's worker and beat, the
    # database (Celery's queries included) and Locust itself
    flood_cpu: dict[str, float]
    errors_5xx: int
    admission: Admission
    outcomes: dict[str, int]
    alive: dict[str, bool]
    seconds: float
    cpu: dict[str, float]  # CPU seconds of the gunicorn ("web"), Celery and database work
    load_average: tuple[float, float, float]
    niceness: dict[str, int]

    def problems(self) -> list[str]:
        """What makes the run wrong, not slow: the benchmark fails on these."""
        problems = [f"{name} died" for name, alive in self.alive.items() if not alive]
        if self.errors_5xx:
            problems.append(f"{self.errors_5xx} answers were 5xx")
        problems += self.admission.violations
        if not self.outcomes["started"]:
            problems.append("no submitted run started: admission or the worker did not run")
        return problems

    def ok(self) -> bool:
        return not self.problems()

    def throughput(self) -> float:
        """Requests a second of the flood: what the stack serves at its limit."""
        return self.flood["Aggregated"].requests / self.flood_seconds

    def people_rate(self) -> float:
        return self.loaded["Aggregated"].requests / self.seconds

    def targets_missed(self) -> list[str]:
        """The targets of issues 20.4 and 39.4, for this (the after) stack: no failed
        request, p95 ≤ 300 ms for every kind of request the people make. (Issue 20.4's
        twice the flood throughput was against the code before it, no longer BEFORE_REF.)"""
        missed = []
        failed = sum(kind.failures for name, kind in self.loaded.items() if name != "Aggregated")
        failed += sum(kind.failures for name, kind in self.flood.items() if name != "Aggregated")
        if failed:
            missed.append(f"{failed} requests failed")
        slow = [
            f"{name} ({kind.p95_ms:,.0f} ms)"
            for name, kind in sorted(self.loaded.items())
            if name != "Aggregated" and kind.p95_ms is not None and kind.p95_ms > P95_TARGET_MS
        ]
        if slow:
            missed.append(f"p95 above {P95_TARGET_MS} ms: {', '.join(slow)}")
        return missed


P95_TARGET_MS = 300
FLOOD_CPU_NAMES = {
    "web": "gunicorn",
    "celery": "Celery's worker",
    "beat": "beat",
    "locust": "Locust",
    "database": "PostgreSQL",
}
# The sides of the CPU table: FLOOD_CPU_NAMES', then the rest of the machine's busy time.
CPU_SIDES = ("web", "celery", "beat", "database", "locust")


def milliseconds(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f} ms"


def report(before: Result, after: Result) -> Section:
    from portal import gunicorn_conf

    section = Section(
        title=f"Load: {USERS} people for {DURATION_S} s, and a flood",
        intro=(
            "The stack of docker-compose.yml (gunicorn as portal/gunicorn_conf.py sets it up: "
            f"{gunicorn_conf.workers} {gunicorn_conf.worker_class} workers here), on "
            "PostgreSQL with a Celery worker and beat running admission every second and the "
            "simulator cluster (96 GPUs, 60× sped up), twice side by side in one run, each on "
            f"a database of its own, seeded alike: *before*, the code of main at "
            f"{BEFORE_REF[:7]}; *after*, this checkout. They take turns, so that a drift in "
            "the machine's speed weighs on both: the people on before, then on after, then "
            f"the flood in rounds of {FLOOD_ROUND_S} s ({', '.join(FLOOD_ORDER)}); while one "
            "is measured, the other's Celery worker and beat are paused (SIGSTOP), so each "
            "has the machine to itself, and a stack resumed catches up for "
            f"{RESUME_S} s first. Locust on "
            f"127.0.0.1. *People*: `--users {USERS} --spawn-rate "
            f"{SPAWN_RATE} --run-time {DURATION_S}s`, each person arriving at a moment of "
            "their second (Locust starts a second's 20 at one instant), one after the other: "
            "40 researchers' scripts submit and read "
            "runs with API tokens, 50 researchers and 10 tenant admins of 4 tenants log in "
            "and browse, 2 to 8 s apart (from their log-in's home page too), a run page or "
            "the run list they open polling its "
            "live parts as the browser does (twice, at the page's own interval: 3 s and 5 s) "
            "before they move on, and 2 probes ask `/healthz` every second; their pace sets "
            "the requests a second. *Flood*: "
            f"{FLOOD_USERS} of the same people (4 scripts, 5 researchers, a tenant admin) "
            f"without any pause for {FLOOD_S} s in all: the throughput of the stack at its "
            "limit. "
            f"*Alone*: one such client for {BASELINE_S} s on the after stack before its load: "
            "what a request costs with nobody else around (`bench/load.py`, "
            "`bench/locustfile.py`). Times are Locust's (whole milliseconds, coarser above "
            "100 ms)."
        ),
        columns=["request", "people's requests (before / after)", "failed", "p50 before",
                 "p95 before", "p50 after", "p95 after", "alone: p50", "alone: p95"],
    )  # fmt: skip
    names = sorted(set(before.loaded) | set(after.loaded) - {"Aggregated"})
    names = [name for name in names if name != "Aggregated"] + ["Aggregated"]
    for name in names:
        old, new = before.loaded.get(name), after.loaded.get(name)
        alone = after.baseline.get(name)
        section.rows.append(
            [
                "all requests" if name == "Aggregated" else name,
                f"{old.requests if old else 0:,} / {new.requests if new else 0:,}",
                f"{old.failures if old else 0:,} / {new.failures if new else 0:,}",
                milliseconds(old.p50_ms if old else None),
                milliseconds(old.p95_ms if old else None),
                milliseconds(new.p50_ms if new else None),
                milliseconds(new.p95_ms if new else None),
                milliseconds(alone.p50_ms if alone else None),
                milliseconds(alone.p95_ms if alone else None),
            ]
        )
    for result in (before, after):
        admission = result.admission
        outcomes = result.outcomes
        requests = max(1, result.loaded["Aggregated"].requests)
        flood = result.flood["Aggregated"]
        section.notes += [
            f"*{result.stack.label.capitalize()}*: people {result.people_rate():,.1f} "
            f"requests/s over {result.seconds:,.0f} s; flood {result.throughput():,.1f} "
            f"requests/s over {result.flood_seconds:,.0f} s (slowest round: p50 "
            f"{milliseconds(flood.p50_ms)}, p95 {milliseconds(flood.p95_ms)}; CPU a request: "
            + ", ".join(
                f"{FLOOD_CPU_NAMES[name]} {1000 * seconds / max(1, flood.requests):,.1f} ms"
                for name, seconds in result.flood_cpu.items()
                if name in FLOOD_CPU_NAMES
            )
            + f"); 5xx answers: {result.errors_5xx}; failed requests by message: "
            + (", ".join(f"{key} ×{n}" for key, n in sorted(result.failures.items())) or "none")
            + f". Admission checked {admission.samples} times: "
            + (
                "no pool above its capacity, no tenant above its guarantee + borrow limit"
                if not admission.violations
                else "; ".join(admission.violations)
            )
            + f" (at most {admission.peak_held} of 96 GPUs held). Runs submitted "
            f"{outcomes['submitted']:,}: admitted {outcomes['admitted']:,}, started "
            f"{outcomes['started']:,}, succeeded {outcomes['succeeded']:,}, preempted "
            f"{outcomes['preempted']:,}. CPU under the people's load: gunicorn "
            f"{result.cpu['web']:,.1f} s ({1000 * result.cpu['web'] / requests:,.1f} ms a "
            f"request), PostgreSQL {result.cpu['database']:,.1f} s "
            f"({1000 * result.cpu['database'] / requests:,.1f} ms a request, Celery's queries "
            f"included), Celery's worker {result.cpu['celery']:,.1f} s. Load average at the "
            "end: "
            + " / ".join(f"{value:.1f}" for value in result.load_average)
            + " (1 / 5 / 15 min).",
        ]
    section.notes += [
        f"Flood throughput, after ÷ before: {after.throughput() / before.throughput():.2f}×. "
        f"One client alone managed {after.baseline['Aggregated'].per_second:,.1f} requests/s.",
    ]
    return section


def cpu_report(before: Result, after: Result) -> Section:
    """The CPU each side used in each phase (issue 39, point 4): whether background work
    took the cores from the requests, and what is left of the machine for other work."""
    section = Section(
        title="Load: the CPU each side used",
        intro=(
            "CPU seconds (user + system, from /proc) of each stack's processes while Locust "
            "ran, with the cores that makes on average over the phase: gunicorn (its arbiter "
            "and workers), Celery's worker (with its pool) and beat, the PostgreSQL backends "
            "of the stack's database (Celery's queries included) and Locust; *the rest* is "
            "the machine's other busy time meanwhile (/proc/stat: the other stack's gunicorn, "
            "Redis, other work on the machine). The worker and beat of the after stack lower "
            "their own CPU priority at start (`GANTRY_WORKER_NICE`, portal/process_priority.py), "
            "the before code's do not: their niceness is in the last column."
        ),
        columns=["phase", "seconds", *(FLOOD_CPU_NAMES[side] for side in CPU_SIDES),
                 "the rest", "niceness: gunicorn / worker / beat"],
    )  # fmt: skip
    for result in (before, after):
        phases = (
            ("people", result.cpu, result.seconds),
            ("flood", result.flood_cpu, result.flood_seconds),
        )
        for phase, cpu, seconds in phases:
            ours = sum(cpu.get(side, 0.0) for side in CPU_SIDES)
            rest = max(0.0, cpu.get("machine", 0.0) - ours)
            section.rows.append(
                [
                    f"{phase}, {result.stack.label}",
                    f"{seconds:,.0f} s",
                    *(_cpu_cell(cpu.get(side, 0.0), seconds) for side in CPU_SIDES),
                    _cpu_cell(rest, seconds),
                    " / ".join(
                        str(result.niceness.get(name, "?"))
                        for name in ("gunicorn", "worker", "beat")
                    ),
                ]
            )
    return section


def _cpu_cell(used: float, seconds: float) -> str:
    return f"{used:,.1f} s ({used / max(seconds, 1e-9):,.2f} cores)"
