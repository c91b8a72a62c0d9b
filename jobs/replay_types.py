"""What a what-if replay reads and returns: plain, frozen data (``jobs.replay``).

A ``History`` is a window of the platform's past: the runs submitted in it (each with the
GPU time it really needed), the runs already holding GPUs when it began, the nodes, and the
policy in force (quotas, queueing, starvation, fair share, budgets). A ``Proposal`` changes
the policy or the nodes. An ``Outcome`` is what the platform delivered in the window, per
tenant and in total, either observed (``jobs.replay.observed_outcome``) or replayed
(``jobs.replay.replay``), with the same definitions.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from jobs.admission_types import ClusterNode, Queueing, Quota

Key = tuple[str, str]  # (tenant, flavor)


class Ending(StrEnum):
    """What ended a run, as recorded."""

    FINISHED = "finished"
    FAILED = "failed"  # its last attempt failed, no retry left
    CANCELLED = "cancelled"  # by a person, or by Gantry (an idle-GPU policy)
    UNFINISHED = "unfinished"  # still queued or holding GPUs when the history was read


@dataclass(frozen=True, slots=True)
class Actual:
    """What really happened to a run in the window (for the observed outcome). Holding means
    what admission counts: from each admission until Gantry took the GPUs back (the run
    ended, was preempted or requeued), clipped to the window."""

    held: tuple[tuple[float, float], ...] = ()  # (from, to) epoch seconds, each admission
    queued_s: float = 0.0  # every wait in the queue, up to the window's end at most
    started: bool = False  # admitted at least once by the window's end
    preemptions: int = 0
    lost_gpu_s: float = 0.0  # preempted work not kept by a checkpoint


@dataclass(frozen=True, slots=True)
class Submission:
    """A run submitted in the window (or before it and still queued at its start).

    ``ran_s``: how long it held its GPUs in the attempt that ended it, plus what earlier
    preempted attempts kept for it (their work up to the checkpoint the next attempt resumed
    from); its attempts that failed and were retried are ``failed_attempts_s``, each held
    that long before it went back to the queue. A run still going when the history was read
    (``UNFINISHED``) needs at least ``ran_s``: the replay lets it run to its time limit.

    ``cancelled_at``: a person (or Gantry) cancelled it then, while it held no GPUs (queued,
    or preempted and waiting to return): the replay cancels it at the same moment, whatever
    it is doing then. A run cancelled while it ran is ``ran_s`` long and ``CANCELLED``."""

    id: int
    tenant: str
    flavor: str
    nodes: int
    gpus_per_node: int
    priority: int
    submitted: float  # epoch seconds
    ran_s: float
    max_runtime_s: float | None = None
    topology_level: str = ""
    topology_required: bool = False
    ended: Ending = Ending.FINISHED
    cancelled_at: float | None = None
    cancelled_by: str = ""  # the person's username; "" for Gantry or nobody
    failed_attempts_s: tuple[float, ...] = ()
    # Its checkpoints' interval (a preempted attempt in the replay keeps its work up to the
    # last one); None: none known, a preempted attempt loses all it did.
    checkpoint_every_s: float | None = None
    actual: Actual = field(default_factory=Actual)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class Holding:
    """A run that held GPUs when the window began: it keeps them ``remaining_s`` from the
    window's start (when it really gave them back), unless the replay preempts it."""

    id: int
    tenant: str
    flavor: str
    cluster: str
    gpus: int
    nodes: tuple[str, ...]  # an equal share of its GPUs on each; () if not known
    priority: int
    submitted: float
    admitted: float
    borrowed: bool
    remaining_s: float
    max_runtime_s: float | None = None
    ended: Ending = Ending.FINISHED
    actual: Actual = field(default_factory=Actual)

    @property
    def gang(self) -> tuple[int, int]:
        """(nodes, GPUs per node)."""
        count = max(1, len(self.nodes))
        return count, self.gpus // count


@dataclass(frozen=True, slots=True)
class QuotaChange:
    """A quota as it was set at ``at`` during the window (replayed at the same moment)."""

    at: float
    tenant: str
    flavor: str
    quota: Quota | None  # None: the quota was deleted


