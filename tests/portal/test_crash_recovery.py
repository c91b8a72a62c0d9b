"""Crashes and outages: kill -9 of the Celery worker during submits, Redis and PostgreSQL
restarted during activity, a backend that cannot be reached. Each scenario runs real
processes, ends with exact counts read from the backends themselves, and records its
figures (tests/crash_support.py; docs/reliability.md, "Crashes and outages").

The first tests are the regressions of the bugs these scenarios found, without processes.
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from celery import Celery
from django.conf import settings
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError
from kubernetes import client

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
from portal.task_queues import QUEUE_OF_TASK
from tests.conftest import experiment_input
from tests.crash_support import (
    KILL_POINTS_ENV,
    PHASES,
    ROOT,
    KillSwitch,
    Process,
    ThrowawayServices,
    celery_beat,
    celery_worker,
    child_pids,
    clone_schema,
    figures_path,
    gantry_env,
    percentile,
    record_figures,
    wait_ready,
    wait_until,
)
from tests.k8s_fake import FakeKubernetes

A100 = "NVIDIA-A100-SXM4-80GB"
TOKEN, TOKEN_ENV = "crash-test-token", "GANTRY_TEST_K8S_TOKEN"
EXPECTED_TIMELINE = ["QUEUED", "ADMITTED", "SUBMITTING", "PENDING", "RUNNING", "SUCCEEDED"]
SIM_H100 = {"flavor": "h100-80gb", "gpus_per_node": 1, "env": {"GANTRY_SIM_DURATION_S": "1500"}}
K8S_A100 = {"flavor": "a100-80gb", "gpus_per_node": 1}
NLP = {"tenant": "nlp", "project": "llm"}
KILL_SEED = 20261130
KILLS = 50
WHOLE_WORKER_SHARE = 0.2  # of the kills; the others kill one pool process
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


# --- shared by the scenarios -------------------------------------------------------------------


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
    """The fake Kubernetes API server, its controller stepping every 0.1 s. Jobs run until
    a test sets ``controller.runtime_s``: every run is seen RUNNING before it ends."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    fake = FakeKubernetes(token=TOKEN, runtime_s=10**9).start()
    for index in range(4):
        fake.controller.add_node(f"gpu-{index}", product=A100, gpus=8)
    stopping = threading.Event()

    def step():
        # The fake's clock keeps to real time: a backend whose times run ahead of Gantry's
        # clock is not believed (tests/jobs/test_clock_skew.py).
        while not stopping.wait(0.1):
            fake.controller.advance(0.1)

    stepper = threading.Thread(target=step, daemon=True)
    stepper.start()
    yield fake
    stopping.set()
    stepper.join()
    fake.stop()


def k8s_cluster(fake: FakeKubernetes) -> Cluster:
    cluster = Cluster.objects.create(
        name="k8s-1",
        backend=Cluster.Backend.KUBERNETES,
        settings={
            "url": fake.url,
            "token_env": TOKEN_ENV,
            "timeout_s": 5,
            "flavors": {"a100-80gb": {"product": A100}},
            "ttl_seconds_after_finished": 30 * 86400,  # keep finished Jobs to count them
        },
    )
    cluster_refresh_inventory(cluster=cluster)
    return cluster


def official_client(fake: FakeKubernetes) -> client.ApiClient:
    configuration = client.Configuration(host=fake.url)
    configuration.api_key = {"authorization": TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)


def kubernetes_jobs(fake: FakeKubernetes) -> list:
    """Every Gantry Job on the cluster, listed over HTTP by the official client."""
    with official_client(fake) as api:
        batch = client.BatchV1Api(api)
        return batch.list_job_for_all_namespaces(label_selector="gantry.io/attempt").items


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


# --- kill -9 of the worker during submits -----------------------------------------------------


def run_name(index: int) -> str:
    return f"kill-{index:03d}"


def _next_run(world, index: int) -> Run:
    """Runs alternate between the simulator (H100) and Kubernetes (A100), and between the
    two tenants, one GPU each: all of them fit at once."""
    backend = SIM_H100 if index % 2 == 0 else K8S_A100
    tenant = {} if index // 2 % 2 == 0 else NLP
    user = world.researcher_a if not tenant else world.researcher_b
    data = experiment_input(world, name=run_name(index), **backend, **tenant)
    return run_submit(user=user, data=data)


