"""One run with its related rows, a run's attempts with their clusters and its events with
their actors, each in one SQL statement, built into the model instances the ORM's
``select_related`` would build, with the same columns loaded.

The run page, its 5-second poll and the API's run detail read a run with its tenant,
flavor, cluster, submitter, experiment, project (and image), its attempts and its events on
every request; through the ORM, compiling those queries (the run's joins seven tables) cost
more CPU than anything else those requests do. Here the SQL text depends only on the shape
of the request (which columns, how many readable tenants, whether the reader sees admin
detail), so it is built once per shape; the values are always parameters. Plain SQL that
PostgreSQL and SQLite both run (tests/jobs/test_run_sql.py holds each to the ORM query it
replaced, on both).
"""

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, cast

from django.db import connection
from django.db.models import Field, ForeignKey

from jobs.models import Attempt, Run, RunEvent
from jobs.selectors.sql import Loaded, Statement, related_model
from jobs.selectors.sql import field_of as _field
from jobs.selectors.sql import quoted_column as _quoted
from tenants.access import tenant_ids_sql

# The relations read with a run (as select_related names them: those of run_list_viewable,
# and the experiment's image when whole rows are loaded), each with the alias of its table.
_ALIASES = {
    "": "r",
    "tenant": "t",
    "flavor": "f",
    "cluster": "c",
    "submitted_by": "u",
    "experiment": "e",
    "experiment__project": "p",
    "experiment__image": "i",
}
_WITHOUT_COLUMNS = tuple(_ALIASES)
_WITH_COLUMNS = tuple(relation for relation in _ALIASES if relation != "experiment__image")


def run_get_sql(
    *, run_id: int, tenant_ids: Sequence[int] | None, columns: Sequence[str] = ()
) -> Run | None:
    """The run ``run_id`` if it is of an active tenant among ``tenant_ids`` (any active
    tenant for None), else None: ``run_list_viewable``'s ``get(pk=run_id)`` with
    ``only(*columns)`` if columns are given, else with ``select_related("experiment__image")``
    (whole rows of the run and its seven related rows), in one statement."""
    if tenant_ids is not None and not tenant_ids:
        return None
    scope, scope_params = tenant_ids_sql(
        tenant_ids=None if tenant_ids is None else list(tenant_ids), tenant="t"
    )
    statement = _run_statement(vendor=connection.vendor, columns=tuple(columns), scope=scope)
    with connection.cursor() as db_cursor:
        db_cursor.execute(statement.sql, [run_id, *scope_params])
        row = db_cursor.fetchone()
    if row is None:
        return None
    db = connection.alias
    built = {
        relation: None if row[part.start] is None else statement.readers[relation](row, db)
        for relation, part in statement.loaded.items()
    }
    run = built.pop("")
    assert isinstance(run, Run)
    for relation, instance in sorted(built.items(), key=lambda item: item[0].count("__")):
        *path, name = relation.split("__")
        holder = run
        for step in path:
            holder = getattr(holder, step)
        key = holder._meta.get_field(name)
        assert isinstance(key, ForeignKey)
        key.set_cached_value(holder, instance)
    return run


def run_attempts_sql(*, run: Run) -> list[Attempt]:
    """The run's attempts by number, each with its cluster (whole rows) and the run itself
    attached: ``run.attempts.select_related("cluster").order_by("number")`` in one statement."""
    statement = _attempts_statement(vendor=connection.vendor)
    with connection.cursor() as db_cursor:
        db_cursor.execute(statement.sql, [run.pk])
        rows = db_cursor.fetchall()
    db = connection.alias
    read_attempt, read_cluster = statement.readers[""], statement.readers["cluster"]
    run_field, cluster_field = Attempt._meta.get_field("run"), Attempt._meta.get_field("cluster")
    clusters: dict[Any, Any] = {}
    attempts = []
    for row in rows:
        attempt = cast(Attempt, read_attempt(row, db))
        cluster_id = row[statement.loaded["cluster"].start]
        cluster = clusters.get(cluster_id)
        if cluster is None:
            cluster = clusters[cluster_id] = read_cluster(row, db)
        cluster_field.set_cached_value(attempt, cluster)
        run_field.set_cached_value(attempt, run)
        attempts.append(attempt)
    return attempts


