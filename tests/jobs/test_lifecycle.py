"""Run lifecycle through the services and the simulator backend, without Celery."""

from datetime import timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.utils import timezone

from clusters.backends import simulator
from clusters.models import SimulatedJob
from jobs.calendar import month_start
from jobs.models import Attempt, AttemptState, Experiment, Run, RunEvent, RunState
from jobs.selectors.preview import admission_preview
from jobs.selectors.queue import gpu_hours_this_month
from jobs.selectors.runs import runs_place_in_line
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from jobs.services.lifecycle import run_cancel, run_preempt
from jobs.services.submission import run_submit
from jobs.services.usage import usage_record_attempt
from tenants.models import Quota
from tests.conftest import experiment_input


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def age_simulated_jobs(seconds: float) -> None:
    """Move the virtual clock: pretend every placed job started ``seconds`` earlier."""
    for job in SimulatedJob.objects.exclude(started_at=None):
        job.started_at -= timedelta(seconds=seconds)
        job.save(update_fields=["started_at"])


def test_submit_records_experiment_and_queues_a_run(world):
    run = submit(world)
    assert run.state == RunState.QUEUED
    assert run.gpus == 2
    assert run.experiment.image_reference == ("registry.example.org/ml/pytorch@sha256:" + "a" * 64)
    assert list(run.events.values_list("to_state", "reason")) == [("QUEUED", "SUBMITTED")]


def test_run_goes_from_queued_to_succeeded_on_the_simulator(world):
    run = submit(world)
    summary = admission_run_cycle()
    assert (summary.admitted, summary.preempted, summary.waiting) == (1, 0, 0)
    attempt = Attempt.objects.get(run=run)
    assert (attempt.number, attempt.state, attempt.cluster_id) == (1, "CREATED", world.cluster.pk)

    attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    run.refresh_from_db()
    assert (run.state, attempt.state) == (RunState.PENDING, AttemptState.PENDING)
    assert '"image": "registry.example.org/ml/pytorch@sha256:' in attempt.rendered_spec

    cluster_sync(cluster=world.cluster)  # places the job on virtual nodes
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert attempt.node_list == ["sim-1-a100-80gb-00"]

    age_simulated_jobs(1)  # 1 s real = 1000 s simulated > 30 s startup + 600 s of work
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state, attempt.exit_code) == ("SUCCEEDED", "SUCCEEDED", 0)
    assert list(run.events.values_list("to_state", flat=True)) == [
        "QUEUED",
        "ADMITTED",
        "SUBMITTING",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
    ]
    # What the simulated workload did, in simulated and in wall time, as the run's last event;
    # nothing in the attempt's failure message.
    assert attempt.failure_message == ""
    assert run.events.last().message == (
        "compute-bound workload ended: 10.5 min of simulated work in 1 s "
        "(1000× faster than real time)"
    )


def test_redelivered_submit_creates_no_second_simulated_job(world):
    run = submit(world)
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    attempt_submit(attempt_id=attempt.pk)
    # A worker that died after claiming the attempt: the state is SUBMITTING again.
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUBMITTING)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUBMITTING)
    attempt_submit(attempt_id=attempt.pk)
    assert SimulatedJob.objects.filter(name=f"gantry-a{attempt.pk}").count() == 1
    assert SimulatedJob.objects.count() == 1
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.PENDING


def test_only_the_try_that_records_the_intent_to_submit_skips_the_look_up(world, monkeypatch):
    """The first delivery moves the attempt CREATED -> SUBMITTING before calling the backend,
    so no earlier try can have reached it: no look-up for a job to adopt. A redelivery (or
    the same task after a crash) finds SUBMITTING and asks the backend to look."""
    asked: list[bool] = []
    real = simulator.SimulatorBackend.submit

    def submit_and_record(self, spec, *, may_exist=True):
        asked.append(may_exist)
        return real(self, spec, may_exist=may_exist)

    monkeypatch.setattr(simulator.SimulatorBackend, "submit", submit_and_record)
    run = submit(world)
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUBMITTING)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUBMITTING)
    attempt_submit(attempt_id=attempt.pk)
    assert asked == [False, True]
    assert SimulatedJob.objects.filter(name=f"gantry-a{attempt.pk}").count() == 1


