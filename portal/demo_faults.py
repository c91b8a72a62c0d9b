"""The demo's node-health story, seeded as history (portal/demo.py): a lemon node of the
simulated cluster lost a GPU (XID 79), Gantry's policy quarantined it and drained it on the
simulator, and the run whose attempt it ended was retried from its checkpoint on another
node, its lost GPU-hours credited (the cause class ``hardware`` the accounting credits).

The fault's instant is the simulator's own (``clusters.sim_faults``, the cluster's lemon),
so the history and the live simulator tell the same story."""

from datetime import UTC, datetime, timedelta

from clusters.backends import backend_for
from clusters.health import XIDS, Signal, SignalClass, Source
from clusters.health_policy import signal_sentence
from clusters.models import Cluster, SimulatedFence
from clusters.services.health import FENCE_REASON_PREFIX, node_fences_push, node_signals_record
from clusters.sim_faults import CLASS_XID, Fault, fault_settings, faults_between
from clusters.simulation import STARTUP_S, sim_layout
from jobs.models import Attempt, AttemptState, Checkpoint, Run, RunEvent, RunState
from jobs.services.usage import usage_record_attempt
from portal.demo_history import date_the_records, history_telemetry_record
from telemetry.models import GpuMinute

LEMON = "sim-east-a100-80gb-04"
# The demo cluster's "faults" (portal/demo.py): the lemon's GPU 3 falls off the bus every
# 4 hours; GPU 7 of node 05 (busy with work from outside Gantry) runs hot: its clock-event
# reasons say HW thermal slowdown.
DEMO_FAULTS = {
    "seed": 34,
    "lemons": {LEMON: {"class": "gpu_lost", "every_s": 4 * 3600, "gpu": 3}},
    "throttled": {"sim-east-a100-80gb-05": {"gpu": 7, "reasons": 0x40}},
}
CHECKPOINT_EVERY_S = 1800
# How long after the fault the signal was recorded and the node quarantined, and then
# drained: within the collector's minute and the next sync.
QUARANTINED_AFTER = timedelta(seconds=45)
FENCED_AFTER = timedelta(seconds=70)
RETRY_NODE = "sim-east-a100-80gb-01"


def lemon_fault(cluster: Cluster, *, after: datetime) -> Fault:
    """The lemon's first fault in the 4 hours from ``after``."""
    layout = sim_layout(cluster.name, cluster.settings)
    nodes = {node.name: node.gpus for node in layout.nodes}
    settings = fault_settings(cluster.settings["faults"], nodes=nodes)
    start = after.timestamp()
    return faults_between({LEMON: nodes[LEMON]}, settings, start=start, end=start + 4 * 3600)[0]


def fault_signal(fault: Fault) -> Signal:
    """The DCGM signal the fault makes (telemetry/exposition/health_signals.py's words)."""
    return Signal(
        node=fault.node,
        signal=fault.signal,
        source=Source.DCGM,
        at=fault.at,
        gpu=str(fault.gpu),
        code=str(fault.xid),
        detail=f"XID {fault.xid} {XIDS[fault.xid].description}",
    )


def fault_reason(fault: Fault) -> str:
    """The node's health reason, as the policy words it (``GPU 3: XID 79 …``)."""
    return signal_sentence(fault_signal(fault))


def lemon_fence(cluster: Cluster) -> None:
    """Drain the lemon on the simulator as Gantry did (dated by the history), before the
    seed's first inventory read, so that read already finds it taking no work."""
    lemon = fault_settings(
        cluster.settings["faults"],
        nodes={node.name: node.gpus for node in sim_layout(cluster.name, cluster.settings).nodes},
    ).lemons[LEMON]
    fault = Fault(0.0, LEMON, lemon.gpu, lemon.signal, CLASS_XID[lemon.signal], lemon=True)
    # The reason node_fences_push gives, so its push later finds the fence as it wants it.
    backend_for(cluster).fence(LEMON, f"{FENCE_REASON_PREFIX} {fault_reason(fault)}")


