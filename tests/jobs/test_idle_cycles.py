"""Admission cycles whose inputs did not change stop after a digest of them (issue 20.2),
and decide again as soon as anything they read changes, or time alone would change a
decision (a run begins starving, an inventory goes stale, a month begins), or a minute
has passed."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from clusters.models import ClusterNode
from jobs.models import AdmissionState, Run, RunEvent, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.submission import run_submit
from tenants.models import Quota
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def waiting_world(world):
    """vision's 16 guaranteed A100s in use by two running gangs, a third queued: the cycle
    has nothing to admit."""
    for _ in range(3):
        run_submit(user=world.researcher_a, data=experiment_input(world, nodes=1, gpus_per_node=8))
    return admission_run_cycle(now=T0)


def submit_whole_node(world, user, tenant, project, nodes=1) -> Run:
    return run_submit(
        user=user,
        data=experiment_input(world, tenant=tenant, project=project, nodes=nodes, gpus_per_node=8),
    )


def cycle(at: datetime):
    with time_machine.travel(at, tick=False):
        return admission_run_cycle(now=at)


def test_a_cycle_with_the_same_inputs_decides_nothing_and_writes_nothing(world):
    with time_machine.travel(T0, tick=False):
        first = waiting_world(world)
    assert (first.admitted, first.skipped) == (2, False)
    # The cycle after admissions reads new inputs (two runs now held): it decides in full.
    assert cycle(T0 + timedelta(seconds=5)).skipped is False
    events = RunEvent.objects.count()
    state = AdmissionState.objects.get()
    idle = cycle(T0 + timedelta(seconds=10))
    assert idle.skipped is True
    assert RunEvent.objects.count() == events
    assert AdmissionState.objects.get().decided_at == state.decided_at


def test_any_change_of_what_admission_reads_decides_again(world):
    with time_machine.travel(T0, tick=False):
        waiting_world(world)
    cycle(T0 + timedelta(seconds=5))
    assert cycle(T0 + timedelta(seconds=6)).skipped

    # A quota raised: the queued run is admitted.
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(guaranteed_gpus=24)
    after_quota = cycle(T0 + timedelta(seconds=7))
    assert (after_quota.skipped, after_quota.admitted) == (False, 1)
    cycle(T0 + timedelta(seconds=8))
    assert cycle(T0 + timedelta(seconds=9)).skipped

    # Load from outside Gantry appears on a node: decided again.
    node = ClusterNode.objects.filter(flavor=world.a100).order_by("name").last()
    ClusterNode.objects.filter(pk=node.pk).update(gpus_used=node.gpus_used + 1)
    assert cycle(T0 + timedelta(seconds=10)).skipped is False

    # A run submitted: decided again.
    with time_machine.travel(T0 + timedelta(seconds=11), tick=False):
        run_submit(user=world.researcher_b, data=experiment_input(
            world, tenant="nlp", project="llm", nodes=1, gpus_per_node=8
        ))  # fmt: skip
    assert cycle(T0 + timedelta(seconds=11)).skipped is False


def test_time_alone_decides_again_when_a_run_begins_starving_or_a_minute_passed(world, settings):
    settings.GANTRY_STARVATION_AFTER_S = 1800
    settings.GANTRY_ADMISSION_FULL_EVERY_S = 60
    # vision holds two of the four A100 nodes, nlp one; nlp's two-node gang, within its
    # guarantee, finds one node free: it waits for capacity, and starving, holds nodes.
    Quota.objects.filter(tenant=world.nlp, flavor=world.a100).update(guaranteed_gpus=32)
    with time_machine.travel(T0, tick=False):
        for _ in range(2):
            submit_whole_node(world, world.researcher_a, "vision", "detection")
        submit_whole_node(world, world.researcher_b, "nlp", "llm")
        admission_run_cycle(now=T0)
        submit_whole_node(world, world.researcher_b, "nlp", "llm", nodes=2)
    queued = Run.objects.get(state=RunState.QUEUED)
    starving_at = queued.submitted_at + timedelta(seconds=1800)
    cycle(T0 + timedelta(seconds=5))
    # Within a minute of the last full cycle, before anything starves: skipped.
    assert cycle(T0 + timedelta(seconds=64)).skipped
    # A minute after it: in full, whatever the digest says.
    assert cycle(T0 + timedelta(seconds=66)).skipped is False
    assert cycle(starving_at - timedelta(seconds=10)).skipped is False  # > 60 s since
    assert cycle(starving_at - timedelta(seconds=1)).skipped
    # The queued run begins starving: its reservation is decided.
    assert cycle(starving_at).skipped is False
    queued.refresh_from_db()
    assert "are held for it" in queued.wait_message
