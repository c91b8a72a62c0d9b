"""jobs.enqueue: background work is sent by task name after the commit, robustly.

The proof that matters is with real processes: while the broker is down, a quota edit and
a capacity edit still save (the page answers, the rows and audit rows are written), and
once the broker is back, a real Celery worker and beat do the work those edits called for.
"""

import logging
import subprocess

import pytest
from django.db import transaction
from django.urls import reverse

from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from jobs import enqueue
from jobs.models import Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.submission import run_submit
from portal.celery import app as celery_app
from tenants.models import AuditEvent, Quota
from tests.celery_support import (
    celery_env,
    free_port,
    start_worker_and_beat,
    stop_process,
    wait_for,
)
from tests.conftest import experiment_input

pytestmark = pytest.mark.integration


def test_every_task_named_by_the_services_is_registered():
    for name in (enqueue.ADMISSION_CYCLE, enqueue.ATTEMPT_SUBMIT, enqueue.ATTEMPT_CANCEL):
        assert celery_app.tasks[name].name == name


@pytest.mark.django_db(transaction=True)
def test_a_send_waits_for_the_commit_and_a_rollback_sends_nothing(monkeypatch):
    sent = []
    monkeypatch.setattr(
        enqueue, "_send", lambda task, *args, countdown=0: sent.append((task, args))
    )

    with transaction.atomic():
        enqueue.attempt_submit_enqueue([7, 8])
        enqueue.attempt_cancel_enqueue(9)
        assert sent == []
    with transaction.atomic():
        enqueue.admission_cycle_enqueue()
        transaction.set_rollback(True)

    assert sent == [
        ("jobs.tasks.attempt_submit", (7,)),
        ("jobs.tasks.attempt_submit", (8,)),
        ("jobs.tasks.attempt_cancel", (9,)),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_changes_sends_one_admission_cycle_until_a_cycle_starts(monkeypatch, settings):
    settings.GANTRY_ADMISSION_BATCH_MS = 500
    sent = []
    monkeypatch.setattr(
        enqueue, "_send", lambda task, *args, countdown=0: sent.append((task, countdown))
    )

    # Given three changes, each committed, before any cycle starts
    for _ in range(3):
        with transaction.atomic():
            enqueue.admission_cycle_enqueue()
    # Then one cycle is sent, to start half a second later: it reads all three
    assert sent == [(enqueue.ADMISSION_CYCLE, 0.5)]

    # When that cycle starts, a change committed after it sends a new one
    admission_run_cycle()
    with transaction.atomic():
        enqueue.admission_cycle_enqueue()
    with transaction.atomic():
        enqueue.admission_cycle_enqueue()
    assert sent == [(enqueue.ADMISSION_CYCLE, 0.5), (enqueue.ADMISSION_CYCLE, 0.5)]


@pytest.mark.django_db(transaction=True)
def test_an_admission_cycle_that_could_not_be_sent_is_tried_again_by_the_next_change(
    monkeypatch, caplog
):
    attempts = []

    def broker_down(task, *args, countdown=0):
        attempts.append(task)
        raise ConnectionError("broker down")

    monkeypatch.setattr(enqueue, "_send", broker_down)
    with caplog.at_level(logging.ERROR, logger="django.db.backends.base"):
        for _ in range(2):
            with transaction.atomic():
                enqueue.admission_cycle_enqueue()
    # Both tried (and logged): the failed send left no mark behind
    assert attempts == [enqueue.ADMISSION_CYCLE, enqueue.ADMISSION_CYCLE]
    assert len([r for r in caplog.records if "in on_commit()" in r.getMessage()]) == 2


class PrivateRedis:
    """A Redis of the test's own on a free loopback port, to stop and start at will."""

    def __init__(self, directory) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for(self.answers, timeout=20, what="Redis to answer")

    def answers(self) -> bool:
        result = subprocess.run(
            ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
        )
        return result.stdout.strip() == "PONG"

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=20)
            self.process = None


@pytest.fixture
def broker(tmp_path, monkeypatch):
    """The in-process Celery app sends to a private Redis for the test's length."""
    redis = PrivateRedis(tmp_path)

    def use(url: str | None) -> None:
        # Celery reads the broker from CELERY_BROKER_URL before its settings.
        if url is None:
            monkeypatch.undo()
        else:
            monkeypatch.setenv("CELERY_BROKER_URL", url)
        # The producer pools are bound to the broker they were made for.
        celery_app._pool = None
        celery_app.amqp._producer_pool = None

    use(redis.url)
    assert celery_app.conf.broker_url == redis.url
    yield redis
    redis.stop()
    use(None)


