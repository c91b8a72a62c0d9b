"""Who may see and do what in tenants: the one access module of the app, used by views,
the API and templates (other apps' access modules build on it).

Global roles come from groups, tenant roles from memberships (both cached on the user for
the request). Restricted querysets (``*_list_viewable``, ``*_list_submittable``) are where
every scoped list and lookup starts, in the spirit of NetBox's ``restrict()``; predicates
(``*_can_*``, ``is_*``) answer for one user. A lookup outside the restricted querysets
raises the model's ``DoesNotExist``, alike for a missing object and a hidden one; the web
and API edges turn it into 404 (``core.http.or_404``).
"""

from django.contrib.auth.models import Group, User
from django.core.exceptions import ObjectDoesNotExist
from django.db import connection
from django.db.models import QuerySet

from core.types import UserLike
from tenants.models import (
    GlobalRole,
    Membership,
    Tenant,
)

# Attributes of the user object that cache its roles for the request.
_GLOBAL_ROLES_CACHE = "_gantry_global_roles"
_TENANT_ROLES_CACHE = "_gantry_tenant_roles"


class NotVisible(ObjectDoesNotExist):
    """What the user may not see: a page or an object outside their restricted querysets.
    It is a DoesNotExist, so the edges answer it exactly like a missing object (404)."""


def global_roles(user: UserLike) -> frozenset[str]:
    if not user.is_authenticated:
        return frozenset()
    cached = getattr(user, _GLOBAL_ROLES_CACHE, None)
    if cached is None:
        cached = _roles_load(user)[0]
    return cached


def is_platform_admin(user: UserLike) -> bool:
    return GlobalRole.PLATFORM_ADMIN in global_roles(user)


def is_finance(user: UserLike) -> bool:
    return GlobalRole.FINANCE in global_roles(user)


def sees_all_tenants(user: UserLike) -> bool:
    """Platform admins and finance read every tenant's runs (finance drills down to runs)."""
    return bool(global_roles(user))


def tenant_roles(user: UserLike) -> dict[int, str]:
    """tenant id -> membership role, cached on the user object for the request."""
    if not user.is_authenticated:
        return {}
    cached = getattr(user, _TENANT_ROLES_CACHE, None)
    if cached is None:
        cached = _roles_load(user)[1]
    return cached


