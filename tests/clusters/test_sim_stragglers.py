"""The simulator's stragglers: what an experiment's env asks for, and the lockstep of a gang
with a slow GPU, a slow node's input, a degraded link or a placement across leaf switches
(pure, no database)."""

import pytest

from clusters.sim_stragglers import (
    CROSS_LEAF_TRANSFER,
    RankShare,
    Straggler,
    StragglerKind,
    lockstep,
    straggler_from_env,
)
from clusters.simulation import Workload, gang_gpus, gang_lockstep

# The compute-bound profile: 1 % of a step waiting for input, 2 % on the all-reduce.
DATA, COMM = 0.01, 0.02
COMPUTE = 1 - DATA - COMM
LEAF_1, LEAF_2 = ("block-1", "leaf-1.1"), ("block-1", "leaf-1.2")


def shares(*pairs: tuple[float, float]) -> tuple:
    return tuple(
        RankShare(pytest.approx(d, rel=1e-12), pytest.approx(c, rel=1e-12)) for d, c in pairs
    )


def test_the_env_asks_for_a_straggler_by_kind_rank_and_factor():
    env = {
        "GANTRY_SIM_STRAGGLER": "slow_gpu",
        "GANTRY_SIM_STRAGGLER_RANK": "11",
        "GANTRY_SIM_STRAGGLER_FACTOR": "1.25",
    }

    assert straggler_from_env(env) == Straggler(StragglerKind.SLOW_GPU, 11, 1.25)
    assert straggler_from_env({"GANTRY_SIM_STRAGGLER": "degraded_link"}) == Straggler(
        StragglerKind.DEGRADED_LINK, 0, 1.5
    )
    assert straggler_from_env({}) is None
    workload = Workload.from_env({**env, "GANTRY_SIM_DURATION_S": "600"})
    assert (workload.straggler, workload.straggler_rank, workload.straggler_factor) == (
        "slow_gpu",
        11,
        1.25,
    )
    assert workload.straggling == Straggler(StragglerKind.SLOW_GPU, 11, 1.25)
    assert Workload.from_env({}).straggling is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GANTRY_SIM_STRAGGLER": "slow"}, "GANTRY_SIM_STRAGGLER must be one of slow_gpu, "
         "slow_input, degraded_link, got 'slow'"),
        ({"GANTRY_SIM_STRAGGLER": "slow_gpu", "GANTRY_SIM_STRAGGLER_RANK": "-1"},
         "GANTRY_SIM_STRAGGLER_RANK must be a rank (0, 1, …), got '-1'"),
        ({"GANTRY_SIM_STRAGGLER": "slow_gpu", "GANTRY_SIM_STRAGGLER_RANK": "٣"},
         "GANTRY_SIM_STRAGGLER_RANK must be a rank (0, 1, …), got '٣'"),
        ({"GANTRY_SIM_STRAGGLER": "slow_gpu", "GANTRY_SIM_STRAGGLER_FACTOR": "2.01"},
         "GANTRY_SIM_STRAGGLER_FACTOR must be a number from 1.1 to 2.0, got '2.01'"),
        ({"GANTRY_SIM_STRAGGLER": "slow_gpu", "GANTRY_SIM_STRAGGLER_FACTOR": "1.09"},
         "GANTRY_SIM_STRAGGLER_FACTOR must be a number from 1.1 to 2.0, got '1.09'"),
        ({"GANTRY_SIM_STRAGGLER": "slow_gpu", "GANTRY_SIM_STRAGGLER_FACTOR": "nan"},
         "GANTRY_SIM_STRAGGLER_FACTOR must be a number from 1.1 to 2.0, got 'nan'"),
        ({"GANTRY_SIM_STRAGGLER_RANK": "3"},
         "GANTRY_SIM_STRAGGLER_RANK needs GANTRY_SIM_STRAGGLER"),
        ({"GANTRY_SIM_STRAGGLER_FACTOR": "1.5"},
         "GANTRY_SIM_STRAGGLER_FACTOR needs GANTRY_SIM_STRAGGLER"),
    ],
)  # fmt: skip
def test_a_straggler_the_simulator_cannot_model_is_refused_with_what_it_takes(env, message):
    with pytest.raises(ValueError) as refused:
        straggler_from_env(env)
    assert str(refused.value) == message
    with pytest.raises(ValueError):
        Workload.from_env(env)


def test_a_clean_gang_on_one_leaf_keeps_its_profiles_shares_exactly():
    gang = lockstep(
        data_share=DATA, comm_share=COMM, nodes=["a", "a", "b", "b"],
        paths={"a": LEAF_1, "b": LEAF_1}, straggler=None,
    )  # fmt: skip

    assert (gang.step, gang.pace, gang.slow_ranks, gang.cross_leaf) == (
        1.0,
        1.0,
        frozenset(),
        False,
    )
    assert gang.ranks == (RankShare(DATA, COMM),) * 4