def test_failing_workload_fails_with_exit_code_and_reason(world):
    run = submit(world, env={"GANTRY_SIM_PROFILE": "crash", "GANTRY_SIM_DURATION_S": "100"})
    admission_run_cycle()
    attempt_submit(attempt_id=run.attempts.get().pk)
    cluster_sync(cluster=world.cluster)
    age_simulated_jobs(1)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    attempt = run.attempts.get()
    assert (run.state, run.failure_reason) == ("FAILED", "USER_EXIT")
    assert (attempt.exit_code, attempt.failure_reason) == (1, "USER_EXIT")


def test_failed_run_with_restarts_left_is_requeued_with_a_new_attempt(world):
    run = submit(world, env={"GANTRY_SIM_PROFILE": "oom"}, max_restarts=1)
    admission_run_cycle()
    attempt_submit(attempt_id=run.attempts.get().pk)
    cluster_sync(cluster=world.cluster)
    age_simulated_jobs(10)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert (run.state, run.restarts) == (RunState.QUEUED, 1)
    admission_run_cycle()
    assert list(run.attempts.values_list("number", "state")) == [(1, "FAILED"), (2, "CREATED")]


def test_admission_respects_guarantee_and_explains_the_wait(world):
    first = submit(world, nodes=2, gpus_per_node=8)  # 16 = vision's whole a100 guarantee
    second = submit(world, gpus_per_node=1)
    other = submit(world, user=world.researcher_b, tenant="nlp", project="llm", gpus_per_node=8)
    summary = admission_run_cycle()
    assert (summary.admitted, summary.preempted, summary.waiting) == (2, 0, 1)
    first.refresh_from_db()
    second.refresh_from_db()
    other.refresh_from_db()
    assert (first.state, other.state, second.state) == ("ADMITTED", "ADMITTED", "QUEUED")
    assert second.wait_reason == "QUOTA"
    assert second.wait_message == (
        "tenant vision uses 16 of 16 guaranteed a100-80gb GPUs and may not borrow; this run needs 1"
    )
    runs_place_in_line([second])
    assert second.queue_position == 1


def test_cancel_queued_run_is_immediate_and_recorded(world):
    run = submit(world)
    run_cancel(run=run, actor=world.researcher_a)
    run.refresh_from_db()
    assert (run.state, run.failure_reason) == ("CANCELLED", "CANCELLED")
    assert RunEvent.objects.filter(run=run, to_state="CANCELLED").get().actor == world.researcher_a
    assert admission_run_cycle().admitted == 0


def test_cancel_running_run_goes_through_the_backend(world, django_capture_on_commit_callbacks):
    run = submit(world)
    admission_run_cycle()
    attempt_submit(attempt_id=run.attempts.get().pk)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert run.state == "RUNNING"
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run_cancel(run=run, actor=world.tenant_admin_a)
    assert len(callbacks) == 1
    attempt_cancel(attempt_id=run.attempts.get().pk)
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert SimulatedJob.objects.get().state == "CANCELLED"


def _to_running(world, run: Run) -> None:
    admission_run_cycle()
    attempt_submit(attempt_id=run.attempts.get().pk)
    cluster_sync(cluster=world.cluster)


def _queued(world, run: Run) -> None:
    pass


def _admitted(world, run: Run) -> None:
    admission_run_cycle()


def _pending(world, run: Run) -> None:
    admission_run_cycle()
    attempt_submit(attempt_id=run.attempts.get().pk)


def _preempted_job_still_running(world, run: Run) -> None:
    _to_running(world, run)
    run.refresh_from_db()
    run_preempt(run=run, message="reclaimed")


