"""The demo's past: queued runs turned into runs that ran before the seed, with their
attempts, events, checkpoints, usage and the telemetry a simulator profile would have
reported (portal/demo.py tells the story; this writes it into the records)."""

from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils import timezone

from clusters.models import Cluster
from clusters.simulation import (
    STARTUP_S,
    Workload,
    gang_gpus,
    gang_lockstep,
    sim_layout,
    work_wall_s,
)
from jobs.models import Attempt, AttemptState, Checkpoint, Experiment, Run, RunEvent, RunState
from jobs.services.usage import usage_record_attempt
from telemetry.exposition.node_links import NodeLinkRollups
from telemetry.models import GpuMinute, NodeLinkMinute
from telemetry.simulated import (
    GAUGES_PER_SCRAPE,
    SimulatedMinute,
    max_sm_clock_mhz,
    node_link_samples,
    simulated_telemetry,
)
from telemetry.simulator_source import simulated_rank_windows_store, simulated_windows_store


def history_record_preempted(*, run: Run, cluster: Cluster, submitted) -> None:
    """A run that borrowed GPUs, was preempted, and resumed from its checkpoint."""
    first_start = submitted + timedelta(minutes=3)
    preempted_at = first_start + timedelta(hours=2, minutes=10)
    second_start = preempted_at + timedelta(minutes=40)
    finished = second_start + timedelta(hours=1, minutes=5)
    first = Attempt.objects.create(
        run=run,
        number=1,
        cluster=cluster,
        state=AttemptState.PREEMPTED,
        backend_job_id=f"history-{run.pk}-1",
        submitted_at=first_start,
        started_at=first_start,
        finished_at=preempted_at,
        failure_reason="PREEMPTED",
        node_list=[f"{cluster.name}-a100-80gb-03"],
    )
    checkpoint = Checkpoint.objects.create(
        run=run,
        attempt=first,
        step=7200,
        uri=f"s3://checkpoints/nlp/colbert-distill/{first.name}/step-7200",
        saved_at=first_start + timedelta(hours=2),
        save_seconds=14.0,
    )
    second = Attempt.objects.create(
        run=run,
        number=2,
        cluster=cluster,
        state=AttemptState.SUCCEEDED,
        backend_job_id=f"history-{run.pk}-2",
        submitted_at=second_start,
        started_at=second_start,
        finished_at=finished,
        exit_code=0,
        node_list=[f"{cluster.name}-a100-80gb-02"],
        resumed_from=checkpoint,
    )
    for attempt, start, end in (
        (first, first_start, preempted_at),
        (second, second_start, finished),
    ):
        usage_record_attempt(attempt=attempt, started=start, finished=end)
    history_telemetry_record(attempt=first, profile="compute-bound")
    history_telemetry_record(attempt=second, profile="compute-bound", resume_step=checkpoint.step)
    Run.objects.filter(pk=run.pk).update(
        state=RunState.SUCCEEDED,
        cluster=cluster,
        submitted_at=submitted,
        admitted_at=second_start,
        started_at=first_start,
        finished_at=finished,
        borrowed=True,
    )
    date_the_records(
        run=run, submitted=submitted, attempts={first: first_start, second: second_start}
    )
    for at, attempt, from_state, to_state, reason, message in (
        (first_start, first, "QUEUED", "ADMITTED", "ADMITTED",
         "Admitted to sim-east: 8 a100-80gb GPUs borrowing idle GPUs (preemptible)"),
        (first_start, first, "PENDING", "RUNNING", "STARTED", "Running on sim-east-a100-80gb-03"),
        (preempted_at, first, "RUNNING", "PREEMPTED", "PREEMPTED",
         "a tenant within its guarantee reclaimed 8 a100-80gb GPUs on sim-east; this run had "
         "borrowed 8"),
        (preempted_at, first, "PREEMPTED", "QUEUED", "REQUEUED",
         "Back in the queue after preemption; it will resume from checkpoint step 7200"),
        (second_start, second, "QUEUED", "ADMITTED", "ADMITTED",
         "Admitted to sim-east: 8 a100-80gb GPUs borrowing idle GPUs (preemptible)"),
        (second_start, second, "PENDING", "RUNNING", "STARTED", "Running on sim-east-a100-80gb-02"),
        (finished, second, "RUNNING", "SUCCEEDED", "SUCCEEDED", "Finished successfully"),
    ):  # fmt: skip
        event = RunEvent.objects.create(
            run=run,
            attempt=attempt,
            from_state=from_state,
            to_state=to_state,
            reason=reason,
            message=message,
            # Who reclaimed the GPUs, as admission records it: for platform admins only.
            admin_detail=(
                "tenant vision reclaimed 8 a100-80gb GPUs of its guarantee on sim-east; this run "
                "had borrowed 8"
                if reason == "PREEMPTED"
                else ""
            ),
        )
        RunEvent.objects.filter(pk=event.pk).update(at=at)