def history_record_hardware_fault(*, run: Run, cluster: Cluster, submitted: datetime) -> None:
    """``run`` ran on the lemon until its GPU fell off the bus, and ran again elsewhere."""
    first_start = submitted + timedelta(minutes=6)
    # The attempt ends at the lemon's first fault after it started, and saved a checkpoint
    # before it: a start too close to a fault (the lemon fails every 4 hours, whatever the
    # hour the demo is seeded at) moves just past that fault.
    early = lemon_fault(cluster, after=first_start)
    if early.at < (first_start + timedelta(seconds=STARTUP_S + CHECKPOINT_EVERY_S)).timestamp():
        first_start = datetime.fromtimestamp(early.at + 1, tz=UTC)
    fault = lemon_fault(cluster, after=first_start + timedelta(seconds=STARTUP_S))
    failed_at = datetime.fromtimestamp(fault.at, tz=UTC)
    step = int((failed_at - first_start).total_seconds() - STARTUP_S)
    saved_step = step // CHECKPOINT_EVERY_S * CHECKPOINT_EVERY_S
    second_admitted = failed_at + timedelta(minutes=2)
    second_start = second_admitted + timedelta(minutes=2)
    finished = second_start + timedelta(hours=2, minutes=20)
    evidence = {
        "node": LEMON,
        "gpu": str(fault.gpu),
        "signal": SignalClass.GPU_LOST.value,
        "code": str(fault.xid),
        "at": failed_at.isoformat(),
        "detail": f"XID {fault.xid} {XIDS[fault.xid].description}",
    }
    first = Attempt.objects.create(
        run=run,
        number=1,
        cluster=cluster,
        state=AttemptState.FAILED,
        backend_job_id=f"history-{run.pk}-1",
        submitted_at=first_start,
        started_at=first_start,
        finished_at=failed_at,
        exit_code=fault.exit_code,
        failure_reason=fault.failure_reason,
        failure_message=fault.message(),
        node_list=[LEMON],
        cause_class="hardware",
        cause_evidence=evidence,
    )
    checkpoint = Checkpoint.objects.create(
        run=run,
        attempt=first,
        step=saved_step,
        uri=f"s3://checkpoints/vision/segmentation/{first.name}/step-{saved_step}",
        saved_at=first_start + timedelta(seconds=STARTUP_S + saved_step),
        save_seconds=12.0,
    )
    second = Attempt.objects.create(
        run=run,
        number=2,
        cluster=cluster,
        state=AttemptState.SUCCEEDED,
        backend_job_id=f"history-{run.pk}-2",
        submitted_at=second_admitted,
        started_at=second_start,
        finished_at=finished,
        exit_code=0,
        node_list=[RETRY_NODE],
        resumed_from=checkpoint,
    )
    for attempt, start, end in ((first, first_start, failed_at), (second, second_start, finished)):
        usage_record_attempt(attempt=attempt, started=start, finished=end)
    history_telemetry_record(attempt=first, profile="compute-bound")
    history_telemetry_record(attempt=second, profile="compute-bound", resume_step=saved_step)
    # The exporter's last XID on the GPU that fell, in the minute it fell.
    _xid_minute(first, fault)
    Run.objects.filter(pk=run.pk).update(
        state=RunState.SUCCEEDED,
        cluster=cluster,
        submitted_at=submitted,
        admitted_at=second_admitted,
        started_at=first_start,
        finished_at=finished,
        platform_retries=1,
        excluded_nodes=[LEMON],
    )
    date_the_records(
        run=run, submitted=submitted, attempts={first: first_start, second: second_admitted}
    )
    _events(run, first, second, fault, saved_step, first_start, second_start, finished)
    _quarantine(cluster, fault)


def _xid_minute(attempt: Attempt, fault: Fault) -> None:
    minute = datetime.fromtimestamp(fault.at // 60 * 60, tz=UTC)
    GpuMinute.objects.filter(
        attempt=attempt, host=fault.node, gpu=str(fault.gpu), minute=minute
    ).update(xid=fault.xid)


def _events(
    run: Run,
    first: Attempt,
    second: Attempt,
    fault: Fault,
    saved_step: int,
    first_start: datetime,
    second_start: datetime,
    finished: datetime,
) -> None:
    failed_at = datetime.fromtimestamp(fault.at, tz=UTC)
    admitted = "Admitted to sim-east: 8 a100-80gb GPUs"
    for at, attempt, from_state, to_state, reason, message in (
        (first_start, first, "QUEUED", "ADMITTED", "ADMITTED", admitted),
        (first_start, first, "PENDING", "RUNNING", "STARTED", f"Running on {LEMON}"),
        (failed_at, first, "RUNNING", "QUEUED", fault.failure_reason,
         f"A hardware fault on the node ended attempt 1 ({fault.description}); retried from "
         f"checkpoint step {saved_step} on other nodes, not counted against max_restarts; "
         "its lost GPU-hours are credited"),
        (second_start, second, "QUEUED", "ADMITTED", "ADMITTED", admitted),
        (second_start, second, "PENDING", "RUNNING", "STARTED", f"Running on {RETRY_NODE}"),
        (finished, second, "RUNNING", "SUCCEEDED", "SUCCEEDED", "Finished successfully"),
    ):  # fmt: skip
        event = RunEvent.objects.create(
            run=run,
            attempt=attempt,
            from_state=from_state,
            to_state=to_state,
            reason=reason,
            message=message,
        )
        RunEvent.objects.filter(pk=event.pk).update(at=at)


def _quarantine(cluster: Cluster, fault: Fault) -> None:
    """What Gantry's policy did about the fault, through the node-health services at the
    history's instants: the XID 79 signal, which quarantines by default (its own row
    says so), recorded 45 s after the fault; the drain pushed to the simulator 70 s after
    it (a ``fence`` row of Gantry's)."""
    failed_at = datetime.fromtimestamp(fault.at, tz=UTC)
    node_signals_record(
        cluster=cluster, signals=[fault_signal(fault)], now=failed_at + QUARANTINED_AFTER
    )
    fenced_at = failed_at + FENCED_AFTER
    node_fences_push(cluster=cluster, now=fenced_at)
    SimulatedFence.objects.filter(cluster=cluster, node=LEMON).update(fenced_at=fenced_at)
