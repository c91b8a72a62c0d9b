"""An ended attempt's cause class stored by the sync, hardware and platform ends retried on
other nodes (bounded), runs on a quarantined node, and the attempt-failures signal."""

import pytest
from django.utils import timezone

from clusters.backends import JobStatus
from clusters.health import Signal, SignalClass, Source
from clusters.models import ClusterNode, NodeHealthEvent
from jobs.models import Attempt, AttemptState, Checkpoint, Run, RunEvent, RunState
from jobs.selectors.queue import cluster_nodes
from jobs.selectors.runs import attempt_get_for_work
from jobs.services import attribution as attribution_services
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit, job_spec_for
from jobs.services.backend_sync import attempt_apply_status, attempt_cancel, cluster_sync
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

LONG = {"GANTRY_SIM_DURATION_S": "86400"}


def running(world, user=None, tenant="vision", project="detection", **overrides) -> Attempt:
    """A run of one node × 8 GPUs running on the simulator; its attempt, fresh."""
    data = experiment_input(world, tenant=tenant, project=project, env=LONG, **overrides)
    run = run_submit(user=user or world.researcher_a, data=data)
    admission_run_cycle()
    attempt = run.attempts.get()
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    attempt = Attempt.objects.select_related("run__experiment", "cluster").get(pk=attempt.pk)
    assert attempt.state == AttemptState.RUNNING
    return attempt


def end(attempt: Attempt, *, reason: str, message: str = "", exit_code=None, state="FAILED"):
    now = timezone.now()
    status = JobStatus(
        state=state,
        finished_at=now,
        failure_reason=reason,
        message=message,
        exit_code=exit_code,
        node_list=list(attempt.node_list),
    )
    return attempt_apply_status(attempt=attempt, status=status, now=now)


def xid79(world, node: str, at, gpu="3") -> NodeHealthEvent:
    return NodeHealthEvent.objects.create(
        cluster=world.cluster,
        node=node,
        gpu=gpu,
        source="dcgm",
        signal="gpu_lost",
        code="79",
        detail="GPU has fallen off the bus",
        observed_at=at,
        last_observed_at=at,
        recorded_at=at,
    )


def last_event(run: Run) -> str:
    return RunEvent.objects.filter(run=run).order_by("-id").values_list("message", flat=True)[0]


def test_hardware_end_is_retried_on_other_nodes_not_counted_against_restarts(world):
    attempt = running(world)
    node = attempt.node_list[0]
    event = xid79(world, node, attempt.started_at)
    Checkpoint.objects.create(
        run=attempt.run, attempt=attempt, step=500, uri="s3://ck/500", saved_at=timezone.now()
    )
    assert end(attempt, reason="GPU_XID", message="GPU error") == 1

    attempt.refresh_from_db()
    assert (attempt.state, attempt.cause_class) == (AttemptState.FAILED, "hardware")
    assert attempt.cause_evidence == {
        "node": node,
        "gpu": "3",
        "signal": "gpu_lost",
        "code": "79",
        "at": event.observed_at.isoformat(),
        "detail": "GPU has fallen off the bus",
    }
    run = Run.objects.get(pk=attempt.run_id)
    assert (run.state, run.restarts, run.platform_retries, run.excluded_nodes) == (
        RunState.QUEUED,
        0,
        1,
        [node],
    )
    assert last_event(run) == (
        "Attempt 1 ended: a hardware fault on its node (XID 79 on GPU 3); requeued from step "
        "500 on other nodes, not counted against your restarts"
    )
    # The next admission places it elsewhere.
    admission_run_cycle()
    second = run.attempts.get(number=2)
    assert node not in second.placement
    assert len(second.placement) == 1
    assert job_spec_for(attempt_get_for_work(second.pk)).excluded_nodes == (node,)


def test_a_run_that_keeps_hitting_broken_hardware_fails_after_the_limit(world):
    world.cluster.health_policy = {"max_platform_retries": 2}
    world.cluster.save(update_fields=["health_policy"])
    attempt = running(world)
    Run.objects.filter(pk=attempt.run_id).update(platform_retries=2, excluded_nodes=["other"])
    attempt.run.refresh_from_db()
    end(attempt, reason="NODE_FAILURE", message="node went down")
    run = Run.objects.get(pk=attempt.run_id)
    node = attempt.node_list[0]
    assert (run.state, run.failure_reason, run.platform_retries) == (
        RunState.FAILED,
        "NODE_FAILURE",
        2,
    )
    assert run.excluded_nodes == ["other", node]
    assert last_event(run) == (
        "Attempt 1 ended: a hardware fault on its node (node down); not retried again: the run "
        "already had 2 retries after hardware or platform faults, the cluster's limit"
    )