@pytest.fixture
def worker_and_beat(tmp_path):
    """``start(broker_url)``: a real worker and beat on that broker and the test database."""
    processes: list[subprocess.Popen] = []
    log = (tmp_path / "celery.log").open("w")

    def start(broker_url: str) -> None:
        env = celery_env(tmp_path, CELERY_BROKER_URL=broker_url)
        processes.extend(start_worker_and_beat(env, log, concurrency=1))

    yield start
    for process in reversed(processes):
        stop_process(process)
    log.close()


def set_a100_pool(cluster: Cluster, *, nodes: int) -> None:
    cluster.settings["pools"][0] = {"flavor": "a100-80gb", "nodes": nodes, "gpus_per_node": 8}
    cluster.save(update_fields=["settings"])
    cluster_refresh_inventory(cluster=cluster)


@pytest.mark.django_db(transaction=True)
def test_quota_and_capacity_edits_save_while_the_broker_is_down_and_their_work_runs_after(
    world, client, broker, worker_and_beat, caplog
):
    # Given two a100 nodes, both held by nlp within its guarantee, and a run of vision that
    # waits: vision has no a100 guarantee, may only borrow idle GPUs, and none is idle
    set_a100_pool(world.cluster, nodes=2)
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(
        guaranteed_gpus=0, borrow_limit_gpus=8
    )
    broker.start()
    nlp = experiment_input(world, tenant="nlp", project="llm", gpus_per_node=8)
    held = [run_submit(user=world.researcher_b, data=nlp) for _ in range(2)]
    waiting = run_submit(user=world.researcher_a, data=experiment_input(world, gpus_per_node=8))
    admission_run_cycle()
    states = [Run.objects.get(pk=run.pk).state for run in (*held, waiting)]
    assert states == [RunState.ADMITTED, RunState.ADMITTED, RunState.QUEUED]

    # When the broker goes down, and a platform admin gives vision a guarantee of 8 and adds
    # a node
    broker.stop()
    client.force_login(world.platform_admin)
    with caplog.at_level(logging.ERROR, logger="django.db.backends.base"):
        quota = client.post(
            f"{reverse('jobs:quota_edit')}?tenant=vision&flavor=a100-80gb",
            # 8 + nlp's 16 is more than the 16 GPUs of two nodes: confirmed (the node comes next)
            {"guaranteed_gpus": "8", "borrow_limit_gpus": "8", "max_gpus_per_run": "16",
             "budget_mode": "hard", "fair_share_weight": "1", "confirm_overcommit": "on"},
        )  # fmt: skip
        capacity = client.post(
            reverse("jobs:cluster_capacity", args=["sim-1"]),
            {"flavor": "a100-80gb", "nodes": "3", "gpus_per_node": "8"},
        )

    # Then both pages answer as when the broker is up, and both changes are saved and audited
    assert (quota.status_code, quota.url) == (302, f"{reverse('jobs:quota_list')}?tenant=vision")
    assert (capacity.status_code, capacity.url) == (302, reverse("jobs:cluster_list"))
    assert Quota.objects.get(tenant=world.vision, flavor=world.a100).guaranteed_gpus == 8
    world.cluster.refresh_from_db()
    assert world.cluster.settings["pools"][0] == {
        "flavor": "a100-80gb",
        "nodes": 3,
        "gpus_per_node": 8,
    }
    assert sorted(AuditEvent.objects.values_list("action", flat=True)) == [
        "cluster.capacity",
        "quota.overcommit",  # confirmed: 8 + 16 guaranteed on two 8-GPU nodes
        "quota.update",
    ]
    failed_sends = [r for r in caplog.records if "in on_commit()" in r.getMessage()]
    assert len(failed_sends) == 2  # each edit's admission trigger, logged, not raised
    assert Run.objects.get(pk=waiting.pk).state == RunState.QUEUED  # nothing ran meanwhile

    # And once the broker is back, beat's admission cycle admits the run on the new node, within
    # the new guarantee (not borrowed): the work of both edits
    broker.start()
    worker_and_beat(broker.url)

    def admitted() -> bool:
        return Run.objects.get(pk=waiting.pk).state != RunState.QUEUED

    wait_for(admitted, timeout=90, what="the waiting run to be admitted")
    run = Run.objects.get(pk=waiting.pk)
    assert (run.borrowed, run.events.filter(to_state=RunState.ADMITTED).count()) == (False, 1)
