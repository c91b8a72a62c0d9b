"""Crashes and outages: the regressions of bugs that scenarios with real processes found, without
processes; then a backend that cannot be reached, with real processes, exact counts read from
the backend itself, and its figures (tests/crash_support.py; docs/reliability.md, "Crashes
and outages"). kill -9 of web and Celery workers and of beat, and Redis and PostgreSQL
restarted, are the chaos test's (tests/portal/test_chaos.py).
"""

import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from clusters.backends import TransientBackendError
from clusters.backends.simulator import SimulatorBackend
from clusters.models import Cluster, SimulatedJob
from clusters.services import cluster_refresh_inventory
from jobs import tasks
from jobs.models import Attempt, AttemptState, Run, RunEvent, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_submit
from portal.celery import app as celery_app
from tests.chaos_support import (
    K8S_TOKEN,
    K8S_TOKEN_ENV,
    kubernetes_jobs,
    kubernetes_settings,
    running_fake_kubernetes,
)
from tests.conftest import experiment_input
from tests.crash_support import celery_beat, celery_worker, gantry_env, wait_until
from tests.reliability_figures import figures_path, record_figures

EXPECTED_TIMELINE = ["QUEUED", "ADMITTED", "SUBMITTING", "PENDING", "RUNNING", "SUCCEEDED"]
K8S_A100 = {"flavor": "a100-80gb", "gpus_per_node": 1}
OUTAGE_S = 5.0  # how long the Kubernetes API server stays unreachable


def transitions(run_id: int) -> list[str]:
    """The run's state changes in order (events that change nothing, such as a runtime
    report or a cancel request, left out)."""
    return [
        to_state
        for from_state, to_state in RunEvent.objects.filter(run_id=run_id).values_list(
            "from_state", "to_state"
        )
        if from_state != to_state
    ]


def event_differences(timelines: list[list[str]]) -> tuple[int, int]:
    """(lost, duplicated) transitions over all runs, against the expected timeline."""
    expected = Counter(EXPECTED_TIMELINE)
    lost = sum(sum((expected - Counter(t)).values()) for t in timelines)
    duplicated = sum(sum((Counter(t) - expected).values()) for t in timelines)
    return lost, duplicated


# --- regressions, without processes ------------------------------------------------------------


class WorkerKilled(BaseException):
    """What the rest of a task sees of a kill -9: nothing runs after this point."""


def _submit_admitted(world, **overrides) -> Attempt:
    run = run_submit(user=world.researcher_a, data=experiment_input(world, **overrides))
    admission_run_cycle()
    return run.attempts.get()


def _killed_after_the_backend_call(world, monkeypatch) -> Attempt:
    """An attempt whose worker died right after the backend created its job."""
    attempt = _submit_admitted(world)
    create = SimulatorBackend.submit

    def create_then_die(self, spec, *, may_exist=True):
        create(self, spec, may_exist=may_exist)
        raise WorkerKilled

    with monkeypatch.context() as patched:
        patched.setattr(SimulatorBackend, "submit", create_then_die)
        with pytest.raises(WorkerKilled):
            attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.backend_job_id) == (AttemptState.SUBMITTING, "")
    return attempt


def test_a_job_the_sync_finds_running_before_its_submit_recorded_it_is_recorded(world, monkeypatch):
    attempt = _killed_after_the_backend_call(world, monkeypatch)
    job = SimulatedJob.objects.get(name=attempt.name)

    cluster_sync(cluster=world.cluster)  # places the job: it runs

    attempt.refresh_from_db()
    assert (attempt.state, attempt.backend_job_id) == (AttemptState.RUNNING, str(job.pk))
    assert attempt.submitted_at is not None
    events = RunEvent.objects.filter(run_id=attempt.run_id).values_list("to_state", "message")
    assert list(events)[-2:] == [
        ("PENDING", f"sim-1 accepted job {job.pk} (found by the sync)"),
        ("RUNNING", "Running on sim-1-a100-80gb-00"),
    ]
    # The redelivered submit finds the work done: no second job, no second event.
    attempt_submit(attempt_id=attempt.pk)
    assert SimulatedJob.objects.filter(name=attempt.name).count() == 1
    assert transitions(attempt.run_id) == EXPECTED_TIMELINE[:-1]


