"""Checkpoints the job-side SDK reports become the run's checkpoints: a requeued run
resumes from them, and the accounting counts each save once."""

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.backends import CheckpointReport
from jobs.models import Attempt, AttemptState, Checkpoint, Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit, attempt_token_issue
from jobs.services.backend_sync import attempt_cancel, checkpoints_record
from jobs.services.lifecycle import run_preempt
from telemetry import services
from telemetry.selectors.timeline import attempt_timeline
from tests.jobs.test_lifecycle import run_to_running, submit

URL = "/api/v1/attempts/events/"
SOURCE = "rank0-6b1d2c3a"
NO_SIMULATED_CHECKPOINTS = {"GANTRY_SIM_DURATION_S": "100000", "GANTRY_SIM_CHECKPOINT_EVERY_S": "0"}


def post_events(attempt: Attempt, *events, source: str = SOURCE) -> dict:
    client = APIClient()
    token = attempt_token_issue(attempt=attempt)
    client.credentials(HTTP_AUTHORIZATION="Attempt " + token)
    body = {"source": source, "sdk": "gantry-sdk/0.1.0", "events": list(events)}
    response = client.post(URL, json.dumps(body), content_type="application/json")
    assert response.status_code == 202
    return response.json()


def saved(seq: int, step: int, ts: float, *, uri: str | None = None, seconds=12.5) -> dict:
    return {
        "type": "checkpoint_saved",
        "seq": seq,
        "ts": ts,
        "step": step,
        "uri": uri or f"s3://ckpt/vision/run/step-{step}",
        "seconds": seconds,
    }


def checkpoints(run: Run) -> list[tuple]:
    return list(
        Checkpoint.objects.filter(run=run)
        .order_by("step")
        .values_list("attempt__number", "step", "uri", "saved_at", "save_seconds")
    )


def running_attempt(world) -> Attempt:
    run = submit(world, env=NO_SIMULATED_CHECKPOINTS)
    run_to_running(world, run)
    attempt = run.attempts.get()
    assert attempt.state == AttemptState.RUNNING
    return attempt


def test_saved_checkpoints_from_the_sdk_are_recorded_once(world):
    attempt = running_attempt(world)
    t0 = timezone.now().replace(microsecond=0).timestamp()
    restored = {**saved(3, 500, t0 + 5), "type": "checkpoint_restored"}
    batch = [saved(1, 1000, t0 + 60), saved(2, 2000, t0 + 120.25, seconds=3), restored]

    first = post_events(attempt, *batch)
    again = post_events(attempt, *batch)
    other_rank = post_events(attempt, saved(1, 2000, t0 + 121, uri="s3://elsewhere"), source="r1")

    assert first == {"accepted": 3, "duplicates": 0, "rejected": 0, "refused": {}, "messages": []}
    assert again == {"accepted": 0, "duplicates": 3, "rejected": 0, "refused": {}, "messages": []}
    assert other_rank == {
        "accepted": 1,
        "duplicates": 0,
        "rejected": 0,
        "refused": {},
        "messages": [],
    }
    assert checkpoints(attempt.run) == [
        (1, 1000, "s3://ckpt/vision/run/step-1000", datetime.fromtimestamp(t0 + 60, UTC), 12.5),
        (1, 2000, "s3://ckpt/vision/run/step-2000", datetime.fromtimestamp(t0 + 120.25, UTC), 3.0),
    ]


def test_the_longest_uri_the_sdk_accepts_fits_a_checkpoint_and_a_longer_report_is_skipped(world):
    attempt = running_attempt(world)
    ts = timezone.now().timestamp()
    longest = "s3://" + "x" * 2043

    result = post_events(attempt, saved(1, 10, ts, uri=longest))
    checkpoints_record(
        attempt=attempt,
        reports=[CheckpointReport(step=20, uri=longest + "x", saved_at=timezone.now())],
    )

    assert result == {"accepted": 1, "duplicates": 0, "rejected": 0, "refused": {}, "messages": []}
    assert list(Checkpoint.objects.values_list("step", "uri")) == [(10, longest)]