def history_telemetry_record(*, attempt: Attempt, profile: str, resume_step: int = 0) -> None:
    """The step windows and GPU minutes a job of ``profile`` would have reported over the
    attempt (the collector's output, written directly: this history never ran)."""
    gpus = [(node, str(gpu)) for node in attempt.node_list for gpu in range(attempt.run.gpus)]
    assert attempt.started_at is not None and attempt.finished_at is not None  # a past attempt
    seconds = (attempt.finished_at - attempt.started_at).total_seconds()
    telemetry = simulated_telemetry(
        Workload(profile=profile, duration_s=int(seconds) - STARTUP_S, resume_step=resume_step),
        started_at=attempt.started_at,
        until=attempt.finished_at,
        finished=True,
        speedup=1,
        gpus=gpus,
    )
    simulated_windows_store(attempt_id=attempt.pk, source="demo", windows=telemetry.windows)
    _gpu_minutes_insert(attempt=attempt, minutes=telemetry.minutes)


def history_record_gang(
    *, run: Run, cluster: Cluster, submitted: datetime, nodes: list[str]
) -> Attempt:
    """``run`` ran on every GPU of ``nodes`` as its experiment's env says (its profile, its
    work, a straggler in its gang: clusters/sim_stragglers.py), for as long as that work
    takes at the pace its gang's lockstep sets, and succeeded; with the telemetry it would
    have reported: step windows, every rank's windows, the GPUs' minutes with their clocks
    and NVLink, and its nodes' InfiniBand minutes (the collector's output, written
    directly: this history never ran)."""
    allocation = {node: list(range(run.experiment.gpus_per_node)) for node in nodes}
    paths = {node.name: node.path for node in sim_layout(cluster.name, cluster.settings).nodes}
    workload = Workload.from_env({str(k): str(v) for k, v in run.experiment.env.items()})
    pace = gang_lockstep(workload, allocation, paths).pace
    attempt = history_record(
        run=run,
        cluster=cluster,
        state=RunState.SUCCEEDED,
        exit_code=0,
        submitted=submitted,
        hours=work_wall_s(workload, speedup=pace) / 3600,
        nodes=nodes,
    )
    assert attempt.started_at is not None and attempt.finished_at is not None  # a past attempt
    started, finished = attempt.started_at, attempt.finished_at
    telemetry = simulated_telemetry(
        workload,
        started_at=started,
        until=finished,
        finished=True,
        speedup=pace,
        gpus=[(node, str(gpu)) for node, gpu in gang_gpus(allocation)],
        paths=paths,
        max_clock_mhz=max_sm_clock_mhz(run.flavor.slug),
    )
    simulated_windows_store(attempt_id=attempt.pk, source="demo", windows=telemetry.windows)
    simulated_rank_windows_store(attempt_id=attempt.pk, windows=telemetry.rank_windows)
    _gpu_minutes_insert(attempt=attempt, minutes=telemetry.minutes)
    first = started.replace(second=0, microsecond=0)
    end = finished + timedelta(minutes=2)  # the counters' reads just after the end, too
    links = NodeLinkRollups(start_ms=_ms(first), end_ms=_ms(end))
    links.add(node_link_samples(telemetry.links, since=started, until=end))
    NodeLinkMinute.objects.bulk_create(
        [
            NodeLinkMinute(
                cluster=cluster,
                host=row.host,
                minute=datetime.fromtimestamp(row.minute, tz=UTC),
                ib_bytes_s=row.ib_bytes_s,
                ib_errors=row.ib_errors,
                ports=row.ports,
                samples=row.samples,
            )
            for row in links.rows()
        ]
    )
    return attempt


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


# The columns of GpuMinute, in the order _gpu_minutes_insert gives their values.
GPU_MINUTE_COLUMNS = (
    "attempt", "host", "gpu", "minute", "activity", "sm_active", "tensor_active", "dram_active",
    "fb_used", "power", "xid", "samples", "sm_clock_mhz", "max_sm_clock_mhz", "nvlink_bytes_s",
    "updated_at",
)  # fmt: skip


