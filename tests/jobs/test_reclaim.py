"""A preemption is made only when its freed GPUs reach the reclaiming run (issue 31, point 4):
the pure rule, and how the outside queue is kept between the inventory and admission."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from clusters.backends.base import PendingClaim
from clusters.backends.simulator import SimulatorBackend
from clusters.models import Cluster, SimulatedJob
from clusters.outside_claims import OutsideClaim, OutsideQueue, claims_record, queues_of
from clusters.services import cluster_refresh_inventory
from jobs.admission import decide
from jobs.admission_types import (
    Admit,
    HeldRun,
    Pool,
    Preempt,
    QueuedRun,
    Quota,
    Snapshot,
    Wait,
    Waiting,
    nodes_of,
)
from jobs.enqueue import ATTEMPT_CANCEL
from jobs.models import Attempt, AttemptState, RunState
from jobs.models import Run as RunModel
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_redrive_deferred_cancels, attempt_submit
from jobs.services.backend_sync import attempt_cancel
from tenants.models import Quota as QuotaModel
from tests.jobs.test_lifecycle import run_to_running, submit

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


# --- through the services: a preempted job is cancelled once the reclaiming one is queued


def sent(callbacks, task: str) -> list[str]:
    """The arguments of every ``task`` sent by the captured on-commit callbacks."""
    prefix = f"send {task}"
    return [c.__qualname__[len(prefix) :] for c in callbacks if c.__qualname__.startswith(prefix)]


@pytest.fixture
def reclaim_first_simulator(world, monkeypatch):
    """The simulator as a backend that starts a reclaiming run first (as Slurm through the
    CLI does), recorded with its inventory: its preempted jobs are cancelled only once the
    reclaiming one is submitted."""
    monkeypatch.setattr(SimulatorBackend, "reclaim_first", True)
    cluster_refresh_inventory(cluster=world.cluster)
    assert Cluster.objects.get(pk=world.cluster.pk).outside_claims == {
        "reclaim_first": True, "error": "", "claims": [], "next": []
    }  # fmt: skip


def test_a_preempted_job_is_cancelled_only_after_the_reclaiming_job_was_submitted(
    world, reclaim_first_simulator, django_capture_on_commit_callbacks
):
    QuotaModel.objects.filter(tenant=world.nlp, flavor=world.h100).update(
        guaranteed_gpus=0, borrow_limit_gpus=16
    )
    h100 = {"tenant": "nlp", "project": "llm", "flavor": "h100-80gb", "gpus_per_node": 8}
    lent = submit(world, user=world.researcher_b, nodes=2, **h100)
    run_to_running(world, lent)
    assert RunModel.objects.get(pk=lent.pk).state == RunState.RUNNING
    victim = lent.attempts.get()

    reclaimer = submit(world, flavor="h100-80gb", gpus_per_node=8)
    with django_capture_on_commit_callbacks() as callbacks:
        admission_run_cycle()
    reclaiming = Attempt.objects.get(run=reclaimer)
    victim.refresh_from_db()
    assert victim.preempted_for_id == reclaiming.pk
    assert sent(callbacks, ATTEMPT_CANCEL) == [f"({victim.pk},)"]

    # The cancel task, run before the reclaiming job is submitted, leaves the job running;
    attempt_cancel(attempt_id=victim.pk)
    assert SimulatedJob.objects.get(name=victim.name).state == "RUNNING"
    assert attempt_redrive_deferred_cancels() == 0
    # the submit sends it again, and then it cancels.
    with django_capture_on_commit_callbacks() as callbacks:
        attempt_submit(attempt_id=reclaiming.pk)
    assert sent(callbacks, ATTEMPT_CANCEL) == [f"({victim.pk},)"]
    attempt_cancel(attempt_id=victim.pk)
    assert SimulatedJob.objects.get(name=victim.name).state == "CANCELLED"
    assert RunModel.objects.get(pk=lent.pk).state == RunState.QUEUED


def test_a_deferred_cancel_whose_sender_died_is_sent_again_by_the_sync(
    world, reclaim_first_simulator, django_capture_on_commit_callbacks
):
    QuotaModel.objects.filter(tenant=world.nlp, flavor=world.h100).update(
        guaranteed_gpus=0, borrow_limit_gpus=16
    )
    h100 = {"tenant": "nlp", "project": "llm", "flavor": "h100-80gb", "gpus_per_node": 8}
    lent = submit(world, user=world.researcher_b, nodes=2, **h100)
    run_to_running(world, lent)
    victim = lent.attempts.get()
    reclaimer = submit(world, flavor="h100-80gb", gpus_per_node=8)
    admission_run_cycle()
    reclaiming = Attempt.objects.get(run=reclaimer)
    # The reclaiming job reached the backend, but the worker died before sending the cancel.
    Attempt.objects.filter(pk=reclaiming.pk).update(state=AttemptState.PENDING)
    assert attempt_redrive_deferred_cancels() == 0  # its own submit may still send it
    later = timezone.now() + timedelta(seconds=31)
    with time_machine.travel(later), django_capture_on_commit_callbacks() as callbacks:
        assert attempt_redrive_deferred_cancels() == 1
    assert sent(callbacks, ATTEMPT_CANCEL) == [f"({victim.pk},)"]
