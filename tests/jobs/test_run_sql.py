"""A run and its attempts in one SQL statement each (jobs/selectors/run_sql.py) are what the
ORM built before (kept below as ``orm_run`` and ``orm_attempts``, the queries they
replaced): the same run or none for every reader, the same columns loaded of the run and of
each related row, with whole rows and with the API's columns, and the same attempts with
their clusters, in the same order.
"""

import pytest
from django.db import connection
from django.db.models import F, Model, TextField, Value
from django.db.models.functions import Coalesce, NullIf
from django.test.utils import CaptureQueriesContext

from jobs.access import run_list_viewable
from jobs.models import Attempt, AttemptState, Run, RunEvent, RunState
from jobs.selectors.runs import run_attempts, run_events, run_get_viewable, runs_place_in_line
from jobs.serializers.runs import RUN_DETAIL_COLUMNS, RunDetailSerializer, RunEventSerializer
from tenants.access import is_platform_admin, tenant_roles
from tenants.models import Tenant
from tests.jobs.test_lifecycle import submit
from tests.jobs.test_run_rows import runs_in_every_state

pytestmark = pytest.mark.django_db

PERSONAS = ("researcher_a", "researcher_b", "tenant_admin_a", "finance", "platform_admin")
RELATIONS = (
    "tenant",
    "flavor",
    "cluster",
    "submitted_by",
    "experiment",
    "experiment__project",
    "experiment__image",
)


def orm_run(*, user, run_id: int, columns=()) -> Run:
    """The run as the ORM selected it before the statement: its reference."""
    runs = run_list_viewable(user=user)
    run = (runs.only(*columns) if columns else runs.select_related("experiment__image")).get(
        pk=run_id
    )
    if run.state == RunState.QUEUED:
        runs_place_in_line([run])
    return run


def orm_attempts(*, run: Run) -> list[Attempt]:
    return list(run.attempts.select_related("cluster").order_by("number"))


def orm_events(*, run: Run, user) -> list[RunEvent]:
    shown = (
        Coalesce(NullIf("admin_detail", Value("")), "message", output_field=TextField())
        if is_platform_admin(user)
        else F("message")
    )
    return list(
        run.events.select_related("actor").annotate(shown_message=shown).order_by("at", "id")
    )


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


def related(run: Run, relation: str) -> tuple[bool, dict[str, object] | None]:
    """Whether the relation is loaded with the run, and the columns loaded of it."""
    holder: Model = run
    *path, name = relation.split("__")
    for step in path:
        holder = getattr(holder, step)
    field = holder._meta.get_field(name)
    if not field.is_cached(holder):  # type: ignore[union-attr]
        return False, None
    return True, loaded(getattr(holder, name))


def everything_of(run: Run) -> dict[str, object]:
    return {
        "run": loaded(run),
        "queue_position": getattr(run, "queue_position", None),
        **{relation: related(run, relation) for relation in RELATIONS},
    }


@pytest.fixture
def runs_of_three_tenants(world):
    """Runs in every state in vision, one in nlp, and one in a tenant no longer active."""
    runs_in_every_state(world)
    submit(world, user=world.researcher_b, tenant="nlp", project="llm")
    Run.objects.filter(tenant=world.nlp).update(cluster=world.cluster)
    closed = submit(world, name="of a closed tenant")
    closed_tenant = Tenant.objects.create(slug="closed", name="closed", active=False)
    Run.objects.filter(pk=closed.pk).update(tenant=closed_tenant)
    return world


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("columns", [(), RUN_DETAIL_COLUMNS], ids=["whole rows", "api columns"])
def test_the_run_is_the_orm_run_for_every_reader(runs_of_three_tenants, persona, columns):
    user = getattr(runs_of_three_tenants, persona)
    run_ids = [*Run.objects.values_list("pk", flat=True), 999_999]
    found = 0
    for run_id in run_ids:
        try:
            old = orm_run(user=user, run_id=run_id, columns=columns)
        except Run.DoesNotExist:
            with pytest.raises(Run.DoesNotExist):
                run_get_viewable(user=user, run_id=run_id, columns=columns)
            continue
        new = run_get_viewable(user=user, run_id=run_id, columns=columns)
        assert everything_of(new) == everything_of(old)
        if columns:
            assert RunDetailSerializer(new).data == RunDetailSerializer(old).data
        found += 1
    assert found  # every reader reads some of the runs