def _gpu_minutes_insert(*, attempt: Attempt, minutes: list[SimulatedMinute]) -> None:
    """The rows ``GpuMinute.objects.bulk_create`` would insert (the simulator's gauges at
    each scrape, as the collector keeps them), in one executemany: 0.2 s of CPU for the
    history's ~23,000 minutes when measured, 1.3 s (a third of the seed) through the ORM,
    which builds and prepares each row."""
    fields = GpuMinute._meta.concrete_fields
    column_of = {field.name: field.column for field in fields if field.column is not None}
    adapt = connection.ops.adapt_datetimefield_value
    updated_at = adapt(timezone.now())
    rows = [
        (
            attempt.pk, minute.host, minute.gpu, adapt(minute.minute), minute.activity,
            minute.sm_active, minute.tensor_active, None, None, None, 0,
            GAUGES_PER_SCRAPE * minute.samples, minute.sm_clock_mhz, minute.max_sm_clock_mhz,
            minute.nvlink_bytes_s, updated_at,
        )
        for minute in minutes
    ]  # fmt: skip
    quote = connection.ops.quote_name
    columns = ", ".join(quote(column_of[name]) for name in GPU_MINUTE_COLUMNS)
    placeholders = ", ".join(["%s"] * len(GPU_MINUTE_COLUMNS))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {quote(GpuMinute._meta.db_table)} ({columns}) VALUES ({placeholders})",  # noqa: S608 - our own names
            rows,
        )


def history_record(
    *,
    run: Run,
    cluster: Cluster,
    state: str,
    exit_code: int,
    submitted,
    hours: float,
    nodes: list[str] | None = None,
) -> Attempt:
    """Turn a freshly queued run into one that ran in the past for ``hours`` (demo history
    only), on ``nodes`` or one of the first nodes of its flavor's pool."""
    admitted = submitted + timedelta(minutes=4)
    started = admitted + timedelta(minutes=2)
    finished = started + timedelta(hours=hours)
    failed = state == RunState.FAILED
    # One of the first nodes of the flavor's pool (the H100 pool has two).
    pool_nodes = 4 if run.flavor.slug == "a100-80gb" else 2
    attempt = Attempt.objects.create(
        run=run,
        number=1,
        cluster=cluster,
        state=AttemptState.FAILED if failed else AttemptState.SUCCEEDED,
        backend_job_id=f"history-{run.pk}",
        submitted_at=admitted,
        started_at=started,
        finished_at=finished,
        exit_code=exit_code,
        failure_reason="USER_EXIT" if failed else "",
        failure_message="Traceback: loss became NaN at step 41200" if failed else "",
        node_list=nodes or [f"{cluster.name}-{run.flavor.slug}-0{run.pk % pool_nodes}"],
    )
    Run.objects.filter(pk=run.pk).update(
        state=state,
        cluster=cluster,
        submitted_at=submitted,
        admitted_at=admitted,
        started_at=started,
        finished_at=finished,
        failure_reason="USER_EXIT" if failed else "",
    )
    usage_record_attempt(attempt=attempt, started=started, finished=finished)
    date_the_records(run=run, submitted=submitted, attempts={attempt: admitted})
    for at, from_state, to_state, reason in (
        (admitted, RunState.QUEUED, RunState.ADMITTED, "ADMITTED"),
        (started, RunState.PENDING, RunState.RUNNING, "STARTED"),
        (finished, RunState.RUNNING, state, "USER_EXIT" if failed else "SUCCEEDED"),
    ):
        event = RunEvent.objects.create(
            run=run, attempt=attempt, from_state=from_state, to_state=to_state, reason=reason
        )
        RunEvent.objects.filter(pk=event.pk).update(at=at)
    return attempt


def date_the_records(*, run: Run, submitted: datetime, attempts: dict[Attempt, datetime]) -> None:
    """A history run's own records carry its dates, not the seed's: the experiment was
    created and the run submitted at ``submitted``, each attempt created when admitted."""
    Experiment.objects.filter(pk=run.experiment_id).update(created_at=submitted)
    RunEvent.objects.filter(run=run).update(at=submitted)
    for attempt, created in attempts.items():
        Attempt.objects.filter(pk=attempt.pk).update(created_at=created)