@pytest.mark.parametrize(
    ("advance", "state_before"),
    [
        (_queued, RunState.QUEUED),
        (_admitted, RunState.ADMITTED),
        (_pending, RunState.PENDING),
        (_to_running, RunState.RUNNING),
        (_preempted_job_still_running, RunState.PREEMPTED),
    ],
)
def test_every_cancel_path_closes_the_attempt_with_the_run(
    world, django_capture_on_commit_callbacks, advance, state_before
):
    """A cancelled run never keeps an attempt that is created, submitting, pending or
    running, not even for a moment: the run ends with its attempt, whichever state it was
    cancelled in."""

    def open_attempts_of_a_finished_run() -> list[str]:
        run.refresh_from_db()
        if not run.is_terminal:
            return []
        return [a.state for a in run.attempts.all() if a.finished_at is None]

    run = submit(world)
    with django_capture_on_commit_callbacks(execute=False):
        advance(world, run)
        run.refresh_from_db()
        assert run.state == state_before
        run_cancel(run=run, actor=world.researcher_a)
    assert open_attempts_of_a_finished_run() == []
    for attempt in Attempt.objects.filter(run=run):
        attempt_cancel(attempt_id=attempt.pk)  # what the queued cancel task does
    run.refresh_from_db()
    attempts = list(run.attempts.values_list("state", "finished_at"))
    assert run.state == RunState.CANCELLED
    assert [state for state, _ in attempts if state not in ("CANCELLED", "PREEMPTED")] == []
    assert [finished for _, finished in attempts if finished is None] == []
    assert SimulatedJob.objects.filter(state__in=("PENDING", "RUNNING")).count() == 0


def test_cancel_of_a_preempted_run_waits_for_its_job_then_ends_it_instead_of_requeueing(
    world, django_capture_on_commit_callbacks
):
    run = submit(world)
    _to_running(world, run)
    run.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=False):
        run_preempt(run=run, message="reclaimed")
    attempt = run.attempts.get()

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run_cancel(run=run, actor=world.researcher_a)

    run.refresh_from_db()
    attempt.refresh_from_db()
    assert len(callbacks) == 1  # the cancel of the attempt's job, asked again
    assert (run.state, run.cancel_requested_at is not None, attempt.state) == (
        RunState.PREEMPTED,
        True,
        AttemptState.RUNNING,
    )
    assert list(run.events.values_list("to_state", "reason"))[-1] == (
        "PREEMPTED",
        "CANCEL_REQUESTED",
    )

    attempt_cancel(attempt_id=attempt.pk)

    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, run.failure_reason, run.finished_at) == (
        RunState.CANCELLED,
        "CANCELLED",
        attempt.finished_at,
    )
    assert (attempt.state, attempt.failure_reason) == (AttemptState.PREEMPTED, "PREEMPTED")
    assert list(run.events.values_list("to_state", "reason", "message"))[-1] == (
        "CANCELLED",
        "CANCELLED",
        "Cancelled as requested",
    )
    with django_capture_on_commit_callbacks(execute=False):
        assert admission_run_cycle().admitted == 0
    assert run.attempts.count() == 1


def test_cancel_of_a_finished_run_is_refused_and_changes_nothing(world):
    run = submit(world)
    run_cancel(run=run, actor=world.researcher_a)
    events = RunEvent.objects.count()
    with pytest.raises(ValidationError):
        run_cancel(run=run, actor=world.researcher_a)
    assert RunEvent.objects.count() == events


def test_lost_after_grace_when_backend_forgets_the_job(world, settings):
    settings.GANTRY_LOST_GRACE_S = 60
    # A lost job is the platform's: retried, unless the cluster allows no such retry.
    world.cluster.health_policy = {"max_platform_retries": 0}
    world.cluster.save(update_fields=["health_policy"])
    run = submit(world)
    admission_run_cycle()
    attempt = run.attempts.get()
    attempt_submit(attempt_id=attempt.pk)
    SimulatedJob.objects.all().delete()
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert run.state == RunState.PENDING  # within the grace period nothing happens
    # Last seen is kept to LAST_SEEN_RESOLUTION (15 s), so the grace is 60 s plus that
    Attempt.objects.filter(pk=attempt.pk).update(
        last_seen_at=timezone.now() - timedelta(seconds=74)
    )
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert run.state == RunState.PENDING
    Attempt.objects.filter(pk=attempt.pk).update(
        last_seen_at=timezone.now() - timedelta(seconds=76)
    )
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert (run.state, run.failure_reason) == ("FAILED", "LOST")
    assert Attempt.objects.values_list("cause_class", "cause_evidence__signal").get(
        pk=attempt.pk
    ) == ("platform", "lost")


