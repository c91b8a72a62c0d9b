"""A run's verdicts through the page, the REST API and the CLI's formatting: the facts read
from the database (topology, node health, DRAM activity, versions, rank coverage) reach the
tree, and what is missing is named."""

from datetime import timedelta

import pytest
from django.urls import reverse

from clusters.models import ClusterNode, NodeHealthEvent
from gantry_cli.diagnose import attempt_lines
from jobs.models import Attempt, AttemptRankRuntime, AttemptState, CauseClass, Run, RunState
from telemetry.models import (
    GpuMinute,
    NodeLinkMinute,
    RankStepWindow,
    StepWindow,
    StragglerFlag,
)
from tests.telemetry.test_telemetry_pages import (
    T0,
    account,
    attempt_of,
    page,
    submit,
    telemetry_url,
)


def nodes(world, *specs: tuple[str, list[str], str, str]) -> None:
    world.cluster.topology_levels = ["block", "leaf"]
    world.cluster.save(update_fields=["topology_levels"])
    for name, path, health, reason in specs:
        ClusterNode.objects.create(
            cluster=world.cluster,
            name=name,
            flavor=world.a100,
            gpus=8,
            path=path,
            updated_at=T0,
            health=health,
            health_reason=reason,
        )


def steps(attempt, *, comm_wait_s: float, data_wait_s: float = 0.0) -> None:
    StepWindow.objects.create(
        attempt=attempt,
        source="rank-0",
        seq=1,
        start=attempt.started_at,
        end=attempt.started_at + timedelta(minutes=10),
        steps=100,
        step_time_s=1.0,
        comm_wait_s=comm_wait_s,
        data_wait_s=data_wait_s,
    )


def gpu_minute(attempt, host: str, *, activity: float, dram: float | None) -> None:
    GpuMinute.objects.create(
        attempt=attempt,
        host=host,
        gpu="0",
        minute=attempt.started_at,
        activity=activity,
        tensor_active=0.4,
        dram_active=dram,
        samples=4,
    )


@pytest.fixture
def spread_run(world):
    """A 2-node run whose attempt runs on two leaves, one node suspect, waiting on
    communication a third of its steps."""
    nodes(
        world,
        ("n1", ["b1", "l1"], "healthy", ""),
        ("n2", ["b1", "l2"], "suspect", "thermal throttle on GPU 3"),
    )
    run = submit(world, nodes=2, gpus_per_node=8)
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING)
    attempt = attempt_of(
        world,
        run,
        state=AttemptState.RUNNING,
        node_list=["n1", "n2"],
        runtime_env={"driver_version": "470.82.01"},
    )
    steps(attempt, comm_wait_s=33.0)
    gpu_minute(attempt, "n1", activity=0.8, dram=0.7)
    gpu_minute(attempt, "n2", activity=0.6, dram=0.5)
    image = run.experiment.image
    image.cuda_version = "12.2"
    image.save(update_fields=["cuda_version"])
    return run


def test_the_api_gives_each_attempts_verdicts_with_figures_and_missing_signals(
    client, world, spread_run
):
    client.force_login(world.researcher_a)
    body = client.get(reverse("api:run-verdicts", args=[spread_run.pk])).json()

    (attempt,) = body["attempts"]
    assert (attempt["attempt"], attempt["state"], attempt["status"]) == (1, "RUNNING", "running")
    assert [v["code"] for v in attempt["verdicts"]] == [
        "node_health",
        "driver_too_old",
        "placement_spread",
        "memory_bound",
    ]
    node, driver, spread, memory = attempt["verdicts"]
    assert node["node"] == "n2"
    assert node["text"].startswith("Node n2 is suspect: thermal throttle on GPU 3.")
    assert driver["numbers"] == {"driver": "470.82.01", "image_cuda": "12.2"}
    assert spread["numbers"] == {
        "nodes": 2,
        "level": "leaf",
        "domains": 2,
        "comm_wait_share": 0.33,
        "tighter_wait_s": None,
    }
    # minute-weighted over the GPUs: (0.7 + 0.5) / 2 at (0.8 + 0.6) / 2 activity
    assert memory["numbers"] == {"dram_activity": 0.6, "activity": 0.7}
    assert attempt["missing"] == [
        "the NCCL version of each rank",
        "per-rank step windows (the Gantry SDK sends them from every rank)",
        "DCGM NVLink counters",
        "InfiniBand port counters (node exporter)",
    ]


