"""Redis gone for minutes (issue 39): a Gantry on 127.0.0.1 (gunicorn, one Celery worker,
one beat, all with Redis as broker, beat lock and cache, as in production) loses its Redis
for 150 s, and people keep submitting through the REST API meanwhile.

Exactly: every submission during the outage is answered 201 (or a retryable answer whose
retry with the same Idempotency-Key names the run) and recorded in PostgreSQL, QUEUED,
while no background work runs; the worker and the beat ride the outage out (no restart:
they retry the broker for as long as it takes, portal/settings.py); once Redis is back
(empty: it keeps nothing on disk), beat leads again, the periodic sync runs again, and every
run submitted during the outage is admitted and submitted to the simulated cluster within
60 s, then succeeds. The figures go to docs/reliability.md ("Redis gone for minutes").
"""

import json
import re
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection

from tests.chaos_support import (
    RETRYABLE_STATUSES,
    Heartbeats,
    Submissions,
    gunicorn,
    leading,
    run_body,
    web_ready,
)
from tests.crash_support import (
    ROOT,
    celery_beat,
    celery_worker,
    free_port,
    gantry_env,
    wait_ready,
    wait_until,
)
from tests.reliability_figures import figures_path, record_figures
from tests.throwaway_services import ThrowawayServices, clone_schema

OUTAGE_S = 150.0
RUNS_BEFORE = 4  # submitted and on the cluster before Redis goes: the stack works
RUNS_DURING = 12  # one every 10 s, from 10 s into the outage
PACE_S = 10.0
RESUME_WITHIN_S = 60.0
SIM_DURATION_S = 2000  # simulated seconds: 2 s at the simulator's speed-up of 1000
SUBMITTED = ("PENDING", "RUNNING", "SUCCEEDED")
CONNECTED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Connected to redis://"
)


def body_of(index: int) -> dict:
    return run_body(index, on_kubernetes=False, sim_duration_s=SIM_DURATION_S)


def _rows(servers: ThrowawayServices, sql: str, params: list | None = None) -> list[tuple]:
    with servers.connect() as conn:
        return conn.execute(sql, params or []).fetchall()


def _runs(servers: ThrowawayServices, first: int, count: int) -> dict[str, tuple]:
    """Runs ``chaos-{first}`` … by name: (id, idempotency key, state, attempts submitted)."""
    names = [body_of(index)["name"] for index in range(first, first + count)]
    rows = _rows(
        servers,
        "SELECT e.name, r.id, r.submission_key::text, r.state, "
        "count(a.id) FILTER (WHERE a.submitted_at IS NOT NULL) "
        "FROM jobs_run r JOIN jobs_experiment e ON e.id = r.experiment_id "
        "LEFT JOIN jobs_attempt a ON a.run_id = r.id "
        "WHERE e.name = ANY(%s) GROUP BY e.name, r.id ORDER BY e.name",
        [names],
    )
    return {name: tuple(rest) for name, *rest in rows}


def _all_submitted(servers: ThrowawayServices, first: int, count: int) -> bool:
    runs = _runs(servers, first, count)
    return len(runs) == count and all(
        state in SUBMITTED and submitted == 1 for _, _, state, submitted in runs.values()
    )


def _connections(log: Path) -> list[datetime]:
    """When the worker connected to the broker, by its log (written in local time)."""
    return [
        datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").astimezone()
        for line in log.read_text().splitlines()
        if (found := CONNECTED.match(line))
    ]


def _submit(stack: dict, first: int, count: int, *, pace_s: float) -> Submissions:
    return Submissions(
        base_url=stack["base_url"],
        tokens=stack["tokens"],
        body_of=lambda index: body_of(first + index),
        runs=count,
        rate_per_s=1 / pace_s,
        clients=2,
    ).start()


@pytest.fixture
def figures_file(tmp_path_factory) -> Path:
    return figures_path(tmp_path_factory.getbasetemp())