def test_a_slow_gpu_computes_factor_times_longer_and_the_others_wait_for_it():
    gang = lockstep(
        data_share=DATA, comm_share=COMM, nodes=["a", "a", "b", "b"], paths={},
        straggler=Straggler(StragglerKind.SLOW_GPU, 3, 2.0),
    )  # fmt: skip

    step = COMPUTE * 2.0 + DATA + COMM  # 1.97
    assert gang.step == pytest.approx(1.97, rel=1e-12)
    assert gang.pace == pytest.approx(1 / 1.97, rel=1e-12)
    assert gang.slow_ranks == frozenset({3})
    others = (DATA / step, (step - COMPUTE - DATA) / step)  # waits 0.99 of 1.97 on the others
    assert gang.ranks == shares(others, others, others, (DATA / step, COMM / step))


def test_slow_input_on_a_node_makes_its_ranks_wait_for_data():
    gang = lockstep(
        data_share=DATA, comm_share=COMM, nodes=["a", "a", "b", "b", "c", "c"], paths={},
        straggler=Straggler(StragglerKind.SLOW_INPUT, 3, 1.5),
    )  # fmt: skip

    step = 0.98 * 1.5 + COMM  # 1.49
    slow_data = DATA + 0.5 * 0.98  # 0.5 of its time to the collective more, all input
    assert gang.step == pytest.approx(1.49, rel=1e-12)
    assert gang.slow_ranks == frozenset({2, 3})
    normal = (DATA / step, (step - 0.98) / step)
    slow = (slow_data / step, COMM / step)
    assert gang.ranks == shares(normal, normal, slow, slow, normal, normal)


def test_a_degraded_link_delays_its_nodes_ranks_and_a_gang_across_leaves_pays_the_spine():
    gang = lockstep(
        data_share=DATA, comm_share=COMM, nodes=["a", "b", "c"],
        paths={"a": LEAF_1, "b": LEAF_1, "c": LEAF_2},
        straggler=Straggler(StragglerKind.DEGRADED_LINK, 2, 1.5),
    )  # fmt: skip

    transfer = COMM * CROSS_LEAF_TRANSFER  # 0.03
    assert gang.step == pytest.approx(0.98 * 1.5 + transfer, rel=1e-12)  # 1.5
    assert (gang.slow_ranks, gang.cross_leaf) == (frozenset({2}), True)
    normal = (DATA / 1.5, (1.5 - 0.98) / 1.5)
    assert gang.ranks == shares(normal, normal, (DATA / 1.5, transfer / 1.5))


def test_a_degraded_link_of_a_single_node_gang_slows_nothing():
    gang = lockstep(
        data_share=DATA, comm_share=COMM, nodes=["a", "a"], paths={},
        straggler=Straggler(StragglerKind.DEGRADED_LINK, 1, 2.0),
    )  # fmt: skip

    assert (gang.step, gang.slow_ranks) == (1.0, frozenset())


def test_a_placement_across_two_leaves_slows_every_all_reduce():
    gang = lockstep(
        data_share=DATA, comm_share=COMM, nodes=["a", "a", "b", "b"],
        paths={"a": LEAF_1, "b": LEAF_2}, straggler=None,
    )  # fmt: skip

    assert gang.step == pytest.approx(1.01, rel=1e-12)
    assert gang.ranks == shares(*[(DATA / 1.01, 0.03 / 1.01)] * 4)


def test_a_straggler_rank_outside_the_gang_is_refused():
    with pytest.raises(ValueError, match="straggler rank 4 is not a rank of 4"):
        lockstep(
            data_share=DATA, comm_share=COMM, nodes=["a"] * 4, paths={},
            straggler=Straggler(StragglerKind.SLOW_GPU, 4, 1.5),
        )  # fmt: skip


def test_ranks_follow_node_names_then_gpu_indices():
    allocation = {"sim-b": [3, 1], "sim-a": [7, 0]}

    assert gang_gpus(allocation) == [("sim-a", 0), ("sim-a", 7), ("sim-b", 1), ("sim-b", 3)]
    workload = Workload("input-bound", 600, straggler="slow_gpu", straggler_rank=2,
                        straggler_factor=1.5)  # fmt: skip
    gang = gang_lockstep(workload, allocation, {})
    # input-bound: 60 % data, 2 % communication, 38 % compute; rank 2 is sim-b's GPU 1.
    assert gang.slow_ranks == frozenset({2})
    assert gang.step == pytest.approx(0.38 * 1.5 + 0.6 + 0.02, rel=1e-12)
