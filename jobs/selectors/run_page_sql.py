"""The run list's page in one SQL statement: the runs of a keyset page with their
experiment, project, flavor, cluster and submitter, built into the model instances the
ORM's ``select_related`` would build, with the same columns loaded.

The run list (and its 5-second poll) and the API list are the most frequent requests of
the portal; through the ORM, compiling the page's query and its submitters' query and
building five objects per row cost more CPU than everything else they do. Here the SQL
text depends only on the shape of the request (which columns, how many tenants and
states, which cursor), so it is built once per shape; the values are always parameters.
Plain SQL that PostgreSQL and SQLite both run.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from django.db import connection
from django.db.models import Field, Model

from jobs.models import Experiment, Run
from jobs.selectors.sql import Loaded, Statement, instance_reader, related_model
from jobs.selectors.sql import field_of as _field
from jobs.selectors.sql import placeholders as _marks
from jobs.selectors.sql import quoted_column as _quoted

# The relations the page loads with each run (as select_related names them), each with the
# alias of its table in the statement and the relation it hangs from ("" for the run).
_RUN, _EXPERIMENT, _PROJECT, _FLAVOR, _CLUSTER, _SUBMITTER = (
    "",
    "experiment",
    "experiment__project",
    "flavor",
    "cluster",
    "submitted_by",
)
_ALIASES = {
    _RUN: "r",
    _EXPERIMENT: "e",
    _PROJECT: "p",
    _FLAVOR: "f",
    _CLUSTER: "c",
    _SUBMITTER: "u",
}
_NEWEST_FIRST, _OLDEST_FIRST = "DESC", "ASC"


@dataclass(frozen=True)
class PageFilter:
    """Which runs a page lists (the ids of tenants in ``tenant_ids``, non-empty) and which
    runs may mark its position (``readable_tenant_ids``)."""

    tenant_ids: Sequence[int]
    readable_tenant_ids: Sequence[int]
    states: Sequence[str] = ()
    submitted_by_id: int | None = None


def runs_page_sql(
    *,
    where: PageFilter,
    size: int,
    before: int | None,
    after: int | None,
    columns: Collection[str],
    deferred: Collection[str],
) -> tuple[list[Run], bool, bool]:
    """The ``size`` runs just older than run ``before``, just newer than run ``after``, or
    the newest ones, newest first by (submitted_at, id), with whether newer and older ones
    exist: ``keyset_page`` of the ORM's ``select_related("experiment__project", "flavor",
    "cluster")`` page, with ``only(*columns)`` (or ``defer(*deferred)`` without columns)
    and the submitter (its id and username) attached, in one statement. Each row's
    related objects are shared by the runs that have the same ones."""
    cursor_id = before if before is not None else after
    statement = _statement(
        vendor=connection.vendor,
        columns=tuple(columns),
        deferred=tuple(deferred),
        tenants=len(where.tenant_ids),
        states=len(where.states),
        mine=where.submitted_by_id is not None,
        cursor="before" if before is not None else "after" if after is not None else "",
        readable_tenants=len(where.readable_tenant_ids) if cursor_id is not None else 0,
    )
    params: list[Any] = [*where.tenant_ids, *where.states]
    if where.submitted_by_id is not None:
        params.append(where.submitted_by_id)
    if cursor_id is not None:
        at = [cursor_id, *where.readable_tenant_ids]
        params += [*at, *at, cursor_id, *at]
    params.append(size + 1)
    with connection.cursor() as db_cursor:
        db_cursor.execute(statement.sql, params)
        rows = db_cursor.fetchall()
    runs = _built(rows, statement.loaded)
    if after is not None:
        return runs[:size][::-1], len(runs) > size, True
    return runs[:size], before is not None, len(runs) > size


def runs_count_sql(*, where: PageFilter, up_to: int) -> int:
    """How many runs the filter matches, counted no further than ``up_to``."""
    table = connection.ops.quote_name(Run._meta.db_table)
    matching = _filter_sql(
        tenants=len(where.tenant_ids),
        states=len(where.states),
        mine=where.submitted_by_id is not None,
    )
    sql = (
        f"SELECT COUNT(*) FROM (SELECT {_column('id')} FROM {table} "  # noqa: S608
        f"WHERE {matching} LIMIT %s) AS matching"
    )
    params: list[Any] = [*where.tenant_ids, *where.states]
    if where.submitted_by_id is not None:
        params.append(where.submitted_by_id)
    with connection.cursor() as db_cursor:
        db_cursor.execute(sql, [*params, up_to])
        (found,) = db_cursor.fetchone()
    return int(found)


def _filter_sql(*, tenants: int, states: int, mine: bool) -> str:
    conditions = [f"{_column('tenant')} IN ({_marks(tenants)})"]
    if states:
        conditions.append(f"{_column('state')} IN ({_marks(states)})")
    if mine:
        conditions.append(f"{_column('submitted_by')} = %s")
    return " AND ".join(conditions)


def _column(name: str, model: type[Model] = Run) -> str:
    """The column of ``model``'s field ``name``, quoted."""
    return _quoted(_field(model, name))