def test_a_user_without_tenants_asks_nothing_of_the_runs(runs_of_three_tenants):
    from tests.conftest import make_user

    nobody = make_user("nobody")
    run = Run.objects.first()
    assert run is not None
    tenant_roles(nobody)  # as every page loads them
    with CaptureQueriesContext(connection) as queries, pytest.raises(Run.DoesNotExist):
        run_get_viewable(user=nobody, run_id=run.pk)
    assert len(queries) == 0


def test_the_run_is_one_query_and_a_queued_one_two(runs_of_three_tenants):
    user = runs_of_three_tenants.researcher_a
    tenant_roles(user)
    for run in Run.objects.filter(tenant=runs_of_three_tenants.vision):
        with CaptureQueriesContext(connection) as queries:
            shown = run_get_viewable(user=user, run_id=run.pk)
            read = [shown.tenant.slug, shown.experiment.image.digest, shown.experiment.project]
            read += [shown.submitted_by.username, shown.flavor.slug, shown.cluster]
        assert len(queries) == (2 if run.state == RunState.QUEUED else 1), read


def test_the_attempts_are_the_orm_attempts_with_their_clusters(runs_of_three_tenants, world):
    other = type(world.cluster).objects.create(name="sim-2", backend=world.cluster.backend)
    run = Run.objects.filter(tenant=world.vision).order_by("pk").last()
    assert run is not None
    for number, cluster in ((2, other), (1, world.cluster), (3, other)):  # out of order
        Attempt.objects.create(
            run=run, number=number, cluster=cluster, state=AttemptState.FAILED, rendered_spec="{}"
        )
    for shown in Run.objects.all():
        old, new = orm_attempts(run=shown), run_attempts(run=shown)
        assert [(loaded(a), loaded(a.cluster)) for a in new] == [
            (loaded(a), loaded(a.cluster)) for a in old
        ]
        assert all(attempt.run is shown for attempt in new)  # no query for the run
    assert [a.number for a in run_attempts(run=run)] == [1, 2, 3]
    with CaptureQueriesContext(connection) as queries:
        names = [attempt.cluster.name for attempt in run_attempts(run=run)]
    assert (names, len(queries)) == (["sim-1", "sim-2", "sim-2"], 1)


@pytest.mark.parametrize("persona", PERSONAS)
def test_the_events_are_the_orm_events_as_each_reader_reads_them(runs_of_three_tenants, persona):
    world = runs_of_three_tenants
    user = getattr(world, persona)
    run = Run.objects.filter(tenant=world.vision).order_by("pk").first()
    assert run is not None
    same_instant = RunEvent.objects.filter(run=run).first()
    assert same_instant is not None
    for actor, detail in (
        (world.tenant_admin_a, "moved for run 7 of nlp"),
        (None, ""),
        (None, "x"),
    ):
        event = RunEvent.objects.create(
            run=run,
            to_state="QUEUED",
            reason="X",
            message="neutral",
            admin_detail=detail,
            actor=actor,
        )
        RunEvent.objects.filter(pk=event.pk).update(at=same_instant.at)  # the id breaks the tie
    for shown in Run.objects.all():
        old, new = orm_events(run=shown, user=user), run_events(run=shown, user=user)
        assert [(loaded(e), e.shown_message, loaded(e.actor)) for e in new] == [
            (loaded(e), e.shown_message, loaded(e.actor)) for e in old
        ]
        assert RunEventSerializer(new, many=True).data == RunEventSerializer(old, many=True).data
        assert all(event.run is shown for event in new)
    with CaptureQueriesContext(connection) as queries:
        actors = [event.actor and event.actor.username for event in run_events(run=run, user=user)]
    assert (len(queries), actors.count("tara")) == (1, 1)
