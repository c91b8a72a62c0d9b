"""Concurrency against real PostgreSQL with real threads: submitters and admitters at once.

Every thread talks to the database through its own connection (Django's connections are
per thread) and closes it when done. Submitting only inserts QUEUED rows and admission
holds a PostgreSQL advisory lock, so no interleaving may over-admit.
"""

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
from django.db import connection, connections
from django.db.models import Count, Sum

from clusters.models import ClusterFlavor
from jobs import admission
from jobs.models import HOLDING_STATES, Attempt, Run, RunEvent, RunState
from jobs.services import admission_cycle
from jobs.services.admission_cycle import AdmissionSummary, admission_run_cycle
from jobs.services.submission import run_submit
from portal.celery import app as celery_app
from tenants.models import Quota
from tests.conftest import experiment_input

SUBMITTERS = 50
ADMITTERS = 3
WAVES, WAVE_S = 10, 0.03  # submitters start in 10 waves of 5, 30 ms apart

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="needs PostgreSQL's advisory locks"
    ),
    # Each test here holds about SUBMITTERS + ADMITTERS connections at once: two of them in
    # two pytest-xdist workers together exceed PostgreSQL's default max_connections (100).
    pytest.mark.xdist_group("many-db-connections"),
]


@dataclass
class SlowDecide:
    delay: float  # seconds added to every decision
    calls: list[int] = field(default_factory=list)  # the calling threads


@pytest.fixture
def slow_decide(monkeypatch) -> SlowDecide:
    """Make every admission decision slower, deterministically. It widens the window in
    which two admitters could overlap, so a missing lock shows as over-admission rather
    than depending on luck. (the cycle calls ``admission.decide`` through the module.)"""
    slow = SlowDecide(delay=0.02)
    real_decide = admission.decide

    def decide(snapshot):
        slow.calls.append(threading.get_ident())
        time.sleep(slow.delay)
        return real_decide(snapshot)

    monkeypatch.setattr(admission, "decide", decide)
    return slow


@pytest.fixture(autouse=True)
def purge_celery_queue():
    """Submits and admissions enqueue tasks on commit; no worker runs here, so drop them."""
    yield
    celery_app.control.purge()


def in_threads(targets, *, timeout: float = 120) -> list:
    """Start one thread per callable behind a barrier; return each one's result, re-raising
    the first error. Each thread closes its database connections when it is done."""
    barrier = threading.Barrier(len(targets))
    results: list = [None] * len(targets)
    errors: list[BaseException] = []

    def work(index, target):
        try:
            barrier.wait(timeout=30)
            results[index] = target()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=work, args=(index, target), daemon=True)
        for index, target in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


def holding_gpus() -> tuple[dict, dict]:
    """GPUs held now per (cluster, flavor) and per (tenant, flavor), in one query each."""
    holding = Run.objects.filter(state__in=HOLDING_STATES)
    per_pool = {
        (row["cluster__name"], row["flavor__slug"]): row["gpus"]
        for row in holding.values("cluster__name", "flavor__slug").annotate(gpus=Sum("gpus"))
    }
    per_tenant = {
        (row["tenant__slug"], row["flavor__slug"]): row["gpus"]
        for row in holding.values("tenant__slug", "flavor__slug").annotate(gpus=Sum("gpus"))
    }
    return per_pool, per_tenant


def limits() -> tuple[dict, dict]:
    capacity = {
        (cf.cluster.name, cf.flavor.slug): cf.capacity_gpus
        for cf in ClusterFlavor.objects.select_related("cluster", "flavor")
    }
    ceiling = {
        (q.tenant.slug, q.flavor.slug): q.guaranteed_gpus + q.borrow_limit_gpus
        for q in Quota.objects.select_related("tenant", "flavor")
    }
    return capacity, ceiling


def assert_within_limits(capacity: dict, ceiling: dict) -> None:
    per_pool, per_tenant = holding_gpus()
    for pool, gpus in per_pool.items():
        assert gpus <= capacity[pool], f"{pool} holds {gpus} of {capacity[pool]} GPUs"
    for key, gpus in per_tenant.items():
        assert gpus <= ceiling[key], f"{key} holds {gpus} GPUs, above its {ceiling[key]}"


def submitter(world, index: int):
    """Submitter ``index``: vision or nlp, a100 or h100, 1-8 GPUs, three priorities."""
    vision = index % 2 == 0
    data = experiment_input(
        world,
        tenant="vision" if vision else "nlp",
        project="detection" if vision else "llm",
        flavor="a100-80gb" if index % 3 else "h100-80gb",
        nodes=1,
        gpus_per_node=1 + (index * 5) % 8,
        priority=(30, 50, 70)[index % 3],
        name=f"concurrent-{index}",
    )
    user = world.researcher_a if vision else world.researcher_b

    def submit():
        time.sleep(WAVE_S * (index % WAVES))  # a stream of waves while admitters run
        return run_submit(user=user, data=data).pk

    return submit


def admitter(done: threading.Event, capacity: dict, ceiling: dict):
    """Run admission cycles until the submitters are done, checking the limits after each."""

    def loop():
        summaries = []
        while not done.is_set():
            summaries.append(admission_run_cycle())
            assert_within_limits(capacity, ceiling)
        return summaries

    return loop


