"""``field__among=values``: membership in a list bound as one parameter, whatever its length.

``__in`` binds one parameter per value, and PostgreSQL refuses a statement with more than
65,535 (SQLite more than 32,766): a list of ids that grows with the data (every queued run,
every live attempt of a cluster) fails at scale. ``__among`` binds the whole list once: an
array on PostgreSQL (``= ANY(%s)``), a JSON array read by ``json_each`` on SQLite, which has
no arrays. Use ``__in`` for what is bounded (a page, a fixed set of states), ``__among`` for
the rest. Registered on every field by ``TenantsConfig.ready`` (tenants is the app every
other one builds on)."""

import json
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Field, ForeignObject, Lookup


def among_sql(vendor: str, expression: str, values: list[Any]) -> tuple[str, Any]:
    """SQL that tests ``expression`` for membership in ``values``, and its one parameter;
    for statements written by hand. ``values`` are ids or strings (JSON has no dates: a
    field's other values go through the lookup, which prepares them as the field stores them)."""
    if vendor == "postgresql":
        return f"{expression} = ANY(%s)", list(values)
    # ``expression`` is SQL the caller built from quoted identifiers; the values are bound.
    sql = f"{expression} IN (SELECT value FROM json_each(%s))"  # noqa: S608
    return sql, json.dumps(list(values))


class Among(Lookup):
    lookup_name = "among"
    prepare_rhs = False

    def get_prep_lookup(self) -> list[Any]:
        field = self.lhs.output_field
        return [field.get_prep_value(value) for value in self.rhs]

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        field = self.lhs.output_field
        values = [
            field.get_db_prep_value(value, connection, prepared=True)
            for value in dict.fromkeys(self.rhs)
        ]
        if not values:
            raise EmptyResultSet  # as ``__in`` does: nothing matches an empty list
        sql, param = among_sql(connection.vendor, lhs, values)
        return sql, (*lhs_params, param)


Field.register_lookup(Among)
# Relations look lookups up from ForeignObject down, not on Field: ``run__among=[ids]``.
ForeignObject.register_lookup(Among)
