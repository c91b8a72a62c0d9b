"""What runs hold, what nodes have and what tenants used this month, read in plain SQL.

Every quota page (the quotas list, a tenant admin's home, the members page) and every
admission cycle reads these; through the ORM, compiling their queries cost more CPU than the
rest of the quotas page. The statements here read the same rows in the same order, with the
values through the same converters the ORM applies (SQLite's datetimes and booleans, JSON).
Table and column names come from the models; values are always parameters. Plain SQL that
PostgreSQL and SQLite both run.
"""

from collections.abc import Collection, Sequence
from datetime import date
from functools import lru_cache
from typing import Any

from django.db import connection
from django.db.models import Model

from clusters.models import Cluster, ClusterFlavor, ClusterNode
from jobs.models import Attempt, Experiment, Run, TenantMonthUsage, Workspace
from jobs.selectors.sql import Converter, field_of, orm_converter, placeholders
from tenants.models import GpuFlavor, Quota, Tenant


def _table(model: type[Model]) -> str:
    return _quoted(connection.vendor, model, None)


def _column(alias: str, model: type[Model], name: str) -> str:
    return f"{alias}.{_quoted(connection.vendor, model, name)}"


@lru_cache(maxsize=256)
def _quoted(vendor: str, model: type[Model], name: str | None) -> str:
    """The quoted name of ``model``'s table (``name`` None) or of the column of its field
    ``name``, as the connection's database (``vendor``) quotes it: looked up once."""
    column = model._meta.db_table if name is None else field_of(model, name).column
    assert column is not None
    return connection.ops.quote_name(column)


def _placeholders(values: Collection[Any]) -> str:
    return placeholders(len(values))


def _converter(model: type[Model], name: str) -> Converter | None:
    """value -> the value the ORM would give for ``model.name`` (None: as read)."""
    field = field_of(model, name)
    return orm_converter(field, field.get_col(model._meta.db_table))