def test_rank_windows_take_the_slow_rank_branch_off_the_missing_list(client, world, spread_run):
    attempt = spread_run.attempts.get()
    RankStepWindow.objects.create(
        attempt=attempt,
        rank=0,
        seq=1,
        world_size=16,
        host="n1",
        gpu="0",
        start=T0,
        end=T0 + timedelta(seconds=30),
        steps=3,
        step_time_s=1.0,
    )
    client.force_login(world.researcher_a)
    body = client.get(reverse("api:run-verdicts", args=[spread_run.pk])).json()
    assert (
        "per-rank step windows (the Gantry SDK sends them from every rank)"
        not in (body["attempts"][0]["missing"])
    )


def test_an_attempt_a_hardware_fault_ended_names_the_node(client, world):
    nodes(world, ("n1", ["b1", "l1"], "healthy", ""))
    run = submit(world)
    attempt = attempt_of(
        world,
        run,
        state=AttemptState.FAILED,
        node_list=["n1"],
        cause_class=CauseClass.HARDWARE,
        cause_evidence={"node": "n1", "gpu": "3", "signal": "gpu_lost", "detail": ""},
    )
    account(attempt, allocated=3600)
    client.force_login(world.researcher_a)
    body = client.get(reverse("api:run-verdicts", args=[run.pk])).json()
    (verdict,) = [v for v in body["attempts"][0]["verdicts"] if v["code"] == "node_health"]
    assert verdict["text"].startswith("Node n1 is faulty: gpu lost.")


def test_the_page_shows_the_verdicts_and_what_was_not_checked(client, world, spread_run):
    content = page(client, world.researcher_a, telemetry_url(spread_run))
    assert 'data-finding="placement_spread"' in content
    assert "this run&#x27;s 2 nodes sit in 2 leafs" in content
    assert "Not checked, for want of its signal: the NCCL version of each rank;" in content


def test_an_outsider_gets_404(client, world, spread_run):
    client.force_login(world.researcher_b)
    response = client.get(reverse("api:run-verdicts", args=[spread_run.pk]))
    assert response.status_code == 404


def test_the_cli_prints_one_line_per_verdict_and_the_missing_signals():
    attempt = {
        "attempt": 2,
        "state": "RUNNING",
        "status": "running",
        "verdicts": [
            {"code": "slow_rank", "text": "A slow rank: rank 3.", "numbers": {}, "node": "n2"}
        ],
        "missing": ["DCGM NVLink counters", "the NCCL version of each rank"],
    }
    assert attempt_lines(attempt) == [
        "Attempt 2 (RUNNING) (running: where the GPU time went follows when it ends)",
        "  - [slow_rank] A slow rank: rank 3.",
        "  Not checked, for want of its signal: DCGM NVLink counters; "
        "the NCCL version of each rank",
    ]
    waiting = {
        "attempt": 1,
        "state": "PENDING",
        "status": "waiting",
        "verdicts": None,
        "missing": [],
    }
    assert attempt_lines(waiting) == ["Attempt 1 (PENDING)", "  Not started yet."]


def flag(attempt, *, rank: int, node: str, cause: str, evidence: dict) -> StragglerFlag:
    return StragglerFlag.objects.create(
        attempt=attempt,
        run=attempt.run,
        cluster=attempt.cluster,
        node=node,
        gpu="3",
        rank=rank,
        world_size=16,
        cause=cause,
        slowdown=1.4688,
        windows=5,
        first_window=4,
        evidence=evidence,
        detected_at=T0,
        updated_at=T0,
    )


def test_a_flagged_rank_is_a_verdict_with_a_restart_button_while_running(client, world, spread_run):
    attempt = spread_run.attempts.get()
    flag(
        attempt, rank=11, node="n2", cause="slow_gpu", evidence={"gpu_signs": ["thermal throttle"]}
    )
    RankStepWindow.objects.create(
        attempt=attempt, rank=0, seq=1, world_size=16, host="n1", gpu="0", start=T0,
        end=T0 + timedelta(seconds=30), steps=3, step_time_s=1.0,
    )  # fmt: skip
    client.force_login(world.researcher_a)
    body = client.get(reverse("api:run-verdicts", args=[spread_run.pk])).json()
    (slow,) = [v for v in body["attempts"][0]["verdicts"] if v["code"] == "slow_rank"]
    assert slow["numbers"] == {
        "rank": 11,
        "node": "n2",
        "gpu": "3",
        "slowdown": 1.4688,
        "windows": 5,
        "cause": "slow_gpu",
    }
    assert slow["text"].startswith(
        "A slow rank: rank 11 on n2, GPU 3, reached each all-reduce 1.47× later than the "
        "gang's median for 5 windows, and every other rank waited for it; its GPU is slow "
        "(thermal throttle)."
    )
    content = page(client, world.researcher_a, telemetry_url(spread_run))
    restart = reverse("jobs:run_restart_excluding", args=[spread_run.pk])
    # one button per verdict naming n2 (the suspect node's and the slow rank's)
    assert content.count(f'action="{restart}"') == 2
    assert content.count('data-restart-excluding="n2"') == 2


