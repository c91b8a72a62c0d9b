"""The jobs from outside Gantry a cluster's queue holds, as its inventory last read them:
``claims_record`` writes ``Cluster.outside_claims`` from a backend's ``PendingClaim`` rows,
``queues_of`` reads the records back for admission (``jobs.reclaim``). Pure: no ORM, no I/O.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clusters.backends.base import PendingClaim


@dataclass(frozen=True, slots=True)
class OutsideClaim:
    """A job from outside Gantry waiting for ``nodes`` nodes with ``gpus_per_node`` free
    GPUs of ``flavor`` each, on any of ``eligible`` (empty: any node of the flavor)."""

    job: str  # the backend's name for it: "Slurm job 812"
    flavor: str
    nodes: int
    gpus_per_node: int
    eligible: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OutsideQueue:
    """A cluster's queue of outside jobs as admission sees it. ``error``: the queue could
    not be read whole, so whether a preemption's GPUs would reach the reclaiming run is not
    known."""

    reclaim_first: bool = True
    claims: tuple[OutsideClaim, ...] = ()
    error: str = ""


def queues_of(records: Mapping[str, Mapping[str, Any]]) -> dict[str, OutsideQueue]:
    """The queues of ``Cluster.outside_claims`` records (``claims_record``), by cluster."""
    return {
        cluster: OutsideQueue(
            reclaim_first=bool(record.get("reclaim_first", True)),
            claims=tuple(
                OutsideClaim(
                    job=str(claim["job"]),
                    flavor=str(claim["flavor"]),
                    nodes=int(claim["nodes"]),
                    gpus_per_node=int(claim["gpus_per_node"]),
                    eligible=tuple(claim.get("eligible") or ()),
                )
                for claim in record.get("claims") or ()
            ),
            error=str(record.get("error") or ""),
        )
        for cluster, record in records.items()
        if record
    }


def claims_record(
    claims: Iterable[PendingClaim], *, error: str, reclaim_first: bool, flavors: Iterable[str]
) -> dict[str, Any]:
    """What ``Cluster.outside_claims`` keeps of an inventory's ``PendingClaim`` rows (those
    of flavors Gantry knows): ``claims`` for admission, in the backend's order (priority
    first where it has one), and ``next`` for people, with the backend's priority, expected
    start and planned nodes (left out of admission's fingerprint: they move every cycle)."""
    known = set(flavors)
    kept = sorted(
        (claim for claim in claims if claim.flavor in known),
        key=lambda claim: -(claim.priority or 0),
    )
    return {
        "reclaim_first": reclaim_first,
        "error": error,
        "claims": [
            {
                "job": claim.job,
                "flavor": claim.flavor,
                "nodes": claim.nodes,
                "gpus_per_node": claim.gpus_per_node,
                "eligible": list(claim.eligible),
            }
            for claim in kept
        ],
        "next": [
            {
                "job": claim.job,
                "priority": claim.priority,
                "expected_start": (
                    claim.expected_start.isoformat() if claim.expected_start else None
                ),
                "expected_nodes": list(claim.expected_nodes),
            }
            for claim in kept
        ],
    }