def _rows(sql: str, params: Sequence[Any], fields: Sequence[tuple[type[Model], str]]) -> list:
    """The rows of ``sql``, each column converted as the ORM converts the field it reads."""
    converting = [
        (index, convert)
        for index, (model, name) in enumerate(fields)
        if (convert := _converter(model, name)) is not None
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not converting:
        return rows
    converted = []
    for row in rows:
        values = list(row)
        for index, convert in converting:
            values[index] = convert(values[index])
        converted.append(values)
    return converted


_HELD_FIELDS = (
    (Run, "id"),
    (Tenant, "slug"),
    (GpuFlavor, "slug"),
    (Cluster, "name"),
    (Run, "gpus"),
    (Run, "priority"),
    (Run, "admitted_at"),
    (Run, "submitted_at"),
    (Run, "borrowed"),
    (Attempt, "node_list"),
    (Attempt, "placement"),
    (Attempt, "started_at"),
    (Experiment, "max_runtime_minutes"),
)


def held_run_rows(*, holding: Sequence[str], live: Sequence[str]) -> list:
    """Runs in a state of ``holding``, newest submitted first: id, tenant slug, flavor slug,
    cluster name (or None), gpus, priority, admitted_at, submitted_at, borrowed, the node
    list, placement and start of the run's latest attempt in a state of ``live`` (or None),
    and its max runtime in minutes (its experiment's, and a workspace's extensions)."""

    def latest(name: str) -> str:
        return (
            f"(SELECT {_column('a', Attempt, name)} FROM {_table(Attempt)} a "  # noqa: S608
            f"WHERE {_column('a', Attempt, 'run')} = {_column('r', Run, 'id')} "
            f"AND {_column('a', Attempt, 'state')} IN ({_placeholders(live)}) "
            f"ORDER BY {_column('a', Attempt, 'number')} DESC LIMIT 1)"
        )

    node_list, placement, started = latest("node_list"), latest("placement"), latest("started_at")
    sql = (
        f"SELECT {_column('r', Run, 'id')}, {_column('t', Tenant, 'slug')}, "  # noqa: S608
        f"{_column('f', GpuFlavor, 'slug')}, {_column('c', Cluster, 'name')}, "
        f"{_column('r', Run, 'gpus')}, {_column('r', Run, 'priority')}, "
        f"{_column('r', Run, 'admitted_at')}, {_column('r', Run, 'submitted_at')}, "
        f"{_column('r', Run, 'borrowed')}, {node_list}, {placement}, {started}, "
        f"{_column('e', Experiment, 'max_runtime_minutes')} + COALESCE(("
        f"SELECT {_column('w', Workspace, 'extended_minutes')} FROM {_table(Workspace)} w "
        f"WHERE {_column('w', Workspace, 'run')} = {_column('r', Run, 'id')}), 0) "
        f"FROM {_table(Run)} r "
        f"JOIN {_table(Experiment)} e "
        f"ON {_column('e', Experiment, 'id')} = {_column('r', Run, 'experiment')} "
        f"JOIN {_table(Tenant)} t ON {_column('t', Tenant, 'id')} = {_column('r', Run, 'tenant')} "
        f"JOIN {_table(GpuFlavor)} f "
        f"ON {_column('f', GpuFlavor, 'id')} = {_column('r', Run, 'flavor')} "
        f"LEFT JOIN {_table(Cluster)} c "
        f"ON {_column('c', Cluster, 'id')} = {_column('r', Run, 'cluster')} "
        f"WHERE {_column('r', Run, 'state')} IN ({_placeholders(holding)}) "
        f"ORDER BY {_column('r', Run, 'submitted_at')} DESC, {_column('r', Run, 'id')} DESC"
    )
    # The subqueries' placeholders come first in the statement, before the WHERE clause's.
    return _rows(sql, [*live, *live, *live, *holding], _HELD_FIELDS)


_NODE_FIELDS = (
    (Cluster, "name"),
    (Cluster, "inventory_at"),
    (Cluster, "inventory_valid_until"),
    (GpuFlavor, "slug"),
    (ClusterNode, "name"),
    (ClusterNode, "gpus"),
    (ClusterNode, "gpus_used"),
    (ClusterNode, "gpus_used_by_gantry"),
    (ClusterNode, "schedulable"),
    (ClusterNode, "reason"),
    (ClusterNode, "path"),
    (ClusterNode, "health"),
    (ClusterNode, "health_reason"),
)


def cluster_node_rows(*, cluster_ids: Collection[int] | None) -> list:
    """Nodes of enabled clusters (or of the clusters of ``cluster_ids``) by cluster name and
    node name: the columns of ``_NODE_FIELDS``."""
    columns = ", ".join(
        _column({Cluster: "c", GpuFlavor: "f", ClusterNode: "n"}[model], model, name)
        for model, name in _NODE_FIELDS
    )
    if cluster_ids is None:
        where, params = f"{_column('c', Cluster, 'enabled')}", []
    elif not cluster_ids:
        return []
    else:
        where = f"{_column('c', Cluster, 'id')} IN ({_placeholders(cluster_ids)})"
        params = list(cluster_ids)
    sql = (
        f"SELECT {columns} FROM {_table(ClusterNode)} n "  # noqa: S608
        f"JOIN {_table(Cluster)} c "
        f"ON {_column('c', Cluster, 'id')} = {_column('n', ClusterNode, 'cluster')} "
        f"JOIN {_table(GpuFlavor)} f "
        f"ON {_column('f', GpuFlavor, 'id')} = {_column('n', ClusterNode, 'flavor')} "
        f"WHERE {where} "
        f"ORDER BY {_column('c', Cluster, 'name')}, {_column('n', ClusterNode, 'name')}"
    )
    return _rows(sql, params, _NODE_FIELDS)


def month_usage_rows(*, month: date, tenant_id: int | None) -> list:
    """The ledger of ``month`` (of one tenant, or of all): tenant slug, flavor slug,
    GPU-seconds."""
    tenant_filter = (
        "" if tenant_id is None else f" AND {_column('u', TenantMonthUsage, 'tenant')} = %s"
    )
    sql = (
        f"SELECT {_column('t', Tenant, 'slug')}, {_column('f', GpuFlavor, 'slug')}, "  # noqa: S608
        f"{_column('u', TenantMonthUsage, 'gpu_seconds')} "
        f"FROM {_table(TenantMonthUsage)} u "
        f"JOIN {_table(Tenant)} t "
        f"ON {_column('t', Tenant, 'id')} = {_column('u', TenantMonthUsage, 'tenant')} "
        f"JOIN {_table(GpuFlavor)} f "
        f"ON {_column('f', GpuFlavor, 'id')} = {_column('u', TenantMonthUsage, 'flavor')} "
        f"WHERE {_column('u', TenantMonthUsage, 'month')} = %s{tenant_filter}"
    )
    params: list[Any] = [connection.ops.adapt_datefield_value(month)]
    if tenant_id is not None:
        params.append(tenant_id)
    return _rows(
        sql,
        params,
        ((Tenant, "slug"), (GpuFlavor, "slug"), (TenantMonthUsage, "gpu_seconds")),
    )


def started_attempt_rows(*, live: Sequence[str], tenant_id: int | None) -> list:
    """Attempts in a state of ``live`` that have started (of one tenant's runs, or of all),
    in the runs' order (newest submitted first) then by number: tenant slug, flavor slug,
    the run's GPUs, started_at. The order is the ORM's: sums over these rows add up in it."""
    tenant_filter = "" if tenant_id is None else f" AND {_column('r', Run, 'tenant')} = %s"
    sql = (
        f"SELECT {_column('t', Tenant, 'slug')}, {_column('f', GpuFlavor, 'slug')}, "  # noqa: S608
        f"{_column('r', Run, 'gpus')}, {_column('a', Attempt, 'started_at')} "
        f"FROM {_table(Attempt)} a "
        f"JOIN {_table(Run)} r ON {_column('r', Run, 'id')} = {_column('a', Attempt, 'run')} "
        f"JOIN {_table(Tenant)} t ON {_column('t', Tenant, 'id')} = {_column('r', Run, 'tenant')} "
        f"JOIN {_table(GpuFlavor)} f "
        f"ON {_column('f', GpuFlavor, 'id')} = {_column('r', Run, 'flavor')} "
        f"WHERE {_column('a', Attempt, 'started_at')} IS NOT NULL "
        f"AND {_column('a', Attempt, 'state')} IN ({_placeholders(live)}){tenant_filter} "
        f"ORDER BY {_column('r', Run, 'submitted_at')} DESC, {_column('r', Run, 'id')} DESC, "
        f"{_column('a', Attempt, 'number')}"
    )
    params: list[Any] = list(live)
    if tenant_id is not None:
        params.append(tenant_id)
    return _rows(
        sql,
        params,
        ((Tenant, "slug"), (GpuFlavor, "slug"), (Run, "gpus"), (Attempt, "started_at")),
    )


def flavor_guarantee_rows() -> list:
    """Each flavor some quota names: flavor slug, its guarantees summed over every tenant,
    and its GPUs on enabled clusters (0 without any)."""
    sql = (
        f"SELECT {_column('f', GpuFlavor, 'slug')}, g.gpus, COALESCE(cap.gpus, 0) "  # noqa: S608
        f"FROM (SELECT {_column('q', Quota, 'flavor')} AS flavor_id, "
        f"SUM({_column('q', Quota, 'guaranteed_gpus')}) AS gpus "
        f"FROM {_table(Quota)} q GROUP BY {_column('q', Quota, 'flavor')}) g "
        f"JOIN {_table(GpuFlavor)} f ON {_column('f', GpuFlavor, 'id')} = g.flavor_id "
        f"LEFT JOIN (SELECT {_column('p', ClusterFlavor, 'flavor')} AS flavor_id, "
        f"SUM({_column('p', ClusterFlavor, 'gpus')}) AS gpus "
        f"FROM {_table(ClusterFlavor)} p JOIN {_table(Cluster)} c "
        f"ON {_column('c', Cluster, 'id')} = {_column('p', ClusterFlavor, 'cluster')} "
        f"WHERE {_column('c', Cluster, 'enabled')} "
        f"GROUP BY {_column('p', ClusterFlavor, 'flavor')}) cap ON cap.flavor_id = g.flavor_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()
