"""SDK events endpoint, simulator telemetry and per-attempt accounting, through the DB."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import SimulatedJob
from clusters.simulation import Workload
from jobs.models import ENDED_ATTEMPT_STATES, Attempt, AttemptState, Checkpoint, Run
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit, attempt_token_issue
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_submit
from telemetry import collection, services, tasks
from telemetry.accounting import WASTE, AttemptTimeline, Outcome, account
from telemetry.accounting import StepWindow as AccountingWindow
from telemetry.models import AttemptAccounting, GpuMinute, SdkEvent, StepWindow
from telemetry.selectors.finished_attempts import attempts_pending_accounting
from telemetry.services import AttemptClosed, sdk_events_ingest
from telemetry.simulated import SIGNALS, simulated_telemetry
from tests.conftest import experiment_input

URL = "/api/v1/attempts/events/"
TS = 1_780_000_000.0
SOURCE = "3f0c9a1e5b7d4c2a9e8f6b1d2c3a4e5f"


def submit(world, **overrides):
    return run_submit(user=world.researcher_a, data=experiment_input(world, **overrides))


def admitted_attempt(world, **overrides) -> Attempt:
    run = submit(world, **overrides)
    admission_run_cycle()
    return run.attempts.get()


def client_for(attempt: Attempt) -> APIClient:
    client = APIClient()
    token = attempt_token_issue(attempt=attempt)
    client.credentials(HTTP_AUTHORIZATION="Attempt " + token)
    return client


def post(client: APIClient, body, **extra):
    return client.post(URL, json.dumps(body), content_type="application/json", **extra)


def batch(*events, source=SOURCE) -> dict:
    return {
        "source": source,
        "sdk": "gantry-sdk/0.1.0",
        "dropped": 0,
        "rank": 0,
        "events": list(events),
    }


READY = {"type": "ready", "seq": 1, "ts": TS}
WINDOW = {
    "type": "step_window",
    "seq": 2,
    "ts": TS + 30,
    "start": TS,
    "end": TS + 30,
    "steps": 36,
    "step_time_s": 0.8,
    "data_wait_s": 6.0,
    "comm_wait_s": 2.5,
    "checkpoint_s": 0.0,
    "step": 1036,
    "some_future_field": "ignored",
}
SAVED = {
    "type": "checkpoint_saved",
    "seq": 3,
    "ts": TS + 40,
    "step": 1036,
    "uri": "s3://b/c",
    "seconds": 12.5,
}
RESTORED = {
    "type": "checkpoint_restored",
    "seq": 4,
    "ts": TS - 5,
    "step": 1000,
    "uri": "s3://b/a",
    "seconds": 3.1,
}
UNKNOWN = {"type": "profiler_trace", "seq": 5, "ts": TS}
MALFORMED = {
    "type": "step_window",
    "seq": 6,
    "ts": TS,
    "start": TS + 10,
    "end": TS,
    "steps": 1,
    "step_time_s": 1,
}


# --- the endpoint -----------------------------------------------------------------------------


def test_batch_is_stored_with_exact_counts_and_a_resend_is_all_duplicates(world):
    attempt = admitted_attempt(world)
    client = client_for(attempt)
    body = batch(READY, WINDOW, SAVED, RESTORED, UNKNOWN, MALFORMED)

    first = post(client, body)
    again = post(client, body)

    assert first.status_code == 202
    assert first.json() == {
        "accepted": 4,
        "duplicates": 0,
        "rejected": 2,
        "refused": {},
        "messages": [],
    }
    assert again.status_code == 202
    assert again.json() == {
        "accepted": 0,
        "duplicates": 4,
        "rejected": 2,
        "refused": {},
        "messages": [],
    }
    window = StepWindow.objects.get(attempt=attempt)
    assert (window.source, window.seq, window.steps, window.step) == (SOURCE, 2, 36, 1036)
    assert (window.data_wait_s, window.comm_wait_s, window.step_time_s) == (6.0, 2.5, 0.8)
    assert (window.end - window.start) == timedelta(seconds=30)
    assert list(
        SdkEvent.objects.filter(attempt=attempt)
        .order_by("seq")
        .values_list("seq", "type", "payload")
    ) == [
        (1, "ready", {}),
        (3, "checkpoint_saved", {"step": 1036, "uri": "s3://b/c", "seconds": 12.5}),
        (4, "checkpoint_restored", {"step": 1000, "uri": "s3://b/a", "seconds": 3.1}),
    ]


def test_same_seq_from_another_source_is_a_new_event_and_repeats_in_a_batch_count_once(world):
    attempt = admitted_attempt(world)
    client = client_for(attempt)
    post(client, batch(READY))

    response = post(client, batch(READY, READY, source="forked-worker"))

    assert response.json() == {
        "accepted": 1,
        "duplicates": 1,
        "rejected": 0,
        "refused": {},
        "messages": [],
    }
    assert SdkEvent.objects.filter(attempt=attempt).count() == 2


@pytest.mark.parametrize(
    "event",
    [
        {**WINDOW, "steps": -1},
        {**WINDOW, "steps": True},
        {**WINDOW, "data_wait_s": -0.5},
        {**WINDOW, "step": 1.5},
        {k: v for k, v in WINDOW.items() if k != "step_time_s"},
        {**WINDOW, "seq": 0},
        {**WINDOW, "ts": "yesterday"},
        {**WINDOW, "ts": 1e300},
        {**SAVED, "uri": ""},
        {**SAVED, "uri": "s3://" + "x" * 2048},
        {**SAVED, "seconds": None},
        {**SAVED, "uri": "s3://b/\x00"},
        "not an object",
    ],
)
def test_malformed_event_is_rejected_and_stores_nothing(world, event):
    attempt = admitted_attempt(world)

    response = post(client_for(attempt), batch(event))

    assert response.json() == {
        "accepted": 0,
        "duplicates": 0,
        "rejected": 1,
        "refused": {},
        "messages": [],
    }
    assert not StepWindow.objects.exists() and not SdkEvent.objects.exists()


def test_wrong_or_missing_token_is_401_and_stores_nothing(world):
    attempt = admitted_attempt(world)
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION=f"Attempt gat_{attempt.pk}.not-the-signature")

    assert forged.post(URL, batch(READY), format="json").status_code == 401
    assert APIClient().post(URL, batch(READY), format="json").status_code == 401
    assert not SdkEvent.objects.exists()


def test_token_of_one_attempt_writes_only_that_attempt(world):
    mine = admitted_attempt(world)
    other = admitted_attempt(world, name="other-run")
    mine_mac = attempt_token_issue(attempt=mine).split(".", 1)[1]
    spliced = APIClient()
    spliced.credentials(HTTP_AUTHORIZATION=f"Attempt gat_{other.pk}.{mine_mac}")

    assert post(client_for(mine), batch(READY)).status_code == 202
    assert post(spliced, batch(READY)).status_code == 401
    assert list(SdkEvent.objects.values_list("attempt_id", flat=True)) == [mine.pk]


def test_limits_and_malformed_bodies(world):
    attempt = admitted_attempt(world)
    client = client_for(attempt)
    too_many = batch(*({**READY, "seq": n} for n in range(1, 502)))
    padded = batch({**SAVED, "uri": "s3://b/" + "x" * 2000})
    padded["sdk"] = "x" * (257 * 1024)

    assert post(client, too_many).status_code == 400
    assert post(client, padded).status_code == 413
    assert client.post(URL, "{not json", content_type="application/json").status_code == 400
    assert (
        client.post(
            URL, '{"source": "s", "events": [{"seq": NaN}]}', content_type="application/json"
        ).status_code
        == 400
    )
    assert post(client, {"source": "", "events": [READY]}).status_code == 400
    assert post(client, {"source": "s", "events": []}).status_code == 400
    assert post(client, [READY]).status_code == 400
    assert (
        post(client, batch(*({**READY, "seq": n} for n in range(1, 501)))).json()["accepted"] == 500
    )
    assert SdkEvent.objects.count() == 500


@pytest.mark.parametrize("state", ENDED_ATTEMPT_STATES)
def test_events_of_an_ended_attempt_are_refused_with_the_reason_and_store_nothing(world, state):
    # Given a job's client, and its attempt ended the instant after its last batch
    attempt = admitted_attempt(world)
    client = client_for(attempt)
    assert post(client, batch(READY)).status_code == 202
    Attempt.objects.filter(pk=attempt.pk).update(state=state, finished_at=timezone.now())

    # When it posts a checkpoint at a step far ahead
    response = post(client, batch({**SAVED, "seq": 2, "step": 999_999}))

    # Then the token is dead, and neither the event nor the checkpoint is stored
    assert response.status_code == 401
    label = AttemptState(state).label.lower()
    assert response.json() == {
        "detail": f"Attempt 1 of run {attempt.run_id} has ended ({label}): its token is no "
        "longer valid."
    }
    assert SdkEvent.objects.count() == 1
    assert not Checkpoint.objects.exists()


def test_a_batch_that_races_the_end_of_its_attempt_is_refused_whole(world):
    # Given an attempt that ended after its token was checked (the service sees the end)
    attempt = admitted_attempt(world)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.PREEMPTED, finished_at=timezone.now()
    )

    # When the batch reaches the service, then nothing is stored
    with pytest.raises(AttemptClosed, match=r"^Attempt 1 of run \d+ has ended \(preempted\)"):
        sdk_events_ingest(attempt=attempt, source=SOURCE, events=[SAVED])
    assert not SdkEvent.objects.exists()
    assert not Checkpoint.objects.exists()


# --- accounting from SDK data -----------------------------------------------------------------


def finished_attempt_with_sdk_data(world) -> Attempt:
    attempt = admitted_attempt(world)
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=30)
    Run.objects.filter(pk=attempt.run_id).update(submitted_at=start - timedelta(seconds=90))
    t0 = start.timestamp()
    windows = [
        {
            "type": "step_window",
            "seq": n + 1,
            "ts": t0 + 60 + (n + 1) * 100,
            "start": t0 + 60 + n * 100,
            "end": t0 + 60 + (n + 1) * 100,
            "steps": 100,
            "step_time_s": 1.0,
            "data_wait_s": 10.0,
            "comm_wait_s": 5.0,
        }
        for n in range(5)
    ]
    saved = {
        "type": "checkpoint_saved",
        "seq": 6,
        "ts": t0 + 570,
        "step": 500,
        "uri": "s3://c",
        "seconds": 10,
    }
    # Sent while it runs (an ended attempt's token is dead), then it ends.
    assert post(client_for(attempt), batch(*windows, saved)).json()["accepted"] == 6
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.SUCCEEDED, started_at=start, finished_at=start + timedelta(seconds=600)
    )
    return attempt


def test_accounting_splits_sdk_windows_and_recomputing_gives_identical_rows(world):
    attempt = finished_attempt_with_sdk_data(world)

    first = services.accounting_compute(attempt=attempt)
    values = {
        f: getattr(first, f)
        for f in ("allocated_gpu_s", "effective_gpu_s", *(f"{w}_gpu_s" for w in WASTE))
    }
    second = services.accounting_compute(attempt=attempt)

    # 2 GPUs x 600 s: startup 60 s; five 100 s windows, 10 % of each waiting for data and
    # 5 % on communication; then 10 s blocked saving a checkpoint and 30 s of other work.
    assert values == {
        "allocated_gpu_s": 1200,
        "startup_gpu_s": 120,
        "checkpoint_gpu_s": 20,
        "interactive_idle_gpu_s": 0,
        "lost_gpu_s": 0,
        "idle_gpu_s": 0,
        "input_wait_gpu_s": 100,
        "comm_wait_gpu_s": 50,
        "effective_gpu_s": 910,
    }
    assert {f: getattr(second, f) for f in values} == values
    assert AttemptAccounting.objects.count() == 1
    assert second.queue_s == 90.0


def test_pending_accounting_picks_new_attempts_and_new_data_only(world):
    attempt = finished_attempt_with_sdk_data(world)
    assert list(attempts_pending_accounting(limit=10)) == [attempt]

    assert services.accounting_compute_pending(limit=10) == 1
    assert list(attempts_pending_accounting(limit=10)) == []
    attempt.refresh_from_db()

    # A window collected after the end (the simulator's collector writes a finished job's
    # last ones; the SDK cannot: the attempt's token died with it).
    end = attempt.finished_at
    StepWindow.objects.create(
        attempt=attempt, source="simulator", seq=1, start=end, end=end, steps=1, step_time_s=1.0
    )
    assert list(attempts_pending_accounting(limit=10)) == [attempt]


# --- golden scenarios through the simulator ---------------------------------------------------


def age_running_jobs(seconds: float) -> None:
    """Move the virtual clock: running jobs and their attempts started ``seconds`` earlier."""
    for job in SimulatedJob.objects.filter(state="RUNNING"):
        job.started_at -= timedelta(seconds=seconds)
        job.save(update_fields=["started_at"])
        attempt = Attempt.objects.get(backend_job_id=str(job.pk), cluster=job.cluster)
        attempt.started_at -= timedelta(seconds=seconds)
        attempt.save(update_fields=["started_at"])


def run_attempt_to_the_end(world, attempt: Attempt) -> None:
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)  # placed: running
    age_running_jobs(3 * 3600)
    cluster_sync(cluster=world.cluster)  # finished as the profile says


def simulate(world, profile: str, *, max_restarts: int = 0, **env) -> list[Attempt]:
    """Run a job of ``profile`` at real-time speed, collect its telemetry and account it."""
    world.cluster.settings["speedup"] = 1
    world.cluster.save(update_fields=["settings"])
    run = submit(
        world,
        env={"GANTRY_SIM_PROFILE": profile, "GANTRY_SIM_DURATION_S": "1200", **env},
        max_restarts=max_restarts,
    )
    while True:
        admission_run_cycle()
        attempt = run.attempts.filter(state=AttemptState.CREATED).first()
        if attempt is None:
            break
        run_attempt_to_the_end(world, attempt)
    collection.telemetry_collect(cluster=world.cluster)
    services.accounting_compute_pending(limit=100)
    attempts = list(run.attempts.select_related("accounting").order_by("number"))
    for attempt in attempts:
        row = attempt.accounting
        assert row.effective_gpu_s + row.waste_gpu_s == row.allocated_gpu_s
    return attempts


def largest_waste(row: AttemptAccounting) -> str:
    return max(WASTE, key=lambda name: getattr(row, f"{name}_gpu_s"))


def test_input_bound_job_wastes_most_on_input(world):
    (attempt,) = simulate(world, "input-bound")
    row = attempt.accounting
    assert attempt.state == AttemptState.SUCCEEDED
    assert row.allocated_gpu_s == 2 * 1230  # 30 s startup + 1200 s of work on 2 GPUs
    assert largest_waste(row) == "input_wait"
    assert row.input_wait_gpu_s == 2 * 1200 * 60 // 100


def test_idle_notebook_like_job_is_all_idle(world):
    (attempt,) = simulate(world, "idle")
    row = attempt.accounting
    assert largest_waste(row) == "idle"
    assert (row.idle_gpu_s, row.effective_gpu_s) == (row.allocated_gpu_s, 0)


def test_comm_bound_job_wastes_most_on_communication(world):
    (attempt,) = simulate(world, "comm-bound")
    assert largest_waste(attempt.accounting) == "comm_wait"


def test_healthy_compute_bound_job_has_goodput_above_90_percent(world):
    (attempt,) = simulate(world, "compute-bound")
    row = attempt.accounting
    assert row.effective_gpu_s / row.allocated_gpu_s > 0.90
    assert (row.lost_gpu_s, row.idle_gpu_s, row.startup_gpu_s) == (0, 0, 2 * 30)
    assert row.activity_weighted_gpu_s == pytest.approx(2 * 1200 * 0.92, rel=0.01)


def test_crash_after_the_last_checkpoint_loses_the_work_since_it(world):
    first, second = simulate(world, "crash", max_restarts=1)

    # Both attempts crash at step 720 (60 % of 1200). The first saved steps 300 and 600
    # (at 330 s and 630 s) and ended at 750 s; the second resumed from step 600.
    assert second.resumed_from.attempt_id == first.pk
    assert second.resumed_from.step == 600
    assert (first.state, second.state) == (AttemptState.FAILED, AttemptState.FAILED)
    assert first.accounting.allocated_gpu_s == 2 * 750
    assert first.accounting.lost_gpu_s == 2 * (750 - 630)
    # Nothing resumed from the second: all its work after startup is lost.
    assert second.accounting.allocated_gpu_s == 2 * 150
    assert (second.accounting.startup_gpu_s, second.accounting.lost_gpu_s) == (60, 240)


def test_collecting_twice_writes_the_same_rows(world):
    (attempt,) = simulate(world, "compute-bound")
    windows = list(StepWindow.objects.order_by("seq").values_list("seq", "start", "end", "steps"))
    minutes = list(
        GpuMinute.objects.order_by("host", "gpu", "minute").values_list("gpu", "minute", "activity")
    )

    collection.telemetry_collect(cluster=world.cluster)
    services.accounting_compute(attempt=attempt)

    assert len(windows) == 20
    assert (
        list(StepWindow.objects.order_by("seq").values_list("seq", "start", "end", "steps"))
        == windows
    )
    assert (
        list(
            GpuMinute.objects.order_by("host", "gpu", "minute").values_list(
                "gpu", "minute", "activity"
            )
        )
        == minutes
    )
    attempt.accounting.refresh_from_db()
    assert attempt.accounting.effective_gpu_s == AttemptAccounting.objects.get().effective_gpu_s


def test_running_job_reports_only_complete_windows(world):
    world.cluster.settings["speedup"] = 1
    world.cluster.save(update_fields=["settings"])
    run = submit(
        world, env={"GANTRY_SIM_PROFILE": "compute-bound", "GANTRY_SIM_DURATION_S": "1200"}
    )
    admission_run_cycle()
    attempt = run.attempts.get()
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    age_running_jobs(30 + 150)  # startup, two full windows and half of the third

    collection.telemetry_collect(cluster=world.cluster)

    assert list(StepWindow.objects.values_list("seq", "steps", "step")) == [
        (1, 60, 60),
        (2, 60, 120),
    ]
    assert GpuMinute.objects.filter(attempt=attempt).count() >= 2 * 3
    assert list(attempts_pending_accounting(limit=10)) == []


@pytest.mark.parametrize("offset_s", range(0, 60, 7))
@pytest.mark.parametrize("profile", ["input-bound", "compute-bound", "comm-bound"])
def test_simulated_profiles_account_the_same_wherever_the_job_starts_in_a_minute(profile, offset_s):
    started = datetime(2026, 3, 1, 12, 0, offset_s, tzinfo=UTC)
    workload = Workload(profile=profile, duration_s=1200)
    telemetry = simulated_telemetry(
        workload,
        started_at=started,
        until=started + timedelta(seconds=1230),
        finished=True,
        speedup=1,
        gpus=[("node-0", "0"), ("node-0", "1")],
    )
    t0 = started.timestamp()
    result = account(
        AttemptTimeline(
            gpus=2,
            start=t0,
            end=t0 + 1230,
            outcome=Outcome.SUCCEEDED,
            step_windows=[
                AccountingWindow(
                    start=w.start.timestamp(),
                    end=w.end.timestamp(),
                    steps=w.steps,
                    step_time_s=w.step_time_s,
                    data_wait_s=w.data_wait_s,
                    comm_wait_s=w.comm_wait_s,
                )
                for w in telemetry.windows
            ],
            activity={
                f"{m.host}/{m.gpu}": {
                    int(n.minute.timestamp()): n.activity
                    for n in telemetry.minutes
                    if (n.host, n.gpu) == (m.host, m.gpu)
                }
                for m in telemetry.minutes
            },
        )
    )
    signals = SIGNALS[profile]
    assert (result.idle, result.startup, result.lost) == (0, 60, 0)
    assert float(result.input_wait) == pytest.approx(2 * 1200 * signals.data_share)
    assert float(result.comm_wait) == pytest.approx(2 * 1200 * signals.comm_share)


def test_tasks_collect_and_account_a_simulator_cluster(world):
    world.cluster.settings["speedup"] = 1
    world.cluster.save(update_fields=["settings"])
    run = submit(world, env={"GANTRY_SIM_PROFILE": "compute-bound", "GANTRY_SIM_DURATION_S": "120"})
    admission_run_cycle()
    run_attempt_to_the_end(world, run.attempts.get())

    tasks.telemetry_collect(world.cluster.pk)
    tasks.accounting_compute_pending()
    tasks.accounting_compute_pending()  # redelivered: nothing left to do

    row = AttemptAccounting.objects.get()
    assert (row.allocated_gpu_s, row.startup_gpu_s) == (2 * 150, 2 * 30)
    assert StepWindow.objects.count() == 2