def test_checkpoints_record_keeps_the_first_report_of_a_step(world):
    attempt = running_attempt(world)
    at = timezone.now().replace(microsecond=0)
    checkpoints_record(
        attempt=attempt, reports=[CheckpointReport(step=5, uri="s3://first", saved_at=at)]
    )

    checkpoints_record(
        attempt=attempt,
        reports=[
            CheckpointReport(step=5, uri="s3://second", saved_at=at, save_seconds=9.0),
            CheckpointReport(step=6, uri="s3://six", saved_at=at, save_seconds=1.0),
            CheckpointReport(step=6, uri="s3://six-again", saved_at=at, save_seconds=2.0),
        ],
    )
    checkpoints_record(attempt=attempt, reports=[])

    assert checkpoints(attempt.run) == [(1, 5, "s3://first", at, 0.0), (1, 6, "s3://six", at, 1.0)]


def test_preempted_run_resumes_from_the_checkpoint_the_sdk_reported(
    world, django_capture_on_commit_callbacks
):
    first = running_attempt(world)
    run = first.run
    t0 = timezone.now().timestamp()
    post_events(first, saved(1, 1000, t0 - 60), saved(2, 2000, t0 - 5, uri="s3://ckpt/2000"))

    with django_capture_on_commit_callbacks(execute=False):
        assert run_preempt(run=run, message="reclaimed for a test") == 1
    attempt_cancel(attempt_id=first.pk)  # what the queued task does
    run.refresh_from_db()
    first.refresh_from_db()

    assert (run.state, first.state) == (RunState.QUEUED, AttemptState.PREEMPTED)
    assert run.events.get(reason="REQUEUED").message == (
        "Back in the queue after preemption; it will resume from checkpoint step 2000"
    )
    with django_capture_on_commit_callbacks(execute=False):
        admission_run_cycle()
    second = run.attempts.get(number=2)
    assert (second.resumed_from.step, second.resumed_from.uri) == (2000, "s3://ckpt/2000")
    assert second.resumed_from.attempt_id == first.pk

    attempt_submit(attempt_id=second.pk)
    spec = Attempt.objects.get(pk=second.pk).rendered_spec
    assert '"GANTRY_RESUME_FROM": "s3://ckpt/2000"' in spec
    assert '"GANTRY_RESUME_STEP": "2000"' in spec


def started_attempt(world) -> tuple[Attempt, datetime]:
    run = submit(world)
    admission_run_cycle()
    attempt = run.attempts.get()
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=30)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.RUNNING, started_at=start)
    attempt.refresh_from_db()
    return attempt, start


def finish(attempt: Attempt, start: datetime) -> None:
    """It ends 600 s after its start; its job reported before (its token dies now)."""
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.SUCCEEDED, finished_at=start + timedelta(seconds=600)
    )
    attempt.refresh_from_db()


def test_a_checkpoint_the_sdk_reported_is_counted_once_in_the_accounting(world):
    attempt, start = started_attempt(world)
    t0 = start.timestamp()
    window = {
        "type": "step_window",
        "seq": 1,
        "ts": t0 + 560,
        "start": t0 + 60,
        "end": t0 + 560,
        "steps": 500,
        "step_time_s": 1.0,
    }
    post_events(attempt, window, saved(2, 500, t0 + 570, seconds=10))
    finish(attempt, start)
    assert checkpoints(attempt.run) == [
        (1, 500, "s3://ckpt/vision/run/step-500", start + timedelta(seconds=570), 10.0)
    ]

    timeline = attempt_timeline(attempt=attempt)
    row = services.accounting_compute(attempt=attempt)

    assert timeline.checkpoint_intervals == [(Fraction(int(t0) + 560), Fraction(int(t0) + 570))]
    # 2 GPUs x 600 s: 60 s startup, 500 s of steps, 10 s saving, 30 s of other work.
    assert (row.allocated_gpu_s, row.startup_gpu_s, row.checkpoint_gpu_s) == (1200, 120, 20)
    assert row.effective_gpu_s == 1200 - 120 - 20


