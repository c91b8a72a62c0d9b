"""What the selectors written in plain SQL share (run_page_sql, run_sql, submit_context,
holding_sql): fields and their quoted columns from the models, placeholders, and a column's
value turned into what the ORM would give for its field (SQLite's datetimes and booleans,
JSON), so that rows read by hand build the same values and instances as the ORM's; and for
those that build model instances, where each model's columns sit in a row and the reader
that turns them into the instance."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
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


def related_model(model: type[Model], relation: str) -> type[Model]:
    """The model at the end of ``relation`` ("experiment__project") from ``model``."""
    for name in relation.split("__") if relation else ():
        related = model._meta.get_field(name).related_model
        assert isinstance(related, type)
        model = related
    return model


@dataclass(frozen=True)
class Loaded:
    """The columns of one model a statement loads, in the model's field order (what
    ``Model.from_db`` takes), and where they start in a row of the statement."""

    model: type[Model]
    fields: tuple[Field, ...]
    start: int

    @property
    def attnames(self) -> list[str]:
        return [field.attname for field in self.fields]

    @property
    def end(self) -> int:
        return self.start + len(self.fields)


@dataclass(frozen=True)
class Statement:
    sql: str
    loaded: dict[str, Loaded]  # relation -> its columns in the row

    @cached_property
    def readers(self) -> dict[str, Callable[[tuple, str], Model]]:
        """relation -> row, db -> its instance (the converters looked up once)."""
        return {relation: instance_reader(part) for relation, part in self.loaded.items()}


def instance_reader(part: Loaded) -> Callable[[tuple, str], Model]:
    """row, db -> the instance of ``part``'s model its columns hold, through the converters
    the ORM applies to those fields (SQLite's datetimes and booleans, JSON)."""
    converting = [
        (index, convert)
        for index, field in enumerate(part.fields)
        if (convert := orm_converter(field, field.get_col(part.model._meta.db_table)))
    ]
    attnames, model, start, end = part.attnames, part.model, part.start, part.end

    def read(row: tuple, db: str) -> Model:
        values = list(row[start:end])
        for index, convert in converting:
            values[index] = convert(values[index])
        return model.from_db(db, attnames, values)

    return read