def test_a_user_end_counts_against_restarts_as_before(world):
    attempt = running(world)
    xid79(world, attempt.node_list[0], attempt.started_at, gpu="GPU-other")
    Attempt.objects.filter(pk=attempt.pk).update(gpu_uuids=["GPU-mine"])
    attempt.gpu_uuids = ["GPU-mine"]  # the event is on another job's GPU of the node
    end(attempt, reason="OOM_GPU", exit_code=1)
    attempt.refresh_from_db()
    assert (attempt.cause_class, attempt.cause_evidence["signal"]) == ("user", "oom_gpu")
    run = Run.objects.get(pk=attempt.run_id)
    assert (run.state, run.platform_retries, run.excluded_nodes) == (RunState.FAILED, 0, [])


def test_success_has_no_cause(world):
    attempt = running(world)
    end(attempt, reason="", state="SUCCEEDED")
    attempt.refresh_from_db()
    assert (attempt.cause_class, attempt.cause_evidence) == ("", {})


def test_two_tenants_failing_on_one_node_send_the_attempt_failures_signal(world, monkeypatch):
    sent = []
    monkeypatch.setattr(
        attribution_services,
        "node_signals_record",
        lambda **kwargs: sent.append(kwargs),
    )
    first = running(world, gpus_per_node=4)
    second = running(
        world,
        user=world.researcher_b,
        tenant="nlp",
        project="llm",
        gpus_per_node=4,
    )
    assert first.node_list == second.node_list  # packed onto one node
    end(first, reason="USER_EXIT", exit_code=1)
    assert sent == []  # one tenant so far
    end(second, reason="USER_EXIT", exit_code=1)
    node = first.node_list[0]
    [call] = sent
    assert call["cluster"] == world.cluster
    assert call["signals"] == [
        Signal(
            node,
            SignalClass.ATTEMPT_FAILURES,
            Source.ATTEMPTS,
            call["now"].timestamp(),
            detail="attempts of 2 tenants failed on the node within 60 min",
        )
    ]


def test_the_attempt_failures_signal_makes_the_node_suspect(world):
    """Through the clusters service, not a stand-in: the node is suspect, the event names
    no tenant."""
    first = running(world, gpus_per_node=4)
    second = running(world, user=world.researcher_b, tenant="nlp", project="llm", gpus_per_node=4)
    end(first, reason="USER_EXIT", exit_code=1)
    end(second, reason="USER_EXIT", exit_code=1)
    node = ClusterNode.objects.get(cluster=world.cluster, name=first.node_list[0])
    assert (node.health, node.health_reason) == (
        "suspect",
        "attempts of 2 tenants failed on the node within 60 min",
    )
    [event] = NodeHealthEvent.objects.filter(cluster=world.cluster)
    assert (event.node, event.source, event.signal, event.action, event.count) == (
        node.name,
        "attempts",
        "attempt_failures",
        "warn",
        1,
    )


def test_a_persons_quarantine_during_the_attempt_is_the_platforms(world):
    from clusters.services.health import node_quarantine

    attempt = running(world)
    node = attempt.node_list[0]
    act = node_quarantine(
        cluster=world.cluster, node=node, actor=world.platform_admin, note="fan noise"
    )
    end(attempt, reason="USER_EXIT", exit_code=137)
    attempt.refresh_from_db()
    assert (attempt.cause_class, attempt.cause_evidence) == (
        "platform",
        {
            "node": node,
            "gpu": "",
            "signal": "quarantine",
            "code": "",
            "at": act.observed_at.isoformat(),
            "detail": "",
        },
    )
    run = Run.objects.get(pk=attempt.run_id)
    assert (run.state, run.platform_retries, run.excluded_nodes) == (RunState.QUEUED, 1, [node])