@pytest.mark.integration
@pytest.mark.timeout(480)  # the test's own waits fail first, saying what they waited for
def test_redis_gone_for_minutes_loses_no_submission_and_work_resumes(
    transactional_db, tmp_path, figures_file
):
    began = time.monotonic()
    source = dict(connection.settings_dict)  # the test database: its schema is migrated
    servers = ThrowawayServices.start(db_name="gantry_redis_outage")
    processes = []
    heartbeats = Heartbeats(servers)
    try:
        clone_schema(source=source, target=servers)
        env = gantry_env(
            database_url=servers.database_url,
            broker_url=servers.broker_url,
            data_dir=tmp_path,
            GANTRY_CACHE_URL=servers.broker_url.rsplit("/", 1)[0] + "/1",
            # Production's intervals: beat's admission cycle and sync are what resumes the
            # work once Redis is back (the messages sent meanwhile were dropped).
            GANTRY_ADMISSION_INTERVAL_S="5",
            GANTRY_SYNC_INTERVAL_S="3",
            GANTRY_TELEMETRY_INTERVAL_S="3600",
            GANTRY_WORKER_NICE="0",
        )
        seeded = subprocess.run(
            [sys.executable, "-m", "tests.chaos_support", "seed", "--sim-nodes", "4"],
            env=env, cwd=ROOT, check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        port = free_port()
        stack = {
            "tokens": json.loads(seeded.stdout.strip().splitlines()[-1])["tokens"],
            "base_url": f"http://127.0.0.1:{port}",
        }
        web = gunicorn(
            env=env, log_path=tmp_path / "gunicorn.log", port=port,
            access_log=tmp_path / "access.log",
        )  # fmt: skip
        worker = celery_worker(
            env=env, log_path=tmp_path / "worker.log", concurrency=2, kill_points=False
        )
        beat = celery_beat(env=env, log_path=tmp_path / "beat.log")
        processes = [web, worker, beat]
        for process in processes:
            process.start()
        wait_until(lambda: web_ready(stack["base_url"]), timeout=90, what="gunicorn to answer")
        wait_ready(worker, timeout=90)
        wait_until(lambda: leading(beat), timeout=60, what="the beat to lead")
        heartbeats.start()

        before = _submit(stack, 0, RUNS_BEFORE, pace_s=0.5)
        wait_until(before.finished, timeout=60, what="the runs before the outage answered")
        wait_until(
            lambda: _all_submitted(servers, 0, RUNS_BEFORE),
            timeout=60, interval=0.5, what="the runs before the outage on the cluster",
        )  # fmt: skip

        # Redis goes, for minutes; submissions go on.
        stopped_at, stopped = datetime.now(UTC), time.monotonic()
        servers.redis_stop()
        time.sleep(PACE_S)
        during = _submit(stack, RUNS_BEFORE, RUNS_DURING, pace_s=PACE_S)
        wait_until(during.finished, timeout=OUTAGE_S, what="the submissions during the outage")
        wait_until(lambda: time.monotonic() - stopped >= OUTAGE_S, timeout=OUTAGE_S, what="down")
        at_end_of_outage = _runs(servers, RUNS_BEFORE, RUNS_DURING)
        alive_at_end_of_outage = {p.log_path.stem: p.alive for p in processes}
        beat_log_offset = beat.log_path.stat().st_size
        servers.redis_start()
        restarted_at, restarted = datetime.now(UTC), time.monotonic()

        # Back: beat leads again, the sync runs again, the runs of the outage are admitted
        # and submitted.
        wait_until(
            lambda: b"leads the schedule now" in beat.log_path.read_bytes()[beat_log_offset:],
            timeout=RESUME_WITHIN_S, interval=0.25, what="the beat to lead again",
        )  # fmt: skip
        leads_again_s = time.monotonic() - restarted
        wait_until(
            lambda: _all_submitted(servers, RUNS_BEFORE, RUNS_DURING),
            timeout=RESUME_WITHIN_S, interval=0.25, what="the outage's runs on the cluster",
        )  # fmt: skip
        submitted_s = time.monotonic() - restarted
        wait_until(
            lambda: any(at > restarted_at for at in heartbeats.times),
            timeout=RESUME_WITHIN_S, interval=0.25, what="the periodic sync to run again",
        )  # fmt: skip
        sync_again_s = min(at for at in heartbeats.times if at > restarted_at)
        sync_again_s = (sync_again_s - restarted_at).total_seconds()

        def every_run_succeeded() -> bool:
            states = _rows(servers, "SELECT state, count(*) FROM jobs_run GROUP BY state")
            return states == [("SUCCEEDED", RUNS_BEFORE + RUNS_DURING)]

        wait_until(every_run_succeeded, timeout=RESUME_WITHIN_S, interval=0.5, what="success")
        succeeded_s = time.monotonic() - restarted
        after = _runs(servers, RUNS_BEFORE, RUNS_DURING)
        alive = {p.log_path.stem: p.alive for p in processes}
        starts = {p.log_path.stem: len(p.sessions) for p in processes}
    finally:
        heartbeats.stop()
        for process in reversed(processes):
            process.stop()
        servers.stop()

    answers = Counter(a.outcome for got in during.answers for a in got)
    syncs_while_down = [at for at in heartbeats.times if stopped_at < at < restarted_at]
    connected = _connections(worker.log_path)
    reconnected_s = (
        min(at for at in connected if at > restarted_at) - restarted_at
    ).total_seconds()
    record_figures(
        figures_file,
        "redis_outage",
        {
            "outage_s": restarted - stopped,
            "runs_submitted_during_outage": RUNS_DURING,
            "answers_during_outage": dict(answers),
            "requests_per_submission_max": max(len(got) for got in during.answers),
            "syncs_while_down": len(syncs_while_down),
            "alive_at_end_of_outage": alive_at_end_of_outage,
            "worker_reconnected_s": reconnected_s,
            "worker_connections": len(connected),
            "beat_leads_again_s": leads_again_s,
            "sync_again_s": sync_again_s,
            "runs_submitted_to_cluster_s": submitted_s,
            "runs_succeeded_s": succeeded_s,
            "wall_s": time.monotonic() - began,
        },
    )

    # During the outage: every submission answered 201 naming its run (a retryable answer
    # only before it, with the same key), while Redis was still down; each run recorded in
    # PostgreSQL under its key and still QUEUED: nothing in the background ran.
    names = [body_of(RUNS_BEFORE + index)["name"] for index in range(RUNS_DURING)]
    keys = dict(zip(names, during.keys, strict=True))
    assert all(final.outcome == "201" for final in during.final), answers
    assert all(
        a.outcome == "201" or not a.outcome.isdigit() or int(a.outcome) in RETRYABLE_STATUSES
        for got in during.answers
        for a in got
    ), answers
    assert max(final.at for final in during.final) < restarted
    assert at_end_of_outage == {
        name: (final.run_id, keys[name], "QUEUED", 0)
        for name, final in zip(keys, during.final, strict=True)
    }
    # No periodic sync ran while Redis was down (one already running when it went may end).
    assert [at for at in syncs_while_down if (at - stopped_at).total_seconds() > 5] == []
    # The worker and the beat rode it out: alive, never started again.
    assert alive_at_end_of_outage == {"gunicorn": True, "worker": True, "beat": True}
    assert alive == {"gunicorn": True, "worker": True, "beat": True}
    assert starts == {"gunicorn": 1, "worker": 1, "beat": 1}
    # The worker connected twice: at its start, and once Redis was back.
    assert len([at for at in connected if at < stopped_at]) == 1
    assert len([at for at in connected if at > restarted_at]) == 1
    # After it: the same runs, each submitted once, and every run succeeded.
    assert {name: (run_id, key, n) for name, (run_id, key, _, n) in after.items()} == {
        name: (run_id, key, 1) for name, (run_id, key, _, _) in at_end_of_outage.items()
    }
    assert max(leads_again_s, submitted_s, sync_again_s) <= RESUME_WITHIN_S