def _roles_load(user: UserLike) -> tuple[frozenset[str], dict[int, str]]:
    """Both role sets of ``user`` in one query, cached on the user for the request: every
    signed-in page needs them (the navigation), so this is the hottest read of the site,
    written in SQL to spare the ORM's compilation of two queries on every request.
    Memberships count only in active tenants."""
    user_groups = User.groups.through._meta.db_table
    quote = connection.ops.quote_name
    # Identifiers from model metadata (quoted); every value is a parameter.
    sql = (
        f"SELECT m.tenant_id, m.role FROM {quote(Membership._meta.db_table)} m "  # noqa: S608
        f"JOIN {quote(Tenant._meta.db_table)} t ON t.id = m.tenant_id "
        "WHERE t.active AND m.user_id = %s "
        f"UNION ALL SELECT NULL, g.name FROM {quote(Group._meta.db_table)} g "
        f"JOIN {quote(user_groups)} ug ON ug.group_id = g.id WHERE ug.user_id = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [user.pk, user.pk])
        rows = cursor.fetchall()
    names = {name for tenant_id, name in rows if tenant_id is None}
    if user.is_superuser:
        names.add(GlobalRole.PLATFORM_ADMIN)
    roles = frozenset(names & set(GlobalRole.values))
    memberships = {tenant_id: role for tenant_id, role in rows if tenant_id is not None}
    setattr(user, _GLOBAL_ROLES_CACHE, roles)
    setattr(user, _TENANT_ROLES_CACHE, memberships)
    return roles, memberships


def is_tenant_admin(user: UserLike, tenant_id: int) -> bool:
    return tenant_roles(user).get(tenant_id) == Membership.Role.TENANT_ADMIN


def tenant_ids_administered(user: UserLike) -> list[int]:
    """The tenants the user is a tenant admin of (active ones), by id."""
    return sorted(
        tenant_id
        for tenant_id, role in tenant_roles(user).items()
        if role == Membership.Role.TENANT_ADMIN
    )


def tenant_ids_viewable(user: UserLike) -> list[int] | None:
    """Who sees whose runs and experiments, the one rule: the ids of the active tenants the
    user may read, sorted, or None for every active tenant (global roles). The restricted
    querysets (``tenant_list_viewable``) and the SQL written by hand
    (``tenant_scope_sql``) both start here."""
    if sees_all_tenants(user):
        return None
    return sorted(tenant_roles(user))


def tenant_ids_member(user: UserLike) -> list[int]:
    """The active tenants the user is a member of, by id, sorted: where they may submit, and
    "my tenants" (global roles are not enough)."""
    return sorted(tenant_roles(user))


def tenant_list_viewable(*, user: UserLike) -> QuerySet[Tenant]:
    """Tenants whose runs and experiments the user may read."""
    ids = tenant_ids_viewable(user)
    active = Tenant.objects.filter(active=True)
    return active if ids is None else active.filter(id__in=ids)


def tenant_list_submittable(*, user: UserLike) -> QuerySet[Tenant]:
    """Tenants the user may submit to: membership is required, global roles are not enough."""
    return Tenant.objects.filter(active=True, id__in=tenant_ids_member(user))


def tenant_scope_sql(
    *, user: UserLike, tenant: str, members_only: bool = False
) -> tuple[str, list[bool | int]]:
    """The condition, and its parameters, that keeps SQL written by hand to the rows the
    user may read, as the restricted querysets do: ``tenant`` is the alias of the tenants
    table joined to those rows; active tenants only, all of them for global roles
    (``tenant_ids_viewable``), else the user's; with ``members_only``, the tenants the user
    is a member of (``tenant_ids_member``). No tenant is a condition nothing meets."""
    ids = tenant_ids_member(user) if members_only else tenant_ids_viewable(user)
    return tenant_ids_sql(tenant_ids=ids, tenant=tenant)


def tenant_ids_sql(*, tenant_ids: list[int] | None, tenant: str) -> tuple[str, list[bool | int]]:
    """``tenant_scope_sql`` for ids already read (None: every active tenant). The SQL text
    depends only on the number of ids; every value is a parameter."""
    quote = connection.ops.quote_name
    active = f"{tenant}.{quote(_column(Tenant, 'active'))} = %s"
    if tenant_ids is None:
        return active, [True]
    if not tenant_ids:
        return "1 = 0", []
    marks = ", ".join(["%s"] * len(tenant_ids))
    params: list[bool | int] = [True, *tenant_ids]
    return f"{active} AND {tenant}.{quote(_column(Tenant, 'id'))} IN ({marks})", params


def _column(model, name: str) -> str:
    column = model._meta.get_field(name).column
    assert column is not None  # a concrete field
    return column


def require_platform_admin(user: UserLike) -> None:
    """The gate of every platform page: NotVisible (a 404 at the edge) for everyone else,
    so the page stays unseen."""
    if not is_platform_admin(user):
        raise NotVisible("No such page")


def audit_tenant_ids(*, user: UserLike) -> frozenset[int] | None:
    """Tenants whose audit log the user reads: None for all (platform admins), else the
    tenants the user administers (possibly none)."""
    if is_platform_admin(user):
        return None
    return frozenset(
        tenant_id
        for tenant_id, role in tenant_roles(user).items()
        if role == Membership.Role.TENANT_ADMIN
    )


def membership_can_manage(*, user: UserLike, tenant: Tenant) -> bool:
    """Tenant admins of ``tenant`` and platform admins add, re-role and remove its members."""
    return is_platform_admin(user) or is_tenant_admin(user, tenant.pk)


def roles_forget(user: UserLike) -> None:
    """Drop the roles cached on ``user`` for the request: after a change of the user's own
    membership, the rest of the request must see the new roles."""
    for cache in (_GLOBAL_ROLES_CACHE, _TENANT_ROLES_CACHE):
        if hasattr(user, cache):
            delattr(user, cache)


def idle_policy_can_edit(*, user: UserLike, tenant: Tenant) -> bool:
    """Tenant admins of ``tenant`` and platform admins set its idle-GPU policy."""
    return is_platform_admin(user) or is_tenant_admin(user, tenant.pk)