def test_a_sync_writes_last_seen_only_when_it_is_older_than_its_resolution(world):
    # A run that runs for a simulated day: every sync below finds it RUNNING, as it was
    run = submit(world, env={"GANTRY_SIM_DURATION_S": "86400"})
    admission_run_cycle()
    attempt = run.attempts.get()
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING
    first_seen = attempt.last_seen_at
    assert first_seen is not None

    with time_machine.travel(first_seen + timedelta(seconds=14), tick=False):
        cluster_sync(cluster=world.cluster)
    assert Attempt.objects.get(pk=attempt.pk).last_seen_at == first_seen  # nothing written

    later = first_seen + timedelta(seconds=15)
    with time_machine.travel(later, tick=False):
        cluster_sync(cluster=world.cluster)
    assert Attempt.objects.get(pk=attempt.pk).last_seen_at == later


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"image": "registry.example.org/ml/pytorch@sha256:XYZ"}, "image"),
        ({"image": "registry.example.org/ml/pytorch:latest"}, "image"),
        ({"image": "registry.example.org/nlp/megatron@sha256:" + "b" * 64}, "image"),
        ({"image": "registry.example.org/ml/old@sha256:" + "c" * 64}, "image"),
        ({"nodes": 0}, "nodes"),
        ({"nodes": 5}, "nodes"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"gpus_per_node": 9}, "gpus_per_node"),
        ({"params": [1, 2]}, "params"),
        ({"params": {"blob": "x" * (64 * 1024)}}, "params"),
        ({"command": "x" * (16 * 1024 + 1)}, "command"),
        ({"command": "  "}, "command"),
        ({"tenant": "nope"}, "tenant"),
        ({"tenant": "nlp"}, "tenant"),
        ({"project": "nope"}, "project"),
        ({"flavor": "v100"}, "flavor"),
        ({"code_commit": "abc"}, "code_commit"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"priority": 101}, "priority"),
        ({"params": {"lr": float("nan")}}, "params"),
        ({"params": {"note": "a\x00b"}}, "params"),
        ({"dataset_uri": "s3://" + "x" * 600}, "dataset_uri"),
        ({"name": "n" * 201}, "name"),
    ],
)
def test_bad_input_names_the_field_and_saves_nothing(world, overrides, field):
    with pytest.raises(ValidationError) as excinfo:
        submit(world, **overrides)
    assert field in excinfo.value.message_dict
    assert Experiment.objects.count() == 0
    assert Run.objects.count() == 0


def run_to_running(world, run: Run) -> None:
    """Admit, submit and place everything queued (``run`` among it)."""
    admission_run_cycle()
    for attempt in Attempt.objects.filter(state=AttemptState.CREATED):
        attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)


def test_guarantee_preempts_a_borrowed_run_which_resumes_from_its_checkpoint(
    world, django_capture_on_commit_callbacks
):
    # At 10 simulated seconds per second the next checkpoint (step 900) is 20 s of wall time
    # away: a slow or busy machine cannot reach it during the test.
    world.cluster.settings["speedup"] = 10
    world.cluster.save(update_fields=["settings"])
    Quota.objects.filter(tenant=world.nlp, flavor=world.h100).update(borrow_limit_gpus=8)
    long_job = {"GANTRY_SIM_DURATION_S": "100000", "GANTRY_SIM_CHECKPOINT_EVERY_S": "300"}
    h100 = {"tenant": "nlp", "project": "llm", "flavor": "h100-80gb", "gpus_per_node": 8}
    own = submit(world, user=world.researcher_b, env=long_job, **h100)
    lent = submit(world, user=world.researcher_b, env=long_job, **h100)
    run_to_running(world, own)
    own.refresh_from_db()
    lent.refresh_from_db()
    assert (own.state, own.borrowed, lent.state, lent.borrowed) == (
        "RUNNING",
        False,
        "RUNNING",
        True,
    )
    age_simulated_jobs(70)  # 700 simulated seconds: checkpoints at steps 300 and 600
    cluster_sync(cluster=world.cluster)
    assert list(lent.checkpoints.values_list("step", flat=True)) == [300, 600]

    reclaimer = submit(world, flavor="h100-80gb", gpus_per_node=8)
    with django_capture_on_commit_callbacks(execute=False):
        summary = admission_run_cycle()
    assert (summary.admitted, summary.preempted) == (1, 1)
    lent.refresh_from_db()
    assert lent.state == RunState.PREEMPTED
    event = lent.events.get(to_state="PREEMPTED")
    assert event.message == (
        "a tenant within its guarantee reclaimed 8 h100-80gb GPUs on sim-1; this run had borrowed 8"
    )
    assert event.admin_detail == (
        f"tenant vision reclaimed 8 h100-80gb GPUs of its guarantee on sim-1 for run "
        f"{reclaimer.pk}; this run had borrowed 8"
    )

    attempt_cancel(attempt_id=lent.attempts.get().pk)  # what the queued task does
    lent.refresh_from_db()
    first = lent.attempts.get()
    assert (lent.state, first.state, first.failure_reason) == ("QUEUED", "PREEMPTED", "PREEMPTED")
    assert lent.events.get(reason="REQUEUED").message == (
        "Back in the queue after preemption; it will resume from checkpoint step 600"
    )
    assert SimulatedJob.objects.get(name=first.name).state == "CANCELLED"

    # The reclaimer finishes; the preempted run is admitted again and resumes at step 600.
    run_cancel(run=reclaimer, actor=world.researcher_a)
    with django_capture_on_commit_callbacks(execute=False):
        admission_run_cycle()
    second = lent.attempts.get(number=2)
    assert second.resumed_from.step == 600
    attempt_submit(attempt_id=second.pk)
    spec = SimulatedJob.objects.get(name=second.name)
    assert spec.profile["workload"]["resume_step"] == 600
    assert '"GANTRY_RESUME_STEP": "600"' in Attempt.objects.get(pk=second.pk).rendered_spec