def test_a_job_the_sync_finds_waiting_is_recorded_once(world, monkeypatch):
    attempt = _killed_after_the_backend_call(world, monkeypatch)
    # Every A100 of the simulated cluster is taken by a job that is not Gantry's.
    SimulatedJob.objects.create(
        cluster=world.cluster,
        name="someone-else",
        flavor="a100-80gb",
        nodes=4,
        gpus_per_node=8,
        profile={
            "workload": {
                "profile": "compute-bound",
                "duration_s": 10**6,
                "checkpoint_every_s": 0,
                "resume_step": 0,
            },
            "checkpoint_dir": "sim://checkpoints",
        },
        max_runtime_s=10**7,
        state="RUNNING",
        allocation={f"sim-1-a100-80gb-{node:02d}": list(range(8)) for node in range(4)},
        submitted_at=timezone.now(),
        started_at=timezone.now(),
    )
    for _ in range(2):
        cluster_sync(cluster=world.cluster)
    attempt.refresh_from_db()
    job = SimulatedJob.objects.get(name=attempt.name)
    assert (attempt.state, attempt.backend_job_id, job.state) == ("PENDING", str(job.pk), "PENDING")
    assert transitions(attempt.run_id) == ["QUEUED", "ADMITTED", "SUBMITTING", "PENDING"]


def test_a_broker_outage_does_not_fail_a_submit_that_was_recorded(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    def broker_down(*args, **kwargs):
        raise BrokerError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.admission_cycle, "delay", broker_down)
    monkeypatch.setattr(tasks.attempt_submit, "delay", broker_down)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run = run_submit(user=world.researcher_a, data=experiment_input(world))
    assert len(callbacks) == 1
    assert Run.objects.get(pk=run.pk).state == RunState.QUEUED
    # Beat's admission cycle picks it up; its submit message is lost too, and re-driven.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        admission_run_cycle()
    # The submit's send (lost, logged) and the submit-to-admission metric; neither raised.
    assert len(callbacks) == 2
    assert Attempt.objects.get(run=run).state == AttemptState.CREATED


def test_the_sync_reports_an_unreachable_backend_on_every_live_attempt(world, monkeypatch):
    attempt = _submit_admitted(world)
    attempt_submit(attempt_id=attempt.pk)

    def unreachable(self, *args, **kwargs):
        raise TransientBackendError("connection refused by 127.0.0.1:1")

    monkeypatch.setattr(SimulatorBackend, "inventory", unreachable)
    monkeypatch.setattr(SimulatorBackend, "sync", unreachable)
    tasks.sync_all_clusters()
    attempt.refresh_from_db()
    world.cluster.refresh_from_db()
    assert attempt.backend_error == "backend unreachable: connection refused by 127.0.0.1:1"
    assert world.cluster.last_error == "connection refused by 127.0.0.1:1"


# --- the backend unreachable -------------------------------------------------------------------


@pytest.fixture
def figures_file(tmp_path_factory) -> Path:
    return figures_path(tmp_path_factory.getbasetemp())


@pytest.fixture
def clean_broker(transactional_db):
    """Committed data for the processes to see, and no message in the test's Redis
    database before or after: a killed worker leaves its unacknowledged message behind,
    which a later worker would restore."""

    def purge():
        celery_app.control.purge()
        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(
            "unacked", "unacked_index", "unacked_mutex"
        )

    purge()
    yield
    purge()


