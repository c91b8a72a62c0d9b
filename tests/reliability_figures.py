"""The figures the crash tests record (tests/portal/test_chaos.py,
tests/portal/test_crash_recovery.py) and the "Crashes and outages" section of
docs/reliability.md written from them.

The tests write their figures to ``$GANTRY_RELIABILITY_FIGURES`` (a JSON file), else to a file
in pytest's temporary directory; ``python -m tests.reliability_figures FIGURES.json`` writes
the section from such a file.
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELIABILITY_DOC = ROOT / "docs" / "reliability.md"
SECTION = "## Crashes and outages"
INTRO = """# Reliability

How Gantry behaves under load and when parts of it fail, measured by tests that run in CI.
Each section says how its figures were produced.
"""


def figures_path(default_dir: Path) -> Path:
    configured = os.environ.get("GANTRY_RELIABILITY_FIGURES")
    return Path(configured) if configured else default_dir / "crash-figures.json"


def measured_on() -> dict:
    import platform
    from datetime import UTC, datetime

    import celery

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, Python "
        f"{platform.python_version()}, Celery {celery.__version__}",
    }


def record_figures(path: Path, scenario: str, figures: dict) -> None:
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[scenario] = figures | measured_on()
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
    print(f"\n[{scenario}] " + json.dumps(figures, sort_keys=True))


def _s(value: float) -> str:
    return f"{value:.1f} s"


def _counts(counts: dict) -> str:
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return ", ".join(f"{what} × {n:,}" for what, n in ordered) or "none"


def _chaos(c: dict) -> list[str]:
    events = "; ".join(
        f"{what} at {s:.0f} s" for what, s in sorted(c["events"].items(), key=lambda e: e[1])
    )
    cpu = ", ".join(f"{what} {s:.0f} s" for what, s in c["cpu_s"].items())
    downtime = ", ".join(f"{what} {s:.1f} s" for what, s in c["downtime"].items())
    return [
        "### Chaos: 1,000 submissions while each part fails in turn",
        "",
        "`tests/portal/test_chaos.py`, on 127.0.0.1: gunicorn (one master, 3 sync workers;",
        "the portal behind a kill point, `tests/chaos_web.py`), 3 Celery workers of 2 pool",
        "processes each on every queue, 2 beats (one leads, `portal/beat.py`), and a",
        "PostgreSQL and a Redis of the test's own (`tests/throwaway_services.py`; the",
        "database with `synchronous_commit = on`, Redis keeping nothing on disk, and the",
        "cache on Redis too, as in production). The simulator (1,000× real time) runs most",
        "runs, the fake Kubernetes API server (`tests/k8s_fake`) every tenth; each run takes",
        "one GPU for a second or two. Beat runs the admission cycle every 5 s and the sync",
        "every 3 s, production's intervals; telemetry collection is off (the accounting checked",
        "is of GPUs and times); the test triggers accounting and DailyUsage every 10 s.",
        f"The clients, {c['clients']} threads, submit {c['runs']:,} runs through",
        "`POST /api/v1/runs/`,",
        f"at most {c['rate_per_s']} a second, each with its own `Idempotency-Key`, and send the",
        "same request with the same key again after a connection error, a timeout, a 5xx or",
        "a 429, keeping every answer. Meanwhile, in turn: kill -9 of the gunicorn worker",
        "that has just committed a run, before it answers (its master starts another);",
        "kill -9 of Celery processes in the middle of submits, at every point of a submit",
        "(`tests/crash_support.py`: before the backend call, after it, before the ack,",
        "anywhere), of the pool process and of the whole worker (started again at once, as",
        "a supervisor would), on both backends; kill -9 of the beat that leads (started",
        "again at once); Redis stopped for 5 s and started while a submit holds its message",
        "unacknowledged; PostgreSQL stopped and started, then killed -9 and started. Then",
        "exact counts from the database, the simulator's job table and the Kubernetes API",
        "(listed over HTTP by the official client); any difference fails the test.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| runs submitted; of them on Kubernetes | {c['runs']:,}; {c['k8s_runs']} |",
        f"| burst: first request to last answer | {_s(c['burst_s'])} |",
        f"| when (seconds after the burst began) | {events} |",
        f"| answers the clients got | {_counts(c['answers'])} |",
        f"| requests sent again, by the answer before them | {_counts(c['retried_after'])} |",
        "| the client whose web worker was killed after the commit | "
        f"{' then '.join(c['web_kill_answers'])}: the run committed before the kill |",
        "| runs in the database / distinct keys / SUCCEEDED | "
        f"{c['runs_in_database']:,} / {c['keys']:,} / {c['runs_succeeded']:,} |",
        "| every client's last answer named its key's run; every 201 it got, the same | "
        f"{c['clients_with_their_run']:,} of {c['runs']:,} |",
        f"| requests sent again after the end, same keys: same run | {c['replays_same_run']} "
        f"of {c['replays']} |",
        f"| Celery kills (point, victim) | {', '.join(c['celery_kills'])} |",
        "| processes started again (supervisor) | "
        f"{c['worker_restarts']} Celery workers, 1 beat; none for the server restarts |",
        f"| submits recorded by the sync that found their job | {c['adopted_by_sync']} |",
        "| from a kill to the job recorded, p50 / max | "
        f"{_s(c['recovery_p50_s'])} / {_s(c['recovery_max_s'])} |",
        f"| takeover after the leading beat's kill -9 (lock TTL {c['beat_lock_ttl_s']} s, "
        f"poll {c['beat_lock_poll_s']} s) | {_s(c['takeover_s'])}, by {c['taken_over_by']} |",
        "| periodic work across that kill, gap / back after the kill: beat's sends; the "
        f"sync's runs | {_s(c['sends_gap_s'])} / {_s(c['sends_back_after_s'])}; "
        f"{_s(c['syncs_gap_s'])} / {_s(c['syncs_back_after_s'])} |",
        "| longest gap of periodic work in the whole test: beat's sends; the sync's runs | "
        f"{_s(c['longest_send_gap_s'])}; {_s(c['longest_sync_gap_s'])} |",
        f"| downtime | {downtime} |",
        "| answers while each server was down | "
        + "; ".join(f"{what}: {_counts(got)}" for what, got in c["answers_while_down"].items())
        + " |",
        "| backend jobs per attempt (min / max); attempts per run | "
        f"{c['jobs_per_attempt_min']} / {c['jobs_per_attempt_max']}; 1 |",
        f"| run events lost / duplicated | {c['events_lost']} / {c['events_duplicated']} |",
        "| budget ledger (TenantMonthUsage) / Σ attempts' GPU × (end − start) | "
        f"{c['ledger_gpu_s']:.3f} / {c['attempts_gpu_s']:.3f} GPU-s |",
        "| attempt accounting rows; DailyUsage / accounting, allocated | "
        f"{c['accounting_rows']:,}; {c['daily_usage_gpu_s']:,} / {c['accounting_gpu_s']:,} GPU-s |",
        "| from the last restart until every run had succeeded | "
        f"{_s(c['converged_after_last_restart_s'])} |",
        f"| CPU used, from the stack's start | {cpu} |",
        f"| the whole test | {_s(c['wall_s'])} |",
        "",
        f"The test is bound by CPU: {sum(c['cpu_s'].values()):.0f} CPU-seconds in all, about",
        "a fifth of a CPU-second per run across gunicorn, the workers and PostgreSQL, and some",
        "50 s to start its processes. On 2 cores shared with the rest of the suite the burst",
        "takes longer than the clients' pace alone would, and the runs finish after it.",
        "",
    ]


def _outage(o: dict) -> list[str]:
    return [
        "### Backend unreachable",
        "",
        "`tests/portal/test_crash_recovery.py`: the fake Kubernetes API server is stopped",
        "while runs run, new runs are submitted, and it comes back on the same port.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| runs running / submitted during the outage | {o['running_at_outage']} / "
        f"{o['submitted_during_outage']} |",
        f"| outage | {_s(o['outage_s'])} |",
        f'| attempts showing "backend unreachable" (run page) | {o["attempts_reporting"]} '
        f"of {o['runs']} |",
        "| from the server's return until every run ran again, errors cleared | "
        f"{_s(o['converged_after_return_s'])} |",
        "| Kubernetes Jobs per attempt (min / max); runs SUCCEEDED | "
        f"{o['jobs_per_attempt_min']} / {o['jobs_per_attempt_max']}; "
        f"{o['runs_succeeded']} of {o['runs']} |",
        f"| run events lost / duplicated | {o['events_lost']} / {o['events_duplicated']} |",
        "",
    ]


FOUND = """### What the scenarios found

