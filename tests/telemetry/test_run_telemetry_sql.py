"""The run telemetry page reads its aggregates in PostgreSQL's SQL: each read answers
exactly what its ORM twin (the SQLite path of the embedded mode, the query it replaced)
answers, in every time zone and at every chart resolution; a run without attempts reads
nothing."""

from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.db import connection
from django.utils import timezone

from jobs.models import AttemptState, Checkpoint
from telemetry.models import GpuMinute, SdkEvent, StepWindow
from telemetry.selectors import run_page, run_page_sql
from tests.telemetry.test_telemetry_pages import account, attempt_of, submit

T0 = datetime(2025, 3, 29, 22, 30, tzinfo=UTC)  # the night Europe moves its clocks
ZONES = (
    "UTC",
    "Asia/Kolkata",
    "America/Sao_Paulo",
    "Europe/Berlin",
    dt_timezone(-timedelta(hours=3)),
)


@pytest.fixture
def busy_run(world):
    """Two attempts with GPU minutes across a DST change (nulls, XIDs, two hosts), step
    windows, SDK checkpoint events and cluster checkpoints (one also reported by the SDK),
    and accounting for the first."""
    run = submit(world)
    first = attempt_of(world, run, state=AttemptState.FAILED, start=T0, hours=30)
    second = attempt_of(
        world, run, number=2, state=AttemptState.RUNNING, start=T0 + timedelta(hours=31)
    )
    account(first, allocated=7200, activity_weighted=3000.5, queue_s=12.25, lost=600, idle=30)
    for attempt in (first, second):
        start = attempt.started_at
        for index in range(0, 40 * 60, 37):
            for host, gpu in (("node-b", "1"), ("node-a", "0"), ("node-a", "1")):
                GpuMinute.objects.create(
                    attempt=attempt,
                    host=host,
                    gpu=gpu,
                    minute=start + timedelta(minutes=index),
                    activity=None if index % 5 == 0 else (index % 97) / 97,
                    sm_active=(index % 13) / 13,
                    tensor_active=None if index % 3 == 0 else (index % 7) / 7,
                    fb_used=1000.0 + index,
                    xid=79 if index % 11 == 0 else 0,
                )
        for seq in range(1, 60):
            StepWindow.objects.create(
                attempt=attempt,
                source="rank0",
                seq=seq,
                start=start + timedelta(minutes=seq * 29),
                end=start + timedelta(minutes=seq * 29 + 1),
                steps=seq,
                step_time_s=0.1 * seq,
                data_wait_s=seq / 7,
                comm_wait_s=seq / 11,
                checkpoint_s=seq % 3,
            )
        for step in (100, 200, 300):
            Checkpoint.objects.create(
                run=run,
                attempt=attempt,
                step=step,
                uri=f"s3://c/{attempt.number}/{step}",
                saved_at=start + timedelta(minutes=step // 10),
                save_seconds=0 if step == 200 else step / 40,
            )
        for seq, (kind, step) in enumerate(
            ((SdkEvent.Type.CHECKPOINT_SAVED, 100), (SdkEvent.Type.CHECKPOINT_RESTORED, 50)), 1
        ):
            SdkEvent.objects.create(
                attempt=attempt,
                source="rank0",
                seq=seq,
                type=kind,
                ts=start + timedelta(minutes=10, seconds=seq),
                payload={"step": step, "uri": f"s3://sdk/{step}", "seconds": 1.5 * seq},
            )
        SdkEvent.objects.create(
            attempt=attempt, source="rank0", seq=9, type=SdkEvent.Type.READY, ts=start, payload={}
        )
    return run, {first.pk: 1, second.pk: 2}


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("resolution", ["minute", "hour", "day"])
def test_series_are_the_orm_queries_answers(busy_run, zone, resolution):
    _, numbers = busy_run
    ids = list(numbers)
    with timezone.override(zone):
        series = run_page_sql.gpu_activity_series(numbers=numbers, resolution=resolution)
        assert len(series) == 6  # 3 GPUs of each attempt
        assert series == run_page_sql._gpu_activity_series_orm(numbers, resolution)
        assert run_page_sql.step_split_series(attempt_ids=ids, resolution=resolution) == (
            run_page_sql._step_split_series_orm(ids, resolution)
        )


def test_per_attempt_reads_are_the_orm_queries_answers(busy_run):
    run, numbers = busy_run
    ids = list(numbers)

    assert run_page_sql.gpu_summaries(attempt_ids=ids) == run_page_sql._gpu_summaries_orm(ids)
    assert run_page_sql.step_split_by_attempt(attempt_ids=ids) == (
        run_page_sql._step_split_by_attempt_orm(ids)
    )
    assert run_page_sql.run_checkpoint_marks(run_id=run.pk, numbers=numbers) == (
        run_page_sql._run_checkpoint_marks_orm(run.pk, numbers)
    )
    assert run_page_sql.accounting_by_attempt(attempt_ids=ids) == (
        run_page_sql._accounting_by_attempt_orm(ids)
    )
    assert len(run_page_sql.accounting_by_attempt(attempt_ids=ids)) == 1


def test_the_sql_and_its_twins_are_compared_on_postgresql():
    # Elsewhere each read would call its twin, and the comparisons above could not fail
    assert connection.vendor == "postgresql"


TWINS = {
    "accounting_by_attempt": "_accounting_by_attempt_orm",
    "gpu_summaries": "_gpu_summaries_orm",
    "gpu_activity_series": "_gpu_activity_series_orm",
    "step_split_by_attempt": "_step_split_by_attempt_orm",
    "step_split_series": "_step_split_series_orm",
    "run_checkpoint_marks": "_run_checkpoint_marks_orm",
}
CALLS = {
    "accounting_by_attempt": ({"attempt_ids": [7, 8]}, ([7, 8],)),
    "gpu_summaries": ({"attempt_ids": [7, 8]}, ([7, 8],)),
    "gpu_activity_series": ({"numbers": {7: 1}, "resolution": "hour"}, ({7: 1}, "hour")),
    "step_split_by_attempt": ({"attempt_ids": [7]}, ([7],)),
    "step_split_series": ({"attempt_ids": [7], "resolution": "day"}, ([7], "day")),
    "run_checkpoint_marks": ({"run_id": 3, "numbers": {7: 1}}, (3, {7: 1})),
}


@pytest.mark.parametrize("read", sorted(TWINS))
def test_off_postgresql_each_read_answers_through_its_own_twin(read, monkeypatch):
    """The pairs compared above are the pairs the embedded mode switches between."""
    asked = []
    for name, twin in TWINS.items():
        monkeypatch.setattr(
            run_page_sql, twin, lambda *args, name=name: asked.append((name, args)) or name
        )
    monkeypatch.setattr(connection, "vendor", "sqlite")
    keywords, positional = CALLS[read]

    answer = getattr(run_page_sql, read)(**keywords)

    assert (answer, asked) == (read, [(read, positional)])


@pytest.mark.django_db
def test_the_reads_of_no_attempt_are_empty_both_ways():
    assert run_page_sql.gpu_summaries(attempt_ids=[]) == run_page_sql._gpu_summaries_orm([]) == []
    assert run_page_sql.accounting_by_attempt(attempt_ids=[]) == {}
    assert run_page_sql._accounting_by_attempt_orm([]) == {}
    assert run_page_sql.step_split_by_attempt(attempt_ids=[]) == {}
    assert run_page_sql._step_split_by_attempt_orm([]) == {}


def test_a_run_without_attempts_reads_no_telemetry(world, django_assert_num_queries):
    run = submit(world)

    with django_assert_num_queries(0):
        telemetry = run_page.run_telemetry(run=run, attempts=[], now=timezone.now())

    assert telemetry == run_page.RunTelemetry(
        attempts=[], resolution="minute", gpu_series=[], step_series=[], checkpoints=[]
    )
