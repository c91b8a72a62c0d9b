"""Every rank reports (issue 36): a rank's identity from the launcher's variables, one
``rank_window`` per window from every rank, rank 0 unchanged, and the opt-out."""

import pytest
from gantry_sdk import ranks

from tests.sdk.test_sdk import TOKEN, Reporter, StepTimer, portal  # noqa: F401 (the fixture)

TORCHRUN = {
    "RANK": "11",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "16",
    "CUDA_VISIBLE_DEVICES": "4,5,6,7",
    "NODE_NAME": "gpu-07",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "8",
    "SLURMD_NODENAME": "node002",
}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            TORCHRUN,
            {"rank": 11, "local_rank": 3, "world_size": 16, "host": "gpu-07", "gpu": "7"},
        ),
        (SLURM, {"rank": 5, "local_rank": 1, "world_size": 8, "host": "node002", "gpu": "1"}),
        # srun --gpus-per-task=1: the task sees its one GPU, whatever its local rank.
        ({**SLURM, "CUDA_VISIBLE_DEVICES": "6"}, {"gpu": "6"}),
        ({**TORCHRUN, "CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc,GPU-dd"}, {"gpu": "GPU-dd"}),
        ({**TORCHRUN, "GANTRY_SDK_DEVICE": "0"}, {"gpu": "4"}),
        ({**TORCHRUN, "GANTRY_SDK_GPU": "GPU-1234"}, {"gpu": "GPU-1234"}),
    ],
)
def test_the_rank_and_its_physical_gpu_come_from_the_launcher(environ, expected):
    identity = ranks.rank_identity(environ)
    assert identity is not None
    assert {name: identity[name] for name in expected} == expected


@pytest.mark.parametrize(
    "environ",
    [
        {},  # no launcher
        {"RANK": "0", "WORLD_SIZE": "1"},  # a world of one: nothing to compare
        {"RANK": "8", "WORLD_SIZE": "8"},  # not a rank of that world
        {"RANK": "1", "WORLD_SIZE": "70000"},  # beyond 65,536
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "0,1"},
        {"RANK": "1", "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""},  # no GPU visible
    ],
)
def test_no_identity_without_a_rank_of_several_and_a_gpu(environ):
    assert ranks.rank_identity(environ) is None


def _env(portal, **extra):  # noqa: F811 (the fixture's value)
    return {"GANTRY_API_URL": portal.url, "GANTRY_ATTEMPT_TOKEN": TOKEN, **TORCHRUN, **extra}


def _windows(reporter, count, steps_per_window=3):
    """``count`` windows through a step timer, flushed by hand (no waiting on a clock)."""
    timer = StepTimer(reporter, window_seconds=3600, step=0)
    for _ in range(count):
        for _ in range(steps_per_window):
            with timer.step(), timer.data():
                pass
        timer.flush()


def test_a_rank_other_than_zero_sends_one_rank_window_per_window_and_nothing_else(portal):  # noqa: F811
    reporter = Reporter.from_env(_env(portal))
    assert (reporter.enabled, reporter.primary, reporter.flush_interval) == (True, False, 120.0)
    reporter.ready()
    reporter.checkpoint_saved(10, "s3://b/10", 1.0)
    reporter.runtime_env()
    _windows(reporter, 3)
    assert reporter.flush(5)

    events = portal.accepted_events()
    assert [event["type"] for event in events] == ["rank_window"] * 3
    assert [event["window"] for event in events] == [1, 2, 3]
    assert [event["seq"] for event in events] == [1, 2, 3]
    first = events[0]
    assert set(first) == {
        "type", "seq", "ts", "rank", "local_rank", "world_size", "host", "gpu", "window",
        "start", "end", "steps", "step_time_s", "data_wait_s", "comm_wait_s",
    }  # fmt: skip
    assert (first["rank"], first["local_rank"], first["world_size"]) == (11, 3, 16)
    assert (first["host"], first["gpu"], first["steps"]) == ("gpu-07", "7", 3)
    assert portal.bodies()[0]["rank"] == 11
    assert portal.posts("/report/") == []


def test_rank_zero_sends_what_it_sent_before_and_its_rank_window(portal):  # noqa: F811
    reporter = Reporter.from_env(_env(portal, RANK="0", LOCAL_RANK="0"))
    assert (reporter.primary, reporter.flush_interval) == (True, 5.0)
    reporter.ready()
    _windows(reporter, 2)
    reporter.checkpoint_saved(6, "s3://b/6", 1.0)
    assert reporter.flush(5)

    events = portal.accepted_events()
    assert [event["type"] for event in events] == [
        "ready", "step_window", "rank_window", "step_window", "rank_window", "checkpoint_saved",
    ]  # fmt: skip
    step_windows = [event for event in events if event["type"] == "step_window"]
    rank_windows = [event for event in events if event["type"] == "rank_window"]
    assert [window["step"] for window in step_windows] == [3, 6]
    for step_window, rank_window in zip(step_windows, rank_windows, strict=True):
        for name in ("start", "end", "steps", "step_time_s", "data_wait_s", "comm_wait_s"):
            assert rank_window[name] == step_window[name]
    assert [(w["rank"], w["gpu"], w["window"]) for w in rank_windows] == [(0, "4", 1), (0, "4", 2)]


@pytest.mark.parametrize("value", ["0", "false", "off", "No"])
def test_the_opt_out_restores_rank_zero_only(portal, value):  # noqa: F811
    assert not Reporter.from_env(_env(portal, GANTRY_SDK_RANKS=value)).enabled
    assert not Reporter.from_env(_env(portal), ranks=False).enabled
    reporter = Reporter.from_env(_env(portal, RANK="0", GANTRY_SDK_RANKS=value))
    _windows(reporter, 2)
    assert reporter.flush(5)
    assert [event["type"] for event in portal.accepted_events()] == ["step_window"] * 2


def test_all_ranks_sends_everything_from_every_rank(portal):  # noqa: F811
    reporter = Reporter.from_env(_env(portal), all_ranks=True)
    reporter.ready()
    _windows(reporter, 1)
    assert reporter.flush(5)
    kinds = [event["type"] for event in portal.accepted_events()]
    assert kinds == ["ready", "step_window", "rank_window"]


def test_an_invalid_window_of_a_rank_is_counted_not_sent(portal):  # noqa: F811
    reporter = Reporter.from_env(_env(portal))
    reporter.step_window(steps=1, step_time_s=float("nan"))
    reporter.step_window(steps=2, step_time_s=0.5, end=1_700_000_000.0)
    assert reporter.flush(5)
    assert reporter.stats()["rejected"] == 1
    [event] = portal.accepted_events()
    assert (event["window"], event["steps"], event["start"]) == (1, 2, 1_699_999_999.0)


def test_a_rank_flush_interval_of_its_own(portal):  # noqa: F811
    environ = _env(portal, GANTRY_SDK_RANK_FLUSH_INTERVAL="30", GANTRY_SDK_FLUSH_INTERVAL="2")
    assert Reporter.from_env(environ).flush_interval == 30.0
    assert Reporter.from_env({**environ, "RANK": "0"}).flush_interval == 2.0
