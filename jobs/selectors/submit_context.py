"""What a submit is checked against, read in one SQL statement.

A submit asks for a tenant, a project, an image, a GPU flavor, the tenant's quota of it and
how many nodes and GPUs per node the enabled clusters offer of it: six ORM queries, each
costing more to compile than to run. ``submit_context`` reads them all at once, with the
same rules as the selectors it stands for (``tenant_list_submittable``, a tenant's
projects, ``image_list_usable``, ``GpuFlavor`` by slug, the tenant's ``Quota``,
``flavor_node_limits``); tests/jobs/test_submit_context.py holds it to them.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model

from clusters.models import Cluster, ClusterFlavor
from core.types import UserLike
from images.models import Image
from jobs.selectors.sql import orm_converter
from tenants.access import tenant_roles
from tenants.models import GpuFlavor, Project, Quota, Tenant

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class SubmitContext:
    tenant: Tenant | None  # None: unknown, inactive, or the user is not a member
    project: Project | None  # None: no tenant, or no such project of it
    image: Image | None  # None: no tenant, none asked for, or not usable by the tenant
    flavor: GpuFlavor | None
    quota: Quota | None  # the tenant's quota of the flavor
    node_limits: tuple[int, int] | None  # flavor_node_limits()[flavor], None if not there


class _Rows:
    """Whole rows of one model under a table alias: its select list, and the instance a
    row's slice makes (converted as the ORM converts it, ``Model.from_db`` as it builds)."""

    def __init__(self, model: type[M], alias: str) -> None:
        quote = connection.ops.quote_name
        fields = model._meta.concrete_fields
        self.model = model
        self.columns = [f"{alias}.{quote(_column(field))}" for field in fields]
        self.names = [field.attname for field in fields]
        self.converters = [
            (index, convert)
            for index, field in enumerate(fields)
            if (convert := orm_converter(field, field.get_col(alias)))
        ]

    def build(self, values: Sequence[Any]) -> Any:
        if values[0] is None:  # the primary key: no row joined
            return None
        values = list(values)
        for index, convert in self.converters:
            values[index] = convert(values[index])
        return self.model.from_db(connection.alias, self.names, values)


def _column(field: object) -> str:
    """The column of a concrete field (the stubs allow relations and a missing column)."""
    assert isinstance(field, Field) and field.column is not None, field
    return field.column


def _text(value: object) -> str | None:
    """A value as the ORM compares it with a text column (CharField.get_prep_value)."""
    return None if value is None else str(value)


def submit_context(
    *,
    user: UserLike,
    tenant: str,
    project: str,
    flavor: str,
    image: tuple[str, str] | None = None,
) -> SubmitContext:
    """The tenant ``tenant`` if the user may submit to it, its project ``project``, the
    image ``image`` (repository, digest) if it is usable by that tenant, the flavor
    ``flavor``, the tenant's quota of it and the largest node count and GPUs per node an
    enabled cluster offers of it: one query (the user's roles aside, read once a request)."""
    quote = connection.ops.quote_name
    tenant_ids = list(tenant_roles(user))
    rows = [
        _Rows(Tenant, "t"),
        _Rows(Project, "p"),
        _Rows(Image, "i"),
        _Rows(GpuFlavor, "f"),
        _Rows(Quota, "q"),
    ]
    member = f"t.id IN ({', '.join(['%s'] * len(tenant_ids))})" if tenant_ids else "1 = 0"
    allowed = Image.allowed_tenants.through._meta.db_table
    repository, digest = image if image is not None else (None, None)

    def largest(name: str) -> str:  # over the enabled clusters offering the flavor
        return (
            f"(SELECT MAX(cf.{quote(_column(ClusterFlavor._meta.get_field(name)))}) "  # noqa: S608
            f"FROM {quote(ClusterFlavor._meta.db_table)} cf "
            f"JOIN {quote(Cluster._meta.db_table)} c ON c.id = cf.cluster_id "
            "WHERE c.enabled AND cf.flavor_id = f.id)"
        )

    # Identifiers from model metadata (quoted); every value is a parameter. The tenant
    # joins only where the user is a member of it (tenant_list_submittable); everything
    # else of the tenant joins only on a tenant found.
    sql = (
        f"SELECT {', '.join(column for found in rows for column in found.columns)}, "  # noqa: S608
        f"{largest('nodes')}, {largest('gpus_per_node')} "
        "FROM (SELECT 1 AS one) AS base "
        f"LEFT JOIN {quote(Tenant._meta.db_table)} t ON t.slug = %s AND t.active AND {member} "
        f"LEFT JOIN {quote(Project._meta.db_table)} p ON p.tenant_id = t.id AND p.slug = %s "
        f"LEFT JOIN {quote(Image._meta.db_table)} i ON i.repository = %s AND i.digest = %s "
        "AND i.status = %s AND t.id IS NOT NULL AND (i.visible_to_all OR EXISTS (SELECT 1 FROM "
        f"{quote(allowed)} a WHERE a.image_id = i.id AND a.tenant_id = t.id)) "
        f"LEFT JOIN {quote(GpuFlavor._meta.db_table)} f ON f.slug = %s "
        f"LEFT JOIN {quote(Quota._meta.db_table)} q ON q.tenant_id = t.id AND q.flavor_id = f.id"
    )
    params = [
        _text(tenant),
        *tenant_ids,
        _text(project),
        _text(repository),
        _text(digest),
        Image.Status.APPROVED.value,
        _text(flavor),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    built = []
    start = 0
    for found in rows:
        built.append(found.build(row[start : start + len(found.columns)]))
        start += len(found.columns)
    max_nodes, max_gpus = row[start], row[start + 1]
    found_tenant, found_project, found_image, found_flavor, found_quota = built
    if found_project is not None:
        found_project.tenant = found_tenant  # as tenant.projects would have it
    return SubmitContext(
        tenant=found_tenant,
        project=found_project,
        image=found_image,
        flavor=found_flavor,
        quota=found_quota,
        node_limits=None if max_nodes is None else (max_nodes, max_gpus),
    )