def test_submit_refuses_what_the_quota_could_never_admit(world):
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(max_gpus_per_run=4)
    with pytest.raises(ValidationError) as excinfo:
        submit(world, gpus_per_node=8)
    assert excinfo.value.message_dict["gpus_per_node"] == [
        "This run asks for 8 GPUs; tenant vision may use at most 4 a100-80gb GPUs per run. "
        "The largest a100-80gb run that could ever start for tenant vision: 4 GPUs (1 node × 4)."
    ]
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(max_gpus_per_run=None)
    with pytest.raises(ValidationError) as excinfo:
        submit(world, nodes=3, gpus_per_node=8)
    assert excinfo.value.message_dict["gpus_per_node"] == [
        "This run asks for 24 GPUs and could never start: tenant vision may hold at most 16 "
        "a100-80gb GPUs (16 guaranteed + 0 borrowed). The largest a100-80gb run that"
        " could ever start for tenant vision: "
        "16 GPUs (2 nodes × 8)."
    ]
    assert Run.objects.count() == 0


def test_budget_counts_finished_attempts_and_prorates_running_ones(world):
    now = month_start(timezone.now()) + timedelta(days=10)
    first = submit(world, env={"GANTRY_SIM_DURATION_S": "100"})
    second = submit(world)
    run_to_running(world, first)
    running, finished = first.attempts.get(), second.attempts.get()
    # 2 GPUs running for the last 3 hours; 2 GPUs that ran from 2 days before the month
    # began until 1 hour into it (only that hour counts this month).
    Attempt.objects.filter(pk=running.pk).update(started_at=now - timedelta(hours=3))
    begun = month_start(now) - timedelta(days=2)
    ended = month_start(now) + timedelta(hours=1)
    Attempt.objects.filter(pk=finished.pk).update(
        state=AttemptState.SUCCEEDED, started_at=begun, finished_at=ended
    )
    usage_record_attempt(attempt=finished, started=begun, finished=ended)
    assert gpu_hours_this_month(now=now) == {("vision", "a100-80gb"): 2 * 3 + 2 * 1}
    previous = gpu_hours_this_month(now=month_start(now) - timedelta(seconds=1))
    assert previous == {("vision", "a100-80gb"): 2 * 48}