@lru_cache(maxsize=256)
def _statement(
    *,
    vendor: str,
    columns: tuple[str, ...],
    deferred: tuple[str, ...],
    tenants: int,
    states: int,
    mine: bool,
    cursor: str,
    readable_tenants: int,
) -> Statement:
    """The SQL of a page of this shape on this database (parameters: the tenant ids, the
    states, the submitter, the cursor's, the limit), and where each model's columns are in
    its rows."""
    quote = connection.ops.quote_name
    loaded: dict[str, Loaded] = {}
    start = 0
    for relation, fields in _columns(columns, deferred).items():
        loaded[relation] = Loaded(model=related_model(Run, relation), fields=fields, start=start)
        start += len(fields)
    user = related_model(Run, _SUBMITTER)
    username = _field(user, user.USERNAME_FIELD)  # type: ignore[attr-defined]
    loaded[_SUBMITTER] = Loaded(model=user, fields=(_field(user, "pk"), username), start=start)

    run_table, submitted_at, run_id = (
        quote(Run._meta.db_table),
        _column("submitted_at"),
        _column("id"),
    )
    order = _OLDEST_FIRST if cursor == "after" else _NEWEST_FIRST
    conditions = [_filter_sql(tenants=tenants, states=states, mine=mine)]
    if cursor:
        # The cursor run's position: only among the runs the reader may read (any other
        # id marks none, and the page is empty), whatever the filters. The bound on
        # submitted_at alone is what an index range can use; the id breaks ties.
        at = (
            f"(SELECT {submitted_at} FROM {run_table} WHERE {run_id} = %s "  # noqa: S608
            f"AND {_column('tenant')} IN ({_marks(readable_tenants)}))"
        )
        beyond, beyond_or_at = ("<", "<=") if cursor == "before" else (">", ">=")
        conditions.append(
            f"({submitted_at} {beyond} {at} OR ({submitted_at} = {at} AND {run_id} {beyond} %s))"
            f" AND {submitted_at} {beyond_or_at} {at}"
        )
    # The run's columns the statement reads: what it loads, orders by and joins on.
    read = {_quoted(field) for field in loaded[_RUN].fields} | {
        _column(name)
        for name in ("id", "submitted_at", "experiment", "flavor", "cluster", "submitted_by")
    }
    page = (
        f"SELECT {', '.join(sorted(read))} "  # noqa: S608
        f"FROM {run_table} WHERE {' AND '.join(conditions)} "
        f"ORDER BY {submitted_at} {order}, {run_id} {order} LIMIT %s"
    )
    selected = ", ".join(
        f"{_ALIASES[relation]}.{_quoted(field)}"
        for relation, part in loaded.items()
        for field in part.fields
    )

    def joined(relation: str, on: str, *, outer: bool = False) -> str:
        """The join of ``relation``'s table, by its primary key, to foreign key ``on``."""
        model, alias = related_model(Run, relation), _ALIASES[relation]
        kind = "LEFT JOIN" if outer else "JOIN"
        return (
            f"{kind} {quote(model._meta.db_table)} {alias} ON {alias}.{_column('pk', model)} = {on}"
        )

    def run_column(name: str) -> str:
        return f"r.{_column(name)}"

    # The page first, then its few rows joined: the joins never weigh on the page's plan.
    sql = " ".join(
        (
            f"SELECT {selected} FROM ({page}) r",  # noqa: S608 (identifiers from metadata)
            joined(_EXPERIMENT, run_column("experiment")),
            joined(_PROJECT, f"e.{_column('project', Experiment)}"),
            joined(_FLAVOR, run_column("flavor")),
            joined(_CLUSTER, run_column("cluster"), outer=True),
            joined(_SUBMITTER, run_column("submitted_by")),
            f"ORDER BY r.{submitted_at} {order}, r.{run_id} {order}",
        )
    )
    return Statement(sql=sql, loaded=loaded)


