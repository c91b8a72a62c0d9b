"""The node-health benchmark's core (bench/node_health.py) on a tiny input: two 1-GPU nodes,
a run on a node that keeps failing (three GPU-lost faults), and a run the trace says failed."""

import itertools
import math
from dataclasses import replace

import pytest

from bench.node_health import (
    LLAMA_GPU_DAYS,
    RATES,
    HealthReplay,
    inject,
    replay,
)
from bench.trace import Task
from clusters.health import NodeHealth, SignalClass
from clusters.sim_faults import Fault, Lemon
from jobs.admission_types import Pool, nodes_of

NODES = nodes_of(Pool("c", "gpu", nodes=2, gpus_per_node=1))
TASKS = [
    Task(id=1, name="long", qos="LS", gpus_per_node=1, arrival=0.0, runtime=10_800.0),
    Task(id=2, name="broken", qos="LS", gpus_per_node=1, arrival=0.0, runtime=3_600.0),
]
# The node the long run lands on fails at 1 h 40 min 30 s, and every hour after.
FAULTS = [
    Fault(at, "c-gpu-00", 0, SignalClass.GPU_LOST, 79, lemon=True)
    for at in (6_030.0, 9_630.0, 13_230.0)
]
UNTIL = 2 * 86_400.0


def run(*, guard: bool, faults=FAULTS) -> tuple:
    return replay(
        TASKS, NODES, faults, guard=guard, label="t", until=UNTIL, failing=frozenset({"broken"})
    )


def test_with_the_policy_the_node_is_quarantined_and_the_run_moves():
    figures, sim = run(guard=True)
    assert sim.health[("c", "c-gpu-00")] == NodeHealth.QUARANTINED
    assert sim.health[("c", "c-gpu-01")] == NodeHealth.HEALTHY
    assert (figures.faults, figures.lemon_faults, figures.hit_attempts) == (3, 3, 1)
    # Killed at 6,030 s, checkpointed at 5,400 s: 630 GPU-seconds lost.
    assert figures.lost_fault_gpu_s == 630.0
    assert figures.lost_requeue_gpu_s == 0.0
    assert figures.quarantines == 1 and figures.refused == 0
    # Seen at the next sync (6,060 s): 30 s from the fault to the quarantine.
    assert figures.latencies == [30.0]
    assert figures.placements_on_quarantined == 0
    assert figures.failed_again_same_node == 0
    assert (figures.true_pos, figures.false_pos, figures.false_neg, figures.negatives) == (
        1,
        0,
        0,
        1,
    )
    assert figures.precision == figures.recall == 1.0
    # Requeued at 6,060 s onto c-gpu-01 with 5,400 s of work left: ends at 11,460 s.
    assert sim.excluded[1] == {"c-gpu-00"}
    assert sim.ended_at == {2: 3_600.0, 1: 11_460.0}
    assert figures.ettr.part == 10_800.0 + 3_600.0
    assert figures.ettr.whole == 11_460.0 + 3_600.0
    assert figures.runs_ended == 2 and figures.given_up == 0


def test_without_the_policy_the_lemon_fails_the_run_again_and_again():
    figures, sim = run(guard=False)
    assert sim.health[("c", "c-gpu-00")] == NodeHealth.HEALTHY
    assert figures.hit_attempts == 3
    assert figures.failed_again_same_node == 2
    # 630 s, then two attempts of 3,570 s that kept 1,800 s each.
    assert figures.lost_fault_gpu_s == 630.0 + 1_770.0 + 1_770.0
    assert figures.quarantines == 0 and figures.latencies == []
    # Attribution is measured on the baseline's ends too: the three ends are the hardware's.
    assert (figures.true_pos, figures.false_pos, figures.false_neg) == (3, 0, 0)
    assert sim.ended_at == {2: 3_600.0, 1: 15_060.0}
    assert math.isclose(figures.ettr.percent, 14_400 * 100 / (15_060 + 3_600))


def test_no_fault_no_quarantine():
    figures, sim = run(guard=True, faults=[])
    assert figures.quarantines == 0 and figures.faults == 0
    assert sim.ended_at == {2: 3_600.0, 1: 10_800.0}
    assert figures.ettr.percent == 100.0
    assert (figures.true_pos, figures.false_pos, figures.negatives) == (0, 0, 1)


def test_the_rates_are_llama_3s_per_gpu_day_and_lemons_fail_on_time():
    assert RATES[SignalClass.GPU_LOST] == 148 / (54 * 16_384) == 148 / LLAMA_GPU_DAYS
    assert RATES[SignalClass.ECC_UNCORRECTABLE] == 91 / LLAMA_GPU_DAYS
    lemon = Lemon(SignalClass.ECC_UNCORRECTABLE, every_s=43_200, gpu=0)
    faults = inject(NODES, {"c-gpu-01": lemon}, seed=34, until=UNTIL)
    lemons = [f for f in faults if f.lemon]
    assert len(lemons) == 4 and {f.node for f in lemons} == {"c-gpu-01"}
    assert [b.at - a.at for a, b in itertools.pairwise(lemons)] == [43_200.0] * 3
    assert faults == inject(NODES, {"c-gpu-01": lemon}, seed=34, until=UNTIL)


def test_a_placement_on_a_quarantined_node_is_counted():
    sim = HealthReplay(TASKS, NODES, until=UNTIL, faults=[], guard=True, label="t")
    sim.health[("c", "c-gpu-00")] = NodeHealth.QUARANTINED
    sim.run()
    assert sim.figures.placements_on_quarantined == 1


@pytest.mark.parametrize("guard", [True, False])
def test_deterministic(guard):
    first, second = (replace(run(guard=guard)[0], seconds=0.0) for _ in range(2))
    assert first == second
