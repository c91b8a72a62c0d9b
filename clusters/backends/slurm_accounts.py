"""Slurm accounts: the ``sacctmgr`` commands that mirror tenants' GPU quotas, whether the
CLI's user is an operator, and the claims of the REST token. Pure: no Django, no processes.
"""

import base64
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from clusters.backends.slurm_quoting import RenderError, plain_word
from clusters.backends.slurm_settings import SlurmSettings

# AdminLevel values (``sacctmgr show user … format=AdminLevel``) that may set a priority.
OPERATOR_LEVELS = frozenset({"Operator", "Administrator"})


def is_operator(admin_level: str) -> bool:
    """``sacctmgr -n -P show user NAME format=AdminLevel``: "Administrator", "Operator",
    "None", or nothing for a user Slurm does not know."""
    return admin_level.strip() in OPERATOR_LEVELS


@dataclass(frozen=True, slots=True)
class QuotaLimit:
    """The most GPUs of a flavor a tenant may hold at once (guaranteed + borrow limit)."""

    tenant: str
    flavor: str
    gpus: int


def quota_commands(
    quotas: Iterable[QuotaLimit], settings: SlurmSettings, *, users: Iterable[str]
) -> list[list[str]]:
    """``sacctmgr -i`` commands that give each tenant an account with a QOS of its own,
    ``GrpTRES=gres/gpu=<total>,gres/gpu:<type>=<n>`` for every GPU type the cluster maps
    (0 for a type the tenant has no quota for), as the account's default QOS.

    Adding what already exists fails harmlessly; the ``modify`` commands make the limits
    exactly these, whatever they were before.
    """
    per_tenant: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    types = sorted({m.gres_type for m in settings.flavors.values()})
    for quota in quotas:
        mapping = settings.flavors.get(quota.flavor)
        if mapping is None:
            continue
        if quota.gpus < 0:
            raise RenderError(f"tenant {quota.tenant}: a GPU limit cannot be negative")
        per_tenant[plain_word(quota.tenant, "tenant")][mapping.gres_type] += int(quota.gpus)
    users = [plain_word(u, "user") for u in users]
    commands: list[list[str]] = []
    for tenant, by_type in sorted(per_tenant.items()):
        qos = plain_word(f"{settings.qos_prefix}{tenant}", "QOS name")
        tres = ",".join(
            [f"gres/gpu={sum(by_type.values())}"]
            + [f"gres/gpu:{t}={by_type.get(t, 0)}" for t in types]
        )
        commands += [
            ["sacctmgr", "-i", "add", "qos", qos],
            ["sacctmgr", "-i", "modify", "qos", "where", f"name={qos}", "set", f"GrpTRES={tres}"],
            ["sacctmgr", "-i", "add", "account", tenant, "Description=gantry tenant"],
        ]
        if users:
            commands.append(["sacctmgr", "-i", "add", "user", ",".join(users), f"account={tenant}"])
        commands.append(
            [
                "sacctmgr",
                "-i",
                "modify",
                "account",
                "where",
                f"name={tenant}",
                "set",
                f"QOS+={qos}",
                f"DefaultQOS={qos}",
            ]
        )
        if users:
            commands.append(
                [
                    "sacctmgr",
                    "-i",
                    "modify",
                    "user",
                    "where",
                    f"name={','.join(users)}",
                    f"account={tenant}",
                    "set",
                    f"QOS+={qos}",
                    f"DefaultQOS={qos}",
                ]
            )
    return commands


def jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, unverified (only slurmctld holds the key). Used to tell a
    malformed, expired or foreign token apart from an unreachable cluster: slurmrestd
    answers both with the same "Unspecified error"."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT (expected three dot-separated parts)")
    padded = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(padded))
    except (ValueError, UnicodeDecodeError):
        raise ValueError("not a JWT (its claims are not base64url JSON)") from None
    if not isinstance(claims, dict):
        raise ValueError("not a JWT (its claims are not an object)")
    return claims