@dataclass(frozen=True, slots=True)
class History:
    start: float  # epoch seconds
    end: float
    submissions: tuple[Submission, ...]
    holding: tuple[Holding, ...]
    nodes: tuple[ClusterNode, ...]
    quotas: Mapping[Key, Quota]  # in force at the window's start
    tenants: tuple[str, ...] = ()  # that exist now (a proposal may name only these)
    flavors: tuple[str, ...] = ()
    quota_changes: tuple[QuotaChange, ...] = ()
    queueing: Mapping[str, Queueing] = field(default_factory=dict)  # cluster -> policy
    tenant_queueing: Mapping[str, Queueing] = field(default_factory=dict)
    levels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # cluster -> levels
    starvation_after_s: float = math.inf
    fair_share_half_life_s: float = 24 * 3600.0
    decayed_usage: Mapping[Key, float] = field(default_factory=dict)  # at the start
    # GPU-hours charged to each (tenant, flavor) in the window's first month before it began
    budget_used: Mapping[Key, float] = field(default_factory=dict)
    # Where this history is known to differ from what admission saw: said on the page.
    notes: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class NodeChange:
    """``count`` nodes added (> 0) or removed (< 0) on ``cluster`` for ``flavor``, for the
    whole window. Added nodes have ``gpus_per_node`` GPUs (0: as many as the cluster's
    nodes of the flavor) and join the topology domain of the pool's last node; removed
    nodes are the pool's last by name (of ``gpus_per_node`` GPUs if given), preferring nodes
    no run held at the window's start."""

    cluster: str
    flavor: str
    count: int
    gpus_per_node: int = 0


@dataclass(frozen=True, slots=True)
class Problems:
    """What is wrong with a proposal (``errors``: it cannot be replayed or applied) and
    what needs a person's confirmation (``warnings``: overcommitted guarantees, say)."""

    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True, slots=True)
