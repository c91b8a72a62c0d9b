"""Per-rank telemetry (issue 36, points 1 and 6): what reporting from every rank costs the
job, and whether the portal keeps up with 1,024 ranks.

* SDK overhead. A synthetic training loop (steps of sleeps standing for compute, input and
  communication, as a GPU-bound step looks to the CPU) runs in blocks, alternately without
  the SDK and with a rank-0 reporter that has a rank identity (it sends both the
  ``step_window`` and the ``rank_window`` of every window, the most any rank sends) to a
  local HTTP server, through the real flusher thread. Windows close every 10 s, three
  times as often as the goal's 30 s. Overhead: the median over the blocks of (with −
  without) ÷ without, each pair of blocks run back to back (robust to other work on a
  shared machine, which delays a sleep now and then); the totals are shown too.
* Ingest. 1,024 ranks of one attempt (128 nodes × 8 GPUs) send one window per 10 s
  through the events endpoint (Django's test client: middleware, token authentication,
  parsing, the service, PostgreSQL of DATABASE_URL), one client after the other, each
  request committed before the next. Gantry: each rank posts its windows every 120 s (the
  SDK's default for ranks other than 0), one request of 12 windows, for 2 minutes of job
  time; then the same on an attempt that already stored 6 hours of windows of every rank
  (the cap's 360 per rank and hour; 2.2 million rows), which the duplicate check and the
  hourly cap read. Baseline: one request per window, for the first 10 s of job time (one
  window of every rank). Windows ingested per second ÷ the 102.4 the ranks produce per
  second is how many times faster than real time the portal ingests.
"""

import http.server
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.report import Section, quick

RANKS = 1024
GPUS_PER_NODE = 8
WINDOW_S = 10.0
POST_EVERY_S = 120.0
JOB_SECONDS = 120.0
HISTORY_HOURS = 6  # stored before the long run's requests: 2,211,840 rows
HISTORY_NUMBERS = 1_000_000  # their window numbers follow, apart from those the ranks post
BASELINE_JOB_SECONDS = 10.0  # one window of every rank: its rate is steady, a sample will do
INGEST_GOAL = 10.0  # times real time
OVERHEAD_GOAL = 0.005  # of step time
OVERHEAD_WINDOW_S = 10.0
STEP_SLEEPS = (0.012, 0.004, 0.004)  # compute, data, comm: a 20 ms step
T0 = 1_780_000_000.0
TOKEN = "gat_1." + "A" * 43
URL = "/api/v1/attempts/events/"
SDK_DIR = Path(__file__).resolve().parent.parent / "sdk"  # as a job vendors it


# --- SDK overhead ------------------------------------------------------------------------------


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts += 1  # type: ignore[attr-defined]
        self.send_response(202)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def _plain_step() -> None:
    compute, data, comm = STEP_SLEEPS
    time.sleep(data)
    time.sleep(compute)
    time.sleep(comm)


def _timed_step(timer) -> None:
    compute, data, comm = STEP_SLEEPS
    with timer.step():
        with timer.data():
            time.sleep(data)
        time.sleep(compute)
        with timer.comm():
            time.sleep(comm)


def sdk_overhead(*, blocks: int, steps_per_block: int) -> dict[str, float]:
    """Seconds of the loop without and with the SDK over the same steps, the windows and
    requests the SDK sent, and the overhead as a fraction of the step time."""
    if str(SDK_DIR) not in sys.path:
        sys.path.insert(0, str(SDK_DIR))
    # sdk/ is put on sys.path above, as a job vendors it: mypy does not see it.
    from gantry_sdk import Reporter  # type: ignore[import-not-found]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    server.posts = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/v1"
    identity = {"rank": 0, "local_rank": 0, "world_size": RANKS, "host": "n0", "gpu": "0"}
    reporter = Reporter(url, TOKEN, rank=0, identity=identity, flush_interval=1.0)
    timer = reporter.step_timer(window_seconds=OVERHEAD_WINDOW_S, step=0)
    pairs = []
    try:
        for _ in range(blocks):
            started = time.perf_counter()
            for _ in range(steps_per_block):
                _plain_step()
            plain_block = time.perf_counter() - started
            started = time.perf_counter()
            for _ in range(steps_per_block):
                _timed_step(timer)
            pairs.append((plain_block, time.perf_counter() - started))
        timer.flush()
        reporter.flush(10)
        stats = reporter.stats()
    finally:
        reporter.close(1)
        server.shutdown()
    return {
        "plain_s": sum(plain for plain, _ in pairs),
        "sdk_s": sum(sdk for _, sdk in pairs),
        "steps": blocks * steps_per_block,
        "events": stats["sent"],
        "posts": server.posts,  # type: ignore[attr-defined]
        "overhead": statistics.median((sdk - plain) / plain for plain, sdk in pairs),
    }