@pytest.fixture
def fake_k8s(monkeypatch):
    """The fake Kubernetes API server; its Jobs run until a test sets
    ``controller.runtime_s``: every run is seen RUNNING before it ends."""
    monkeypatch.setenv(K8S_TOKEN_ENV, K8S_TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with running_fake_kubernetes() as fake:
        yield fake


def k8s_cluster(fake) -> Cluster:
    cluster = Cluster.objects.create(
        name="k8s-1", backend=Cluster.Backend.KUBERNETES, settings=kubernetes_settings(fake.url)
    )
    cluster_refresh_inventory(cluster=cluster)
    return cluster


def env_on_test_servers(tmp_path: Path, **extra: str) -> dict:
    """A Gantry process on the test's own PostgreSQL database and Redis database."""
    db = connection.settings_dict
    return gantry_env(
        database_url=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
        broker_url=settings.CELERY_BROKER_URL,
        data_dir=tmp_path,
        **extra,
    )


def states(run_ids) -> Counter:
    return Counter(Run.objects.filter(pk__in=run_ids).values_list("state", flat=True))


def _k8s_run(world, index: int) -> Run:
    data = experiment_input(world, name=f"outage-{index}", **K8S_A100)
    return run_submit(user=world.researcher_a, data=data)


@pytest.mark.integration
def test_an_unreachable_backend_is_reported_and_converges_with_one_job_per_attempt(
    world, fake_k8s, clean_broker, tmp_path, figures_file, client
):
    Cluster.objects.filter(pk=world.cluster.pk).update(enabled=False)
    k8s = k8s_cluster(fake_k8s)
    env = env_on_test_servers(tmp_path)
    worker = celery_worker(
        env=env, log_path=tmp_path / "worker.log", concurrency=2, kill_points=False
    ).start()
    beat = celery_beat(env=env, log_path=tmp_path / "beat.log").start()
    unreachable = f"backend unreachable: cannot reach the Kubernetes API at {fake_k8s.url}"
    try:
        running = [_k8s_run(world, index).pk for index in range(2)]
        wait_until(lambda: states(running) == {"RUNNING": 2}, timeout=60, what="two runs to run")
        fake_k8s.stop()
        outage_began = time.monotonic()
        waiting = [_k8s_run(world, index).pk for index in range(2, 5)]
        run_ids = running + waiting

        def reported() -> bool:
            errors = Attempt.objects.filter(run_id__in=run_ids).values_list(
                "backend_error", flat=True
            )
            return len(errors) == 5 and all(e.startswith(unreachable) for e in errors)

        wait_until(reported, timeout=60, interval=0.1, what="every attempt to report it")
        assert (states(running), states(waiting)) == ({"RUNNING": 2}, {"SUBMITTING": 3})
        client.force_login(world.researcher_a)
        for run_id in (running[0], waiting[0]):
            page = client.get(reverse("jobs:run_detail", args=[run_id])).content.decode()
            assert f"Backend: {unreachable}: connection refused" in page
        # The outage lasts OUTAGE_S, long enough for the submits to back off and retry.
        wait_until(
            lambda: time.monotonic() - outage_began >= OUTAGE_S,
            timeout=OUTAGE_S + 1,
            what="the outage to have lasted OUTAGE_S",
        )
        fake_k8s.start()  # on the same port
        outage = time.monotonic() - outage_began
        wait_until(
            lambda: (
                states(run_ids) == {"RUNNING": 5}
                and not Attempt.objects.filter(run_id__in=run_ids)
                .exclude(backend_error="")
                .exists()
            ),
            timeout=90,
            interval=0.1,
            what="every run to be on the cluster again",
        )
        converged = time.monotonic() - outage_began - outage
        fake_k8s.controller.runtime_s = 0
        wait_until(
            lambda: states(run_ids) == {"SUCCEEDED": 5}, timeout=60, what="every run to succeed"
        )
        assert worker.alive and beat.alive
        k8s.refresh_from_db()
        assert k8s.last_error == ""
    finally:
        beat.stop()
        worker.stop()

    attempts = list(Attempt.objects.filter(run_id__in=run_ids))
    names = Counter(job.metadata.name for job in kubernetes_jobs(fake_k8s))
    timelines = [transitions(run_id) for run_id in run_ids]
    lost, duplicated = event_differences(timelines)
    jobs_per_attempt = [names[a.name] for a in attempts]
    record_figures(
        figures_file,
        "backend_outage",
        {
            "runs": len(run_ids),
            "running_at_outage": len(running),
            "submitted_during_outage": len(waiting),
            "outage_s": outage,
            "attempts_reporting": 5,
            "converged_after_return_s": converged,
            "jobs_per_attempt_min": min(jobs_per_attempt),
            "jobs_per_attempt_max": max(jobs_per_attempt),
            "runs_succeeded": states(run_ids)["SUCCEEDED"],
            "events_lost": lost,
            "events_duplicated": duplicated,
        },
    )
    assert len(attempts) == 5
    assert names == Counter(a.name for a in attempts)
    assert timelines == [EXPECTED_TIMELINE] * 5
