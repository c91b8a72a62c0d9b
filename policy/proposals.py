"""A what-if proposal as a person or a client sends it (JSON), read into the replay's
``jobs.replay_types.Proposal`` with an error a person can act on (pure: no Django). What a
report keeps is the proposal's own JSON (``Proposal.to_json``, read back with
``Proposal.from_json``); this reads the untrusted input, with defaults for what it leaves
out.

The JSON, every key optional::

    {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 8,
                 "borrow_limit": 4, "max_gpus_per_run": null, "budget_gpu_hours": 1000,
                 "budget_hard": true, "weight": 2}],
     "nodes": [{"cluster": "sim-1", "flavor": "a100-80gb", "count": 2, "gpus_per_node": 0}],
     "preemption": false, "starvation_after_s": 3600,
     "queueing": {"sim-1": "strict"}, "tenant_queueing": {"nlp": "best-effort"},
     "fair_share_half_life_s": 43200}

A quota is the whole new quota of its (tenant, flavor), as the quota form sets it; nodes are
added (``count`` > 0) or removed (< 0) for the whole window; ``preemption`` false means no
borrowed run is ever preempted, ``starvation_after_s`` how long a run waits before GPUs are
held for it; ``queueing`` sets a cluster's queueing policy and ``tenant_queueing`` a tenant's
(strict, backfill or best-effort), ``fair_share_half_life_s`` how fast usage is forgotten.
What the proposal leaves out stays as it was in force.

``proposal_from_json`` checks the shape and the types (``ProposalShapeError`` names the
first wrong value); the values themselves (a negative guarantee, a tenant that does not
exist, more nodes removed than there are) are ``Proposal.validate``'s to judge.
"""

import math
import re
from collections.abc import Mapping
from typing import Any

from jobs.admission_types import Queueing, Quota
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
PROPOSAL_KEYS = (
    "quotas",
    "nodes",
    "preemption",
    "starvation_after_s",
    "queueing",
    "tenant_queueing",
    "fair_share_half_life_s",
)
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
    return Proposal(
        quotas=quotas,
        nodes=nodes,
        preemption=preemption,
        starvation_after_s=_optional_number(proposal, "starvation_after_s"),
        queueing=_policies(proposal.get("queueing", {}), "queueing"),
        tenant_queueing=_policies(proposal.get("tenant_queueing", {}), "tenant_queueing"),
        fair_share_half_life_s=_optional_number(proposal, "fair_share_half_life_s"),
    )


def _optional_number(proposal: Mapping[str, Any], key: str) -> float | None:
    value = proposal.get(key)
    return None if value is None else _number(value, key)


def _policies(value: object, where: str) -> dict[str, Queueing]:
    """{name: queueing policy}: a cluster's or a tenant's."""
    if not isinstance(value, dict):
        raise ProposalShapeError(f"{where} must be an object.")
    known = ", ".join(policy.value for policy in Queueing)
    policies = {}
    for name, policy in value.items():
        _name(name, f"{where} key")
        if policy not in {p.value for p in Queueing}:
            raise ProposalShapeError(f"{where}.{name} must be one of: {known}.")
        policies[name] = Queueing(policy)
    return policies


def proposal_is_empty(proposal: Proposal) -> bool:
    """Changes nothing: replaying it is replaying the policy in force."""
    return proposal == Proposal()


def proposal_tenants(proposal: Proposal) -> set[str]:
    """The tenants whose quotas it changes."""
    return {tenant for tenant, _ in proposal.quotas}
