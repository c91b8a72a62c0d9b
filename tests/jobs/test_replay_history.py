"""A history recorded through the product (issue 38, point 2): runs submitted through the
service, admitted by the admission cycle, run by the simulated cluster on a clock the test
moves; read back by ``replay_history`` and replayed under the policy that was in force."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from jobs.models import Run
from jobs.replay import observed_outcome, replay
from jobs.replay_report import fidelity
from jobs.replay_types import Ending, Proposal, Quota
from jobs.selectors.replay_history import replay_history
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tenants.models import Quota as QuotaRow
from tenants.services.quotas import quota_update
from tests.conftest import experiment_input
from tests.jobs.replay_support import record

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
TICK_S = 30
MINUTES = 30
STARTUP_S = 30  # the simulator's start-up before the work (clusters.simulation.STARTUP_S)


def submit(world, tenant: str, *, work_s: int) -> Run:
    user, project = (
        (world.researcher_a, "detection") if tenant == "vision" else (world.researcher_b, "llm")
    )
    return run_submit(
        user=user,
        data=experiment_input(
            world, tenant=tenant, project=project, gpus_per_node=8,
            env={"GANTRY_SIM_DURATION_S": str(work_s)},
        ),
    )  # fmt: skip


@pytest.fixture
def recorded(world):
    """Half an hour: vision and nlp each submit a 1×8 A100 run every 30 s for two minutes,
    more than their guarantees of 16 GPUs serve at once; bob cancels nlp's last while it
    waits; at 10 minutes a platform admin raises vision's guarantee to 24."""
    world.cluster.settings = {**world.cluster.settings, "speedup": 1}
    world.cluster.save(update_fields=["settings"])
    runs: dict[str, Run] = {}

    def people(second: int) -> None:
        if second <= 120:
            runs[f"v{second}"] = submit(world, "vision", work_s=270 - STARTUP_S)
            runs[f"n{second}"] = submit(world, "nlp", work_s=420 - STARTUP_S)
        if second == 150:
            run_cancel(run=runs["n120"], actor=world.researcher_b)
        if second == 600:
            quota_update(
                tenant=world.vision, flavor=world.a100, guaranteed_gpus=24, borrow_limit_gpus=0,
                max_gpus_per_run=None, monthly_gpu_hour_budget=None, budget_mode="hard",
                fair_share_weight=1, offered_flavors=None, actor=world.platform_admin,
            )  # fmt: skip

    record(world.cluster, start=T0, seconds=MINUTES * 60, tick_s=TICK_S, at_tick=people)
    return runs


def read(**window):
    with time_machine.travel(T0 + timedelta(hours=1), tick=False):
        return replay_history(**window)


def test_a_recorded_history_read_back_and_replayed(world, recorded, django_assert_num_queries):
    with django_assert_num_queries(10):
        history = read(start=T0, end=T0 + timedelta(minutes=MINUTES))
    assert len(history.submissions) == 10
    assert history.holding == ()
    cancelled = next(s for s in history.submissions if s.id == recorded["n120"].pk)
    assert (cancelled.ended, cancelled.cancelled_at, cancelled.cancelled_by) == (
        Ending.CANCELLED, (T0 + timedelta(seconds=150)).timestamp(), "bob"
    )  # fmt: skip
    finished = next(s for s in history.submissions if s.id == recorded["v0"].pk)
    # Admitted at 0 s; submitted, started, and seen to end on the tick after its 270 s.
    assert (finished.ended, finished.ran_s) == (Ending.FINISHED, 300.0)
    # The quotas at the start are those before the change, which is replayed when made.
    assert history.quotas[("vision", "a100-80gb")] == Quota(16)
    assert [(c.at - history.start, c.tenant, c.quota) for c in history.quota_changes] == [
        (600.0, "vision", Quota(24))
    ]
    assert QuotaRow.objects.get(tenant=world.vision, flavor=world.a100).guaranteed_gpus == 24

    # What happened: vision's runs two at a time, 300 s each; nlp's two at a time, 450 s
    # each, its fifth cancelled after 30 s in the queue.
    observed = observed_outcome(history)
    vision, nlp = observed.tenant("vision"), observed.tenant("nlp")
    assert (vision.queue_p50_s, vision.queue_p95_s, vision.started) == (240.0, 480.0, 5)
    assert (nlp.queue_p50_s, nlp.queue_p95_s, nlp.started, nlp.not_started) == (
        30.0, 390.0, 4, 1
    )  # fmt: skip
    # Replayed under the policy in force: exactly what happened.
    replayed = replay(history)
    assert replayed == observed
    check = fidelity(history, observed, replayed)
    assert check.within
    assert [t.within for t in check.tenants] == [True, True]
    assert check.reasons[0] == (
        "Cancelled runs: 1 (1 by people); 1 while waiting, cancelled at the same moment in "
        "the replay, the others after the time they really ran."
    )

    # Under a proposal: vision one run at a time (submitted every 30 s, 300 s each), nlp
    # three at a time.
    proposal = Proposal(quotas={("vision", "a100-80gb"): Quota(8), ("nlp", "a100-80gb"): Quota(24)})
    outcome = replay(history, proposal)
    assert waits(outcome, "vision") == (540.0, 1080.0)
    assert waits(outcome, "nlp") == (0.0, 360.0)


def waits(outcome, tenant):
    figures = outcome.tenant(tenant)
    return figures.queue_p50_s, figures.queue_p95_s


def test_an_empty_window_is_refused_and_one_without_runs_is_empty(world):
    with pytest.raises(ValueError, match="must end after it starts"):
        read(start=T0, end=T0)
    empty = read(start=T0, end=T0 + timedelta(hours=1))
    assert (empty.submissions, empty.holding) == ((), ())
    outcome = observed_outcome(empty)
    assert (outcome.runs, outcome.gpu_hours) == (0, 0.0)
