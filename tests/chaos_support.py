"""Machinery of the chaos test (tests/portal/test_chaos.py): the pieces of a replicated Gantry
on 127.0.0.1, the clients that submit through its API, and what the test measures.

- ``gunicorn(…)``: one master with 3 sync workers serving ``tests.chaos_web`` (the portal
  with a kill point after a committed submit); the master replaces a killed worker itself.
- ``Submissions``: a pool of API clients; each run has its own Idempotency-Key, sent again
  with the same key after a connection error, a timeout, a 5xx or a 429, every answer kept.
- ``CeleryKiller``: kills the Celery process that reached a planned kill point of a submit
  (``tests.crash_support.KillSwitch``): the pool process, or the whole worker, which it
  starts again as a supervisor (systemd, Kubernetes) would.
- ``Heartbeats``: when beat's periodic sync last refreshed the simulated cluster
  (``Cluster.inventory_at``), sampled every 0.5 s; ``sends(beats)``: when the beats sent
  periodic tasks, by their logs; ``gap_across`` and ``longest_gap``: the gaps of either.
- ``RollUps``: accounting and DailyUsage triggered every few seconds, as beat would.
- ``leading(beat)``: whether a beat's log says it leads the schedule now.
- ``running_fake_kubernetes()``: the fake Kubernetes API server with its controller stepping
  in real time; ``kubernetes_jobs(fake)`` lists Gantry's Jobs over HTTP.

``python -m tests.chaos_support seed [--kubernetes-url URL]`` records the chaos world in the
database of ``DATABASE_URL`` (the Kubernetes cluster only with a URL) and prints the API
tokens of its four researchers (JSON).

PYTEST_DONT_REWRITE: a helper module; it asserts nothing.
"""

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import requests

from tests.crash_support import KillSwitch, Process, child_pids
from tests.throwaway_services import ThrowawayServices

SIM_CLUSTER, K8S_CLUSTER = "sim-1", "k8s-1"
SIM_FLAVOR, K8S_FLAVOR = "h100-80gb", "a100-80gb"
A100 = "NVIDIA-A100-SXM4-80GB"
K8S_TOKEN, K8S_TOKEN_ENV = "chaos-test-token", "GANTRY_TEST_K8S_TOKEN"
IMAGE = "registry.example.org/ml/pytorch@sha256:" + "a" * 64
# Four researchers, two per tenant: (user, tenant, project).
RESEARCHERS = [
    ("ada", "vision", "detection"),
    ("grace", "nlp", "llm"),
    ("alan", "vision", "detection"),
    ("linus", "nlp", "llm"),
]
RETRYABLE_STATUSES = {429, 500, 502, 503, 504}

# --- the web -----------------------------------------------------------------------------------


def gunicorn(*, env: dict, log_path: Path, port: int, access_log: Path) -> Process:
    """gunicorn as production runs it (portal/gunicorn_conf.py), 3 sync workers."""
    argv = [sys.executable, "-m", "gunicorn", "tests.chaos_web:application"]
    argv += ["--config", "python:portal.gunicorn_conf"]
    env = env | {
        "GANTRY_WEB_WORKERS": "3",
        "GANTRY_WEB_BIND": f"127.0.0.1:{port}",
        "GANTRY_WEB_ACCESS_LOG": str(access_log),
    }
    return Process(argv, env=env, log_path=log_path)


def web_workers(master: Process) -> list[int]:
    return sorted(child_pids(master.pid))


def web_ready(base_url: str) -> bool:
    with requests.Session() as session, contextlib.suppress(requests.RequestException):
        session.trust_env = False  # no proxy between us and 127.0.0.1
        return session.get(f"{base_url}/readyz", timeout=2).status_code == 200
    return False


# --- the clients -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    outcome: str  # the HTTP status ("201", "503") or the client's exception ("ConnectionError")
    run_id: int | None
    at: float  # time.monotonic() when it came


