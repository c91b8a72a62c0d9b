"""Moving the cluster, node, cluster-flavor and simulated-job models from ``jobs`` to the
``clusters`` app changed Django's state only: a database made before the move, with runs in
every state on its clusters, keeps every row and every id in the same tables and reads them
through ``clusters.models`` afterwards; an empty database migrates forwards to the same
schema; and migrating forwards again changes nothing."""

from datetime import UTC, datetime

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from clusters.models import Cluster, ClusterFlavor, ClusterNode, SimulatedJob
from jobs.models import Attempt, Run

BEFORE_MOVE = [("jobs", "0016_i31_wait_reasons_and_start_estimates"), ("clusters", None)]
MOVE = [
    ("clusters", "0001_initial"),
    ("finance", "0003_s3_cluster_moved_to_clusters"),
    ("telemetry", "0005_s3_cluster_moved_to_clusters"),
    ("jobs", "0017_s3_move_to_clusters"),
]
MOVED_TABLES = ("jobs_cluster", "jobs_clusternode", "jobs_clusterflavor", "jobs_simulatedjob")
MOVED_MODELS = ("cluster", "clusternode", "clusterflavor", "simulatedjob")
AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
# A run in every state, and the attempt (if any) it has on the cluster.
RUN_STATES = {
    "QUEUED": None,
    "ADMITTED": None,
    "SUBMITTING": "SUBMITTING",
    "PENDING": "PENDING",
    "RUNNING": "RUNNING",
    "SUCCEEDED": "SUCCEEDED",
    "FAILED": "FAILED",
    "CANCELLED": "CANCELLED",
    "PREEMPTED": "PREEMPTED",
}


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor


def plan_to(targets) -> list:
    executor = MigrationExecutor(connection)
    return executor.migration_plan(targets)