Fixed, each with a regression test of its own:

- **The re-drive of submits flooded the queue** (the chaos test;
  `tests/jobs/test_submit_redrive.py`). Every sync re-sent every submit older than 30 s,
  so a burst that queued hundreds of submits behind each other had them all sent again
  every second, faster than the workers could take them: 7,913 messages in the queue for
  522 waiting submits, and the burst never drained. A submit is now re-driven 30 s after
  its admission, then after waits that double (60, 120, 240 s, then every 5 minutes), each
  re-drive recorded under a row lock before it is sent.
- **Copies of the sync piled up** (the chaos test; `tests/jobs/test_sync_copies.py`). A
  sync slower than its interval, and the burst of submits the syncs share their queue
  with, had 46 copies of the sync waiting at once, each a full sync when a worker reached
  it, and the submits behind them waited. A sync that starts within half an interval of
  the last one's start now skips. (Expiring the copies instead, tried first, dropped every
  one of them while submits kept the queue busy: no run moved on.)
- **Accounting passes did each other's work** (the chaos test;
  `tests/telemetry/test_accounting_passes.py`). Passes running at once each computed every
  pending attempt: 3,465 computations for 1,000 attempts. They now take the pending
  attempts in chunks under row locks the others skip.
- **A job found by the sync was never recorded.** When the worker died after the
  backend created the job, the next sync (the simulator and Slurm find jobs by name)
  moved the attempt to RUNNING without its job id, its submission time or the run's
  PENDING event. The sync now records the acceptance exactly as the submit would
  (event "… (found by the sync)"; `tests/portal/test_crash_recovery.py`).