# --- ingest -----------------------------------------------------------------------------------


def seed_attempt() -> tuple[int, str]:
    """An empty database with one running attempt of ``RANKS`` GPUs on whole nodes of a
    Kubernetes cluster, and a token for it."""
    from django.contrib.auth import get_user_model

    from bench.cycle import truncate
    from clusters.models import Cluster, ClusterFlavor
    from images.models import Image
    from jobs.models import Attempt, AttemptState, Experiment, Run
    from jobs.services.backend_submit import attempt_token_issue
    from tenants.models import GpuFlavor, Project, Tenant

    truncate()
    nodes = RANKS // GPUS_PER_NODE
    user = get_user_model().objects.create(username="bench-ranks")
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    project = Project.objects.create(tenant=tenant, slug="main", name="Main")
    flavor = GpuFlavor.objects.create(slug="h100-80gb", name="H100", memory_gb=80)
    cluster = Cluster.objects.create(name="bench-k8s", backend=Cluster.Backend.KUBERNETES)
    ClusterFlavor.objects.create(
        cluster=cluster, flavor=flavor, nodes=nodes, gpus_per_node=GPUS_PER_NODE, gpus=RANKS
    )
    image = Image.objects.create(
        repository="registry.example.org/bench/train",
        digest="sha256:" + "0" * 64,
        status=Image.Status.APPROVED,
    )
    experiment = Experiment.objects.create(
        tenant=tenant, project=project, owner=user, name="bench", image=image,
        image_reference=image.reference, command="python train.py", flavor=flavor,
        nodes=nodes, gpus_per_node=GPUS_PER_NODE, gantry_version="bench",
    )  # fmt: skip
    run = Run.objects.create(
        experiment=experiment, tenant=tenant, flavor=flavor, gpus=RANKS, submitted_by=user
    )
    attempt = Attempt.objects.create(
        run=run,
        number=1,
        cluster=cluster,
        state=AttemptState.RUNNING,
        node_list=[f"gpu-{node:03d}" for node in range(nodes)],
    )
    return attempt.pk, attempt_token_issue(attempt=attempt)


def rank_window(rank: int, window: int) -> dict[str, object]:
    """Window ``window`` (from 1) of ``rank``, as the SDK sends it."""
    end = T0 + window * WINDOW_S
    return {
        "type": "rank_window", "seq": window, "ts": end, "rank": rank, "local_rank": rank % 8,
        "world_size": RANKS, "host": f"gpu-{rank // GPUS_PER_NODE:03d}",
        "gpu": str(rank % GPUS_PER_NODE), "window": window, "start": end - WINDOW_S,
        "end": end, "steps": 25, "step_time_s": 0.4, "data_wait_s": 0.5, "comm_wait_s": 1.5,
    }  # fmt: skip


