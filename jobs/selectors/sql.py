"""What the selectors written in plain SQL share (run_page_sql, run_sql, submit_context,
holding_sql): fields and their quoted columns from the models, placeholders, and a column's
value turned into what the ORM would give for its field (SQLite's datetimes and booleans,
JSON), so that rows read by hand build the same values and instances as the ORM's."""

from collections.abc import Callable
from typing import Any

from django.db import connection
from django.db.models import Field, Model
from django.db.models.expressions import Col

Converter = Callable[[Any], Any]


def field_of(model: type[Model], name: str) -> Field:
    """``model``'s concrete field ``name`` ("pk": its primary key)."""
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    assert isinstance(field, Field)  # a concrete column, not a reverse relation
    return field


def quoted_column(field: Field) -> str:
    assert field.column is not None
    return connection.ops.quote_name(field.column)


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def orm_converter(field: Field, column: Col) -> Converter | None:
    """value -> the value the ORM gives for ``field`` read as ``column`` (None: as read)."""
    converters = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
    if not converters:
        return None

    def convert(value: Any) -> Any:
        for converter in converters:
            value = converter(value, column, connection)
        return value

    return convert