def _columns(columns: tuple[str, ...], deferred: tuple[str, ...]) -> dict[str, tuple[Field, ...]]:
    """relation -> the fields it loads, in the model's order: as ``only(*columns)`` loads
    them (its primary key, the named fields, the foreign keys the joins follow), or without
    columns every field but the ``deferred`` ones."""
    relations = (_RUN, _EXPERIMENT, _PROJECT, _FLAVOR, _CLUSTER)
    # The foreign keys each relation's joins follow, always loaded (as only() loads them),
    # and the run's tenant, which the page attaches.
    followed = {
        _RUN: {"experiment", "flavor", "cluster", "submitted_by", "tenant"},
        _EXPERIMENT: {"project"},
    }
    named: dict[str, set[str]] = {relation: set() for relation in relations}
    for column in columns:
        relation, _, name = column.rpartition("__")
        if relation not in named:
            raise ValueError(f"The run page loads no relation {relation!r} ({column})")
        named[relation].add(related_model(Run, relation)._meta.get_field(name).name)
    skipped: dict[str, set[str]] = {relation: set() for relation in relations}
    for column in deferred:
        relation, _, name = column.rpartition("__")
        skipped[relation].add(name)
    chosen = {}
    for relation in relations:
        wanted = named[relation] | followed.get(relation, set())
        chosen[relation] = tuple(
            field
            for field in related_model(Run, relation)._meta.concrete_fields
            if (
                field.primary_key or field.name in wanted
                if columns
                else field.name not in skipped[relation]
            )
        )
    return chosen


def _built(rows: list[tuple], loaded: dict[str, Loaded]) -> list[Run]:
    """The runs of ``rows``, each with its related objects attached as select_related (and
    prefetch_related for the submitter) attaches them."""
    db = connection.alias
    readers = {relation: instance_reader(part) for relation, part in loaded.items()}
    run_reader = readers.pop(_RUN)
    shared: dict[str, dict[Any, Model]] = {relation: {} for relation in readers}
    experiment_field = Run._meta.get_field("experiment")
    project_field = Experiment._meta.get_field("project")
    flavor_field = Run._meta.get_field("flavor")
    cluster_field = Run._meta.get_field("cluster")
    submitter_field = Run._meta.get_field("submitted_by")

    def related(relation: str, row: tuple) -> Model | None:
        start = loaded[relation].start
        pk = row[start]
        if pk is None:
            return None  # no such row: a run without a cluster
        known = shared[relation]
        instance = known.get(pk)
        if instance is None:
            instance = known[pk] = readers[relation](row, db)
        return instance

    runs: list[Run] = []
    for row in rows:
        run = cast(Run, run_reader(row, db))
        experiment = related(_EXPERIMENT, row)
        assert experiment is not None
        project_field.set_cached_value(experiment, related(_PROJECT, row))
        experiment_field.set_cached_value(run, experiment)
        flavor_field.set_cached_value(run, related(_FLAVOR, row))
        cluster_field.set_cached_value(run, related(_CLUSTER, row))
        submitter_field.set_cached_value(run, related(_SUBMITTER, row))
        runs.append(run)
    return runs