@pytest.mark.integration
def test_kill_9_of_the_worker_during_submits_leaves_one_job_per_attempt(
    world, fake_k8s, clean_broker, tmp_path, figures_file
):
    began = time.monotonic()
    rng = random.Random(KILL_SEED)
    # The simulator offers only H100s here, Kubernetes only A100s.
    world.cluster.settings["pools"] = [{"flavor": "h100-80gb", "nodes": 2, "gpus_per_node": 8}]
    world.cluster.save(update_fields=["settings"])
    cluster_refresh_inventory(cluster=world.cluster)
    k8s = k8s_cluster(fake_k8s)
    switch = KillSwitch(tmp_path / "kill-points")
    # Submits trigger the admission cycle themselves; beat's runs of it are only a backstop.
    env = env_on_test_servers(
        tmp_path, GANTRY_ADMISSION_INTERVAL_S="3", **{KILL_POINTS_ENV: str(switch.directory)}
    )
    # Four workers of one pool process each: while one restarts, or has yet to notice
    # that its pool process is gone, the others go on.
    workers = [
        celery_worker(
            env=env, log_path=tmp_path / f"worker-{n}.log", concurrency=1, kill_points=True
        ).start()
        for n in range(4)
    ]
    beat = celery_beat(
        env=env, log_path=tmp_path / "beat.log", schedule=tmp_path / "beat-schedule"
    ).start()
    plan = [
        (rng.choice(PHASES), "worker" if rng.random() < WHOLE_WORKER_SHARE else "pool")
        for _ in range(KILLS)
    ]
    kills, run_ids = {}, []

    def killed(seq: int) -> bool:
        """Kill each process that reached its kill point since the last call; whether
        kill ``seq`` is done."""
        for reached in switch.reached():
            if reached.seq in kills:
                continue
            phase, target = plan[reached.seq]
            if phase == "anywhere":
                time.sleep(rng.uniform(0, 0.03))  # wherever the submit has got to by then
            killed_at = timezone.now()
            if target == "worker":
                worker = next(w for w in workers if reached.pid in child_pids(w.pid))
                worker.kill()
                worker.start()  # ready in a few seconds; the others go on meanwhile
            else:
                os.kill(reached.pid, signal.SIGKILL)
            kills[reached.seq] = (phase, target, reached.attempt_id, killed_at)
        return seq in kills

    try:
        for worker in workers:
            wait_ready(worker)
        # One kill in the submit of every run, at the point the plan says, one run at a
        # time: submitting them all at once would have beat re-drive every waiting submit
        # every second (see docs/reliability.md).
        for seq, (phase, _) in enumerate(plan):
            switch.plan(seq, phase, run_name(seq))
            run_ids.append(_next_run(world, seq).pk)
            wait_until(
                lambda seq=seq: killed(seq),
                timeout=60,
                interval=0.02,
                what=f"kill point {seq} {phase}",
            )
        last_kill = time.monotonic()
        simulated, on_k8s = run_ids[0::2], run_ids[1::2]
        wait_until(
            lambda: (
                states(simulated) == {"SUCCEEDED": len(simulated)}
                and states(on_k8s) == {"RUNNING": len(on_k8s)}
            ),
            timeout=120,
            interval=0.25,
            what="the simulator's runs to succeed and the Kubernetes runs to run",
        )
        fake_k8s.controller.runtime_s = 0  # every Kubernetes job has been seen running: end them
        wait_until(
            lambda: states(run_ids) == {"SUCCEEDED": len(run_ids)},
            timeout=60,
            interval=0.25,
            what="every run to succeed",
        )
        converged = time.monotonic() - last_kill
        assert all(worker.alive for worker in workers) and beat.alive
    finally:
        switch.cancel_plans()
        beat.stop()
        for worker in workers:
            worker.stop()

    attempts = list(Attempt.objects.filter(run_id__in=run_ids).select_related("run__tenant"))
    sim_jobs = Counter(SimulatedJob.objects.values_list("name", flat=True))
    k8s_jobs = kubernetes_jobs(fake_k8s)
    k8s_names = Counter(job.metadata.name for job in k8s_jobs)
    jobs_per_attempt = [
        (sim_jobs if a.cluster_id == world.cluster.pk else k8s_names)[a.name] for a in attempts
    ]
    per_run = Counter(a.run_id for a in attempts)
    timelines = [transitions(run_id) for run_id in run_ids]
    lost, duplicated = event_differences(timelines)
    accepted_at = {a.pk: a.submitted_at for a in attempts}
    recoveries = [
        (accepted_at[attempt_id] - killed_at).total_seconds()
        for _, _, attempt_id, killed_at in kills.values()
        if accepted_at.get(attempt_id) and accepted_at[attempt_id] > killed_at
    ]
    adopted = RunEvent.objects.filter(
        run_id__in=run_ids, message__endswith="(found by the sync)"
    ).count()
    record_figures(
        figures_file,
        "worker_kills",
        {
            "seed": KILL_SEED,
            "kills": len(kills),
            "pool_process_kills": sum(1 for k in kills.values() if k[1] == "pool"),
            "worker_kills": sum(1 for k in kills.values() if k[1] == "worker"),
            "kills_by_phase": dict(Counter(k[0] for k in kills.values())),
            "runs": len(run_ids),
            "runs_succeeded": states(run_ids)["SUCCEEDED"],
            "simulator_jobs": sum(sim_jobs.values()),
            "kubernetes_jobs": sum(k8s_names.values()),
            "attempts_per_run_min": min(per_run.values()),
            "attempts_per_run_max": max(per_run.values()),
            "jobs_per_attempt_min": min(jobs_per_attempt),
            "jobs_per_attempt_max": max(jobs_per_attempt),
            "adopted_by_sync": adopted,
            "events_lost": lost,
            "events_duplicated": duplicated,
            "interrupted_submits": len(recoveries),
            "recovery_p50_s": percentile(recoveries, 0.5),
            "recovery_max_s": max(recoveries),
            "converged_after_last_kill_s": converged,
            "wall_s": time.monotonic() - began,
        },
    )

    assert len(kills) == KILLS and len(run_ids) == KILLS
    assert states(run_ids) == {"SUCCEEDED": KILLS}
    assert per_run == dict.fromkeys(run_ids, 1)
    # Exactly one backend job per attempt, on each backend, and nothing else there.
    sim_attempts = [a for a in attempts if a.cluster_id == world.cluster.pk]
    k8s_attempts = [a for a in attempts if a.cluster_id == k8s.pk]
    assert (len(sim_attempts), len(k8s_attempts)) == (KILLS // 2, KILLS // 2)
    assert sim_jobs == Counter(a.name for a in sim_attempts)
    assert k8s_names == Counter(a.name for a in k8s_attempts)
    sim_ids = dict(SimulatedJob.objects.values_list("name", "pk"))
    for attempt in sim_attempts:
        assert attempt.backend_job_id == str(sim_ids[attempt.name])
    for attempt in k8s_attempts:
        assert attempt.backend_job_id == f"gantry-{attempt.run.tenant.slug}/{attempt.name}"
    assert all(job.status.succeeded == 1 for job in k8s_jobs)
    # Every run went through each state once: no event lost, none written twice.
    assert timelines == [EXPECTED_TIMELINE] * KILLS
    assert (lost, duplicated) == (0, 0)


# --- the backend unreachable -------------------------------------------------------------------


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
    beat = celery_beat(
        env=env, log_path=tmp_path / "beat.log", schedule=tmp_path / "beat-schedule"
    ).start()
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


# --- Redis and PostgreSQL restarted during activity ----------------------------------------------

RESTART_RUNS = 30
IN_FLIGHT_S = 3.0  # how long a submit holds its message across the Redis restart
CRASH_SUPPORT = [sys.executable, "-m", "tests.crash_support"]
ROLLUPS = ("telemetry.tasks.accounting_compute_pending", "finance.tasks.daily_usage_update")


def _rows(servers: ThrowawayServices, sql: str) -> list[tuple]:
    with servers.connect() as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.integration
def test_redis_and_postgres_restarts_lose_no_run_event_or_accounting_row(
    transactional_db, tmp_path, figures_file
):
    began = time.monotonic()
    source = dict(connection.settings_dict)  # the test database: its schema is migrated
    servers = ThrowawayServices.start(db_name="gantry_outage")
    trigger = Celery("outage-trigger", set_as_current=False)
    switch = KillSwitch(tmp_path / "kill-points")
    processes: list[Process] = []
    downtime: dict[str, float] = {}
    last_sent = [0.0]

    def roll_up() -> None:
        """What beat does every minute or two, every second here: account finished
        attempts and roll them into DailyUsage. A broker that is down drops the trigger."""
        if time.monotonic() - last_sent[0] < 1:
            return
        last_sent[0] = time.monotonic()
        # An explicit connection: CELERY_BROKER_URL in this process's environment (the
        # test's own Redis database) would win over any broker given to the app.
        with (
            contextlib.suppress(Exception),
            trigger.connection_for_write(servers.broker_url) as conn,
        ):
            for task in ROLLUPS:
                trigger.send_task(task, connection=conn, queue=QUEUE_OF_TASK[task])

    def submitted() -> int:
        return json.loads(progress.read_text())["submitted"] if progress.exists() else 0

    def restart(what: str, stop, start, *, after_runs: int, in_flight: bool = False) -> None:
        """Restart a server once the client has submitted ``after_runs`` runs; with
        ``in_flight``, while the next run's submit holds its message unacknowledged."""
        if in_flight:
            switch.plan(0, "before_ack", f"chaos-{after_runs:03d}", wait_s=IN_FLIGHT_S)
        wait_until(
            lambda: (
                roll_up() or (submitted() >= after_runs and (not in_flight or switch.reached()))
            ),
            timeout=120,
            what=f"{after_runs} runs submitted",
        )
        stopped = time.monotonic()
        stop()
        # Down for a second at least: every process notices, and keeps trying meanwhile.
        wait_until(lambda: time.monotonic() - stopped >= 1, timeout=2, what="a second down")
        start()
        downtime[what] = time.monotonic() - stopped

    try:
        clone_schema(source=source, target=servers)
        with servers.connect() as conn:
            # This server runs with synchronous_commit = off (scripts/test-services.sh, for
            # speed); a crash could then lose commits it acknowledged: not for this database.
            conn.execute(f'ALTER DATABASE "{servers.db_name}" SET synchronous_commit = on')
        env = gantry_env(
            database_url=servers.database_url, broker_url=servers.broker_url, data_dir=tmp_path
        )
        subprocess.run(
            [*CRASH_SUPPORT, "seed"],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=120,
        )
        progress = tmp_path / "progress.json"
        worker = celery_worker(
            env=env | {KILL_POINTS_ENV: str(switch.directory)},
            log_path=tmp_path / "worker.log",
            concurrency=2,
            kill_points=True,
        )
        beat = celery_beat(
            env=env, log_path=tmp_path / "beat.log", schedule=tmp_path / "beat-schedule"
        )
        client = Process(
            [*CRASH_SUPPORT, "client", "--runs", str(RESTART_RUNS), "--progress", str(progress)],
            env=env,
            log_path=tmp_path / "client.log",
        )
        processes += [worker.start(), beat.start(), client.start()]
        restart(
            "Redis stop + start",
            servers.redis_stop,
            servers.redis_start,
            after_runs=8,
            in_flight=True,
        )
        restart(
            "PostgreSQL stop + start",
            servers.postgres_stop,
            servers.postgres_start,
            after_runs=16,
        )
        restart(
            "PostgreSQL kill -9 + start",
            servers.postgres_kill,
            servers.postgres_start,
            after_runs=24,
        )
        last_restart = time.monotonic()
        wait_until(
            lambda: roll_up() or client.popen.poll() is not None,
            timeout=120,
            what="the client to submit every run",
        )
        assert client.popen.returncode == 0, client.log_since_start()[-3000:]

        def finished() -> bool:
            roll_up()
            return _rows(servers, "SELECT state, count(*) FROM jobs_run GROUP BY state") == [
                ("SUCCEEDED", RESTART_RUNS)
            ]

        wait_until(finished, timeout=120, interval=0.25, what="every run to succeed")
        converged = time.monotonic() - last_restart

        def accounted() -> bool:
            roll_up()
            ((rows, accounted_s),) = _rows(
                servers,
                "SELECT count(*), COALESCE(sum(allocated_gpu_s), 0)::bigint "
                "FROM telemetry_attemptaccounting",
            )
            ((daily_s,),) = _rows(
                servers,
                "SELECT COALESCE(sum(allocated_gpu_s), 0)::bigint FROM telemetry_dailyusage",
            )
            return rows == RESTART_RUNS and daily_s == accounted_s

        wait_until(accounted, timeout=60, interval=0.25, what="every attempt to be accounted")
        assert worker.alive and beat.alive  # they reconnected by themselves

        runs = _rows(
            servers,
            "SELECT r.id, e.name, r.gpus, r.state FROM jobs_run r "
            "JOIN jobs_experiment e ON e.id = r.experiment_id ORDER BY e.name",
        )
        attempts = _rows(
            servers,
            "SELECT id, run_id, state, backend_job_id, started_at, finished_at FROM jobs_attempt",
        )
        sim_jobs = dict(_rows(servers, "SELECT name, id FROM jobs_simulatedjob"))
        events = _rows(
            servers, "SELECT run_id, from_state, to_state FROM jobs_runevent ORDER BY at, id"
        )
        ((ledger_s,),) = _rows(
            servers, "SELECT COALESCE(sum(gpu_seconds), 0) FROM jobs_tenantmonthusage"
        )
        accounting = _rows(
            servers,
            "SELECT attempt_id, allocated_gpu_s, effective_gpu_s + lost_gpu_s + startup_gpu_s "
            "+ checkpoint_gpu_s + interactive_idle_gpu_s + idle_gpu_s + input_wait_gpu_s "
            "+ comm_wait_gpu_s "
            "FROM telemetry_attemptaccounting",
        )
        ((daily_s,),) = _rows(
            servers, "SELECT COALESCE(sum(allocated_gpu_s), 0)::bigint FROM telemetry_dailyusage"
        )
        client_progress = json.loads(progress.read_text())
    finally:
        for process in reversed(processes):
            process.stop()
        trigger.close()
        servers.stop()

    gpus = {run_id: run_gpus for run_id, _, run_gpus, _ in runs}
    attempts_s = sum(
        gpus[run_id] * (end - start).total_seconds() for _, run_id, _, _, start, end in attempts
    )
    timelines = {run_id: [] for run_id, *_ in runs}
    for run_id, from_state, to_state in events:
        if from_state != to_state:
            timelines[run_id].append(to_state)
    lost, duplicated = event_differences(list(timelines.values()))
    jobs_per_run = Counter(run_id for _, run_id, _, _, _, _ in attempts)
    record_figures(
        figures_file,
        "server_restarts",
        {
            "restarts": ", ".join(downtime),
            "downtime": ", ".join(f"{what} {s:.1f} s" for what, s in downtime.items()),
            "runs": RESTART_RUNS,
            "runs_in_database": len(runs),
            "runs_succeeded": sum(1 for *_, state in runs if state == "SUCCEEDED"),
            "client_retries": client_progress["retries"],
            "client_found_recorded": client_progress["found_recorded"],
            "client_errors": client_progress["errors"],
            "simulator_jobs": len(sim_jobs),
            "jobs_per_run_min": min(jobs_per_run.values()),
            "jobs_per_run_max": max(jobs_per_run.values()),
            "events_lost": lost,
            "events_duplicated": duplicated,
            "finished_attempts": len(attempts),
            "accounting_rows": len(accounting),
            "ledger_gpu_s": ledger_s,
            "attempts_gpu_s": attempts_s,
            "accounting_gpu_s": sum(allocated for _, allocated, _ in accounting),
            "daily_usage_gpu_s": daily_s,
            "processes_restarted": 0,
            "converged_after_last_restart_s": converged,
            "wall_s": time.monotonic() - began,
        },
    )

    # Every run the client submitted is there once, went through each state once, and has
    # exactly one job on the simulator, recorded on its attempt.
    assert [name for _, name, _, _ in runs] == [f"chaos-{i:03d}" for i in range(RESTART_RUNS)]
    assert jobs_per_run == {run_id: 1 for run_id, *_ in runs}
    assert sim_jobs == {
        f"gantry-a{attempt_id}": int(backend_job_id)
        for attempt_id, _, _, backend_job_id, *_ in attempts
    }
    assert {run: line for run, line in timelines.items() if line != EXPECTED_TIMELINE} == {}
    assert (lost, duplicated) == (0, 0)
    # Accounting: the budget ledger holds every finished attempt once; each attempt has its
    # accounting, whose categories add up; DailyUsage adds up to the accounting.
    assert abs(ledger_s - attempts_s) < 1e-6
    assert sorted(a for a, _, _ in accounting) == sorted(a for a, *_ in attempts)
    assert all(allocated == parts for _, allocated, parts in accounting)
    assert daily_s == sum(allocated for _, allocated, _ in accounting)
