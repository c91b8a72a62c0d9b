"""Chaos, all on 127.0.0.1 (issue 39, point 3): a replicated Gantry (gunicorn with 3 workers,
3 Celery workers, 2 beats) on a PostgreSQL and a Redis of its own takes a burst of 1,000
submissions through the REST API, with idempotency keys, while the simulator and a fake
Kubernetes cluster run them. Meanwhile, in turn: kill -9 of a web worker that has just
committed a run, kills -9 of Celery processes in the middle of submits (every point of a
submit, the pool process or the whole worker), kill -9 of the beat that leads, then Redis
and PostgreSQL restarted (PostgreSQL twice: stopped, then killed -9). Killed processes are
started again as a supervisor would; gunicorn's master replaces its worker itself.

Then, exactly: one run per idempotency key and every client's last answer names it (every
other answer invited a retry); one backend job per attempt, on each backend; every run's
timeline complete, no event twice; the budget ledger, the attempts' accounting and DailyUsage
agree to the GPU-second; periodic work back within 60 s of the beat's kill. The figures go
to docs/reliability.md ("Crashes and outages", tests/crash_support.py).
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.chaos_support import (
    K8S_CLUSTER,
    K8S_TOKEN,
    K8S_TOKEN_ENV,
    RETRYABLE_STATUSES,
    SIM_CLUSTER,
    CeleryKiller,
    Heartbeats,
    RollUps,
    Submissions,
    gap_across,
    gunicorn,
    kubernetes_jobs,
    leading,
    longest_gap,
    run_body,
    running_fake_kubernetes,
    sends,
    web_ready,
    web_workers,
)
from tests.chaos_web import KILL_POINT_ENV as WEB_KILL_POINT_ENV
from tests.crash_support import (
    KILL_POINTS_ENV,
    ROOT,
    KillSwitch,
    Process,
    celery_beat,
    celery_worker,
    free_port,
    gantry_env,
    percentile,
    wait_ready,
    wait_until,
)
from tests.reliability_figures import figures_path, record_figures
from tests.throwaway_services import ThrowawayServices, clone_schema

RUNS = 1000
RATE_PER_S = 14  # the burst lasts about 70 s: every failure below falls inside it
CLIENTS = 8
SIM_DURATION_S = 1000  # simulated seconds: 1 s at the simulator's speed-up of 1000
K8S_RUNTIME_S = 2.0
WEB_KILL_AFTER = 10  # runs answered
# (phase, target, run index): every point of a submit, on both backends (every tenth run,
# index % 10 == 5, runs on Kubernetes); the pool process, or the whole worker, whose message
# then stays unacknowledged in Redis until the sync re-drives the submit.
CELERY_KILLS = [
    ("before_backend", "pool", 20),
    ("before_ack", "pool", 25),
    ("after_backend", "worker", 30),  # the job exists, Gantry has not recorded it
    ("anywhere", "pool", 35),
    ("before_ack", "pool", 40),
    ("after_backend", "pool", 45),
    ("before_backend", "worker", 55),  # the attempt is claimed, no job yet
    ("anywhere", "pool", 60),
]
HOLD_SEQ = 100  # the submit held unacknowledged across the Redis restart (no kill)
HOLD_S = 3.0
REDIS_DOWN_S = 5.0  # submits go on meanwhile: recorded, their messages dropped and logged
POSTGRES_DOWN_S = 2.0
EXPECTED_TIMELINE = ["QUEUED", "ADMITTED", "SUBMITTING", "PENDING", "RUNNING", "SUCCEEDED"]
CHAOS_SUPPORT = [sys.executable, "-m", "tests.chaos_support"]


def on_kubernetes(index: int) -> bool:
    return index % 10 == 5


def body_of(index: int) -> dict:
    return run_body(index, on_kubernetes=on_kubernetes(index), sim_duration_s=SIM_DURATION_S)


class Stack:
    """The processes of the test and what it did to them."""

    def __init__(self, servers: ThrowawayServices, tmp_path: Path, kubernetes_url: str):
        self.servers, self.tmp_path = servers, tmp_path
        self.switch = KillSwitch(tmp_path / "kill-points")
        self.web_points = tmp_path / "web-kill-point"
        self.web_points.mkdir()
        cache = servers.broker_url.rsplit("/", 1)[0] + "/1"
        self.env = gantry_env(
            database_url=servers.database_url,
            broker_url=servers.broker_url,
            data_dir=tmp_path,
            GANTRY_CACHE_URL=cache,  # Redis, as in production: its restart is part of it
            # Production's intervals (gantry_env's are shorter): submits and ends start
            # admission cycles themselves, beat's are a backstop.
            GANTRY_ADMISSION_INTERVAL_S="5",
            GANTRY_SYNC_INTERVAL_S="3",
            # Telemetry is not what this test is about; the accounting it checks is of the
            # attempts' GPUs and times.
            GANTRY_TELEMETRY_INTERVAL_S="3600",
            # The stack shares the machine with the rest of the suite, not with users.
            GANTRY_WORKER_NICE="0",
            **{
                K8S_TOKEN_ENV: K8S_TOKEN,
                KILL_POINTS_ENV: str(self.switch.directory),
                WEB_KILL_POINT_ENV: str(self.web_points),
            },
        )
        seeded = subprocess.run(
            [*CHAOS_SUPPORT, "seed", "--kubernetes-url", kubernetes_url],
            env=self.env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.tokens = json.loads(seeded.stdout.strip().splitlines()[-1])["tokens"]
        self.base_url = f"http://127.0.0.1:{free_port()}"
        port = int(self.base_url.rsplit(":", 1)[1])
        self.web = gunicorn(
            env=self.env,
            log_path=tmp_path / "gunicorn.log",
            port=port,
            access_log=tmp_path / "access.log",
        )
        self.workers = [
            celery_worker(
                env=self.env, log_path=tmp_path / f"worker-{n}.log", concurrency=2, kill_points=True
            )
            for n in range(3)
        ]
        self.beats = [celery_beat(env=self.env, log_path=tmp_path / f"beat-{n}.log") for n in "ab"]
        self.processes: list[Process] = [self.web, *self.workers, *self.beats]
        self.killer = CeleryKiller(
            self.switch,
            {
                seq: (phase, target, body_of(index)["name"])
                for seq, (phase, target, index) in enumerate(CELERY_KILLS)
            },
            self.workers,
        )
        self.events: dict[str, float] = {}  # what happened, seconds after the burst began
        self.windows: dict[str, tuple[float, float]] = {}  # each server's downtime

    def start(self) -> None:
        for process in self.processes:
            process.start()
        wait_until(lambda: web_ready(self.base_url), timeout=90, what="gunicorn to answer")
        for worker in self.workers:
            wait_ready(worker, timeout=90)
        wait_until(
            lambda: (
                sum(map(leading, self.beats)) == 1
                and all("stands by" in b.log_since_start() for b in self.beats if not leading(b))
            ),
            timeout=60,
            what="one beat leading, the other standing by",
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def kill_a_web_worker(self, submissions: Submissions) -> dict:
        """kill -9 of the gunicorn worker that has just committed a run, before it answered."""
        wait_until(lambda: submissions.answered() >= WEB_KILL_AFTER, timeout=60, what="runs")
        (self.web_points / "plan").write_text("armed")
        reached = self.web_points / "reached"
        wait_until(reached.exists, timeout=30, what="a gunicorn worker at its kill point")
        pid, key = reached.read_text().split()
        assert int(pid) in web_workers(self.web)
        os.kill(int(pid), signal.SIGKILL)
        self.events["web worker killed"] = time.monotonic() - submissions.began
        wait_until(
            lambda: len(web_workers(self.web)) == 3 and int(pid) not in web_workers(self.web),
            timeout=30,
            what="gunicorn's master to replace its worker",
        )
        return {"pid": int(pid), "index": submissions.keys.index(key)}

    def kill_the_leading_beat(self, submissions: Submissions) -> dict:
        """kill -9 of the beat that leads, started again at once; how long until a beat
        leads again, by their logs."""
        leader = next(beat for beat in self.beats if leading(beat))
        standby = next(beat for beat in self.beats if beat is not leader)
        killed_at, killed = datetime.now(UTC), time.monotonic()
        leader.kill()
        self.events["leading beat killed"] = killed - submissions.began
        leader.start()  # as its supervisor would: it stands by, or takes over
        new_leader = wait_until(
            lambda: next((beat for beat in self.beats if leading(beat)), None),
            timeout=90,
            interval=0.1,
            what="a beat to lead again",
        )
        return {
            "killed_at": killed_at,
            "takeover_s": time.monotonic() - killed,
            "taken_over_by": "the standby" if new_leader is standby else "the restarted beat",
        }

    def restart(self, what: str, stop, start, submissions: Submissions, *, down_s: float) -> None:
        stopped = time.monotonic()
        stop()
        # Down a while: every process notices, and keeps trying meanwhile.
        wait_until(lambda: time.monotonic() - stopped >= down_s, timeout=down_s + 1, what="down")
        start()
        self.windows[what] = (stopped, time.monotonic())
        self.events[f"{what} done"] = time.monotonic() - submissions.began

    def restart_redis_while_a_submit_is_unacknowledged(self, submissions: Submissions) -> None:
        """Redis restarted while a worker holds a submit's message unacknowledged: the
        sixth simulator run that waits for its submit, or a run not yet sent."""
        waiting = [
            name
            for (name,) in _rows(
                self.servers,
                "SELECT e.name FROM jobs_run r JOIN jobs_experiment e ON e.id = r.experiment_id "
                "WHERE r.state IN ('QUEUED', 'ADMITTED') ORDER BY r.id",
            )
            if not on_kubernetes(int(name.removeprefix("chaos-")))
        ]
        later = (i for i in range(submissions.answered() + 20, RUNS) if not on_kubernetes(i))
        name = waiting[5] if len(waiting) > 5 else body_of(next(later, RUNS - 1))["name"]
        self.switch.plan(HOLD_SEQ, "before_ack", name, wait_s=HOLD_S)
        wait_until(
            lambda: any(r.seq == HOLD_SEQ for r in self.switch.reached()),
            timeout=60,
            what=f"the submit of {name} held before its ack",
        )
        self.restart(
            "Redis stop + start",
            self.servers.redis_stop,
            self.servers.redis_start,
            submissions,
            down_s=REDIS_DOWN_S,
        )


def _rows(servers: ThrowawayServices, sql: str) -> list[tuple]:
    with servers.connect() as conn:
        return conn.execute(sql).fetchall()


def _accounted(servers: ThrowawayServices) -> bool:
    ((rows, accounted_s),) = _rows(
        servers,
        "SELECT count(*), COALESCE(sum(allocated_gpu_s), 0)::bigint "
        "FROM telemetry_attemptaccounting",
    )
    ((daily_s,),) = _rows(
        servers, "SELECT COALESCE(sum(allocated_gpu_s), 0)::bigint FROM telemetry_dailyusage"
    )
    return rows == RUNS and daily_s == accounted_s


def _collect(servers: ThrowawayServices, fake) -> dict:
    """Everything the assertions read, from the database and the backends themselves."""
    k8s_jobs = kubernetes_jobs(fake)
    return {
        "runs": _rows(
            servers,
            "SELECT r.id, e.name, r.submission_key::text, r.gpus, r.state FROM jobs_run r "
            "JOIN jobs_experiment e ON e.id = r.experiment_id ORDER BY e.name",
        ),
        "attempts": _rows(
            servers,
            "SELECT a.id, a.run_id, c.name, t.slug, a.backend_job_id, a.submitted_at, "
            "a.started_at, a.finished_at FROM jobs_attempt a "
            "JOIN jobs_cluster c ON c.id = a.cluster_id JOIN jobs_run r ON r.id = a.run_id "
            "JOIN tenants_tenant t ON t.id = r.tenant_id",
        ),
        "sim_jobs": _rows(servers, "SELECT name, id FROM jobs_simulatedjob"),
        "k8s_jobs": Counter(job.metadata.name for job in k8s_jobs),
        "k8s_succeeded": sum(1 for job in k8s_jobs if job.status.succeeded == 1),
        "events": _rows(
            servers,
            "SELECT run_id, from_state, to_state, message FROM jobs_runevent ORDER BY at, id",
        ),
        "ledger_s": _rows(
            servers, "SELECT COALESCE(sum(gpu_seconds), 0) FROM jobs_tenantmonthusage"
        )[0][0],
        "accounting": _rows(
            servers,
            "SELECT attempt_id, allocated_gpu_s, effective_gpu_s + lost_gpu_s + startup_gpu_s "
            "+ checkpoint_gpu_s + interactive_idle_gpu_s + idle_gpu_s + input_wait_gpu_s "
            "+ comm_wait_gpu_s FROM telemetry_attemptaccounting",
        ),
        "daily_s": _rows(
            servers, "SELECT COALESCE(sum(allocated_gpu_s), 0)::bigint FROM telemetry_dailyusage"
        )[0][0],
    }


@pytest.fixture
def figures_file(tmp_path_factory) -> Path:
    return figures_path(tmp_path_factory.getbasetemp())


def _chaos(servers: ThrowawayServices, fake, tmp_path: Path) -> dict:
    """Start the stack, submit the burst and do every harm in turn; once every run has
    succeeded and is accounted, what the assertions read."""
    stack = Stack(servers, tmp_path, fake.url)
    heartbeats, roll_ups = Heartbeats(servers), RollUps(servers.broker_url, every_s=10.0)
    threads = []
    cpu_began = time.process_time()
    try:
        stack.start()
        submissions = Submissions(
            base_url=stack.base_url,
            tokens=stack.tokens,
            body_of=body_of,
            runs=RUNS,
            rate_per_s=RATE_PER_S,
            clients=CLIENTS,
        )
        stack.killer.arm()
        for thread in (heartbeats, roll_ups, stack.killer):
            thread.start()
            threads.append(thread)
        burst_began = datetime.now(UTC)
        submissions.start()
        web_kill = stack.kill_a_web_worker(submissions)
        wait_until(stack.killer.done, timeout=120, what="every planned Celery kill")
        stack.events["Celery kills done"] = time.monotonic() - submissions.began
        beat_kill = stack.kill_the_leading_beat(submissions)
        stack.restart_redis_while_a_submit_is_unacknowledged(submissions)
        for what, stop, threshold in (
            ("PostgreSQL stop + start", servers.postgres_stop, 0.8),
            ("PostgreSQL kill -9 + start", servers.postgres_kill, 0.9),
        ):
            wait_until(
                lambda threshold=threshold: submissions.answered() >= RUNS * threshold,
                timeout=120,
                what=f"{threshold:.0%} of the runs answered",
            )
            stack.restart(what, stop, servers.postgres_start, submissions, down_s=POSTGRES_DOWN_S)
        last_restart = time.monotonic()
        wait_until(submissions.finished, timeout=240, what="every client to be answered")

        def succeeded() -> bool:
            states = _rows(servers, "SELECT state, count(*) FROM jobs_run GROUP BY state")
            return states == [("SUCCEEDED", RUNS)]

        wait_until(succeeded, timeout=180, interval=0.5, what="every run to succeed")
        converged_s = time.monotonic() - last_restart
        wait_until(
            lambda: _accounted(servers), timeout=120, interval=0.5, what="every attempt accounted"
        )
        replays = submissions.replay(range(0, RUNS, 20))
        ended = datetime.now(UTC)
        sent = sends(stack.beats)
        return _collect(servers, fake) | {
            "stack": stack,
            "submissions": submissions,
            "web_kill": web_kill,
            "beat_kill": beat_kill,
            "burst_s": max(a.at for a in submissions.final) - submissions.began,
            "converged_s": converged_s,
            "replays": replays,
            "alive": {process.log_path.stem: process.alive for process in stack.processes},
            "starts": {process.log_path.stem: len(process.sessions) for process in stack.processes},
            # Periodic work: beat's sends, and the sync's runs (what it writes).
            "sends_across_kill_s": gap_across(sent, beat_kill["killed_at"]),
            "syncs_across_kill_s": gap_across(heartbeats.times, beat_kill["killed_at"]),
            "longest_send_gap_s": longest_gap(sent, burst_began, ended),
            "longest_sync_gap_s": longest_gap(heartbeats.times, burst_began, ended),
            "cpu_s": {
                "gunicorn": stack.web.cpu_s(),
                "Celery workers": sum(worker.cpu_s() for worker in stack.workers),
                "beats": sum(beat.cpu_s() for beat in stack.beats),
                "PostgreSQL": servers.postgres_cpu_s(),
                "the test (clients, fake Kubernetes)": time.process_time() - cpu_began,
            },
        }
    finally:
        for thread in reversed(threads):
            thread.stop()
        stack.switch.cancel_plans()
        stack.stop()


def _timelines(events: list[tuple]) -> dict[int, list[str]]:
    """Each run's state changes in order (events that change nothing left out)."""
    timelines: dict[int, list[str]] = {}
    for run_id, from_state, to_state, _ in events:
        if from_state != to_state:
            timelines.setdefault(run_id, []).append(to_state)
    return timelines