class Proposal:
    """Changes only; what it leaves out stays as in force (``None``, empty)."""

    quotas: Mapping[Key, Quota] = field(default_factory=dict)  # the whole new quota per key
    nodes: tuple[NodeChange, ...] = ()
    # False: no run is ever preempted (borrowed runs keep their GPUs until they end).
    preemption: bool | None = None
    starvation_after_s: float | None = None
    queueing: Mapping[str, Queueing] = field(default_factory=dict)  # cluster -> policy
    tenant_queueing: Mapping[str, Queueing] = field(default_factory=dict)
    fair_share_half_life_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (a report keeps the proposal it replayed)."""
        return {
            "quotas": [
                {"tenant": tenant, "flavor": flavor, **_quota_json(quota)}
                for (tenant, flavor), quota in sorted(self.quotas.items())
            ],
            "nodes": [
                {
                    "cluster": c.cluster,
                    "flavor": c.flavor,
                    "count": c.count,
                    "gpus_per_node": c.gpus_per_node,
                }
                for c in self.nodes
            ],
            "preemption": self.preemption,
            "starvation_after_s": self.starvation_after_s,
            "queueing": {name: policy.value for name, policy in sorted(self.queueing.items())},
            "tenant_queueing": {
                name: policy.value for name, policy in sorted(self.tenant_queueing.items())
            },
            "fair_share_half_life_s": self.fair_share_half_life_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Proposal":
        def optional(name: str) -> float | None:
            value = data.get(name)
            return None if value is None else float(value)

        return cls(
            quotas={
                (str(q["tenant"]), str(q["flavor"])): Quota(
                    guaranteed=int(q["guaranteed"]),
                    borrow_limit=int(q["borrow_limit"]),
                    max_gpus_per_run=(
                        None if q["max_gpus_per_run"] is None else int(q["max_gpus_per_run"])
                    ),
                    budget_gpu_hours=(
                        None if q["budget_gpu_hours"] is None else float(q["budget_gpu_hours"])
                    ),
                    budget_hard=bool(q["budget_hard"]),
                    weight=int(q["weight"]),
                )
                for q in data.get("quotas", ())
            },
            nodes=tuple(
                NodeChange(
                    str(c["cluster"]), str(c["flavor"]), int(c["count"]), int(c["gpus_per_node"])
                )
                for c in data.get("nodes", ())
            ),
            preemption=None if data.get("preemption") is None else bool(data["preemption"]),
            starvation_after_s=optional("starvation_after_s"),
            queueing={str(k): Queueing(v) for k, v in data.get("queueing", {}).items()},
            tenant_queueing={
                str(k): Queueing(v) for k, v in data.get("tenant_queueing", {}).items()
            },
            fair_share_half_life_s=optional("fair_share_half_life_s"),
        )

    def validate(self, history: History) -> Problems:
        """Errors: a negative or impossible value, a tenant, flavor or cluster that does not
        exist (deleted since the window, say), more nodes removed than there are. Warnings:
        guarantees that add up to more GPUs than the flavor has after the proposal (allowed,
        as on the quota form, once a person confirms it)."""
        errors: list[str] = []
        tenants = set(history.tenants) or {tenant for tenant, _ in history.quotas}
        flavors = set(history.flavors) or {n.flavor for n in history.nodes}
        for (tenant, flavor), quota in sorted(self.quotas.items()):
            if tenant not in tenants:
                errors.append(f"There is no tenant {tenant} (deleted since?).")
            if flavor not in flavors:
                errors.append(f"There is no GPU flavor {flavor} (deleted since?).")
            errors.extend(f"{tenant} {flavor}: {problem}" for problem in _quota_problems(quota))
        errors.extend(_node_change_problems(self.nodes, history, flavors))
        if self.starvation_after_s is not None and not self.starvation_after_s >= 0:
            errors.append("The starvation threshold cannot be negative.")
        if self.fair_share_half_life_s is not None and not self.fair_share_half_life_s > 0:
            errors.append("The fair-share half-life must be longer than 0 s.")
        clusters = {n.cluster for n in history.nodes}
        errors.extend(
            f"There is no cluster {name} to set a queueing policy on."
            for name in sorted(set(self.queueing) - clusters)
        )
        errors.extend(
            f"There is no tenant {name} to set a queueing policy on."
            for name in sorted(set(self.tenant_queueing) - tenants)
        )
        warnings = [] if errors else _overcommit_warnings(self, history)
        return Problems(errors=tuple(errors), warnings=tuple(warnings))


def _quota_json(quota: Quota) -> dict[str, Any]:
    return {
        "guaranteed": quota.guaranteed,
        "borrow_limit": quota.borrow_limit,
        "max_gpus_per_run": quota.max_gpus_per_run,
        "budget_gpu_hours": quota.budget_gpu_hours,
        "budget_hard": quota.budget_hard,
        "weight": quota.weight,
    }


def _quota_problems(quota: Quota) -> list[str]:
    problems = []
    if quota.guaranteed < 0:
        problems.append(f"the guarantee cannot be {quota.guaranteed} GPUs (0 at least).")
    if quota.borrow_limit < 0:
        problems.append(f"the borrow limit cannot be {quota.borrow_limit} GPUs (0 at least).")
    if quota.weight < 1:
        problems.append(f"the fair-share weight cannot be {quota.weight} (1 at least).")
    if quota.max_gpus_per_run is not None and quota.max_gpus_per_run < 1:
        problems.append(f"the largest run cannot be {quota.max_gpus_per_run} GPUs (1 at least).")
    if quota.budget_gpu_hours is not None and not quota.budget_gpu_hours >= 0:
        problems.append(f"the monthly budget cannot be {quota.budget_gpu_hours:g} GPU-hours.")
    return problems


def _pool(nodes: tuple[ClusterNode, ...], cluster: str, flavor: str) -> list[ClusterNode]:
    return sorted((n for n in nodes if n.cluster == cluster and n.flavor == flavor), key=_by_name)


def _by_name(node: ClusterNode) -> str:
    return node.name


def _node_change_problems(
    changes: tuple[NodeChange, ...], history: History, flavors: set[str]
) -> list[str]:
    problems = []
    clusters = {n.cluster for n in history.nodes}
    removed: dict[tuple[str, str, int], int] = {}
    for change in changes:
        where = f"{change.cluster} {change.flavor}"
        pool = _pool(history.nodes, change.cluster, change.flavor)
        if change.cluster not in clusters:
            problems.append(f"There is no cluster {change.cluster} (deleted since?).")
        elif change.flavor not in flavors:
            problems.append(f"There is no GPU flavor {change.flavor} (deleted since?).")
        elif change.count == 0:
            problems.append(f"{where}: a change of 0 nodes changes nothing.")
        elif change.gpus_per_node < 0:
            problems.append(f"{where}: a node cannot have {change.gpus_per_node} GPUs.")
        elif change.count > 0 and change.gpus_per_node == 0 and not pool:
            problems.append(f"{where}: say how many GPUs the new nodes have (none there yet).")
        elif change.count < 0:
            size = change.gpus_per_node
            key = (change.cluster, change.flavor, size)
            removed[key] = removed.get(key, 0) - change.count
            there = sum(1 for n in pool if not size or n.gpus == size)
            if removed[key] > there:
                of = f" of {size} GPUs" if size else ""
                problems.append(f"{where}: cannot remove {removed[key]} nodes{of}; it has {there}.")
    return problems


def proposed_nodes(history: History, changes: tuple[NodeChange, ...]) -> tuple[ClusterNode, ...]:
    """The history's nodes with ``changes`` made (valid ones: ``Proposal.validate``)."""
    nodes = list(history.nodes)
    held_at_start = {(h.cluster, name) for h in history.holding for name in h.nodes}
    for change in changes:
        pool = _pool(tuple(nodes), change.cluster, change.flavor)
        if change.count > 0:
            size = change.gpus_per_node or (pool[-1].gpus if pool else 0)
            path = pool[-1].path if pool else ()
            already = sum(1 for n in pool if "-added-" in n.name)
            nodes.extend(
                ClusterNode(change.cluster, change.flavor,
                            f"{change.cluster}-{change.flavor}-added-{i:02d}", size, path=path)
                for i in range(already, already + change.count)
            )  # fmt: skip
            continue
        candidates = [n for n in pool if not change.gpus_per_node or n.gpus == change.gpus_per_node]
        # The last by name, those no run held at the window's start first.
        candidates.sort(key=lambda n: ((n.cluster, n.name) not in held_at_start, n.name))
        gone = {n.name for n in candidates[change.count :]}
        nodes = [n for n in nodes if not (n.cluster == change.cluster and n.name in gone)]
    return tuple(nodes)