def test_a_signal_the_policy_quarantined_on_and_its_fence_make_a_hardware_end(world):
    from clusters.services.health import node_fences_push, node_signals_record

    attempt = running(world)
    node = attempt.node_list[0]
    at = timezone.now()
    signal = Signal(node, SignalClass.GPU_LOST, Source.DCGM, at.timestamp(), gpu="3",
                    code="79", detail="XID 79 GPU has fallen off the bus")  # fmt: skip
    [recorded] = node_signals_record(cluster=world.cluster, signals=[signal], now=at)
    assert node_fences_push(cluster=world.cluster) == 1
    end(attempt, reason="NODE_FAILURE", exit_code=137)
    attempt.refresh_from_db()
    assert (attempt.cause_class, attempt.cause_evidence) == (
        "hardware",
        {
            "node": node,
            "gpu": "3",
            "signal": "gpu_lost",
            "code": "79",
            "at": recorded.observed_at.isoformat(),
            "detail": "XID 79 GPU has fallen off the bus",
        },
    )
    rows = NodeHealthEvent.objects.filter(node=node).order_by("id")
    assert [(e.source, e.signal, e.action) for e in rows] == [
        ("dcgm", "gpu_lost", "quarantine"),
        ("gantry", "fence", "fenced"),
    ]


@pytest.mark.parametrize("policy", ["requeue", "stop", "finish"])
def test_runs_on_a_quarantined_node_leave_as_the_policy_says(world, policy):
    world.cluster.health_policy = {"on_quarantine": policy}
    world.cluster.save(update_fields=["health_policy"])
    attempt = running(world)
    node = attempt.node_list[0]
    ClusterNode.objects.filter(cluster=world.cluster, name=node).update(
        health="quarantined", health_reason="XID 79 on GPU 3", health_since=timezone.now()
    )
    now = timezone.now()
    acted = attribution_services.quarantined_attempts_settle(cluster=world.cluster, now=now)
    again = attribution_services.quarantined_attempts_settle(cluster=world.cluster, now=now)
    run = Run.objects.get(pk=attempt.run_id)
    attempt.refresh_from_db()
    if policy == "finish":
        assert (acted, run.state, attempt.cause_class) == (0, RunState.RUNNING, "")
        return
    assert (acted, again) == (1, 0)  # never twice
    assert attempt.cause_class == "platform"
    assert attempt.cause_evidence["signal"] == "quarantine"
    assert attempt.cause_evidence["detail"] == "XID 79 on GPU 3"
    if policy == "stop":
        assert run.cancel_requested_at is not None
        return
    assert (run.state, run.excluded_nodes) == (RunState.PREEMPTED, [node])
    assert last_event(run) == (
        f"Taken off its nodes: node {node} was quarantined by Gantry (XID 79 on GPU 3); it "
        "resumes from its latest checkpoint on other nodes, not counted against your restarts"
    )
    attempt_cancel(attempt_id=attempt.pk)  # the job is taken off: the run is back in the queue
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state, attempt.cause_class) == (
        RunState.QUEUED,
        AttemptState.PREEMPTED,
        "platform",
    )


def test_a_quarantined_node_takes_no_work_with_gantrys_reason(world):
    ClusterNode.objects.filter(cluster=world.cluster, name="sim-1-a100-80gb-01").update(
        health="quarantined", health_reason="XID 79 on GPU 3"
    )
    ClusterNode.objects.filter(cluster=world.cluster, name="sim-1-a100-80gb-02").update(
        health="suspect", health_reason="thermal throttling"
    )
    nodes = {node.name: node for node in cluster_nodes(now=timezone.now())}
    assert (nodes["sim-1-a100-80gb-01"].schedulable, nodes["sim-1-a100-80gb-01"].reason) == (
        False,
        "quarantined by Gantry: XID 79 on GPU 3",
    )
    assert (nodes["sim-1-a100-80gb-02"].schedulable, nodes["sim-1-a100-80gb-02"].reason) == (
        True,
        "",
    )  # suspect: still placed on


def test_the_periodic_sync_settles_runs_on_quarantined_nodes(world):
    from jobs.tasks import sync_all_clusters

    attempt = running(world)
    ClusterNode.objects.filter(cluster=world.cluster, name=attempt.node_list[0]).update(
        health="quarantined", health_reason="ECC"
    )
    sync_all_clusters()
    assert Run.objects.get(pk=attempt.run_id).state == RunState.PREEMPTED


def hardware_ended(world) -> tuple[Attempt, str, NodeHealthEvent]:
    attempt = running(world)
    node = attempt.node_list[0]
    event = xid79(world, node, attempt.started_at)
    end(attempt, reason="GPU_XID", message="GPU error")
    return attempt, node, event