def _clients_with_their_run(submissions: Submissions, run_of_key: dict) -> int:
    """Clients whose last answer named their key's run, whose every 201 named it, and whose
    every other answer invited a retry."""
    return sum(
        1
        for key, answers in zip(submissions.keys, submissions.answers, strict=True)
        if answers[-1].outcome == "201"
        and {a.run_id for a in answers if a.outcome == "201"} == {run_of_key.get(key)}
        and all(
            a.outcome == "201" or not a.outcome.isdigit() or int(a.outcome) in RETRYABLE_STATUSES
            for a in answers
        )
    )


@pytest.mark.integration
@pytest.mark.timeout(600)  # the test's own waits fail first, saying what they waited for
def test_chaos_loses_no_run_job_event_or_gpu_second(transactional_db, tmp_path, figures_file):
    began = time.monotonic()
    source = dict(connection.settings_dict)  # the test database: its schema is migrated
    servers = ThrowawayServices.start(db_name="gantry_chaos")
    try:
        clone_schema(source=source, target=servers)
        with servers.connect() as conn:
            # The throwaway server runs with synchronous_commit = off (for speed); a crash
            # could then lose commits it acknowledged: not for this database.
            conn.execute(f'ALTER DATABASE "{servers.db_name}" SET synchronous_commit = on')
        with running_fake_kubernetes(runtime_s=K8S_RUNTIME_S) as fake:
            found = _chaos(servers, fake, tmp_path)
    finally:
        servers.stop()

    stack, submissions = found["stack"], found["submissions"]
    runs, attempts, accounting = found["runs"], found["attempts"], found["accounting"]
    run_of_key = {key: run_id for run_id, _, key, _, _ in runs}
    run_of_name = {name: run_id for run_id, name, _, _, _ in runs}
    gpus_of_run = {run_id: run_gpus for run_id, _, _, run_gpus, _ in runs}
    timelines = _timelines(found["events"])
    expected = Counter(EXPECTED_TIMELINE)
    lost = sum(
        sum((expected - Counter(timelines.get(r, []))).values()) for r in run_of_key.values()
    )
    duplicated = sum(sum((Counter(t) - expected).values()) for t in timelines.values())
    sim_ids = dict(found["sim_jobs"])
    sim_jobs = Counter(name for name, _ in found["sim_jobs"])
    k8s_jobs = found["k8s_jobs"]
    sim_attempts = [a for a in attempts if a[2] == SIM_CLUSTER]
    k8s_attempts = [a for a in attempts if a[2] == K8S_CLUSTER]
    jobs_per_attempt = [sim_jobs[f"gantry-a{a[0]}"] for a in sim_attempts] + [
        k8s_jobs[f"gantry-a{a[0]}"] for a in k8s_attempts
    ]
    attempts_s = sum(
        gpus_of_run[run] * (end - start).total_seconds() for _, run, *_, start, end in attempts
    )
    submitted_at = {a[0]: a[5] for a in attempts}
    recoveries = [
        (submitted_at[k.attempt_id] - k.at).total_seconds()
        for k in stack.killer.kills.values()
        if submitted_at.get(k.attempt_id) and submitted_at[k.attempt_id] > k.at
    ]
    beat_kill, replays = found["beat_kill"], found["replays"]
    answers = Counter(a.outcome for got in submissions.answers for a in got)
    record_figures(
        figures_file,
        "chaos",
        {
            "runs": RUNS,
            "rate_per_s": RATE_PER_S,
            "clients": CLIENTS,
            "k8s_runs": len(k8s_attempts),
            "burst_s": found["burst_s"],
            "events": stack.events,
            "answers": dict(answers),
            "retried_after": dict(
                Counter(a.outcome for got in submissions.answers for a in got[:-1])
            ),
            "web_kill_answers": [
                a.outcome for a in submissions.answers[found["web_kill"]["index"]]
            ],
            "runs_in_database": len(runs),
            "keys": len(run_of_key),
            "runs_succeeded": sum(1 for *_, state in runs if state == "SUCCEEDED"),
            "clients_with_their_run": _clients_with_their_run(submissions, run_of_key),
            "replays": len(replays),
            "replays_same_run": sum(
                1 for i, a in replays.items() if a.run_id == submissions.final[i].run_id
            ),
            "celery_kills": [
                f"{k.phase} {k.target}" for k in sorted(stack.killer.kills.values(), key=str)
            ],
            "worker_restarts": stack.killer.restarts,
            "adopted_by_sync": sum(
                1 for *_, message in found["events"] if message.endswith("(found by the sync)")
            ),
            "recovery_p50_s": percentile(recoveries, 0.5) if recoveries else 0.0,
            "recovery_max_s": max(recoveries, default=0.0),
            "beat_lock_ttl_s": settings.GANTRY_BEAT_LOCK_TTL_S,
            "beat_lock_poll_s": settings.GANTRY_BEAT_LOCK_POLL_S,
            "takeover_s": beat_kill["takeover_s"],
            "taken_over_by": beat_kill["taken_over_by"],
            "sends_gap_s": found["sends_across_kill_s"][0],
            "sends_back_after_s": found["sends_across_kill_s"][1],
            "syncs_gap_s": found["syncs_across_kill_s"][0],
            "syncs_back_after_s": found["syncs_across_kill_s"][1],
            "longest_send_gap_s": found["longest_send_gap_s"],
            "longest_sync_gap_s": found["longest_sync_gap_s"],
            "downtime": {what: end - start for what, (start, end) in stack.windows.items()},
            "answers_while_down": {
                what: dict(
                    Counter(
                        a.outcome
                        for got in submissions.answers
                        for a in got
                        if start <= a.at <= end
                    )
                )
                for what, (start, end) in stack.windows.items()
            },
            "converged_after_last_restart_s": found["converged_s"],
            "jobs_per_attempt_min": min(jobs_per_attempt),
            "jobs_per_attempt_max": max(jobs_per_attempt),
            "events_lost": lost,
            "events_duplicated": duplicated,
            "ledger_gpu_s": float(found["ledger_s"]),
            "attempts_gpu_s": attempts_s,
            "accounting_rows": len(accounting),
            "accounting_gpu_s": sum(allocated for _, allocated, _ in accounting),
            "daily_usage_gpu_s": found["daily_s"],
            "cpu_s": found["cpu_s"],
            "wall_s": time.monotonic() - began,
        },
    )

    # Every process, or its restart, rode it out; only the killed ones were started again
    # (the web worker by its master), none for the server restarts.
    assert all(found["alive"].values()), found["alive"]
    worker_kills = Counter(k.target for k in stack.killer.kills.values())["worker"]
    assert sum(found["starts"][f"worker-{n}"] for n in range(3)) == 3 + worker_kills
    assert sorted(found["starts"][f"beat-{n}"] for n in "ab") == [1, 2]
    assert found["starts"]["gunicorn"] == 1
    # One run per key, named as its client named it; each client's last answer is a 201
    # naming that run, every 201 it got named the same run, every other answer invited a
    # retry; requests sent again with the same keys afterwards name the same runs.
    assert len(runs) == len(run_of_key) == RUNS
    assert sorted(run_of_key) == sorted(submissions.keys)
    assert run_of_name == {
        body_of(i)["name"]: run_of_key[key] for i, key in enumerate(submissions.keys)
    }
    assert _clients_with_their_run(submissions, run_of_key) == RUNS
    assert {i: a.run_id for i, a in replays.items()} == {
        i: run_of_key[submissions.keys[i]] for i in replays
    }
    # The only server errors were 503s, which say to send the request again.
    assert {o for o in answers if o.isdigit() and o != "201"} <= {"503"}, answers
    # The killed web worker had committed its run: its client's retry got that run.
    assert submissions.answers[found["web_kill"]["index"]][0].outcome == "ConnectionError"
    # Every run succeeded with one attempt, and each attempt has exactly one job on its
    # backend, recorded on it; nothing else is there.
    assert {state for *_, state in runs} == {"SUCCEEDED"}
    assert Counter(a[1] for a in attempts) == dict.fromkeys(run_of_key.values(), 1)
    assert len(k8s_attempts) == sum(map(on_kubernetes, range(RUNS)))
    assert sim_jobs == Counter(f"gantry-a{a[0]}" for a in sim_attempts)
    assert k8s_jobs == Counter(f"gantry-a{a[0]}" for a in k8s_attempts)
    assert found["k8s_succeeded"] == len(k8s_attempts)
    for attempt_id, _, _, _, job_id, *_ in sim_attempts:
        assert job_id == str(sim_ids[f"gantry-a{attempt_id}"])
    for attempt_id, _, _, tenant, job_id, *_ in k8s_attempts:
        assert job_id == f"gantry-{tenant}/gantry-a{attempt_id}"
    assert len(stack.killer.kills) == len(CELERY_KILLS)
    # Every run went through each state once: no event lost, none written twice.
    assert {r: t for r, t in timelines.items() if t != EXPECTED_TIMELINE} == {}
    assert (lost, duplicated) == (0, 0)
    # Accounting: the budget ledger holds every finished attempt once; each attempt has its
    # accounting, whose categories add up; DailyUsage adds up to the accounting.
    assert abs(float(found["ledger_s"]) - attempts_s) < 1e-6
    assert sorted(a for a, _, _ in accounting) == sorted(a[0] for a in attempts)
    assert all(allocated == parts for _, allocated, parts in accounting)
    assert found["daily_s"] == sum(allocated for _, allocated, _ in accounting)
    # Periodic work came back within 60 s of the leading beat's kill: beat's sends (as
    # after every outage), and the sync they trigger. (A sync waits behind the submits
    # queued before it, in the queue they share: its longest gap is a figure, not a bound.)
    assert found["sends_across_kill_s"][1] <= 60
    assert found["longest_send_gap_s"] <= 60
    assert found["syncs_across_kill_s"][1] <= 60