class Submissions:
    """``runs`` submits through the API by ``clients`` threads, paced at ``rate_per_s``.

    Run ``i`` is submitted by researcher ``i % 4`` with its own Idempotency-Key; after an
    answer that invites it (connection error, timeout, 5xx, 429) the same request is sent
    again with the same key, after the answer's Retry-After (at most 2 s) or a short backoff,
    until a 201 names the run or ``give_up_s`` passed. Any other answer ends the run's
    submission (the test fails on it)."""

    def __init__(
        self,
        *,
        base_url: str,
        tokens: list[str],
        body_of: Callable[[int], dict],
        runs: int,
        rate_per_s: float,
        clients: int,
        give_up_s: float = 240,
    ):
        self.url = f"{base_url}/api/v1/runs/"
        self.tokens, self.body_of, self.runs = tokens, body_of, runs
        self.rate_per_s, self.give_up_s = rate_per_s, give_up_s
        self.keys = [str(uuid.uuid4()) for _ in range(runs)]
        self.answers: list[list[Answer]] = [[] for _ in range(runs)]
        self.final: list[Answer | None] = [None] * runs
        self._indices = iter(range(runs))
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        self.began = 0.0

    def start(self) -> "Submissions":
        self.began = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def answered(self) -> int:
        return sum(1 for final in self.final if final is not None)

    def finished(self) -> bool:
        return not any(thread.is_alive() for thread in self._threads)

    def _next_index(self) -> int | None:
        with self._lock:
            return next(self._indices, None)

    def _client(self) -> None:
        with requests.Session() as session:
            session.trust_env = False  # no proxy between us and 127.0.0.1
            while (index := self._next_index()) is not None:
                # Paced: run i leaves no earlier than i / rate after the start.
                time.sleep(max(0.0, self.began + index / self.rate_per_s - time.monotonic()))
                self.final[index] = self.submit(session, index, self.answers[index])

    def submit(self, session: requests.Session, index: int, answers: list[Answer]) -> Answer:
        """Submit run ``index`` until an answer ends it, each answer added to ``answers``;
        the last one."""
        user = index % len(self.tokens)
        headers = {
            "Authorization": f"Bearer {self.tokens[user]}",
            "Idempotency-Key": self.keys[index],
        }
        deadline = time.monotonic() + self.give_up_s
        for tries in itertools.count():
            retry_after = None
            try:
                response = session.post(
                    self.url, json=self.body_of(index), headers=headers, timeout=30
                )
                run_id = response.json()["id"] if response.status_code == 201 else None
                answer = Answer(str(response.status_code), run_id, time.monotonic())
                retry_after = response.headers.get("Retry-After")
                retryable = response.status_code in RETRYABLE_STATUSES
            except requests.RequestException as exc:
                answer = Answer(type(exc).__name__, None, time.monotonic())
                retryable = True
            answers.append(answer)
            if answer.run_id is not None or not retryable or time.monotonic() > deadline:
                return answer
            pause = float(retry_after) if retry_after else 0.25 * 2 ** min(tries, 3)
            time.sleep(min(pause, 2.0))
        raise AssertionError("unreachable")

    def replay(self, indices) -> dict[int, Answer]:
        """Send the requests of runs ``indices`` again, with their keys: each one's answer."""
        with requests.Session() as session:
            session.trust_env = False
            return {index: self.submit(session, index, []) for index in indices}


# --- kills of Celery processes ----------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    seq: int
    phase: str
    target: str  # "pool" (the pool process) or "worker" (the whole worker, started again)
    run_name: str
    attempt_id: int
    at: datetime


class CeleryKiller(threading.Thread):
    """Kills each Celery process that reached a planned kill point: ``plan`` maps the plan's
    sequence number to (phase, target, run name); other sequence numbers (a pause of a
    submit without a kill) are left alone."""

    def __init__(self, switch: KillSwitch, plan: dict[int, tuple[str, str, str]], workers):
        super().__init__(daemon=True)
        self.switch, self.plan, self.workers = switch, plan, workers
        self.kills: dict[int, Kill] = {}
        self.restarts = 0
        self._rng = random.Random(20261201)
        self._stopping = threading.Event()

    def arm(self) -> None:
        for seq, (phase, _, run_name) in self.plan.items():
            self.switch.plan(seq, phase, run_name)

    def run(self) -> None:
        while not self._stopping.wait(0.05):
            for reached in self.switch.reached():
                if reached.seq in self.plan and reached.seq not in self.kills:
                    self._kill(reached)

    def _kill(self, reached) -> None:
        phase, target, run_name = self.plan[reached.seq]
        if phase == "anywhere":
            time.sleep(self._rng.uniform(0, 0.03))  # wherever the worker has got to by then
        at = datetime.now(UTC)
        if target == "worker":
            worker = next(w for w in self.workers if reached.pid in child_pids(w.pid))
            worker.kill()
            worker.start()  # as its supervisor would
            self.restarts += 1
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(reached.pid, signal.SIGKILL)
        self.kills[reached.seq] = Kill(reached.seq, phase, target, run_name, reached.attempt_id, at)

    def done(self) -> bool:
        return len(self.kills) == len(self.plan)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)