def _overcommit_warnings(proposal: Proposal, history: History) -> list[str]:
    capacity: dict[str, int] = {}
    for node in proposed_nodes(history, proposal.nodes):
        capacity[node.flavor] = capacity.get(node.flavor, 0) + node.gpus
    guaranteed: dict[str, int] = {}
    for (_, flavor), quota in {**history.quotas, **proposal.quotas}.items():
        guaranteed[flavor] = guaranteed.get(flavor, 0) + quota.guaranteed
    warnings = []
    for flavor, total in sorted(guaranteed.items()):
        gpus = capacity.get(flavor, 0)
        if total > gpus:
            warnings.append(
                f"The {flavor} guarantees of all tenants add up to {total:,} GPUs, "
                f"{total - gpus:,} more than the {gpus:,} the clusters would have: not all "
                "can be kept at once. Confirm to replay or apply it anyway."
            )
    return warnings


@dataclass(frozen=True, slots=True)
class BudgetBurn:
    """A tenant's GPU-hours of a flavor in one calendar month (UTC) against its budget,
    counting what it used in that month before the window."""

    flavor: str
    month: str  # "2027-02"
    used_gpu_hours: float
    budget_gpu_hours: float
    hard: bool


@dataclass(frozen=True, slots=True)
class TenantOutcome:
    """Queue times are of the runs submitted in the window: every wait of a run, from
    submission (or a requeue) to admission; a run still waiting at the window's end counts
    what it waited until then. Percentiles are nearest-rank: p50 is the smallest queue time
    that at least half of the runs did not exceed."""

    tenant: str
    runs: int
    started: int  # admitted at least once by the window's end
    not_started: int
    queue_p50_s: float | None  # None: no run submitted
    queue_p95_s: float | None
    gpu_hours: float  # GPU-hours its runs held in the window
    preemptions: int
    lost_gpu_hours: float
    budgets: tuple[BudgetBurn, ...] = ()

    @classmethod
    def nothing(cls, tenant: str) -> "TenantOutcome":
        """A tenant without runs in an outcome (one side of a comparison)."""
        return cls(tenant, 0, 0, 0, None, None, 0.0, 0, 0.0)