def submit_while_admitting(world) -> list:
    capacity, ceiling = limits()
    done = threading.Event()
    finished = []

    def submit_then_signal(target):
        def run():
            try:
                return target()
            finally:
                finished.append(target)
                if len(finished) == SUBMITTERS:
                    done.set()

        return run

    results = in_threads(
        [submit_then_signal(submitter(world, index)) for index in range(SUBMITTERS)]
        + [admitter(done, capacity, ceiling) for _ in range(ADMITTERS)]
    )
    final = admission_run_cycle()
    assert final is not None  # nobody else holds the lock now
    assert_within_limits(capacity, ceiling)
    # The final cycle left nothing that could still start.
    assert admission_run_cycle().admitted == 0
    return [s for loop in results[SUBMITTERS:] for s in loop] + [final]


def test_fifty_concurrent_submitters_never_over_admit(transactional_db, world, slow_decide):
    summaries = submit_while_admitting(world)

    assert Run.objects.count() == SUBMITTERS
    queued_events = Counter(
        RunEvent.objects.filter(to_state=RunState.QUEUED).values_list("run_id", flat=True)
    )
    assert set(queued_events.values()) == {1}
    assert len(queued_events) == SUBMITTERS
    attempts = dict(Run.objects.annotate(n=Count("attempts")).values_list("pk", "n"))
    assert max(attempts.values()) <= 1
    # Exactly the runs holding GPUs have an attempt; each was admitted once.
    holding = set(Run.objects.filter(state__in=HOLDING_STATES).values_list("pk", flat=True))
    assert {pk for pk, n in attempts.items() if n} == holding
    admitted_events = Counter(
        RunEvent.objects.filter(to_state=RunState.ADMITTED).values_list("run_id", flat=True)
    )
    assert admitted_events == Counter(holding)
    assert holding  # something was admitted at all
    assert sum(s.admitted for s in summaries if s is not None) == len(holding)


def test_fifty_concurrent_submitters_with_borrowing_and_reclaim(
    transactional_db, world, slow_decide
):
    # Guarantees fill the clusters and borrowing comes on top. Before the rush, nlp holds
    # its 16 guaranteed a100 GPUs and borrows 8 more, which vision is bound to reclaim.
    Quota.objects.filter(flavor=world.a100).update(borrow_limit_gpus=8)
    Quota.objects.filter(flavor=world.h100).update(borrow_limit_gpus=4)
    for index in range(3):
        run_submit(
            user=world.researcher_b,
            data=experiment_input(
                world, tenant="nlp", project="llm", gpus_per_node=8, name=f"early-{index}"
            ),
        )
    assert admission_run_cycle().admitted == 3
    assert Run.objects.filter(tenant=world.nlp, borrowed=True).count() == 1

    summaries = submit_while_admitting(world)

    assert Run.objects.count() == SUBMITTERS + 3
    submitted = Counter(
        RunEvent.objects.filter(reason="SUBMITTED").values_list("run_id", flat=True)
    )
    assert set(submitted.values()) == {1}
    assert len(submitted) == SUBMITTERS + 3
    # Every admission made exactly one attempt, numbered 1, 2, ... per run.
    admitted_events = Counter(
        RunEvent.objects.filter(to_state=RunState.ADMITTED).values_list("run_id", flat=True)
    )
    numbers = defaultdict(list)
    for run_id, number in Attempt.objects.order_by("number").values_list("run_id", "number"):
        numbers[run_id].append(number)
    assert {run_id: len(n) for run_id, n in numbers.items()} == dict(admitted_events)
    assert all(n == list(range(1, len(n) + 1)) for n in numbers.values())
    # Vision reclaimed nlp's borrowed a100 GPUs (and either may have reclaimed h100 GPUs);
    # a preempted run is back in the queue, never left holding GPUs.
    preemptions = RunEvent.objects.filter(to_state=RunState.PREEMPTED)
    assert preemptions.filter(run__tenant=world.nlp, run__flavor=world.a100).exists()
    assert sum(s.preempted for s in summaries if s is not None) == preemptions.count()
    for event in preemptions.select_related("run__tenant"):
        reclaimer = "nlp" if event.run.tenant == world.vision else "vision"
        assert event.message.startswith("a tenant within its guarantee reclaimed ")
        assert event.admin_detail.startswith(f"tenant {reclaimer} reclaimed ")
    assert not Run.objects.filter(state=RunState.PREEMPTED).exists()


def test_two_admitters_started_at_once_never_both_admit(transactional_db, world, monkeypatch):
    runs = [
        run_submit(
            user=world.researcher_a,
            data=experiment_input(world, gpus_per_node=gpus, name=f"slow-{gpus}"),
        )
        for gpus in (8, 4, 2)
    ]
    # Whoever takes the lock first decides only once the other has tried it too, so the
    # two cycles overlap whatever the scheduling.
    lock_results: list[bool] = []
    both_tried = threading.Event()
    real_lock, real_decide = admission_cycle.admission_lock, admission.decide

    def lock() -> bool:
        taken = real_lock()
        lock_results.append(taken)
        if len(lock_results) == 2:
            both_tried.set()
        return taken

    def decide(snapshot):
        assert both_tried.wait(timeout=30)
        return real_decide(snapshot)

    monkeypatch.setattr(admission_cycle, "admission_lock", lock)
    monkeypatch.setattr(admission, "decide", decide)

    results = in_threads([admission_run_cycle, admission_run_cycle])

    assert sorted(lock_results) == [False, True]
    assert sorted(results, key=lambda r: r is None) == [
        AdmissionSummary(admitted=3, preempted=0, waiting=0),
        None,
    ]
    for run in runs:
        run.refresh_from_db()
        assert run.state == RunState.ADMITTED
        assert run.events.filter(to_state=RunState.ADMITTED).count() == 1
        assert run.attempts.count() == 1