# --- periodic work and beat leadership ------------------------------------------------------


class Heartbeats(threading.Thread):
    """Every ``inventory_at`` of the simulated cluster seen, sampled every 0.5 s: beat's sync
    writes it, and nothing else does while the test runs."""

    def __init__(self, servers: ThrowawayServices):
        super().__init__(daemon=True)
        self.servers = servers
        self.times: list[datetime] = []  # aware, as PostgreSQL gives them
        self._stopping = threading.Event()

    def run(self) -> None:
        conn = None
        while not self._stopping.wait(0.5):
            try:
                conn = conn or self.servers.connect()
                (at,) = conn.execute(
                    "SELECT inventory_at FROM jobs_cluster WHERE name = %s", [SIM_CLUSTER]
                ).fetchone()
            except Exception:  # PostgreSQL restarting: sample again
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
                continue
            if at is not None and (not self.times or at > self.times[-1]):
                self.times.append(at)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)


ROLL_UPS = ("telemetry.tasks.accounting_compute_pending", "finance.tasks.daily_usage_update")


class RollUps(threading.Thread):
    """What beat does every minute or two, every ``every_s`` here: account the finished
    attempts and roll them into DailyUsage. A broker that is down drops the trigger."""

    def __init__(self, broker_url: str, *, every_s: float):
        from celery import Celery

        super().__init__(daemon=True)
        self.broker_url, self.every_s = broker_url, every_s
        self.app = Celery("chaos-roll-ups", set_as_current=False)
        self._stopping = threading.Event()

    def run(self) -> None:
        from portal.task_queues import QUEUE_OF_TASK

        while not self._stopping.wait(self.every_s):
            # An explicit connection: CELERY_BROKER_URL in this process's environment (the
            # test's own Redis database) would win over any broker given to the app.
            with (
                contextlib.suppress(Exception),
                self.app.connection_for_write(self.broker_url) as conn,
            ):
                for task in ROLL_UPS:
                    self.app.send_task(task, connection=conn, queue=QUEUE_OF_TASK[task])

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)
        self.app.close()


SENT = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Scheduler: Sending due task "
)


def sends(beats: list[Process]) -> list[datetime]:
    """When the beats (every start of each) sent a periodic task, by their logs (written in
    this host's local time)."""
    return sorted(
        datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").astimezone()
        for beat in beats
        for line in beat.log_path.read_text().splitlines()
        if (found := SENT.match(line))
    )


def gap_across(times: list[datetime], moment: datetime) -> tuple[float, float]:
    """Seconds from the last of ``times`` before ``moment`` to the first after it, and from
    ``moment`` to that first one."""
    before = max(at for at in times if at <= moment)
    after = min(at for at in times if at > moment)
    return (after - before).total_seconds(), (after - moment).total_seconds()


def longest_gap(times: list[datetime], since: datetime, until: datetime) -> float:
    within = [at for at in times if since <= at <= until]
    return max((b - a).total_seconds() for a, b in itertools.pairwise(within))


def leading(beat: Process) -> bool:
    """Whether the beat, alive, last said (since its start) that it leads the schedule."""
    if not beat.alive:
        return False
    text = beat.log_since_start()
    return text.rfind("leads the schedule now") > text.rfind("lost the leader lock")


# --- the fake Kubernetes ----------------------------------------------------------------------


@contextlib.contextmanager
def running_fake_kubernetes(*, nodes: int = 4, runtime_s: float = 10**9) -> Iterator:
    """The fake Kubernetes API server (``K8S_TOKEN``) with ``nodes`` nodes of 8 A100s, its
    controller stepping every 0.1 s with real time: a backend whose times run ahead of
    Gantry's clock is not believed (tests/jobs/test_clock_skew.py). Jobs run ``runtime_s``."""
    from tests.k8s_fake import FakeKubernetes

    fake = FakeKubernetes(token=K8S_TOKEN, runtime_s=runtime_s).start()
    for index in range(nodes):
        fake.controller.add_node(f"gpu-{index}", product=A100, gpus=8)
    stopping = threading.Event()

    def step():
        while not stopping.wait(0.1):
            fake.controller.advance(0.1)

    stepper = threading.Thread(target=step, daemon=True)
    stepper.start()
    try:
        yield fake
    finally:
        stopping.set()
        stepper.join()
        fake.stop()


