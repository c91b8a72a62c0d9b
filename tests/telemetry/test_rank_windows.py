"""Per-rank step windows (issue 36): the schema, the endpoint's storing and refusals, the
detector's selector and the run page's queries with 1,024 ranks."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster, ClusterFlavor, SimulatedJob
from core.metrics import SDK_RANK_WINDOWS_REFUSED
from jobs.models import Attempt, AttemptState
from telemetry import rank_windows, sdk_events
from telemetry.models import RankStepWindow
from telemetry.rank_windows import HeldGpus
from telemetry.selectors.rank_windows import (
    RANK_WINDOW_FIELDS,
    attempt_held_gpus,
    attempt_rank_windows,
    rank_coverage,
)
from tests.telemetry.test_telemetry_ingest import TS, admitted_attempt, batch, client_for, post
from tests.telemetry.test_telemetry_pages import attempt_of, submit, telemetry_url

# TS is 2026-05-28 20:26:40 UTC: windows of 10 s stay inside one clock hour until 20:59:59.
HOUR_START = (TS // 3600) * 3600


def rank_window(rank=1, window=1, *, seq=None, world_size=2, host="sim-node-1", gpu="1", **fields):
    end = TS + window * 10
    event = {
        "type": "rank_window", "seq": seq or window, "ts": end, "rank": rank,
        "local_rank": rank, "world_size": world_size, "host": host, "gpu": gpu,
        "window": window, "start": end - 10, "end": end, "steps": 25, "step_time_s": 0.4,
        "data_wait_s": 0.5, "comm_wait_s": 1.5,
    }  # fmt: skip
    event.update(fields)
    return event


def stored(attempt):
    return list(
        RankStepWindow.objects.filter(attempt=attempt)
        .order_by("rank", "seq")
        .values_list("rank", "seq", "host", "gpu", "steps")
    )


def refused_count(reason):
    return SDK_RANK_WINDOWS_REFUSED.labels(reason=reason)._value.get()


# --- schema ------------------------------------------------------------------------------------


def test_a_rank_window_as_the_sdk_sends_it_is_valid():
    assert sdk_events.EVENT.is_valid(rank_window())
    assert sdk_events.EVENT.is_valid(
        rank_window(rank=65535, world_size=65536, gpu="GPU-" + "a" * 60)
    )
    without_optional = {k: v for k, v in rank_window().items() if k not in ("local_rank",)}
    assert sdk_events.EVENT.is_valid(without_optional)


@pytest.mark.parametrize(
    "event",
    [
        rank_window(world_size=65537),
        rank_window(world_size=0),
        rank_window(rank=-1),
        rank_window(rank=True),
        rank_window(host=""),
        rank_window(host="h" * 256),
        rank_window(host="node\x00"),
        rank_window(gpu="g" * 65),
        rank_window(gpu=3),
        rank_window(window=0),
        rank_window(steps=-1),
        rank_window(step_time_s=-0.1),
        rank_window(comm_wait_s="1"),
        {k: v for k, v in rank_window().items() if k != "world_size"},
        {k: v for k, v in rank_window().items() if k != "gpu"},
        {k: v for k, v in rank_window().items() if k != "window"},
    ],
)
def test_a_malformed_rank_window_is_rejected_and_stores_nothing(world, event):
    attempt = admitted_attempt(world)
    assert not sdk_events.EVENT.is_valid(event)

    response = post(client_for(attempt), batch(event))

    assert response.json() == {
        "accepted": 0, "duplicates": 0, "rejected": 1, "refused": {}, "messages": [],
    }  # fmt: skip
    assert not RankStepWindow.objects.exists()


# --- storing -----------------------------------------------------------------------------------


def test_windows_of_every_rank_are_stored_once_whatever_the_order(world):
    attempt = admitted_attempt(world)
    client = client_for(attempt)

    first = post(client, batch(rank_window(1, 3), rank_window(1, 1), source="rank1"))
    second = post(client, batch(rank_window(0, 1), rank_window(1, 2), source="rank0"))
    resent = post(client, batch(rank_window(1, 3), rank_window(1, 1), source="rank1"))
    repeated = post(client, batch(rank_window(1, 4), rank_window(1, 4, seq=9), source="r1"))

    assert first.json() == {
        "accepted": 2,
        "duplicates": 0,
        "rejected": 0,
        "refused": {},
        "messages": [],
    }
    assert second.json()["accepted"] == 2
    assert resent.json() == {
        "accepted": 0,
        "duplicates": 2,
        "rejected": 0,
        "refused": {},
        "messages": [],
    }
    assert repeated.json() == {
        "accepted": 1,
        "duplicates": 1,
        "rejected": 0,
        "refused": {},
        "messages": [],
    }
    assert stored(attempt) == [
        (0, 1, "sim-node-1", "1", 25),
        (1, 1, "sim-node-1", "1", 25),
        (1, 2, "sim-node-1", "1", 25),
        (1, 3, "sim-node-1", "1", 25),
        (1, 4, "sim-node-1", "1", 25),
    ]


def test_refusals_say_why_are_counted_and_store_nothing(world):
    attempt = admitted_attempt(world)  # 2 GPUs
    job = SimulatedJob.objects.create(
        cluster=attempt.cluster, name="held", flavor="a100-80gb", nodes=1, gpus_per_node=2,
        max_runtime_s=600, allocation={"sim-node-1": [2, 3]}, submitted_at=timezone.now(),
    )  # fmt: skip
    attempt.backend_job_id = str(job.pk)
    attempt.gpu_uuids = ["GPU-held-2", "GPU-held-3"]
    attempt.save(update_fields=["backend_job_id", "gpu_uuids"])
    before = {reason: refused_count(reason) for reason in rank_windows.REFUSALS}

    response = post(
        client_for(attempt),
        batch(
            rank_window(2, 1, gpu="2"),
            rank_window(1, 2, world_size=4, gpu="2", seq=2),
            rank_window(1, 3, gpu="1", seq=3),
            rank_window(1, 4, gpu="3", host="sim-node-9", seq=4),
            rank_window(1, 5, gpu="GPU-other", seq=5),
            rank_window(0, 6, gpu="2", host="SIM-NODE-1.cluster.example", seq=6),
            rank_window(1, 7, gpu="GPU-held-3", seq=7),
        ),
    )

    assert response.json() == {
        "accepted": 2,
        "duplicates": 0,
        "rejected": 5,
        "refused": {"gpu_not_held": 3, "rank_out_of_range": 1, "world_size_mismatch": 1},
        "messages": [
            "rank 2 is not below the world size 2.",
            "world size 4 contradicts the attempt's 2 GPUs (one rank per GPU).",
            "rank 1 reports GPU 1 of sim-node-1, which the attempt does not hold.",
            "rank 1 reports GPU 3 of sim-node-9, which the attempt does not hold.",
            "rank 1 reports GPU GPU-other, which is not one of the attempt's GPUs.",
        ],
    }
    assert stored(attempt) == [
        (0, 6, "SIM-NODE-1.cluster.example", "2", 25),
        (1, 7, "sim-node-1", "GPU-held-3", 25),
    ]
    after = {reason: refused_count(reason) - before[reason] for reason in rank_windows.REFUSALS}
    assert after == {
        "rank_out_of_range": 1, "world_size_mismatch": 1, "gpu_not_held": 3, "window_cap": 0,
    }  # fmt: skip


def test_a_rank_stores_at_most_360_windows_per_hour_and_a_resend_is_still_a_duplicate(world):
    attempt = admitted_attempt(world)
    client = client_for(attempt)
    hour_end = HOUR_START + 3600
    # 360 windows of 1 s ending in the same clock hour, then 3 more; one resent.
    events = [
        rank_window(0, n, end=hour_end - 400 + n, start=hour_end - 401 + n, steps=1)
        for n in range(1, 364)
    ]
    first = post(client, batch(*events[:300]))
    rest = post(client, batch(*events[300:], events[0]))

    assert first.json()["accepted"] == 300
    assert rest.json() == {
        "accepted": 60,
        "duplicates": 1,
        "rejected": 3,
        "refused": {"window_cap": 3},
        "messages": ["rank 0 already sent 360 windows ending in this hour (one per 10 s at most)."],
    }
    assert RankStepWindow.objects.filter(attempt=attempt).count() == 360
    next_hour = rank_window(0, 400, end=hour_end + 5, start=hour_end - 5)
    assert post(client, batch(next_hour)).json()["accepted"] == 1


def test_an_ended_attempt_takes_no_rank_windows(world):
    attempt = admitted_attempt(world)
    client = client_for(attempt)
    attempt.state = AttemptState.SUCCEEDED
    attempt.save(update_fields=["state"])

    response = post(client, batch(rank_window()))

    assert response.status_code == 401
    assert not RankStepWindow.objects.exists()


# --- reads -------------------------------------------------------------------------------------


def test_the_detector_reads_windows_by_rank_and_seq_in_its_fields(world, django_assert_num_queries):
    attempt = admitted_attempt(world)
    post(
        client_for(attempt),
        batch(rank_window(1, 2), rank_window(0, 1, seq=3), rank_window(1, 1, seq=4)),
    )

    with django_assert_num_queries(1):
        windows = attempt_rank_windows(attempt_id=attempt.pk)
    with django_assert_num_queries(1):
        recent = attempt_rank_windows(
            attempt_id=attempt.pk, since=datetime.fromtimestamp(TS + 20, tz=UTC)
        )

    assert [tuple(window) for window in windows] == [RANK_WINDOW_FIELDS] * 3
    assert [(w["rank"], w["seq"]) for w in windows] == [(0, 1), (1, 1), (1, 2)]
    assert windows[0] == {
        "rank": 0, "world_size": 2, "host": "sim-node-1", "gpu": "1", "seq": 1,
        "start": TS, "end": TS + 10, "steps": 25, "step_time_s": 0.4, "data_wait_s": 0.5,
        "comm_wait_s": 1.5,
    }  # fmt: skip
    assert [(w["rank"], w["seq"]) for w in recent] == [(1, 2)]


def test_held_gpus_of_whole_nodes_follow_the_dcgm_mapping(world, django_assert_num_queries):
    run = submit(world, nodes=2, gpus_per_node=8)
    k8s = Cluster.objects.create(name="k8s-held", backend=Cluster.Backend.KUBERNETES)
    ClusterFlavor.objects.create(cluster=k8s, flavor=run.flavor, nodes=2, gpus_per_node=8, gpus=16)
    attempt = Attempt.objects.create(
        run=run, number=1, cluster=k8s, state=AttemptState.RUNNING,
        node_list=["GPU-01.example.org", "gpu-02"], gpu_uuids=["GPU-a", 7],
    )  # fmt: skip

    with django_assert_num_queries(1):
        held = attempt_held_gpus(attempt=attempt)

    assert held == HeldGpus(
        count=16,
        pairs=frozenset((host, str(gpu)) for host in ("gpu-01", "gpu-02") for gpu in range(8)),
        uuids=frozenset({"GPU-a"}),
    )
    attempt.node_list = []  # not started yet: the GPUs are not known, nothing is refused
    assert attempt_held_gpus(attempt=attempt).pairs is None
    ClusterFlavor.objects.filter(cluster=k8s).update(gpus_per_node=16)  # part of a node
    attempt.node_list = ["gpu-01"]
    assert attempt_held_gpus(attempt=attempt).pairs is None


def test_the_run_page_reads_1024_ranks_in_the_queries_of_one(client, world):
    run = submit(world)
    attempt = attempt_of(
        world, run, state=AttemptState.RUNNING, start=datetime(2026, 5, 28, tzinfo=UTC)
    )
    start = attempt.started_at
    assert start is not None

    def windows(ranks):
        RankStepWindow.objects.bulk_create(
            RankStepWindow(
                attempt=attempt,
                rank=rank,
                seq=seq,
                world_size=1024,
                host=f"n{rank // 8}",
                gpu=str(rank % 8),
                start=start + timedelta(seconds=30 * (seq - 1)),
                end=start + timedelta(seconds=30 * seq),
                steps=10,
                step_time_s=3.0,
            )
            for rank in ranks
            for seq in (1, 2)
        )

    windows([0])
    client.force_login(world.researcher_a)
    with CaptureQueriesContext(connection) as one_rank:
        client.get(telemetry_url(run))
    windows(range(1, 1024))

    with CaptureQueriesContext(connection) as all_ranks:
        response = client.get(telemetry_url(run))

    assert len(all_ranks) == len(one_rank)
    coverage = response.context["telemetry"].attempts[0].ranks
    assert (coverage.ranks, coverage.world_size, coverage.complete) == (1024, 1024, True)
    assert coverage.last_end == start + timedelta(seconds=60)
    assert "1024 of 1024 ranks reported per-rank step windows" in response.content.decode()
    assert rank_coverage(attempt_ids=[attempt.pk + 1000]) == {}


def test_ranks_reporting_are_those_of_the_last_ten_minutes(world):
    run = submit(world)
    attempt = attempt_of(world, run, state=AttemptState.RUNNING)
    start = attempt.started_at
    RankStepWindow.objects.bulk_create(
        RankStepWindow(
            attempt=attempt, rank=rank, seq=seq, world_size=4, host="n0", gpu=str(rank),
            start=start + timedelta(minutes=seq - 1), end=start + timedelta(minutes=seq),
            steps=10, step_time_s=1.0,
        )
        for rank, last in ((0, 30), (1, 30), (2, 21), (3, 19))
        for seq in range(1, last + 1)
    )  # fmt: skip
    # rank 3 went silent 11 minutes before the latest window: not reporting now
    (coverage,) = rank_coverage(attempt_ids=[attempt.pk]).values()
    assert (coverage.ranks, coverage.world_size, coverage.complete) == (3, 4, False)
    assert coverage.last_end == start + timedelta(minutes=30)