def test_the_api_shows_the_cause_and_its_evidence_to_the_runs_tenant_only(world):
    from rest_framework.test import APIClient

    attempt, node, event = hardware_ended(world)
    client = APIClient()
    client.force_authenticate(world.researcher_a)
    [shown] = client.get(f"/api/v1/runs/{attempt.run_id}/").json()["attempts"]
    assert (shown["cause_class"], shown["cause"]) == (
        "hardware",
        "a hardware fault on its node (XID 79 on GPU 3)",
    )
    assert shown["cause_evidence"] == {
        "node": node,
        "gpu": "3",
        "signal": "gpu_lost",
        "code": "79",
        "at": event.observed_at.isoformat(),
        "detail": "GPU has fallen off the bus",
    }
    outsider = APIClient()
    outsider.force_authenticate(world.researcher_b)  # nlp: not the run's tenant
    assert outsider.get(f"/api/v1/runs/{attempt.run_id}/").status_code == 404


def test_the_run_page_shows_the_cause_escaped(world, client):
    from django.urls import reverse

    attempt, node, _ = hardware_ended(world)
    attempt.refresh_from_db()
    Attempt.objects.filter(pk=attempt.pk).update(
        cause_evidence={**attempt.cause_evidence, "detail": "<script>x</script>"}
    )
    client.force_login(world.researcher_a)
    content = client.get(reverse("jobs:run_detail", args=[attempt.run_id])).content.decode()
    assert "Cause: a hardware fault on its node (XID 79 on GPU 3)" in content
    assert f'node <span class="mono">{node}</span>, GPU 3' in content
    assert "&lt;script&gt;x&lt;/script&gt;" in content
    assert "<script>x</script>" not in content


def test_the_cli_says_the_cause_with_its_evidence():
    from gantry_cli.runs import cause_line

    attempt = {
        "cause_class": "hardware",
        "cause": "a hardware fault on its node (XID 79 on GPU 3)",
        "cause_evidence": {"node": "n1", "gpu": "3", "at": "2027-01-15T08:01:00+00:00"},
    }
    assert cause_line(attempt) == (
        "a hardware fault on its node (XID 79 on GPU 3); node n1, GPU 3, at "
        "2027-01-15T08:01:00+00:00"
    )
    assert cause_line({"cause_class": "user", "cause": "the program", "cause_evidence": {}}) == (
        "the program"
    )


def test_exclusions_and_quarantines_add_no_query_to_the_admission_snapshot(world):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.selectors.queue import admission_snapshot

    def snapshot_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            admission_snapshot(now=timezone.now())
        return len(queries)

    run_submit(user=world.researcher_a, data=experiment_input(world))
    before = snapshot_queries()
    for _ in range(5):
        run = run_submit(user=world.researcher_a, data=experiment_input(world))
        Run.objects.filter(pk=run.pk).update(excluded_nodes=["sim-1-a100-80gb-00"])
    ClusterNode.objects.filter(cluster=world.cluster).update(health="quarantined")
    assert snapshot_queries() == before
    snapshot, _ = admission_snapshot(now=timezone.now())
    assert sorted({run.excluded for run in snapshot.queued}) == [(), ("sim-1-a100-80gb-00",)]
    assert {node.reason for node in snapshot.nodes} == {"quarantined by Gantry: no reason given"}


def test_the_runtime_reports_error_at_exit_is_read(world):
    attempt = running(world)
    error = "CUDA error: uncorrectable ECC error encountered"
    Attempt.objects.filter(pk=attempt.pk).update(runtime_env={"error_at_exit": error})
    attempt.runtime_env = {"error_at_exit": error}
    end(attempt, reason="USER_EXIT", exit_code=1, message="")
    attempt.refresh_from_db()
    assert (attempt.cause_class, attempt.cause_evidence["signal"]) == ("hardware", "runtime_error")
    assert attempt.cause_evidence["detail"] == error
    assert Run.objects.get(pk=attempt.run_id).platform_retries == 1


@pytest.mark.parametrize(
    ("reason", "cause", "signal"),
    [("UNKNOWN", "platform", "backend_error"), ("IMAGE_PULL", "user", "image_pull")],
)
def test_a_job_the_cluster_refuses_for_good_gets_its_cause(
    world, monkeypatch, reason, cause, signal
):
    from clusters.backends import PermanentBackendError
    from clusters.backends.simulator import SimulatorBackend

    def refuse(self, spec, *, may_exist=True):
        raise PermanentBackendError("no such partition", failure_reason=reason)

    monkeypatch.setattr(SimulatorBackend, "submit", refuse)
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    admission_run_cycle()
    attempt = run.attempts.get()
    attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.cause_class, attempt.cause_evidence["signal"]) == (
        AttemptState.FAILED,
        cause,
        signal,
    )
    assert attempt.cause_evidence["detail"] == "no such partition"
    assert Run.objects.get(pk=run.pk).state == RunState.FAILED  # refused again if retried
