"""A node's health is part of what admission reads: a quarantine (clusters.services.health)
changes the admission fingerprint, so the next cycle decides again rather than skip, and
places nothing on the node."""

from clusters.models import ClusterNode
from clusters.services.health import node_quarantine
from jobs.models import Attempt, Run, RunState
from jobs.selectors.queue import admission_fingerprint
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.submission import run_submit
from tests.conftest import experiment_input


def whole_nodes(world, tenant="vision", project="detection", nodes=1):
    data = experiment_input(
        world, tenant=tenant, project=project, nodes=nodes, gpus_per_node=8,
        env={"GANTRY_SIM_DURATION_S": "86400"},
    )  # fmt: skip
    user = world.researcher_a if tenant == "vision" else world.researcher_b
    return run_submit(user=user, data=data)


def placed(run: Run) -> list[str]:
    return sorted(Attempt.objects.get(run=run).placement)


def test_a_quarantine_takes_effect_at_the_next_cycle(world):
    from django.utils import timezone

    first = whole_nodes(world)
    assert admission_run_cycle().admitted == 1
    assert not admission_run_cycle().skipped  # admissions: the next cycle decides in full
    assert admission_run_cycle().skipped  # nothing changed since
    a100 = sorted(
        ClusterNode.objects.filter(cluster=world.cluster, flavor=world.a100).values_list(
            "name", flat=True
        )
    )
    free = [name for name in a100 if name not in placed(first)]
    assert len(free) == 3
    before = admission_fingerprint(now=timezone.now())
    node_quarantine(
        cluster=world.cluster, node=free[0], actor=world.platform_admin, note="fan noise"
    )
    assert admission_fingerprint(now=timezone.now())[0] != before[0]
    summary = admission_run_cycle()
    assert (summary.skipped, summary.admitted) == (False, 0)

    # Two whole nodes for nlp: the two free ones that are not quarantined.
    second = whole_nodes(world, tenant="nlp", project="llm", nodes=2)
    assert admission_run_cycle().admitted == 1
    assert placed(second) == free[1:]
    # One more whole node for vision: only the quarantined one is free; it waits.
    third = whole_nodes(world)
    assert admission_run_cycle().admitted == 0
    third.refresh_from_db()
    assert third.state == RunState.QUEUED
    assert not Attempt.objects.filter(run=third).exists()
