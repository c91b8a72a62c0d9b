"""The what-if replay on the demo's history (issue 38, point 2): the demo as `make run` seeds
it runs on for half an hour (the worker's loop driven by hand on a clock the test moves,
with the waiting runs of tests/portal/test_demo_clock.py submitted); that half hour,
replayed under the policy that was in force, gives each tenant's p50 queue time within 10 %
and the utilisation within 3 points of what happened."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import User

from clusters.models import Cluster
from images.models import Image
from jobs.replay import observed_outcome, replay
from jobs.replay_report import fidelity
from jobs.selectors.replay_history import replay_history
from jobs.services.submission import ExperimentInput, run_submit
from portal.demo import demo_seed
from tests.jobs.replay_support import record

pytestmark = pytest.mark.django_db

SEEDED = datetime(2027, 3, 9, 10, 0, tzinfo=UTC)
MINUTES = 30
TICK_S = 30


def submit(username: str, *, image: str = "ml/pytorch", hours: float, **values) -> None:
    catalogued = Image.objects.get(repository__endswith=f"/{image}")
    data = {
        "image": f"{catalogued.repository}:{catalogued.tag}",
        "command": "python train.py",
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 8,
        "env": {"GANTRY_SIM_DURATION_S": str(int(hours * 3600))},
        **values,
    }
    run_submit(user=User.objects.get(username=username), data=ExperimentInput(**data))


def test_replaying_the_demos_half_hour_reproduces_it():
    with time_machine.travel(SEEDED, tick=False):
        demo_seed(speedup=30)
        # The waiting runs of test_demo_clock: nlp's H100 guarantee held, climate's in turn,
        # vision's behind yolo-xl.
        submit(
            "bob",
            tenant="nlp",
            project="llm",
            name="llama-eval",
            image="nlp/megatron",
            flavor="h100-80gb",
            hours=2,
        )
        submit(
            "bob",
            tenant="nlp",
            project="llm",
            name="llama-eval-2",
            image="nlp/megatron",
            flavor="h100-80gb",
            hours=1,
        )
        submit("carol", tenant="climate", project="nowcasting", name="radar-big", hours=3)
        submit("carol", tenant="climate", project="nowcasting", name="radar-big-2", hours=1)
        submit("alice", tenant="vision", project="detection", name="yolo-l-ablation", hours=2)
    cluster = Cluster.objects.get()
    record(cluster, start=SEEDED, seconds=MINUTES * 60, tick_s=TICK_S)

    end = SEEDED + timedelta(minutes=MINUTES)
    with time_machine.travel(end, tick=False):
        history = replay_history(start=SEEDED, end=end)
    observed = observed_outcome(history)
    replayed = replay(history)
    check = fidelity(history, observed, replayed)
    # Every tenant's p50 exactly, the utilisation within a tenth of a point (a preempted
    # run's lost work is reckoned from the demo's checkpoints, not to the second).
    assert [(t.tenant, t.observed_p50_s, t.replayed_p50_s) for t in check.tenants] == [
        ("climate", 60.0, 60.0),
        ("nlp", 600.0, 600.0),
        ("vision", 0.0, 0.0),
    ]
    assert observed.utilisation == pytest.approx(41.46, abs=0.01)
    assert replayed.utilisation == pytest.approx(observed.utilisation, abs=0.1)
    assert check.within
    # The page says where replay and reality may differ: the demo's outside load.
    assert check.reasons[0].startswith("Outside load: jobs from outside Gantry use 6 GPUs now")
