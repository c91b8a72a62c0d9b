"""Which Gantry roles an OpenID Connect user's groups grant: plain data in, plain data out.

``GANTRY_OIDC_GROUP_ROLES`` maps a provider group to one role or a list of roles. A role is a
global role (``platform_admin``, ``finance``) or ``tenant-slug:role`` for a membership
(``vision:researcher``, ``vision:tenant_admin``). The mapping is authoritative for what it
names: a global role that some group maps to, and the membership in a tenant that some group
maps to, are granted when the user is in such a group and revoked when not. Roles the mapping
never names (a membership in another tenant given by a tenant admin) are left alone.

No Django here: the settings parse the variable with it at start-up, so a bad mapping stops
the portal before it serves anyone.
"""

import json
import re
from dataclasses import dataclass, field

# The values of tenants.models.GlobalRole and Membership.Role (a test keeps them equal).
GLOBAL_ROLES = ("platform_admin", "finance")
TENANT_ROLES = ("researcher", "tenant_admin")  # in increasing power
_TENANT_SLUG = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class GroupRolesError(ValueError):
    pass


@dataclass(frozen=True)
class RoleGrant:
    """One role: ``tenant`` is None for a global role."""

    role: str
    tenant: str | None = None


def parse_role(text: str) -> RoleGrant:
    if ":" not in text:
        if text not in GLOBAL_ROLES:
            raise GroupRolesError(
                f"unknown role {text!r}: use {' or '.join(GLOBAL_ROLES)}, or "
                f"tenant-slug:{'|'.join(TENANT_ROLES)}"
            )
        return RoleGrant(role=text)
    tenant, role = text.split(":", 1)
    if not _TENANT_SLUG.match(tenant):
        raise GroupRolesError(f"{text!r}: {tenant!r} is not a tenant slug")
    if role not in TENANT_ROLES:
        raise GroupRolesError(f"{text!r}: a tenant role is one of {', '.join(TENANT_ROLES)}")
    return RoleGrant(role=role, tenant=tenant)


def parse_group_roles(raw: str) -> dict[str, tuple[RoleGrant, ...]]:
    """``{"group": "role" | ["role", …]}`` as JSON; an empty string maps nothing."""
    if not raw.strip():
        return {}
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as error:
        raise GroupRolesError(f"not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise GroupRolesError('must be a JSON object: {"group": "role" or ["role", …]}')
    mapping = {}
    for group, roles in document.items():
        listed = [roles] if isinstance(roles, str) else roles
        if not isinstance(listed, list) or not all(isinstance(r, str) for r in listed):
            raise GroupRolesError(f"group {group!r}: give a role or a list of roles")
        mapping[group] = tuple(parse_role(role) for role in listed)
    return mapping


@dataclass(frozen=True)
class RolePlan:
    """The roles a user should hold, within what the mapping manages."""

    global_roles: frozenset[str]
    memberships: dict[str, str]  # tenant slug -> role
    managed_global_roles: frozenset[str] = field(default_factory=frozenset)
    managed_tenants: frozenset[str] = field(default_factory=frozenset)


def plan_roles(groups: list[str], mapping: dict[str, tuple[RoleGrant, ...]]) -> RolePlan:
    """The roles ``groups`` grant; two groups giving roles in one tenant give the stronger."""
    grants = [grant for roles in mapping.values() for grant in roles]
    held = [grant for group in dict.fromkeys(groups) for grant in mapping.get(group, ())]
    memberships: dict[str, str] = {}
    for grant in held:
        if grant.tenant is None:
            continue
        current = memberships.get(grant.tenant)
        if current is None or TENANT_ROLES.index(grant.role) > TENANT_ROLES.index(current):
            memberships[grant.tenant] = grant.role
    return RolePlan(
        global_roles=frozenset(grant.role for grant in held if grant.tenant is None),
        memberships=memberships,
        managed_global_roles=frozenset(g.role for g in grants if g.tenant is None),
        managed_tenants=frozenset(g.tenant for g in grants if g.tenant is not None),
    )