@dataclass(frozen=True, slots=True)
class Outcome:
    start: float
    end: float
    tenants: tuple[TenantOutcome, ...]  # by name
    capacity_gpu_hours: float  # the nodes' GPUs times the window
    gpu_hours: float  # held by Gantry's runs in the window
    runs: int
    started: int
    not_started: int
    preemptions: int
    lost_gpu_hours: float

    @property
    def utilisation(self) -> float:
        """Percent of the GPU capacity-time that Gantry's runs held."""
        return 100.0 * self.gpu_hours / self.capacity_gpu_hours if self.capacity_gpu_hours else 0.0

    def tenant(self, name: str) -> TenantOutcome | None:
        return next((t for t in self.tenants if t.tenant == name), None)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (a report keeps it in a JSON field)."""
        return {
            "start": self.start,
            "end": self.end,
            "capacity_gpu_hours": self.capacity_gpu_hours,
            "gpu_hours": self.gpu_hours,
            "runs": self.runs,
            "started": self.started,
            "not_started": self.not_started,
            "preemptions": self.preemptions,
            "lost_gpu_hours": self.lost_gpu_hours,
            "tenants": [
                {
                    "tenant": t.tenant,
                    "runs": t.runs,
                    "started": t.started,
                    "not_started": t.not_started,
                    "queue_p50_s": t.queue_p50_s,
                    "queue_p95_s": t.queue_p95_s,
                    "gpu_hours": t.gpu_hours,
                    "preemptions": t.preemptions,
                    "lost_gpu_hours": t.lost_gpu_hours,
                    "budgets": [
                        {
                            "flavor": b.flavor,
                            "month": b.month,
                            "used_gpu_hours": b.used_gpu_hours,
                            "budget_gpu_hours": b.budget_gpu_hours,
                            "hard": b.hard,
                        }
                        for b in t.budgets
                    ],
                }
                for t in self.tenants
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Outcome":
        return cls(
            start=float(data["start"]),
            end=float(data["end"]),
            capacity_gpu_hours=float(data["capacity_gpu_hours"]),
            gpu_hours=float(data["gpu_hours"]),
            runs=int(data["runs"]),
            started=int(data["started"]),
            not_started=int(data["not_started"]),
            preemptions=int(data["preemptions"]),
            lost_gpu_hours=float(data["lost_gpu_hours"]),
            tenants=tuple(
                TenantOutcome(
                    tenant=str(t["tenant"]),
                    runs=int(t["runs"]),
                    started=int(t["started"]),
                    not_started=int(t["not_started"]),
                    queue_p50_s=None if t["queue_p50_s"] is None else float(t["queue_p50_s"]),
                    queue_p95_s=None if t["queue_p95_s"] is None else float(t["queue_p95_s"]),
                    gpu_hours=float(t["gpu_hours"]),
                    preemptions=int(t["preemptions"]),
                    lost_gpu_hours=float(t["lost_gpu_hours"]),
                    budgets=tuple(
                        BudgetBurn(
                            flavor=str(b["flavor"]),
                            month=str(b["month"]),
                            used_gpu_hours=float(b["used_gpu_hours"]),
                            budget_gpu_hours=float(b["budget_gpu_hours"]),
                            hard=bool(b["hard"]),
                        )
                        for b in t["budgets"]
                    ),
                )
                for t in data["tenants"]
            ),
        )
