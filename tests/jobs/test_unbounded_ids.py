"""Queries over sets that grow with the data bind them as one parameter (``__among``,
``rows_update``), never one parameter per row: PostgreSQL refuses a statement with more than
65,535. Each selector and service that takes such a set is called here with 70,000 ids.

The runs are copies of one submitted run made by a single INSERT … SELECT over
generate_series, so a test seeds 70,000 of them in about a second."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from clusters.backends.base import JobRef
from clusters.backends.simulator import SimulatorBackend
from clusters.models import ClusterNode, SimulatedJob
from clusters.services import cluster_refresh_inventory
from core.bulk import rows_update
from jobs.models import Attempt, AttemptState, Run, RunState
from jobs.selectors.estimates import run_start_estimate
from jobs.selectors.runs import runs_place_in_line, runs_usage
from jobs.services.submission import run_submit
from telemetry.models import GpuMinute
from telemetry.policy import idle_streaks
from tenants.lookups import among_sql
from tests import REPOSITORY
from tests.conftest import experiment_input

MANY = 70_000  # past PostgreSQL's 65,535 parameters of one statement


def _copies_of(run: Run, *, count: int) -> list[int]:
    """``count`` - 1 copies of ``run`` (one per second after it, queued, no form key) and
    ``run`` itself: the ids in submission order."""
    fields = [f for f in Run._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    values = ", ".join(
        "r.submitted_at + n * interval '1 second'"
        if f.name == "submitted_at"
        else "NULL"
        if f.name == "submission_key"
        else f"r.{connection.ops.quote_name(f.column)}"
        for f in fields
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Run._meta.db_table} ({columns}) "  # noqa: S608
            f"SELECT {values} FROM {Run._meta.db_table} r, generate_series(1, %s) AS n "
            "WHERE r.id = %s",
            [count - 1, run.pk],
        )
    return list(Run.objects.order_by("submitted_at", "id").values_list("pk", flat=True))


@pytest.fixture
def many_runs(world) -> list[int]:
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    ids = _copies_of(run, count=MANY)
    assert len(ids) == MANY
    return ids


def test_among_matches_exactly_the_listed_rows_of_70000(world, many_runs):
    evens = many_runs[::2]
    assert Run.objects.filter(pk__among=many_runs).count() == MANY
    assert set(Run.objects.filter(pk__among=evens).values_list("pk", flat=True)) == set(evens)
    assert Run.objects.exclude(pk__among=evens).count() == MANY - len(evens)
    # Through a relation, with strings, and with the list empty (nothing matches, as __in).
    assert Run.objects.filter(tenant__among=[world.nlp.pk, world.vision.pk]).count() == MANY
    assert Run.objects.filter(state__among=[RunState.QUEUED] * MANY).count() == MANY
    assert Run.objects.filter(pk__among=[]).count() == 0
    assert Run.objects.exclude(pk__among=[]).count() == MANY
    sql, param = among_sql(connection.vendor, "id", evens)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {Run._meta.db_table} WHERE {sql}", [param])  # noqa: S608
        assert cursor.fetchone() == (len(evens),)


def test_places_in_line_of_70000_queued_runs(world, many_runs):
    runs = list(
        Run.objects.filter(pk__among=many_runs)
        .order_by("submitted_at", "id")
        .only("flavor_id", "state")
    )
    runs_place_in_line(runs)
    assert [run.queue_position for run in runs] == list(range(1, MANY + 1))


def test_usage_of_70000_runs(world, many_runs):
    now = timezone.now()
    first, last = many_runs[0], many_runs[-1]
    for run_id, hours in ((first, 2), (last, 3)):
        Attempt.objects.create(
            run_id=run_id,
            number=1,
            cluster=world.cluster,
            state=AttemptState.SUCCEEDED,
            started_at=now - timedelta(hours=hours + 1),
            finished_at=now - timedelta(hours=1),
        )
    runs = list(Run.objects.filter(pk__among=many_runs))
    runs_usage(runs, now=now)
    hours = {run.pk: run.gpu_hours for run in runs}
    assert len(hours) == MANY
    assert hours[first] == 2 * 2  # 2 GPUs for 2 hours
    assert hours[last] == 2 * 3
    assert sum(1 for value in hours.values() if value == 0) == MANY - 2


def test_rows_update_of_70000_runs_writes_each_value_and_skips_changed_rows(world, many_runs):
    at = timezone.now().replace(microsecond=0)
    Run.objects.filter(pk=many_runs[1]).update(state=RunState.CANCELLED)
    rows_update(
        Run,
        ["wait_message", "start_nodes", "start_full_limits_at"],
        [(pk, f"wait {pk}", ["sim-1", f"n{pk}"], at + timedelta(seconds=pk)) for pk in many_runs],
        state=RunState.QUEUED,
    )
    stored = {
        pk: (message, nodes, latest)
        for pk, message, nodes, latest in Run.objects.values_list(
            "pk", "wait_message", "start_nodes", "start_full_limits_at"
        )
    }
    skipped = many_runs[1]
    assert stored.pop(skipped) == ("", [], None)  # cancelled meanwhile: left as it was
    assert stored == {
        pk: (f"wait {pk}", ["sim-1", f"n{pk}"], at + timedelta(seconds=pk))
        for pk in many_runs
        if pk != skipped
    }


def test_start_estimate_behind_70000_runs_names_only_its_tenants_own(world, many_runs):
    nlp = experiment_input(world, tenant="nlp", project="llm")
    ahead = run_submit(user=world.researcher_b, data=nlp)
    run = run_submit(user=world.researcher_b, data=nlp)
    run.start_behind = [*many_runs, ahead.pk]  # vision's runs, which nlp sees no id of
    run.start_estimated_at = timezone.now()
    estimate = run_start_estimate(run=run)
    assert estimate is not None
    assert estimate.behind == (ahead.pk,)
    assert estimate.behind_elsewhere == MANY


def test_simulator_sync_of_70000_jobs(world):
    now = timezone.now()
    SimulatedJob.objects.bulk_create(
        SimulatedJob(
            cluster=world.cluster,
            name=f"gantry-{n}",
            flavor="a100-80gb",
            nodes=1,
            gpus_per_node=1,
            max_runtime_s=60,
            state="SUCCEEDED" if n % 2 else "FAILED",
            submitted_at=now,
            finished_at=now,
            exit_code=n % 2 - 1,
        )
        for n in range(MANY)
    )
    statuses = SimulatorBackend(world.cluster).sync(
        [JobRef(f"gantry-{n}", "") for n in range(MANY + 1)]  # the last one is unknown
    )
    assert len(statuses) == MANY
    assert "gantry-70000" not in statuses
    assert {statuses["gantry-1"].exit_code, statuses["gantry-2"].exit_code} == {0, -1}


def test_idle_streaks_of_70000_attempts(world, many_runs):
    now = timezone.now().replace(second=0, microsecond=0)
    attempt = Attempt.objects.create(
        run_id=many_runs[0], number=1, cluster=world.cluster, state=AttemptState.RUNNING
    )
    GpuMinute.objects.bulk_create(
        GpuMinute(
            attempt=attempt, host="n1", gpu=0, minute=now - timedelta(minutes=m), activity=0.0
        )
        for m in range(3)
    )
    streaks = idle_streaks(attempt_ids=[attempt.pk, *range(-MANY + 1, 0)], now=now, limit=10)
    assert list(streaks) == [attempt.pk]


def test_inventory_of_9000_nodes_is_rewritten_when_every_node_changes(world):
    """bulk_update bound about 17 parameters per node: 9,000 nodes failed."""
    settings = {"speedup": 1, "pools": [{"flavor": "a100-80gb", "nodes": 9000, "gpus_per_node": 8}]}
    world.cluster.settings = settings
    world.cluster.save(update_fields=["settings"])
    cluster_refresh_inventory(cluster=world.cluster)
    settings["pools"][0]["gpus_per_node"] = 4
    world.cluster.save(update_fields=["settings"])
    cluster_refresh_inventory(cluster=world.cluster)
    gpus = list(ClusterNode.objects.filter(cluster=world.cluster).values_list("gpus", flat=True))
    assert gpus == [4] * 9000


SQLITE_SCRIPT = """
from django.core.management import call_command
from django.db import connection

