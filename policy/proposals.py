"""A what-if proposal as a report keeps it (JSON) and as the replay reads it
(``jobs.replay_types.Proposal``), and back: the one definition of its JSON (pure: no Django).

The JSON, every key optional::

    {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 8,
                 "borrow_limit": 4, "max_gpus_per_run": null, "budget_gpu_hours": 1000,
                 "budget_hard": true, "weight": 2}],
     "nodes": [{"cluster": "sim-1", "flavor": "a100-80gb", "count": 2, "gpus_per_node": 0}],
     "preemption": false, "starvation_after_s": 3600}

A quota is the whole new quota of its (tenant, flavor), as the quota form sets it; nodes are
added (``count`` > 0) or removed (< 0) for the whole window; ``preemption`` false means no
borrowed run is ever preempted, ``starvation_after_s`` how long a run waits before GPUs are
held for it. What the proposal leaves out stays as it was in force.

``proposal_from_json`` checks the shape and the types (``ProposalShapeError`` names the
first wrong value); the values themselves (a negative guarantee, a tenant that does not
exist, more nodes removed than there are) are ``Proposal.validate``'s to judge.
"""

import math
import re
from collections.abc import Mapping
from typing import Any

from jobs.admission_types import Quota
from jobs.replay_types import NodeChange, Proposal

QUOTA_KEYS = (
    "tenant",
    "flavor",
    "guaranteed",
    "borrow_limit",
    "max_gpus_per_run",
    "budget_gpu_hours",
    "budget_hard",
    "weight",
)
NODE_KEYS = ("cluster", "flavor", "count", "gpus_per_node")
PROPOSAL_KEYS = ("quotas", "nodes", "preemption", "starvation_after_s")
# A JSON integer beyond this is no number of GPUs (PostgreSQL's integer columns).
MAX_INT = 2**31 - 1
# A tenant's, flavor's or cluster's slug: lowercase letters, digits, dots and dashes.
NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


class ProposalShapeError(ValueError):
    """The JSON is not a proposal: a wrong key or type, in words a person can act on."""


def _whole(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > MAX_INT:
        raise ProposalShapeError(f"{where} must be a whole number.")
    return value


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProposalShapeError(f"{where} must be a number.")
    return float(value)


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ProposalShapeError(
            f"{where} must be a name: lowercase letters, digits, dots and dashes."
        )
    return value


def _object(value: object, keys: tuple[str, ...], where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ProposalShapeError(f"{where} must be an object.")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise ProposalShapeError(f"{where} has unknown keys: {', '.join(map(str, unknown))}.")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProposalShapeError(f"{where} must be a list.")
    return value


def _quota(item: object, index: int) -> tuple[tuple[str, str], Quota]:
    where = f"quotas[{index}]"
    data = _object(item, QUOTA_KEYS, where)
    missing = [key for key in ("tenant", "flavor", "guaranteed") if key not in data]
    if missing:
        raise ProposalShapeError(f"{where} needs {', '.join(missing)}.")
    tenant = _name(data["tenant"], f"{where}.tenant")
    flavor = _name(data["flavor"], f"{where}.flavor")
    per_run = data.get("max_gpus_per_run")
    budget = data.get("budget_gpu_hours")
    hard = data.get("budget_hard", True)
    if not isinstance(hard, bool):
        raise ProposalShapeError(f"{where}.budget_hard must be true or false.")
    quota = Quota(
        guaranteed=_whole(data["guaranteed"], f"{where}.guaranteed"),
        borrow_limit=_whole(data.get("borrow_limit", 0), f"{where}.borrow_limit"),
        max_gpus_per_run=None if per_run is None else _whole(per_run, f"{where}.max_gpus_per_run"),
        budget_gpu_hours=None if budget is None else _number(budget, f"{where}.budget_gpu_hours"),
        budget_hard=hard,
        weight=_whole(data.get("weight", 1), f"{where}.weight"),
    )
    return (tenant, flavor), quota


def _node_change(item: object, index: int) -> NodeChange:
    where = f"nodes[{index}]"
    data = _object(item, NODE_KEYS, where)
    missing = [key for key in ("cluster", "flavor", "count") if key not in data]
    if missing:
        raise ProposalShapeError(f"{where} needs {', '.join(missing)}.")
    return NodeChange(
        cluster=_name(data["cluster"], f"{where}.cluster"),
        flavor=_name(data["flavor"], f"{where}.flavor"),
        count=_whole(data["count"], f"{where}.count"),
        gpus_per_node=_whole(data.get("gpus_per_node", 0), f"{where}.gpus_per_node"),
    )


def proposal_from_json(data: object) -> Proposal:
    """The proposal ``data`` describes; ProposalShapeError when it is not one."""
    proposal = _object(data, PROPOSAL_KEYS, "The proposal")
    quotas: dict[tuple[str, str], Quota] = {}
    for index, item in enumerate(_list(proposal.get("quotas", []), "quotas")):
        key, quota = _quota(item, index)
        if key in quotas:
            raise ProposalShapeError(f"quotas[{index}]: {key[0]} {key[1]} is proposed twice.")
        quotas[key] = quota
    nodes = tuple(
        _node_change(item, index)
        for index, item in enumerate(_list(proposal.get("nodes", []), "nodes"))
    )
    preemption = proposal.get("preemption")
    if preemption is not None and not isinstance(preemption, bool):
        raise ProposalShapeError("preemption must be true, false or null.")
    starvation = proposal.get("starvation_after_s")
    return Proposal(
        quotas=quotas,
        nodes=nodes,
        preemption=preemption,
        starvation_after_s=None
        if starvation is None
        else _number(starvation, "starvation_after_s"),
    )


def proposal_to_json(proposal: Proposal) -> dict[str, Any]:
    """The JSON of ``proposal`` (the fields a report keeps), keys in a fixed order."""
    return {
        "quotas": [
            {
                "tenant": tenant,
                "flavor": flavor,
                "guaranteed": quota.guaranteed,
                "borrow_limit": quota.borrow_limit,
                "max_gpus_per_run": quota.max_gpus_per_run,
                "budget_gpu_hours": quota.budget_gpu_hours,
                "budget_hard": quota.budget_hard,
                "weight": quota.weight,
            }
            for (tenant, flavor), quota in sorted(proposal.quotas.items())
        ],
        "nodes": [
            {
                "cluster": change.cluster,
                "flavor": change.flavor,
                "count": change.count,
                "gpus_per_node": change.gpus_per_node,
            }
            for change in proposal.nodes
        ],
        "preemption": proposal.preemption,
        "starvation_after_s": proposal.starvation_after_s,
    }


def proposal_is_empty(proposal: Proposal) -> bool:
    """Changes nothing: replaying it is replaying the policy in force."""
    return (
        not proposal.quotas
        and not proposal.nodes
        and proposal.preemption is None
        and proposal.starvation_after_s is None
    )


def proposal_tenants(proposal: Proposal) -> set[str]:
    """The tenants whose quotas it changes."""
    return {tenant for tenant, _ in proposal.quotas}
