"""What admission reads for backfill (issue 35): each queued run's max runtime, each held
run's latest end (its one definition, which the start estimates read from the snapshot),
the queueing policy of every enabled cluster and each tenant's override, at no query more;
a change of policy makes the next cycle decide again."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.models import Cluster
from jobs.admission_types import Queueing
from jobs.models import Attempt, AttemptState, Run, RunState
from jobs.selectors.estimates import estimate_inputs
from jobs.selectors.queue import admission_fingerprint, admission_snapshot, held_runs
from jobs.services.submission import run_submit
from tenants.models import Tenant
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
GRACE_S = 300  # GANTRY_PLACEMENT_GRACE_S


def submitted(world, *, minutes: int, at: datetime = T0, tenant: str = "vision") -> Run:
    with time_machine.travel(at, tick=False):
        return run_submit(
            user=world.researcher_a if tenant == "vision" else world.researcher_b,
            data=experiment_input(
                world,
                tenant=tenant,
                project="detection" if tenant == "vision" else "llm",
                max_runtime_minutes=minutes,
            ),
        )


def holding(run: Run, *, state: RunState, admitted: datetime, started: datetime | None) -> Run:
    """``run`` holding its GPUs on sim-1 since ``admitted``, its attempt started or not."""
    cluster = Cluster.objects.get(name="sim-1")
    Run.objects.filter(pk=run.pk).update(state=state, cluster=cluster, admitted_at=admitted)
    Attempt.objects.create(
        run=run,
        number=1,
        cluster=cluster,
        state=AttemptState.RUNNING if started else AttemptState.CREATED,
        started_at=started,
        placement=["sim-1-a100-80gb-00"],
    )
    return run


def test_queued_runs_carry_their_max_runtime_in_seconds(world):
    short, day = submitted(world, minutes=90), submitted(world, minutes=24 * 60)

    snapshot, _ = admission_snapshot(now=T0)

    assert {run.id: run.max_runtime_s for run in snapshot.queued} == {
        short.pk: 5400.0,
        day.pk: 86400.0,
    }


def test_a_held_runs_latest_end_is_its_start_or_placement_grace_plus_its_max_runtime(world):
    running = holding(
        submitted(world, minutes=60),
        state=RunState.RUNNING,
        admitted=T0,
        started=T0 + timedelta(minutes=2),
    )
    admitted = holding(
        submitted(world, minutes=30), state=RunState.ADMITTED, admitted=T0, started=None
    )

    # Within the placement grace: the admitted run starts by its end at the latest.
    early = {run.id: run.latest_end for run in held_runs(now=T0 + timedelta(seconds=60))}
    # Past it: it starts now at the earliest (or goes back to the queue).
    late = {run.id: run.latest_end for run in held_runs(now=T0 + timedelta(hours=1))}

    assert early == {
        running.pk: (T0 + timedelta(minutes=2, hours=1)).timestamp(),
        admitted.pk: (T0 + timedelta(seconds=GRACE_S, minutes=30)).timestamp(),
    }
    assert late == {
        running.pk: (T0 + timedelta(minutes=2, hours=1)).timestamp(),
        admitted.pk: (T0 + timedelta(hours=1, minutes=30)).timestamp(),
    }


def test_held_runs_stay_one_query(world, django_assert_num_queries):
    for minutes in (30, 60, 90):
        holding(submitted(world, minutes=minutes), state=RunState.RUNNING, admitted=T0, started=T0)

    with django_assert_num_queries(1):
        held = held_runs(now=T0)

    assert sorted(run.latest_end for run in held) == [
        (T0 + timedelta(minutes=minutes)).timestamp() for minutes in (30, 60, 90)
    ]


def test_the_estimates_read_the_latest_end_from_the_snapshot(world):
    run = holding(submitted(world, minutes=60), state=RunState.RUNNING, admitted=T0, started=T0)
    snapshot, _ = admission_snapshot(now=T0 + timedelta(minutes=5))
    moved = (T0 + timedelta(hours=7)).timestamp()
    (held,) = snapshot.held

    as_read = estimate_inputs(snapshot=snapshot, now=T0 + timedelta(minutes=5))
    # A snapshot that says otherwise is what the estimates go by: nothing computes it again.
    as_told = estimate_inputs(
        snapshot=replace(snapshot, held=(replace(held, latest_end=moved),)),
        now=T0 + timedelta(minutes=5),
    )

    assert as_read.latest_ends == {run.pk: (T0 + timedelta(hours=1)).timestamp()}
    assert as_told.latest_ends == {run.pk: moved}
    # The expected end is never after the latest one.
    assert as_read.expected_ends[run.pk] <= as_read.latest_ends[run.pk]


def test_every_enabled_cluster_is_named_with_its_policy_and_tenants_with_their_override(world):
    Cluster.objects.create(
        name="sim-strict", backend=Cluster.Backend.SIMULATOR, queueing=Queueing.STRICT
    )
    Cluster.objects.create(
        name="sim-off", backend=Cluster.Backend.SIMULATOR, enabled=False, queueing="best-effort"
    )
    Tenant.objects.filter(pk=world.nlp.pk).update(queueing=Queueing.BEST_EFFORT)

    snapshot, _ = admission_snapshot(now=T0)

    assert snapshot.queueing == {"sim-1": Queueing.BACKFILL, "sim-strict": Queueing.STRICT}
    assert snapshot.tenant_queueing == {"nlp": Queueing.BEST_EFFORT}
    assert all(type(policy) is Queueing for policy in snapshot.queueing.values())


def test_policies_cost_the_snapshot_no_query(world):
    submitted(world, minutes=60)

    def snapshot_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            admission_snapshot(now=T0)
        return len(queries)

    before = snapshot_queries()
    Tenant.objects.update(queueing=Queueing.STRICT)
    Cluster.objects.create(name="sim-2", backend=Cluster.Backend.SIMULATOR)

    assert snapshot_queries() == before


def test_a_change_of_policy_changes_what_the_cycle_reads(world):
    submitted(world, minutes=60)
    first = admission_fingerprint(now=T0)

    Cluster.objects.filter(pk=world.cluster.pk).update(queueing=Queueing.STRICT)
    cluster_changed = admission_fingerprint(now=T0)
    Tenant.objects.filter(pk=world.vision.pk).update(queueing=Queueing.BEST_EFFORT)
    tenant_changed = admission_fingerprint(now=T0)

    assert first is not None and cluster_changed is not None and tenant_changed is not None
    assert len({first[0], cluster_changed[0], tenant_changed[0]}) == 3
