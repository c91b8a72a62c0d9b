"""The per-rank telemetry benchmark's pieces: the bodies 1,024 ranks send are valid rank
windows, grouped as the SDK posts them; the overhead measure runs the loop both ways."""

import json

from bench import ranks
from telemetry import sdk_events


def test_the_ranks_send_every_window_once_grouped_by_post():
    payloads = [json.loads(body) for body in ranks.bodies(windows_per_post=12, job_seconds=120)]

    assert len(payloads) == 1024
    assert [len(body["events"]) for body in payloads] == [12] * 1024
    windows = [(e["rank"], e["window"]) for body in payloads for e in body["events"]]
    assert len(set(windows)) == len(windows) == 12 * 1024
    assert all(sdk_events.EVENT.is_valid(e) for body in payloads for e in body["events"])
    last = payloads[-1]["events"][-1]
    assert (last["rank"], last["host"], last["gpu"], last["window"]) == (1023, "gpu-127", "7", 12)
    assert (last["end"] - last["start"], last["world_size"]) == (10.0, 1024)


def test_one_window_per_request_for_the_baseline():
    payloads = [json.loads(body) for body in ranks.bodies(windows_per_post=1, job_seconds=20)]
    assert len(payloads) == 2048
    assert {len(body["events"]) for body in payloads} == {1}
    assert [payloads[0]["source"], payloads[1024]["events"][0]["window"]] == ["rank0", 2]


def test_the_overhead_measure_times_the_same_steps_with_and_without_the_sdk():
    result = ranks.sdk_overhead(blocks=1, steps_per_block=5)
    assert result["steps"] == 5
    assert result["plain_s"] >= 5 * sum(ranks.STEP_SLEEPS)
    assert result["sdk_s"] >= 5 * sum(ranks.STEP_SLEEPS)
    assert (result["events"], result["posts"]) == (2, 1)  # a step and a rank window
    # One block: the median of one pair is that pair.
    assert result["overhead"] == (result["sdk_s"] - result["plain_s"]) / result["plain_s"]