def test_a_save_the_backend_recorded_first_is_still_counted_once_as_the_sdk_timed_it(world):
    attempt, start = started_attempt(world)
    t0 = start.timestamp()
    checkpoints_record(
        attempt=attempt,
        reports=[
            CheckpointReport(
                step=500,
                uri="s3://from-the-backend",
                saved_at=start + timedelta(seconds=575),
                save_seconds=20.0,
            )
        ],
    )
    post_events(attempt, saved(1, 500, t0 + 570, seconds=10))
    finish(attempt, start)

    timeline = attempt_timeline(attempt=attempt)
    row = services.accounting_compute(attempt=attempt)

    assert checkpoints(attempt.run)[0][2] == "s3://from-the-backend"  # left as it was
    assert timeline.checkpoint_intervals == [(Fraction(int(t0) + 560), Fraction(int(t0) + 570))]
    assert row.checkpoint_gpu_s == 2 * 10


def old_scheme_token(attempt_id: int) -> str:
    """``gat_<id>.<HMAC>`` as Gantry derived tokens from its secret key before: anyone who
    read the source (and the embedded mode's constant key) could make one."""
    mac = hmac.new(
        settings.SECRET_KEY.encode(), f"gantry-attempt:{attempt_id}".encode(), hashlib.sha256
    ).digest()
    return f"gat_{attempt_id}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def post_with(token: str, *events) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Attempt " + token)
    body = {"source": SOURCE, "sdk": "gantry-sdk/0.1.0", "events": list(events)}
    return client.post(URL, json.dumps(body), content_type="application/json").status_code


def test_a_checkpoint_is_recorded_only_for_the_live_attempt_whose_token_reported_it(
    world, django_capture_on_commit_callbacks
):
    # Given vision's run preempted after its checkpoint at step 2000, its first job still
    # holding the token it ran with, and nlp's run running with a token of its own
    first = running_attempt(world)
    run = first.run
    first_token = attempt_token_issue(attempt=first)
    t0 = timezone.now().timestamp()
    assert post_with(first_token, saved(1, 2000, t0 - 5, uri="s3://ckpt/2000")) == 202
    other_run = submit(
        world, user=world.researcher_b, tenant="nlp", project="llm", env=NO_SIMULATED_CHECKPOINTS
    )
    run_to_running(world, other_run)
    other = other_run.attempts.get()
    other_token = attempt_token_issue(attempt=other)
    with django_capture_on_commit_callbacks(execute=False):
        run_preempt(run=run, message="reclaimed for a test")
    attempt_cancel(attempt_id=first.pk)
    with django_capture_on_commit_callbacks(execute=False):
        admission_run_cycle()
    second = run.attempts.get(number=2)
    far = saved(9, 999_999, t0, uri="s3://attacker/999999")

    # When step 999999 is reported with the ended attempt's own token, with the old scheme's
    # HMAC token of the new attempt, with nlp's random part under the new attempt's id, and
    # by nlp's job with its own token
    ended = post_with(first_token, far)
    forged_old_scheme = post_with(old_scheme_token(second.pk), far)
    spliced = post_with(f"gat_{second.pk}.{other_token.partition('.')[2]}", far)
    own = post_with(other_token, saved(1, 50, t0, uri="s3://nlp/50"))

    # Then only nlp's own checkpoint is recorded, on nlp's run; vision's run keeps the one
    # its first attempt wrote while it ran, and its next attempt resumes from that
    assert (ended, forged_old_scheme, spliced, own) == (401, 401, 401, 202)
    assert checkpoints(run) == [
        (1, 2000, "s3://ckpt/2000", datetime.fromtimestamp(t0 - 5, UTC), 12.5)
    ]
    assert list(Checkpoint.objects.filter(run=other_run).values_list("attempt", "step")) == [
        (other.pk, 50)
    ]
    assert second.resumed_from.step == 2000
    attempt_submit(attempt_id=second.pk)
    assert '"GANTRY_RESUME_STEP": "2000"' in Attempt.objects.get(pk=second.pk).rendered_spec