def test_an_unknown_cause_names_the_signal_it_lacked(client, world, spread_run):
    attempt = spread_run.attempts.get()
    flag(attempt, rank=4, node="n1", cause="unknown", evidence={"missing": "the GPU's SM clock"})
    client.force_login(world.researcher_a)
    body = client.get(reverse("api:run-verdicts", args=[spread_run.pk])).json()
    assert "to name rank 4's cause: the GPU's SM clock" in body["attempts"][0]["missing"]


def test_no_restart_button_once_the_attempt_ended(client, world):
    nodes(world, ("n1", ["b1", "l1"], "healthy", ""))
    run = submit(world, nodes=1, gpus_per_node=8)
    attempt = attempt_of(world, run, state=AttemptState.FAILED, node_list=["n1"])
    flag(attempt, rank=2, node="n1", cause="slow_gpu", evidence={})
    content = page(client, world.researcher_a, telemetry_url(run))
    assert 'data-finding="slow_rank"' in content
    assert "data-restart-excluding" not in content


def test_what_a_tighter_placement_would_have_waited_and_the_ranks_nccl(client, world, spread_run):
    attempt = spread_run.attempts.get()
    Attempt.objects.filter(pk=attempt.pk).update(tighter_wait_s=7500.0)
    for rank in range(16):
        AttemptRankRuntime.objects.create(
            attempt=attempt,
            rank=rank,
            nccl_version="2.18.1" if rank == 9 else "2.20.5",
            driver_version="550.54.15" if rank else "535.54.03",
            reported_at=T0,
        )
    client.force_login(world.researcher_a)
    body = client.get(reverse("api:run-verdicts", args=[spread_run.pk])).json()
    verdicts = {v["code"]: v for v in body["attempts"][0]["verdicts"]}
    assert verdicts["placement_spread"]["numbers"]["tighter_wait_s"] == 7500.0
    assert "would have waited about 2 h 05 min more" in verdicts["placement_spread"]["text"]
    assert verdicts["nccl_mismatch"]["numbers"] == {
        "nccl": {"2.20.5": 15, "2.18.1": 1},
        "image_nccl": "",
    }
    # the oldest driver of the runtime report's (470) and the ranks' (535, 550) is checked
    assert verdicts["driver_too_old"]["numbers"]["driver"] == "470.82.01"
    assert "the NCCL version of each rank" not in body["attempts"][0]["missing"]


def test_link_counters_of_the_attempts_span_become_verdicts(client, world, spread_run):
    attempt = spread_run.attempts.get()
    for minute in range(3):
        at = T0 + timedelta(minutes=minute)
        for name, rate, errors in (("n1", 12e9, 0), ("n2", 2e9, 0)):
            NodeLinkMinute.objects.create(
                cluster=world.cluster, host=name, minute=at, ib_bytes_s=rate, ib_errors=errors
            )
    # before the attempt: not its errors
    NodeLinkMinute.objects.create(
        cluster=world.cluster, host="n2", minute=T0 - timedelta(minutes=5), ib_errors=40
    )
    NodeHealthEvent.objects.create(
        cluster=world.cluster, node="n1", gpu="4", source="dcgm", signal="nvlink_errors",
        observed_at=T0 + timedelta(minutes=7), last_observed_at=T0 + timedelta(minutes=9),
        count=6, recorded_at=T0 + timedelta(minutes=9),
    )  # fmt: skip
    GpuMinute.objects.filter(attempt=attempt).update(nvlink_bytes_s=30e9)
    client.force_login(world.researcher_a)
    body = client.get(reverse("api:run-verdicts", args=[spread_run.pk])).json()

    verdicts = {v["code"]: v for v in body["attempts"][0]["verdicts"]}
    assert verdicts["nvlink"]["numbers"] == {"errors": 6, "nodes": ["n1"]}
    assert verdicts["infiniband"]["numbers"] == {"low": ["n2"], "median_bytes_s": 12e9}
    assert verdicts["infiniband"]["node"] == "n2"
    missing = body["attempts"][0]["missing"]
    assert "DCGM NVLink counters" not in missing
    assert "InfiniBand port counters (node exporter)" not in missing