def test_preview_says_start_borrow_or_wait_without_changing_anything(world):
    Quota.objects.filter(tenant=world.vision, flavor=world.h100).update(
        borrow_limit_gpus=8, monthly_gpu_hour_budget=100
    )
    preview = admission_preview(
        user=world.researcher_a, tenant="vision", flavor="h100-80gb", nodes=1, gpus_per_node=8
    )
    assert (preview.verdict, preview.guaranteed, preview.in_use, preview.idle) == (
        "start",
        8,
        0,
        16,
    )
    assert (preview.borrowable, preview.budget_left_gpu_hours) == (8, 100.0)
    assert preview.message == (
        "Would start now on sim-1 (sim-1-h100-80gb-00), within the tenant's guarantee"
    )

    run_to_running(world, submit(world, flavor="h100-80gb", gpus_per_node=8))
    preview = admission_preview(
        user=world.researcher_a, tenant="vision", flavor="h100-80gb", nodes=1, gpus_per_node=8
    )
    assert (preview.verdict, preview.in_use, preview.idle, preview.borrowable) == (
        "borrow",
        8,
        8,
        8,
    )
    preview = admission_preview(
        user=world.researcher_a, tenant="vision", flavor="h100-80gb", nodes=2, gpus_per_node=8
    )
    assert preview.verdict == "wait"
    assert preview.message == (
        "Would wait: tenant vision uses 8 of 8 guaranteed + 8 borrowable h100-80gb GPUs; "
        "this run needs 16 (position 1)"
    )
    assert Run.objects.count() == 1
    with pytest.raises(ValidationError):
        admission_preview(
            user=world.researcher_a, tenant="nlp", flavor="h100-80gb", nodes=1, gpus_per_node=1
        )


def test_unreachable_backend_is_retried_then_given_up(world, monkeypatch, settings):
    from clusters.backends import TransientBackendError
    from clusters.backends.simulator import SimulatorBackend

    def refuse(self, spec, *, may_exist=True):
        raise TransientBackendError("connection refused by 127.0.0.1:1")

    monkeypatch.setattr(SimulatorBackend, "submit", refuse)
    settings.GANTRY_SUBMIT_GIVE_UP_S = 600
    run = submit(world)
    admission_run_cycle()
    attempt = run.attempts.get()
    with pytest.raises(TransientBackendError):
        attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    run.refresh_from_db()
    assert (run.state, attempt.state) == ("SUBMITTING", "SUBMITTING")
    assert attempt.backend_error == "backend unreachable: connection refused by 127.0.0.1:1"

    Attempt.objects.filter(pk=attempt.pk).update(created_at=timezone.now() - timedelta(seconds=601))
    attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    run.refresh_from_db()
    assert (run.state, attempt.state, attempt.failure_reason) == ("FAILED", "FAILED", "UNKNOWN")
    assert attempt.failure_message == (
        "backend unreachable for 10 minutes, giving up: connection refused by 127.0.0.1:1"
    )


@pytest.mark.parametrize(
    ("simulated_s", "speedup", "message"),
    [
        (1230, 30, "compute-bound workload ended: 20.5 min of simulated work in 41 s "
         "(30× faster than real time)"),
        (6 * 3600, 60, "compute-bound workload ended: 6.0 h of simulated work in 6.0 min "
         "(60× faster than real time)"),
        (45, 1, "compute-bound workload (simulated) ended after 45 s"),
    ],
)  # fmt: skip
def test_a_simulated_outcome_says_simulated_and_wall_time_apart(simulated_s, speedup, message):
    from clusters.backends.simulator import simulated_outcome_message

    assert (
        simulated_outcome_message(profile="compute-bound", simulated_s=simulated_s, speedup=speedup)
        == message
    )


@pytest.mark.parametrize("speedup", [1, 30, 60])
def test_a_simulated_time_limit_is_wall_time_and_the_speedup_shortens_only_the_work(speedup):
    from clusters.simulation import Outcome, Workload, outcome_at

    # 6 simulated hours of work (+ 30 s of start-up), a 1-hour limit, in wall seconds.
    work = Workload(profile="compute-bound", duration_s=6 * 3600)
    work_wall_s = (30 + 6 * 3600) / speedup
    if work_wall_s > 3600:
        assert outcome_at(work, elapsed_s=3599, max_runtime_s=3600, speedup=speedup).state == (
            "RUNNING"
        )
        assert outcome_at(work, elapsed_s=3600, max_runtime_s=3600, speedup=speedup) == Outcome(
            "FAILED", 3600, None, "TIMEOUT"
        )
    else:
        assert outcome_at(work, elapsed_s=work_wall_s, max_runtime_s=3600, speedup=speedup) == (
            Outcome("SUCCEEDED", work_wall_s, 0, "")
        )