def kubernetes_settings(url: str) -> dict:
    return {
        "url": url,
        "token_env": K8S_TOKEN_ENV,
        "timeout_s": 5,
        "flavors": {K8S_FLAVOR: {"product": A100}},
        "ttl_seconds_after_finished": 30 * 86400,  # keep finished Jobs to count them
    }


def kubernetes_jobs(fake) -> list:
    """Every Gantry Job on the fake cluster, listed over HTTP by the official client."""
    from kubernetes import client

    configuration = client.Configuration(host=fake.url)
    configuration.api_key = {"authorization": K8S_TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    with client.ApiClient(configuration) as api:
        batch = client.BatchV1Api(api)
        return batch.list_job_for_all_namespaces(label_selector="gantry.io/attempt").items


# --- the world ---------------------------------------------------------------------------------


def run_body(index: int, *, on_kubernetes: bool, sim_duration_s: int) -> dict:
    """The API request of run ``index`` (``chaos-NNNN``) of researcher ``index % 4``."""
    _, tenant, project = RESEARCHERS[index % len(RESEARCHERS)]
    body = {
        "tenant": tenant,
        "project": project,
        "image": IMAGE,
        "command": "python train.py",
        "flavor": K8S_FLAVOR if on_kubernetes else SIM_FLAVOR,
        "nodes": 1,
        "gpus_per_node": 1,
        "name": f"chaos-{index:04d}",
    }
    if not on_kubernetes:
        body["env"] = {"GANTRY_SIM_DURATION_S": str(sim_duration_s)}
    return body


def _seed(kubernetes_url: str | None, sim_nodes: int) -> None:
    import django

    django.setup()
    from django.contrib.auth.models import User

    from clusters.models import Cluster
    from clusters.services import cluster_refresh_inventory
    from images.models import Image
    from tenants.models import GpuFlavor, Membership, Project, Quota, Tenant
    from tenants.services.tokens import api_token_create

    sim = GpuFlavor.objects.create(slug=SIM_FLAVOR, name="NVIDIA H100 80GB", memory_gb=80)
    k8s = GpuFlavor.objects.create(slug=K8S_FLAVOR, name="NVIDIA A100 80GB", memory_gb=80)
    repository, _, digest = IMAGE.partition("@")
    Image.objects.create(repository=repository, digest=digest, status=Image.Status.APPROVED)
    tokens = []
    for username, slug, project in RESEARCHERS:
        tenant, created = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})
        if created:
            Project.objects.create(tenant=tenant, slug=project, name=project)
            Quota.objects.create(tenant=tenant, flavor=sim, guaranteed_gpus=sim_nodes * 4)
            Quota.objects.create(tenant=tenant, flavor=k8s, guaranteed_gpus=16)
        user = User.objects.create_user(username=username, password="not-used-here")
        Membership.objects.create(user=user, tenant=tenant, role="researcher")
        tokens.append(api_token_create(user=user, name="chaos")[1])
    pools = [{"flavor": SIM_FLAVOR, "nodes": sim_nodes, "gpus_per_node": 8}]
    clusters = [(SIM_CLUSTER, Cluster.Backend.SIMULATOR, {"speedup": 1000, "pools": pools})]
    if kubernetes_url is not None:
        clusters.append(
            (K8S_CLUSTER, Cluster.Backend.KUBERNETES, kubernetes_settings(kubernetes_url))
        )
    for name, backend, settings in clusters:
        cluster_refresh_inventory(
            cluster=Cluster.objects.create(name=name, backend=backend, settings=settings)
        )
    print(json.dumps({"tokens": tokens}))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos_support")
    commands = parser.add_subparsers(dest="command", required=True)
    seed = commands.add_parser("seed")
    seed.add_argument("--kubernetes-url")
    seed.add_argument("--sim-nodes", type=int, default=64)
    args = parser.parse_args(argv)
    _seed(args.kubernetes_url, args.sim_nodes)


if __name__ == "__main__":
    main(sys.argv[1:])
