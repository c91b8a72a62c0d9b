"""A preemption is made only when its freed GPUs reach the reclaiming run (issue 31, point 4):
the pure rule, and how the outside queue is kept between the inventory and admission."""

from datetime import UTC, datetime

import pytest

from jobs.admission import (
    Admit,
    HeldRun,
    Pool,
    Preempt,
    QueuedRun,
    Quota,
    Snapshot,
    Wait,
    Waiting,
    decide,
    nodes_of,
)
from jobs.backends.base import PendingClaim
from jobs.reclaim import OutsideClaim, OutsideQueue, claims_record, queues_of

A100 = "a100-80gb"
NODES = ("c1-a100-80gb-00", "c1-a100-80gb-01")
QUOTAS = {("vision", A100): Quota(guaranteed=16), ("nlp", A100): Quota(0, borrow_limit=16)}
# nlp's borrowed 2 x 8 holds both nodes; vision, within its guarantee, asks for 1 x 8.
NLP = HeldRun(1, "nlp", A100, "c1", 16, 0, 100.0, borrowed=True, nodes=NODES)
VISION = QueuedRun(2, "vision", A100, 1, 8, 0, 200.0)
OUTSIDE_2X8 = OutsideClaim("Slurm job 812", A100, 2, 8)
STOLEN = (
    "preempting 1 borrowed run on c1 would free 16 a100-80gb GPUs, but Slurm job 812 from "
    "outside Gantry (2 × 8 a100-80gb GPUs) waits for them and c1 would start it first; this "
    "run waits until that job has started elsewhere or GPUs free up without a preemption"
)
RECLAIMED = Preempt(
    run_id=1,
    by_run_id=2,
    message="a tenant within its guarantee reclaimed 8 a100-80gb GPUs on c1; this run had "
    "borrowed 16",
    detail="tenant vision reclaimed 8 a100-80gb GPUs of its guarantee on c1 for run 2; this "
    "run had borrowed 16",
)


def scenario(queue: OutsideQueue | None, *, nodes=None, held=(NLP,)) -> Snapshot:
    return Snapshot(
        queued=(VISION,),
        held=tuple(held),
        nodes=nodes or nodes_of(Pool("c1", A100, 2, 8)),
        quotas=QUOTAS,
        outside={} if queue is None else {"c1": queue},
    )


def test_a_preemption_whose_gpus_an_outside_job_would_take_first_is_not_made():
    decisions = decide(scenario(OutsideQueue(reclaim_first=False, claims=(OUTSIDE_2X8,))))
    assert (decisions.admitted, decisions.preempted) == ((), ())
    assert decisions.waiting == (Waiting(2, Wait.CAPACITY, STOLEN, 1),)


@pytest.mark.parametrize(
    "queue",
    [
        None,  # a cluster whose inventory says nothing of outside jobs (the simulator)
        OutsideQueue(reclaim_first=True, claims=(OUTSIDE_2X8,)),  # Slurm CLI: ours goes first
        OutsideQueue(reclaim_first=False, claims=()),
        # Too large for the freed GPUs: 3 nodes on a cluster of 2.
        OutsideQueue(reclaim_first=False, claims=(OutsideClaim("Slurm job 9", A100, 3, 8),)),
        # Another flavor's, or held to a node the preemption does not free.
        OutsideQueue(reclaim_first=False, claims=(OutsideClaim("Slurm job 9", "h100", 1, 8),)),
        OutsideQueue(
            reclaim_first=False,
            claims=(OutsideClaim("Slurm job 9", A100, 1, 8, eligible=("elsewhere-07",)),),
        ),
    ],
)
def test_a_preemption_nothing_outside_would_take_first_is_made(queue):
    decisions = decide(scenario(queue))
    assert decisions.preempted == (RECLAIMED,)
    assert decisions.admitted == (Admit(2, "c1", nodes=(NODES[0],)),)
    assert decisions.waiting == ()


@pytest.mark.parametrize(
    ("claim", "preempted"),
    [
        # Fits on the free third node now: it does not wait for what the preemption frees.
        (OutsideClaim("Slurm job 9", A100, 1, 8), (1,)),
        # Needs two nodes: only the preemption's make room for it.
        (OutsideClaim("Slurm job 9", A100, 2, 8), ()),
    ],
)
def test_only_an_outside_job_that_waits_for_the_freed_gpus_stops_the_preemption(claim, preempted):
    vision = QueuedRun(2, "vision", A100, 2, 8, 0, 200.0)
    snapshot = Snapshot(
        queued=(vision,),
        held=(NLP,),
        nodes=nodes_of(Pool("c1", A100, 3, 8)),
        quotas=QUOTAS,
        outside={"c1": OutsideQueue(reclaim_first=False, claims=(claim,))},
    )
    decisions = decide(snapshot)
    assert tuple(p.run_id for p in decisions.preempted) == preempted
    assert [a.run_id for a in decisions.admitted] == ([2] if preempted else [])


def test_an_outside_queue_that_could_not_be_read_stops_preemption_with_its_reason():
    queue = OutsideQueue(
        reclaim_first=False,
        error="squeue's pending jobs could not be read: job 17: state 'BOOT_FAIL', where only "
        "PENDING was asked for",
    )
    decisions = decide(scenario(queue))
    assert (decisions.admitted, decisions.preempted) == ((), ())
    assert decisions.waiting == (
        Waiting(
            2,
            Wait.CAPACITY,
            "preempting 1 borrowed run on c1 would free 16 a100-80gb GPUs, but c1's queue could "
            "not be read (squeue's pending jobs could not be read: job 17: state 'BOOT_FAIL', "
            "where only PENDING was asked for), so whether they would reach this run is not "
            "known: no preemption on a guess",
            1,
        ),
    )


def test_the_inventorys_claims_reach_admission_in_the_backends_order():
    later = PendingClaim("Slurm job 813", A100, 1, 4, priority=10)
    first = PendingClaim(
        "Slurm job 812",
        A100,
        2,
        8,
        priority=20,
        expected_start=datetime(2026, 12, 6, 4, 0, tzinfo=UTC),
        expected_nodes=NODES,
        eligible=("c1-a100-80gb-01",),
    )
    unknown_flavor = PendingClaim("Slurm job 9", "l4", 1, 1, priority=99)
    record = claims_record(
        [later, first, unknown_flavor], error="", reclaim_first=False, flavors=[A100]
    )
    assert record == {
        "reclaim_first": False,
        "error": "",
        "claims": [
            {"job": "Slurm job 812", "flavor": A100, "nodes": 2, "gpus_per_node": 8,
             "eligible": ["c1-a100-80gb-01"]},
            {"job": "Slurm job 813", "flavor": A100, "nodes": 1, "gpus_per_node": 4,
             "eligible": []},
        ],
        "next": [
            {"job": "Slurm job 812", "priority": 20, "expected_start": "2026-12-06T04:00:00+00:00",
             "expected_nodes": list(NODES)},
            {"job": "Slurm job 813", "priority": 10, "expected_start": None, "expected_nodes": []},
        ],
    }  # fmt: skip
    assert queues_of({"c1": record, "never-read": {}}) == {
        "c1": OutsideQueue(
            reclaim_first=False,
            claims=(
                OutsideClaim("Slurm job 812", A100, 2, 8, eligible=("c1-a100-80gb-01",)),
                OutsideClaim("Slurm job 813", A100, 1, 4),
            ),
        )
    }