def bodies(*, windows_per_post: int, job_seconds: float = JOB_SECONDS) -> list[bytes]:
    """The request bodies 1,024 ranks send over ``job_seconds``, posting every
    ``windows_per_post`` windows, in the order they would arrive (by time, then rank)."""
    windows = int(job_seconds // WINDOW_S)
    result = []
    for first in range(1, windows + 1, windows_per_post):
        for rank in range(RANKS):
            events = [
                rank_window(rank, window)
                for window in range(first, min(first + windows_per_post, windows + 1))
            ]
            body = {"source": f"rank{rank}", "dropped": 0, "rank": rank, "events": events}
            result.append(json.dumps(body, separators=(",", ":")).encode())
    return result


def post_all(token: str, payloads: list[bytes]) -> float:
    """Post every body to the events endpoint; seconds taken. Every one must be accepted.
    One request with a wrong token goes first, untimed: the first request of a process
    imports the URL configuration and the views (about a second), once per web worker."""
    from django.conf import settings
    from django.test import Client

    host = next((name for name in settings.ALLOWED_HOSTS if "*" not in name), "localhost")
    client = Client(HTTP_AUTHORIZATION=f"Attempt {token}", HTTP_HOST=host.lstrip("."))
    warm_up = Client(HTTP_AUTHORIZATION="Attempt gat_1.wrong", HTTP_HOST=host.lstrip("."))
    if warm_up.post(URL, payloads[0], content_type="application/json").status_code != 401:
        raise SystemExit("bench: ranks: the endpoint took a wrong token")
    started = time.perf_counter()
    for body in payloads:
        response = client.post(URL, body, content_type="application/json")
        if response.status_code != 202 or response.json()["rejected"]:
            raise SystemExit(f"bench: ranks: the endpoint answered {response.content!r}")
    return time.perf_counter() - started


def stored_rows() -> tuple[int, int]:
    """Rows of rank windows and the table's size in bytes, indexes included."""
    from django.db import connection

    from telemetry.models import RankStepWindow

    table = RankStepWindow._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE " + connection.ops.quote_name(table))
        cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        size = cursor.fetchone()[0]
    return RankStepWindow.objects.count(), size


def store_history(attempt_id: int, hours: int) -> int:
    """Store ``hours`` of windows of every rank ending before the first one the ranks post
    (one per 10 s: the cap), as the ingest stores them, then VACUUM ANALYZE as autovacuum
    would; returns how many."""
    from django.db import connection

    from telemetry.models import RankStepWindow

    table = connection.ops.quote_name(RankStepWindow._meta.db_table)
    windows = int(hours * 3600 // WINDOW_S)
    first = T0 - windows * WINDOW_S
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (attempt_id, rank, seq, world_size, local_rank,
                host, gpu, start, "end", steps, step_time_s, data_wait_s, comm_wait_s)
            SELECT %(attempt)s, r, %(numbered_from)s + w, %(ranks)s, r %% %(per_node)s,
                'gpu-' || lpad((r / %(per_node)s)::text, 3, '0'), (r %% %(per_node)s)::text,
                to_timestamp(%(first)s + (w - 1) * %(window)s),
                to_timestamp(%(first)s + w * %(window)s), 25, 0.4, 0.5, 1.5
            FROM generate_series(0, %(ranks)s - 1) r, generate_series(1, %(windows)s) w
            """,  # noqa: S608 (the model's table; values as parameters)
            {"attempt": attempt_id, "ranks": RANKS, "per_node": GPUS_PER_NODE, "first": first,
             "window": WINDOW_S, "windows": windows, "numbered_from": HISTORY_NUMBERS},
        )  # fmt: skip
        stored = cursor.rowcount
        cursor.execute(f"VACUUM ANALYZE {table}")
    return stored


def ingest(path: Callable[[], list[bytes]], *, history_hours: int = 0) -> dict[str, float]:
    """Post the bodies ``path`` gives to a fresh attempt (with ``history_hours`` of windows
    stored first): requests, seconds, rows stored by them, the table's bytes, and how many
    times faster than the ranks produce windows."""
    attempt_id, token = seed_attempt()
    history = store_history(attempt_id, history_hours) if history_hours else 0
    payloads = path()
    seconds = post_all(token, payloads)
    rows, size = stored_rows()
    rows -= history
    speed = rows / seconds / (RANKS / WINDOW_S)
    return {"requests": len(payloads), "seconds": seconds, "rows": rows, "bytes": size,
            "speed": speed, "history": history}  # fmt: skip


# --- the section -------------------------------------------------------------------------------


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def _per_request(result: dict[str, float]) -> str:
    return f"{result['seconds'] / result['requests'] * 1000:.1f} ms per request"


def run() -> list[Section]:
    small = quick()
    overhead = sdk_overhead(blocks=2 if small else 15, steps_per_block=25 if small else 100)
    per_post = int(POST_EVERY_S // WINDOW_S)
    gantry = ingest(lambda: bodies(windows_per_post=per_post))
    baseline = ingest(lambda: bodies(windows_per_post=1, job_seconds=BASELINE_JOB_SECONDS))
    long_run = ingest(
        lambda: bodies(windows_per_post=per_post), history_hours=0 if small else HISTORY_HOURS
    )
    expected = (RANKS * JOB_SECONDS // WINDOW_S, RANKS * BASELINE_JOB_SECONDS // WINDOW_S)
    if (gantry["rows"], baseline["rows"]) != expected or long_run["rows"] != expected[0]:
        raise SystemExit("bench: ranks: a path did not store every window once")
    step_ms = sum(STEP_SLEEPS) * 1000
    section = Section(
        title="Per-rank telemetry: SDK overhead and ingest (issue 36, points 1 and 6)",
        intro="\n".join(
            " ".join(item.split()) for item in (__doc__ or "").split("\n\n", 1)[1].split("\n* ")
        ).replace("\n", "\n* "),
        columns=["measure", "Gantry", "baseline", "goal"],
    )
    section.rows.append(
        [
            f"training loop, {overhead['steps']:,} steps of {step_ms:.0f} ms, window "
            f"{OVERHEAD_WINDOW_S:g} s",
            f"{overhead['sdk_s']:.2f} s with the SDK ({overhead['events']:,} events in "
            f"{overhead['posts']:,} requests): overhead {overhead['overhead']:+.3%} (median "
            f"of the blocks; {overhead['sdk_s'] / overhead['plain_s'] - 1:+.3%} in total)",
            f"{overhead['plain_s']:.2f} s without",
            f"< {OVERHEAD_GOAL:.1%} of step time at one window per 30 s: "
            f"{_met(overhead['overhead'] < OVERHEAD_GOAL)}",
        ]
    )
    section.rows.append(
        [
            f"ingest of {RANKS:,} ranks × 1 window per {WINDOW_S:g} s",
            f"{gantry['rows']:,} windows ({JOB_SECONDS:g} s of job time) in "
            f"{gantry['requests']:,} requests of {per_post}, {gantry['seconds']:.2f} s "
            f"({_per_request(gantry)}): {gantry['speed']:.1f}× real time",
            f"{baseline['rows']:,} windows in {baseline['requests']:,} requests of 1, "
            f"{baseline['seconds']:.2f} s ({_per_request(baseline)}): "
            f"{baseline['speed']:.1f}× real time",
            f"≥ {INGEST_GOAL:g}× real time: {_met(gantry['speed'] >= INGEST_GOAL)}",
        ]
    )
    section.rows.append(
        [
            f"the same after {HISTORY_HOURS if not small else 0} h of windows of every rank "
            f"({long_run['history']:,} rows stored before)",
            f"{long_run['rows']:,} windows in {long_run['requests']:,} requests of {per_post}, "
            f"{long_run['seconds']:.2f} s ({_per_request(long_run)}): "
            f"{long_run['speed']:.1f}× real time",
            "",
            f"≥ {INGEST_GOAL:g}× real time: {_met(long_run['speed'] >= INGEST_GOAL)}",
        ]
    )
    per_row = gantry["bytes"] / gantry["rows"]
    hour_rows = RANKS * 3600 / WINDOW_S
    section.notes.append(
        f"Stored: {gantry['rows']:,} rows, {gantry['bytes'] / 1e6:.1f} MB with the index "
        f"({per_row:.0f} bytes per window); a run-hour of {RANKS:,} ranks at one window per "
        f"{WINDOW_S:g} s is {hour_rows:,.0f} rows (~{hour_rows * per_row / 1e6:.0f} MB), the "
        "cap of 360 windows per rank and hour; at the SDK's default 30 s window a third."
    )
    return [section]