def table_rows(table: str) -> list[dict]:
    """Every row of ``table`` by id, as column → value. Later migrations may add columns
    (compare only the columns both sides have: ``same_columns``)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)} ORDER BY id")  # noqa: S608
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def same_columns(rows: list[dict], like: list[dict]) -> list[dict]:
    """``rows`` with only the columns the rows of ``like`` have."""
    columns = set(like[0]) if like else set()
    return [{name: value for name, value in row.items() if name in columns} for row in rows]


@pytest.fixture
def before_move(transactional_db):
    """The database as it was before the move; migrated forward again afterwards whatever
    the test did, so the tests after it find the schema they expect."""
    executor = migrate(BEFORE_MOVE)
    yield executor.loader.project_state(BEFORE_MOVE[0]).apps
    migrate(latest())


def old_world(apps, world) -> dict:
    """Rows of every moved table and runs and attempts on them, written through the models
    as they were in ``jobs``."""
    old_cluster = apps.get_model("jobs", "Cluster")
    old_node = apps.get_model("jobs", "ClusterNode")
    old_flavor = apps.get_model("jobs", "ClusterFlavor")
    old_simjob = apps.get_model("jobs", "SimulatedJob")
    experiment_model = apps.get_model("jobs", "Experiment")
    run_model = apps.get_model("jobs", "Run")
    attempt_model = apps.get_model("jobs", "Attempt")
    slurm = old_cluster.objects.create(
        name="old-slurm",
        backend="slurm",
        settings={"partition": "gpu"},
        topology_levels=["rack"],
        outside_claims={"a100": 3},
    )
    node = old_node.objects.create(
        cluster=slurm,
        name="gpu-01",
        flavor_id=world.a100.pk,
        gpus=8,
        gpus_used=5,
        gpus_used_by_gantry=2,
        path=["rack-1"],
        updated_at=AT,
    )
    flavor = old_flavor.objects.create(
        cluster=slurm, flavor_id=world.a100.pk, nodes=1, gpus_per_node=8, gpus=8
    )
    simjob = old_simjob.objects.create(
        cluster_id=world.cluster.pk,
        name="sim-old-1",
        flavor="a100",
        nodes=1,
        gpus_per_node=2,
        profile={"steps": 10},
        max_runtime_s=600,
        state="RUNNING",
        allocation={"sim-node-0": [0, 1]},
        submitted_at=AT,
        started_at=AT,
    )
    experiment = experiment_model.objects.create(
        tenant_id=world.vision.pk,
        project_id=world.vision_project.pk,
        owner_id=world.researcher_a.pk,
        name="before the move",
        image_id=world.image.pk,
        image_reference=f"{world.image.repository}@{world.image.digest}",
        command="python train.py",
        code_commit="0123456789abcdef0123456789abcdef01234567",
        flavor_id=world.a100.pk,
        nodes=1,
        gpus_per_node=2,
        gantry_version="0.1",
    )
    runs, attempts = {}, {}
    for state, attempt_state in RUN_STATES.items():
        cluster = slurm if state != "QUEUED" else None
        run = run_model.objects.create(
            experiment=experiment,
            tenant_id=world.vision.pk,
            flavor_id=world.a100.pk,
            gpus=2,
            submitted_by_id=world.researcher_a.pk,
            cluster=cluster,
            state=state,
        )
        runs[state] = run.pk
        if attempt_state is not None:
            attempt = attempt_model.objects.create(
                run=run, number=1, cluster=slurm, state=attempt_state
            )
            attempts[state] = attempt.pk
    return {
        "slurm": slurm.pk,
        "node": node.pk,
        "flavor": flavor.pk,
        "simjob": simjob.pk,
        "runs": runs,
        "attempts": attempts,
    }


def test_the_move_keeps_every_row_and_id_of_a_database_with_live_runs(world, before_move):
    # Given a database before the move: clusters, nodes, flavors, a simulated job, runs in
    # every state on a cluster and their attempts, and the content types of the moved models
    ids = old_world(before_move, world)
    tables_before = {table: table_rows(table) for table in (*MOVED_TABLES, "jobs_run")}
    attempts_before = table_rows("jobs_attempt")
    content_types = {
        model: ContentType.objects.get(app_label="jobs", model=model).pk for model in MOVED_MODELS
    }

    # When it is migrated forwards over the move
    migrate(latest())

    # Then every table holds the same rows with the same ids
    assert {
        table: same_columns(table_rows(table), rows) for table, rows in tables_before.items()
    } == tables_before
    assert same_columns(table_rows("jobs_attempt"), attempts_before) == attempts_before
    # and the new models read them, as do the runs' and attempts' foreign keys
    slurm = Cluster.objects.get(pk=ids["slurm"])
    assert (slurm.name, slurm.backend, slurm.settings, slurm.outside_claims) == (
        "old-slurm",
        Cluster.Backend.SLURM,
        {"partition": "gpu"},
        {"a100": 3},
    )
    node = ClusterNode.objects.get(pk=ids["node"])
    assert (node.cluster, node.name, node.gpus, node.gpus_outside, node.path) == (
        slurm,
        "gpu-01",
        8,
        3,
        ["rack-1"],
    )
    assert [n.pk for n in slurm.nodes.all()] == [ids["node"]]
    assert [f.pk for f in slurm.flavors.all()] == [ids["flavor"]]
    assert ClusterFlavor.objects.get(pk=ids["flavor"]).flavor == world.a100
    simjob = SimulatedJob.objects.get(pk=ids["simjob"])
    assert (simjob.cluster, simjob.name, simjob.allocation) == (
        world.cluster,
        "sim-old-1",
        {"sim-node-0": [0, 1]},
    )
    runs = {run.state: (run.pk, run.cluster_id) for run in Run.objects.filter(tenant=world.vision)}
    assert runs == {
        state: (ids["runs"][state], None if state == "QUEUED" else ids["slurm"])
        for state in RUN_STATES
    }
    assert sorted(slurm.runs.values_list("pk", flat=True)) == sorted(
        pk for state, pk in ids["runs"].items() if state != "QUEUED"
    )
    assert {a.pk: (a.run_id, a.state) for a in slurm.attempts.all()} == {
        ids["attempts"][state]: (ids["runs"][state], state) for state in ids["attempts"]
    }
    assert Attempt.objects.get(pk=ids["attempts"]["RUNNING"]).cluster == slurm
    # and the content types (what permissions and the admin log point to) are the same rows,
    # now of the clusters app
    ContentType.objects.clear_cache()
    assert {
        model._meta.model_name: ContentType.objects.get_for_model(model).pk
        for model in (Cluster, ClusterNode, ClusterFlavor, SimulatedJob)
    } == content_types
    assert not ContentType.objects.filter(app_label="jobs", model__in=MOVED_MODELS).exists()
    assert {m._meta.db_table for m in (Cluster, ClusterNode, ClusterFlavor, SimulatedJob)} == set(
        MOVED_TABLES
    )


def test_migrating_forwards_again_changes_nothing(world, before_move):
    # Given a database before the move, migrated over it
    ids = old_world(before_move, world)
    migrate(latest())
    tables = {table: table_rows(table) for table in (*MOVED_TABLES, "jobs_run", "jobs_attempt")}
    applied = set(MigrationRecorder(connection).applied_migrations())

    # When it is migrated forwards a second time
    assert plan_to(latest()) == []
    migrate(latest())

    # Then nothing is applied and no row changes
    assert set(MigrationRecorder(connection).applied_migrations()) == applied
    assert {table: table_rows(table) for table in tables} == tables
    assert Cluster.objects.get(pk=ids["slurm"]).name == "old-slurm"


def test_the_move_back_and_forth_keeps_the_rows_and_content_types(world, before_move):
    # Given a database migrated over the move
    ids = old_world(before_move, world)
    migrate(latest())
    tables = {table: table_rows(table) for table in (*MOVED_TABLES, "jobs_run", "jobs_attempt")}
    content_type = ContentType.objects.get(app_label="clusters", model="cluster").pk

    # When the move is undone, then applied again
    migrate(BEFORE_MOVE)
    assert ContentType.objects.get(app_label="jobs", model="cluster").pk == content_type
    migrate(latest())

    # Then the rows, their ids and the content type are those of before
    assert {table: table_rows(table) for table in tables} == tables
    assert ContentType.objects.get(app_label="clusters", model="cluster").pk == content_type
    assert Cluster.objects.get(pk=ids["slurm"]).nodes.get().pk == ids["node"]


def test_the_move_runs_no_sql(db):
    # The move's migrations only change Django's state: none of them has a statement to run
    # (sqlmigrate prints nothing but its transaction for each).
    executor = MigrationExecutor(connection)
    graph = executor.loader.graph
    for app_label, name in MOVE:
        migration = graph.nodes[(app_label, name)]
        state = executor.loader.project_state((app_label, name), at_end=False)
        with connection.schema_editor(collect_sql=True, atomic=False) as editor:
            migration.apply(state, editor, collect_sql=True)
        statements = [s for s in editor.collected_sql if not s.startswith("--")]
        assert statements == [], (app_label, name)


def test_an_empty_database_migrates_forwards_to_the_moved_models(transactional_db):
    # Given an empty database: every app migrated back to nothing
    executor = MigrationExecutor(connection)
    apps_with_migrations = sorted({app for app, _ in executor.loader.graph.leaf_nodes()})
    migrate([(app, None) for app in apps_with_migrations])
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
    assert tables & set(MOVED_TABLES) == set()

    # When it is migrated forwards
    migrate(latest())

    # Then the moved models work on their old tables, with runs and attempts on them
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
    assert set(MOVED_TABLES) <= tables
    assert plan_to(latest()) == []
    cluster = Cluster.objects.create(name="fresh", backend=Cluster.Backend.SIMULATOR)
    row = table_rows("jobs_cluster")[0]
    assert (row["id"], row["name"], row["backend"]) == (cluster.pk, "fresh", "simulator")