def run_events_sql(*, run: Run, admin_detail: bool) -> list[RunEvent]:
    """The run's timeline by (at, id), each event with its actor (whole rows, None for the
    system) and the run itself attached, and ``shown_message``: the admin-only detail where
    ``admin_detail`` and there is one, else the message. ``run.events.select_related("actor")``
    annotated so, in one statement."""
    statement = _events_statement(vendor=connection.vendor, admin_detail=admin_detail)
    with connection.cursor() as db_cursor:
        db_cursor.execute(statement.sql, [run.pk])
        rows = db_cursor.fetchall()
    db = connection.alias
    read_event, read_actor = statement.readers[""], statement.readers["actor"]
    run_field, actor_field = RunEvent._meta.get_field("run"), RunEvent._meta.get_field("actor")
    actor_start, shown_at = statement.loaded["actor"].start, statement.loaded["actor"].end
    actors: dict[Any, Any] = {}
    events = []
    for row in rows:
        event = cast(RunEvent, read_event(row, db))
        actor_id = row[actor_start]
        actor = None
        if actor_id is not None:
            actor = actors.get(actor_id)
            if actor is None:
                actor = actors[actor_id] = read_actor(row, db)
        actor_field.set_cached_value(event, actor)
        run_field.set_cached_value(event, run)
        # As annotate(shown_message=...) set it.
        event.shown_message = row[shown_at]  # type: ignore[attr-defined]
        events.append(event)
    return events


@lru_cache(maxsize=64)
def _run_statement(*, vendor: str, columns: tuple[str, ...], scope: str) -> Statement:
    """The SQL of a run of this shape on this database (parameters: the run's id, then those
    of ``scope``, the tenants' condition of ``tenants.access.tenant_ids_sql``), and where
    each model's columns are in its row."""
    quote = connection.ops.quote_name
    loaded: dict[str, Loaded] = {}
    start = 0
    for relation, fields in _run_columns(columns).items():
        loaded[relation] = Loaded(model=related_model(Run, relation), fields=fields, start=start)
        start += len(fields)
    selected = ", ".join(
        f"{_ALIASES[relation]}.{_quoted(field)}"
        for relation, part in loaded.items()
        for field in part.fields
    )
    joins = []
    for relation in loaded:
        if not relation:
            continue
        holder, _, name = relation.rpartition("__")
        key = _field(related_model(Run, holder), name)
        model = related_model(Run, relation)
        kind = "LEFT JOIN" if key.null else "JOIN"
        alias = _ALIASES[relation]
        joins.append(
            f"{kind} {quote(model._meta.db_table)} {alias} "
            f"ON {alias}.{_quoted(_field(model, 'pk'))} = {_ALIASES[holder]}.{_quoted(key)}"
        )
    conditions = [f"r.{_quoted(_field(Run, 'pk'))} = %s", scope]
    sql = (
        f"SELECT {selected} FROM {quote(Run._meta.db_table)} r "  # noqa: S608 (identifiers from metadata)
        f"{' '.join(joins)} WHERE {' AND '.join(conditions)}"
    )
    return Statement(sql=sql, loaded=loaded)