from core.bulk import rows_update
from tenants.lookups import among_sql
from tenants.models import Tenant

call_command("migrate", verbosity=0)
Tenant.objects.bulk_create(Tenant(slug=f"t{n}", name=f"T {n}") for n in range(70_000))
ids = list(Tenant.objects.order_by("pk").values_list("pk", flat=True))
evens = ids[::2]
print(connection.vendor, len(ids))
print(
    Tenant.objects.filter(pk__among=evens).count(),
    Tenant.objects.exclude(pk__among=evens).count(),
)
print(Tenant.objects.filter(slug__among=[f"t{n}" for n in range(0, 70_000, 7)]).count())
wanted = [(pk, f"renamed {pk}", pk % 3 > 0) for pk in ids]
rows_update(Tenant, ["name", "active"], wanted, active=True)
rows = list(Tenant.objects.order_by("pk").values_list("pk", "name", "active"))
print(rows == wanted)
sql, param = among_sql(connection.vendor, "id", evens)
with connection.cursor() as cursor:
    cursor.execute(f"SELECT count(*) FROM tenants_tenant WHERE {sql}", [param])
    print(cursor.fetchone()[0])
"""


def test_among_and_rows_update_of_70000_ids_on_sqlite(tmp_path):
    """The embedded default runs on SQLite, which has no arrays (and refuses more than
    32,766 parameters): the same sets go through json_each there. Run as ``make run`` runs
    Gantry, in a process of its own on a fresh data directory."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env |= {"GANTRY_EMBEDDED": "1", "GANTRY_DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", SQLITE_SCRIPT],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "sqlite 70000",
        "35000 35000",
        "10000",
        "True",
        "35000",
    ]
