"""Writing many rows at once."""

import json

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection


def rows_update(model, fields: list[str], rows: list[tuple], **only_if) -> None:
    """Set ``fields`` of many rows, given as ``(pk, *values)``, in one statement.

    bulk_update's CASE WHEN per row costs seconds at 10,000 rows (in Django and in the
    database) and binds parameters per row, which PostgreSQL refuses past 65,535; a join
    against the rows costs milliseconds. The rows are bound as one parameter per column
    however many there are: arrays zipped by ``unnest`` on PostgreSQL, one JSON array of
    rows read by ``json_each`` on SQLite. ``only_if`` (column=value) skips rows that changed
    meanwhile. Values are prepared as each field saves them (JSON, dates); on PostgreSQL
    each array is cast to its column's type, since an array of only NULLs would be text.
    """
    if not rows:
        return
    table = connection.ops.quote_name(model._meta.db_table)
    pk = connection.ops.quote_name(model._meta.pk.column)
    model_fields = [model._meta.get_field(f) for f in fields]
    columns = [connection.ops.quote_name(field.column) for field in model_fields]
    names = [f"v{i}" for i in range(len(fields))]
    assignments = ", ".join(f"{c} = v.{name}" for c, name in zip(columns, names, strict=True))
    prepared = [
        (
            row[0],
            *(
                f.get_db_prep_save(v, connection)
                for f, v in zip(model_fields, row[1:], strict=True)
            ),
        )
        for row in rows
    ]
    if connection.vendor == "postgresql":
        # The type without its modifiers (varchar, not varchar(200)), as Django's own
        # UNNEST insert does: an array element takes no length.
        types = [
            field.db_type(connection).split("(")[0] for field in (model._meta.pk, *model_fields)
        ]
        arrays = ", ".join(f"CAST(%s AS {db_type}[])" for db_type in types)
        source = f"unnest({arrays}) AS v(id, {', '.join(names)})"
        params: list = [list(column) for column in zip(*prepared, strict=True)]
    else:
        picked = ", ".join(
            f"json_extract(value, '$[{i}]') AS {name}" for i, name in enumerate(["id", *names])
        )
        source = f"(SELECT {picked} FROM json_each(%s)) AS v"  # noqa: S608
        params = [json.dumps(prepared, cls=DjangoJSONEncoder)]
    conditions = "".join(
        f" AND {table}.{connection.ops.quote_name(model._meta.get_field(f).column)} = %s"
        for f in only_if
    )
    with connection.cursor() as cursor:
        # Identifiers come from model metadata (quoted); every value is a parameter.
        sql = (
            f"UPDATE {table} SET {assignments} FROM {source} WHERE {table}.{pk} = v.id{conditions}"  # noqa: S608
        )
        cursor.execute(sql, [*params, *only_if.values()])