- **A broker outage failed submits that had been recorded.** The message to Redis
  is sent after the commit; when Redis was down, the error reached the caller: an
  error page or API answer for a run that existed, inviting a second submit.
  Messages are now sent with `on_commit(robust=True)`: logged; beat makes up for them.
- **Running runs did not say "backend unreachable".** The sync refreshed the
  inventory first; when that failed, the sync that records the error on every live
  attempt was skipped. The sync now comes first.
- **A Redis restart could stop a Celery worker.** Celery 5.7.0 closes the collected
  broker connection after a connection loss; with Redis and an unacknowledged
  (`acks_late`) task this raises AttributeError and the worker exits
  ("Unrecoverable error"). Celery is held below 5.7 (pyproject.toml).
- **Settings.** Workers and beat retry the broker for as long as it takes, also at
  start; a PostgreSQL that does not answer fails a connection in 10 s (libpq would
  wait forever). Django's `CONN_HEALTH_CHECKS` already replaces a web process's
  stale connection after a PostgreSQL restart; workers open one per task.

Not fixed (open points):

- **Cancels are not re-driven.** A cancel or a preemption whose message is lost (a
  whole worker killed, Redis restarted) waits for Redis's visibility timeout (1 h)
  or, if Redis lost it, for the job to end by itself.
- **A submit that keeps failing retries on every copy.** A re-driven submit whose first
  task is still retrying against an unreachable backend (with backoff, up to 60 s apart)
  retries too; the doubling waits bound the copies to a handful per attempt, not one.
- **The sync waits behind queued submits.** It shares the backend queue with them, so a
  burst of submits delays it: in the chaos test beat kept sending it every 3 s, yet the
  longest gap between two syncs that ran was the figure above. Its own queue, taken by the
  backend workers too, would let it overtake them.
- **A new pool process imports the Kubernetes client's API classes on first use**
  (1.5-7 s on this machine) before its first Kubernetes call; the test worker loads
  them before forking its pool, as a production worker could.
"""


def render_section(figures: dict) -> str:
    chaos, outage = figures["chaos"], figures["backend_outage"]
    lines = [
        SECTION,
        "",
        "Scenarios with real processes, marked `integration`, part of `make test`. The tests",
        "write their figures to `$GANTRY_RELIABILITY_FIGURES` (a JSON file);",
        "`python -m tests.reliability_figures FIGURES.json` writes them here. These are from",
        f"a run on {chaos['date']} ({chaos['machine']}), shared with other work.",
        "",
        *_chaos(chaos),
        *_outage(outage),
        FOUND,
    ]
    return "\n".join(lines)


def write_section(figures: dict, doc: Path = RELIABILITY_DOC) -> None:
    """Replace this document's crash section (or add it), leaving every other section."""
    text = doc.read_text() if doc.exists() else INTRO
    section = render_section(figures)
    start = text.find(SECTION + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        rest = "" if end < 0 else text[end + 1 :]
        text = text[:start] + section + ("\n" + rest if rest else "")
    doc.write_text(text.rstrip("\n") + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.reliability_figures FIGURES.json")
    write_section(json.loads(Path(sys.argv[1]).read_text()))