def _run_columns(columns: tuple[str, ...]) -> dict[str, tuple[Field, ...]]:
    """relation -> the fields it loads, in the model's order: as ``only(*columns)`` loads
    them (its primary key, the named fields, the foreign keys the joins follow), or without
    columns every field."""
    relations = _WITH_COLUMNS if columns else _WITHOUT_COLUMNS
    followed: dict[str, set[str]] = {relation: set() for relation in relations}
    for relation in relations:
        if relation:
            holder, _, name = relation.rpartition("__")
            followed[holder].add(name)
    named: dict[str, set[str]] = {relation: set() for relation in relations}
    for column in columns:
        relation, _, name = column.rpartition("__")
        if relation not in named:
            raise ValueError(f"A run is read with no relation {relation!r} ({column})")
        named[relation].add(related_model(Run, relation)._meta.get_field(name).name)
    wanted = {relation: named[relation] | followed[relation] for relation in relations}
    return {
        relation: tuple(
            field
            for field in related_model(Run, relation)._meta.concrete_fields
            if not columns or field.primary_key or field.name in wanted[relation]
        )
        for relation in relations
    }


@lru_cache(maxsize=8)
def _events_statement(*, vendor: str, admin_detail: bool) -> Statement:
    """The SQL of a run's events with their actors and shown message (parameter: the run's
    id); the shown message is the last column."""
    quote = connection.ops.quote_name
    actor_model = related_model(RunEvent, "actor")
    event_fields = tuple(RunEvent._meta.concrete_fields)
    actor_fields = tuple(actor_model._meta.concrete_fields)
    loaded = {
        "": Loaded(model=RunEvent, fields=event_fields, start=0),
        "actor": Loaded(model=actor_model, fields=actor_fields, start=len(event_fields)),
    }
    message = f"e.{_quoted(_field(RunEvent, 'message'))}"
    shown = (
        f"COALESCE(NULLIF(e.{_quoted(_field(RunEvent, 'admin_detail'))}, ''), {message})"
        if admin_detail
        else message
    )
    selected = ", ".join(
        [f"e.{_quoted(field)}" for field in event_fields]
        + [f"u.{_quoted(field)}" for field in actor_fields]
        + [shown]
    )
    sql = (
        f"SELECT {selected} FROM {quote(RunEvent._meta.db_table)} e "  # noqa: S608 (identifiers from metadata)
        f"LEFT JOIN {quote(actor_model._meta.db_table)} u "
        f"ON u.{_quoted(_field(actor_model, 'pk'))} = e.{_quoted(_field(RunEvent, 'actor'))} "
        f"WHERE e.{_quoted(_field(RunEvent, 'run'))} = %s "
        f"ORDER BY e.{_quoted(_field(RunEvent, 'at'))}, e.{_quoted(_field(RunEvent, 'id'))}"
    )
    return Statement(sql=sql, loaded=loaded)


@lru_cache(maxsize=4)
def _attempts_statement(*, vendor: str) -> Statement:
    """The SQL of a run's attempts with their clusters (parameter: the run's id)."""
    quote = connection.ops.quote_name
    cluster_model = related_model(Run, "cluster")
    attempt_fields = tuple(Attempt._meta.concrete_fields)
    cluster_fields = tuple(cluster_model._meta.concrete_fields)
    loaded = {
        "": Loaded(model=Attempt, fields=attempt_fields, start=0),
        "cluster": Loaded(model=cluster_model, fields=cluster_fields, start=len(attempt_fields)),
    }
    selected = ", ".join(
        [f"a.{_quoted(field)}" for field in attempt_fields]
        + [f"c.{_quoted(field)}" for field in cluster_fields]
    )
    sql = (
        f"SELECT {selected} FROM {quote(Attempt._meta.db_table)} a "  # noqa: S608 (identifiers from metadata)
        f"JOIN {quote(cluster_model._meta.db_table)} c "
        f"ON c.{_quoted(_field(cluster_model, 'pk'))} = a.{_quoted(_field(Attempt, 'cluster'))} "
        f"WHERE a.{_quoted(_field(Attempt, 'run'))} = %s "
        f"ORDER BY a.{_quoted(_field(Attempt, 'number'))}"
    )
    return Statement(sql=sql, loaded=loaded)
