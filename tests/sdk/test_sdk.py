"""The job-side SDK (sdk/gantry_sdk): wire format, batching, resends, bounded memory, the
no-op mode, the token staying secret, never blocking the caller, the CLI and the example
training script, against a small HTTP server in the test."""

import ast
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests import REPOSITORY

ROOT = REPOSITORY
SDK_DIR = ROOT / "sdk"
EXAMPLE = ROOT / "examples" / "train_pytorch_style.py"
if str(SDK_DIR) not in sys.path:
    sys.path.insert(0, str(SDK_DIR))

import gantry_sdk  # noqa: E402
from gantry_sdk import Reporter, StepTimer  # noqa: E402
from gantry_sdk import runtime_env as sdk_runtime_env  # noqa: E402

TOKEN = "gat_42.c2VjcmV0LXNpZ25hdHVyZS1kby1ub3QtbGVhaw"
REPORT_KEYS = {
    "driver_version",
    "cuda_version",
    "cudnn_version",
    "nccl_version",
    "python_version",
    "framework",
    "hostname",
    "kernel_version",
    "node_list",
    "gpu_uuids",
}


# --- a portal stand-in ---------------------------------------------------------------------------


class Portal:
    """Records every request; answers with the queued ``statuses`` first, then 202 (events)
    or 200 (runtime report)."""

    def __init__(self):
        self.requests = []
        self.statuses = []
        self.location = None  # sent with every answer when set (redirects)
        self.cond = threading.Condition()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                with recorder.cond:
                    status = recorder.statuses.pop(0) if recorder.statuses else None
                    recorder.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                            "status": status,
                        }
                    )
                    recorder.cond.notify_all()
                if status is None:
                    status = 202 if self.path.endswith("/events/") else 200
                answer = json.dumps({"ok": status < 300}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if recorder.location:
                    self.send_header("Location", recorder.location)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def posts(self, suffix="/events/"):
        with self.cond:
            return [r for r in self.requests if r["path"].endswith(suffix)]

    def bodies(self, suffix="/events/"):
        return [json.loads(r["body"]) for r in self.posts(suffix)]

    def accepted_events(self):
        """Events of the batches the server accepted, de-duplicated by (source, seq), in
        arrival order: what the ingestion endpoint is meant to do."""
        seen, events = set(), []
        with self.cond:
            requests = [r for r in self.requests if r["path"].endswith("/events/")]
        for request in requests:
            if request["status"] not in (None, 200, 202):
                continue
            body = json.loads(request["body"])
            for event in body["events"]:
                key = (body["source"], event["seq"])
                if key not in seen:
                    seen.add(key)
                    events.append(event)
        return events

    def wait_for(self, predicate, timeout=10.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True


@pytest.fixture
def portal():
    server = Portal()
    yield server
    server.close()


@pytest.fixture
def closed_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/api/v1"


def _reporter(url, **kwargs):
    options = {"flush_interval": 60.0, "backoff_initial": 0.05, "timeout": 2.0}
    options.update(kwargs)
    return Reporter(url, TOKEN, **options)


# --- wire format ---------------------------------------------------------------------------------


def test_events_arrive_with_the_token_header_and_the_documented_body(portal):
    reporter = _reporter(portal.url, source="src-1", clock=lambda: 1_700_000_000.25)
    reporter.ready()
    reporter.step_window(
        steps=50,
        step_time_s=0.8,
        data_wait_s=6.0,
        comm_wait_s=2.5,
        checkpoint_s=1.0,
        start=1_699_999_959.0,
        end=1_700_000_000.0,
        step=1050,
    )
    reporter.checkpoint_saved(1050, "s3://bucket/run/ckpt-1050", 12.5)
    reporter.checkpoint_restored(1000, "s3://bucket/run/ckpt-1000", 3)
    assert reporter.flush(timeout=5)

    (request,) = portal.posts()
    assert request["path"] == "/api/v1/attempts/events/"
    assert request["headers"]["authorization"] == f"Attempt {TOKEN}"
    assert request["headers"]["content-type"] == "application/json"
    ts = 1_700_000_000.25
    assert json.loads(request["body"]) == {
        "source": "src-1",
        "sdk": f"gantry-sdk/{gantry_sdk.__version__}",
        "dropped": 0,
        "rank": None,
        "events": [
            {"type": "ready", "seq": 1, "ts": ts},
            {
                "type": "step_window",
                "seq": 2,
                "ts": ts,
                "steps": 50,
                "step_time_s": 0.8,
                "data_wait_s": 6.0,
                "comm_wait_s": 2.5,
                "checkpoint_s": 1.0,
                "start": 1_699_999_959.0,
                "end": 1_700_000_000.0,
                "step": 1050,
            },
            {
                "type": "checkpoint_saved",
                "seq": 3,
                "ts": ts,
                "step": 1050,
                "uri": "s3://bucket/run/ckpt-1050",
                "seconds": 12.5,
            },
            {
                "type": "checkpoint_restored",
                "seq": 4,
                "ts": ts,
                "step": 1000,
                "uri": "s3://bucket/run/ckpt-1000",
                "seconds": 3.0,
            },
        ],
    }
    assert reporter.stats() == {
        "queued": 0,
        "sent": 4,
        "dropped": 0,
        "rejected": 0,
        "failures": 0,
    }
    reporter.close()


def test_a_window_without_start_ends_now_and_spans_its_steps(portal):
    reporter = _reporter(portal.url, clock=lambda: 1000.0)
    reporter.step_window(steps=10, step_time_s=0.5, checkpoint_s=2.0)
    reporter.flush(5)
    (event,) = portal.bodies()[0]["events"]
    assert (event["start"], event["end"], event["step"]) == (993.0, 1000.0, None)


def test_events_are_batched_and_seq_increases_across_batches(portal):
    reporter = _reporter(portal.url, batch_events=3)
    for step in range(7):
        reporter.checkpoint_saved(step, f"file:///ckpt/{step}", 0.1)
    assert reporter.flush(timeout=5)
    bodies = portal.bodies()
    assert [len(b["events"]) for b in bodies] == [3, 3, 1]
    seqs = [e["seq"] for b in bodies for e in b["events"]]
    assert seqs == list(range(1, 8))
    assert {b["source"] for b in bodies} == {reporter.source}
    reporter.close()


def test_a_full_batch_is_sent_without_waiting_for_the_interval(portal):
    reporter = _reporter(portal.url, batch_events=5, flush_interval=60)
    for _ in range(5):
        reporter.ready()
    assert portal.wait_for(lambda: len(portal.requests) == 1, timeout=5)
    reporter.close()


def test_a_batch_stays_under_256_kib(portal):
    reporter = _reporter(portal.url)
    uri = "s3://bucket/" + "x" * 2000
    for step in range(400):  # ~ 830 KiB of events
        reporter.checkpoint_saved(step, uri, 1.0)
    assert reporter.flush(timeout=10)
    posts = portal.posts()
    assert len(posts) >= 4
    assert all(len(p["body"]) <= gantry_sdk.MAX_BATCH_BYTES for p in posts)
    assert [e["step"] for e in portal.accepted_events()] == list(range(400))


def test_a_failed_batch_is_resent_byte_for_byte_and_dedupes_by_source_and_seq(portal):
    portal.statuses = [503]
    reporter = _reporter(portal.url)
    reporter.ready()
    reporter.step_window(steps=3, step_time_s=0.1, end=2000.0)
    assert reporter.flush(timeout=5)
    first, second = portal.posts()
    assert first["status"] == 503
    assert first["body"] == second["body"]
    events = portal.accepted_events()
    assert [e["type"] for e in events] == ["ready", "step_window"]
    assert reporter.stats()["failures"] == 1
    assert reporter.stats()["sent"] == 2
    reporter.close()


def test_overflow_drops_the_oldest_and_counts_them(portal):
    reporter = _reporter(portal.url, max_queue=5, background=False)
    for step in range(8):
        reporter.checkpoint_saved(step, "file:///c", 0.0)
    assert reporter.stats()["dropped"] == 3
    assert reporter.send_once() == 202
    (body,) = portal.bodies()
    assert body["dropped"] == 3
    assert [e["seq"] for e in body["events"]] == [4, 5, 6, 7, 8]
    assert [e["step"] for e in body["events"]] == [3, 4, 5, 6, 7]


def test_invalid_values_are_counted_never_raised(portal, caplog):
    reporter = _reporter(portal.url)
    reporter.step_window(steps=1, step_time_s=float("nan"))
    reporter.step_window(steps=-1, step_time_s=1.0)
    reporter.step_window(steps=1, step_time_s=1.0, start=10.0, end=5.0)
    reporter.checkpoint_saved(step=1.5, uri="x", seconds=1)
    reporter.checkpoint_saved(step=1, uri="", seconds=1)
    reporter.checkpoint_restored(step=1, uri="x", seconds="soon")
    assert reporter.stats()["rejected"] == 6
    assert reporter.flush(timeout=2)
    assert portal.posts() == []
    assert "not reported" in caplog.text


def test_a_refusing_endpoint_stops_event_delivery(portal, caplog):
    portal.statuses = [404]
    reporter = _reporter(portal.url, batch_events=1)
    reporter.ready()
    assert portal.wait_for(lambda: len(portal.requests) == 1)
    reporter.ready()
    reporter.ready()
    assert reporter.flush(timeout=2)
    assert len(portal.posts()) == 1
    assert reporter.stats()["rejected"] == 3
    assert caplog.text.count("refused") == 1


def test_a_redirect_is_not_followed_with_the_token(portal):
    elsewhere = Portal()
    try:
        portal.statuses = [302]
        portal.location = elsewhere.url + "/attempts/events/"
        reporter = _reporter(portal.url)
        reporter.ready()
        assert reporter.flush(timeout=5)
        assert len(portal.posts()) == 1
        assert elsewhere.requests == []
        assert reporter.stats()["rejected"] == 1
    finally:
        elsewhere.close()


# --- outside Gantry ------------------------------------------------------------------------------


def test_without_token_the_reporter_is_a_noop(portal):
    environ = {
        "GANTRY_API_URL": portal.url,
        "GANTRY_RESUME_FROM": "s3://b/ckpt-600",
        "GANTRY_RESUME_STEP": "600",
    }
    reporter = Reporter.from_env(environ)
    assert not reporter.enabled
    assert (reporter.resume_step, reporter.resume_uri) == (600, "s3://b/ckpt-600")
    threads = threading.active_count()
    reporter.ready()
    reporter.step_window(steps=1, step_time_s=1.0)
    reporter.checkpoint_saved(1, "s3://x", 1.0)
    reporter.runtime_env()
    timer = reporter.step_timer(window_seconds=0)
    with timer.step(), timer.data():
        pass
    assert reporter.flush(timeout=1) and reporter.close()
    assert threading.active_count() == threads
    assert portal.requests == []
    assert Reporter.from_env({}).resume_step is None


def test_only_rank_zero_reports_unless_asked(portal):
    environ = {"GANTRY_API_URL": portal.url, "GANTRY_ATTEMPT_TOKEN": TOKEN, "RANK": "3"}
    assert not Reporter.from_env(environ).enabled
    assert Reporter.from_env(environ, all_ranks=True).enabled
    assert Reporter.from_env({**environ, "RANK": "0"}).enabled
    assert Reporter.from_env({**environ, "RANK": "", "SLURM_PROCID": "1"}).rank == 1


@pytest.mark.parametrize(
    ("url", "token"),
    [("ftp://portal/api/v1", TOKEN), ("http://portal/api/v1", "gat_1 x"), ("", TOKEN)],
)
def test_a_bad_url_or_token_disables_reporting(url, token):
    assert not Reporter(url, token).enabled


# --- the token stays secret ----------------------------------------------------------------------


def test_the_token_never_appears_in_logs_or_output(portal, closed_url, caplog, capsys):
    caplog.set_level(logging.DEBUG, logger="gantry_sdk")
    portal.statuses = [401, 500]
    for url in (portal.url, closed_url, "ftp://nope"):
        reporter = _reporter(url, batch_events=1, timeout=0.5)
        reporter.ready()
        reporter.checkpoint_saved(1, "s3://x", float("inf"))
        reporter.flush(timeout=1)
        reporter.close(timeout=0.5)
        text = repr(reporter) + str(reporter.stats()) + str(vars(reporter).get("_api_url"))
        assert TOKEN not in text
    captured = capsys.readouterr()
    assert caplog.records
    assert TOKEN not in caplog.text
    assert TOKEN not in captured.out + captured.err


# --- never blocking the caller -------------------------------------------------------------------


def test_a_closed_port_never_blocks_the_training_loop(closed_url):
    reporter = _reporter(closed_url, flush_interval=0.01, timeout=0.2, max_queue=1000)
    started = time.perf_counter()
    for step in range(10_000):
        reporter.step_window(steps=1, step_time_s=0.01, data_wait_s=0.001, step=step)
    reporter.checkpoint_saved(10_000, "s3://b/c", 1.0)
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0
    stats = reporter.stats()
    assert stats["queued"] <= 1000 + gantry_sdk.MAX_BATCH_EVENTS  # bounded memory
    assert stats["dropped"] >= 10_001 - 1000 - gantry_sdk.MAX_BATCH_EVENTS
    started = time.perf_counter()
    assert reporter.close(timeout=0.3) is False
    assert time.perf_counter() - started < 1.0


def test_a_portal_that_never_answers_never_blocks_the_training_loop():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the kernel; nobody answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/api/v1"
        reporter = _reporter(url, flush_interval=0.01, timeout=5.0, batch_events=10)
        started = time.perf_counter()
        for step in range(10_000):
            reporter.step_window(steps=1, step_time_s=0.01, step=step)
        assert time.perf_counter() - started < 1.0
        started = time.perf_counter()
        assert reporter.flush(timeout=0.2) is False
        assert time.perf_counter() - started < 1.0
    finally:
        silent.close()


# --- step timer ----------------------------------------------------------------------------------


def test_step_timer_reports_contiguous_windows_with_waits(portal):
    reporter = _reporter(portal.url)
    timer = StepTimer(reporter, window_seconds=0.05, step=100)
    for _ in range(12):
        with timer.step():
            with timer.data():
                time.sleep(0.004)
            time.sleep(0.002)
            with timer.comm():
                time.sleep(0.002)
    with timer.checkpoint():
        time.sleep(0.01)
    timer.flush()
    timer.flush()  # an empty window is not reported
    reporter.flush(5)
    windows = [e for e in portal.accepted_events() if e["type"] == "step_window"]
    assert len(windows) >= 2
    assert sum(w["steps"] for w in windows) == 12
    assert windows[-1]["step"] == 112
    for before, after in itertools.pairwise(windows):
        assert after["start"] == pytest.approx(before["end"], abs=1e-6)
    for window in windows:
        assert window["end"] >= window["start"]
        busy = window["steps"] * window["step_time_s"]
        assert window["data_wait_s"] + window["comm_wait_s"] <= busy + 1e-6
        assert window["end"] - window["start"] >= busy + window["checkpoint_s"] - 0.01
    assert sum(w["data_wait_s"] for w in windows) >= 12 * 0.004
    assert sum(w["comm_wait_s"] for w in windows) >= 12 * 0.002
    assert windows[-1]["checkpoint_s"] >= 0.01


# --- runtime environment -------------------------------------------------------------------------


def test_runtime_env_goes_to_the_report_endpoint_in_its_format(portal):
    reporter = _reporter(portal.url)
    reporter.runtime_env(extra={"node_list": ["gpu-01", "gpu-02"], "unknown": "x"}, wait=True)
    (request,) = portal.posts("/report/")
    assert request["path"] == "/api/v1/attempts/report/"
    assert request["headers"]["authorization"] == f"Attempt {TOKEN}"
    report = json.loads(request["body"])
    assert set(report) <= REPORT_KEYS
    assert report["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["node_list"] == ["gpu-01", "gpu-02"]
    for key, value in report.items():
        if key in ("node_list", "gpu_uuids"):
            assert all(isinstance(v, str) for v in value)
        elif key == "framework":
            assert all(isinstance(v, str) for v in value.values())
        else:
            assert isinstance(value, str) and 0 < len(value) <= 200


def test_the_runtime_report_is_cleaned_to_what_the_endpoint_accepts():
    clean = gantry_sdk.clean_runtime_report(
        {
            "driver_version": 550,
            "cuda_version": "",
            "framework": {"torch": "2.4.0", "": "1", "jax": None},
            "gpu_uuids": ("GPU-1", "", 7),
            "hostname": "h" * 500,
            "secret": "no",
        }
    )
    assert clean == {
        "driver_version": "550",
        "framework": {"torch": "2.4.0", "jax": "None"},
        "gpu_uuids": ["GPU-1", "7"],
        "hostname": "h" * 200,
    }
    assert sdk_runtime_env._cudnn_text(8907) == "8.9.7"
    assert sdk_runtime_env._cudnn_text(90100) == "9.1.0"
    assert sdk_runtime_env._nccl_text((2, 21, 5)) == "2.21.5"
    assert sdk_runtime_env._nccl_text(21805) == "2.18.5"
    assert sdk_runtime_env._nccl_text(2708) == "2.7.8"


# --- stdlib only, old Pythons --------------------------------------------------------------------


def test_the_sdk_imports_with_the_standard_library_only():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import gantry_sdk, gantry_sdk.__main__;"
        "names = {m.split('.')[0] for m in sys.modules};"
        "extra = names - set(sys.stdlib_module_names) - {'gantry_sdk', '__main__'};"
        "print(sorted(extra))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, str(SDK_DIR)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_sdk_and_the_example_parse_as_python_3_8():
    for path in [*sorted((SDK_DIR / "gantry_sdk").glob("*.py")), EXAMPLE]:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


def test_events_queued_at_exit_are_delivered(portal):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import gantry_sdk;"
        "r = gantry_sdk.Reporter.from_env(flush_interval=600); r.ready();"
        "r.checkpoint_saved(5, 's3://b/5', 0.5)"
    )
    env = {**os.environ, "GANTRY_API_URL": portal.url, "GANTRY_ATTEMPT_TOKEN": TOKEN}
    subprocess.run([sys.executable, "-c", code, str(SDK_DIR)], env=env, timeout=30, check=True)
    assert [e["type"] for e in portal.accepted_events()] == ["ready", "checkpoint_saved"]


# --- CLI -----------------------------------------------------------------------------------------


def _cli(*args, url=None, token=TOKEN, timeout=30):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_")}
    env["PYTHONPATH"] = str(SDK_DIR)
    if url is not None:
        env["GANTRY_API_URL"] = url
    if token is not None:
        env["GANTRY_ATTEMPT_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "gantry_sdk", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_cli_sends_one_event_synchronously(portal):
    done = _cli(
        "checkpoint-saved", "--step", "100", "--uri", "s3://b/ckpt-100", "--seconds", "12.5",
        url=portal.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (body,) = portal.bodies()
    (event,) = body["events"]
    assert event["type"] == "checkpoint_saved" and event["seq"] == 1
    assert (event["step"], event["uri"], event["seconds"]) == (100, "s3://b/ckpt-100", 12.5)
    assert portal.posts()[0]["headers"]["authorization"] == f"Attempt {TOKEN}"
    assert _cli("ready", url=portal.url).returncode == 0
    assert portal.bodies()[-1]["events"][0]["type"] == "ready"


def test_cli_runtime_env(portal):
    done = _cli("runtime-env", "--no-torch", "--print", url=portal.url)
    assert done.returncode == 0, done.stderr
    (report,) = portal.bodies("/report/")
    assert set(report) <= REPORT_KEYS and "python_version" in report
    assert json.loads(done.stdout) == report


def test_cli_exits_0_when_the_portal_is_down_and_keeps_the_token_secret(closed_url):
    done = _cli("ready", "--timeout", "2", url=closed_url)
    assert done.returncode == 0
    assert "not delivered" in done.stderr
    assert TOKEN not in done.stderr + done.stdout
    assert _cli("--strict", "ready", "--timeout", "2", url=closed_url).returncode == 1
    assert _cli("runtime-env", "--no-torch", url=closed_url).returncode == 0


def test_cli_refusal_and_usage_errors(portal):
    portal.statuses = [401]
    done = _cli("ready", url=portal.url)
    assert done.returncode == 0 and "HTTP 401" in done.stderr
    assert TOKEN not in done.stderr
    assert _cli("checkpoint-saved", "--step", "-1", "--uri", "x", "--seconds", "1").returncode == 2
    assert _cli("no-such-command").returncode == 2


def test_cli_outside_gantry_sends_nothing_and_succeeds(portal):
    done = _cli("ready", url=None, token=None)
    assert done.returncode == 0 and "not running under Gantry" in done.stderr
    env_done = _cli("resume-info", url=None, token=None)
    assert env_done.stdout == "GANTRY_RESUME_STEP=''\nGANTRY_RESUME_FROM=''\n"
    assert portal.requests == []


# --- the example training script -----------------------------------------------------------------


def _train(portal, tmp_path, *args, resume=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_")}
    env.update({"GANTRY_API_URL": portal.url, "GANTRY_ATTEMPT_TOKEN": TOKEN})
    env.update({"PYTHONPATH": str(SDK_DIR), "GANTRY_SDK_FLUSH_INTERVAL": "0.1"})
    if resume:
        env["GANTRY_RESUME_STEP"], env["GANTRY_RESUME_FROM"] = str(resume[0]), resume[1]
    argv = [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(tmp_path / "ckpt")]
    argv += ["--compute-seconds", "0.004", "--data-seconds", "0.003", "--comm-seconds", "0.002"]
    argv += ["--window-seconds", "0.05", *args]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_example_reports_and_resumes(portal, tmp_path):
    process = _train(portal, tmp_path, "--steps", "60", "--checkpoint-every", "20")
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err.decode()
    events = portal.accepted_events()
    kinds = [e["type"] for e in events]
    assert kinds[0] == "ready"
    assert "checkpoint_restored" not in kinds
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    assert [e["step"] for e in saved] == [20, 40, 60]
    windows = [e for e in events if e["type"] == "step_window"]
    assert sum(w["steps"] for w in windows) == 60 and windows[-1]["step"] == 60
    assert sum(w["data_wait_s"] for w in windows) > 0
    assert sum(w["comm_wait_s"] for w in windows) > 0
    assert sum(w["checkpoint_s"] for w in windows) > 0
    assert len(portal.posts("/report/")) == 1

    # The next attempt resumes from step 40.
    portal.requests.clear()
    uri = saved[1]["uri"]
    args = ("--steps", "60", "--checkpoint-every", "20")
    process = _train(portal, tmp_path, *args, resume=(40, uri))
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err.decode()
    events = portal.accepted_events()
    assert [e["type"] for e in events][:2] == ["checkpoint_restored", "ready"]
    assert (events[0]["step"], events[0]["uri"]) == (40, uri)
    windows = [e for e in events if e["type"] == "step_window"]
    assert sum(w["steps"] for w in windows) == 20 and windows[-1]["step"] == 60


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_example_checkpoints_before_preemption(portal, tmp_path, signum):
    process = _train(portal, tmp_path, "--steps", "100000", "--checkpoint-every", "0")
    try:
        assert portal.wait_for(
            lambda: any(b"step_window" in r["body"] for r in portal.requests), timeout=20
        )
    finally:
        process.send_signal(signum)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 128 + signum, err.decode()
    events = portal.accepted_events()
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    assert len(saved) == 1
    last_window = [e for e in events if e["type"] == "step_window"][-1]
    assert saved[0]["step"] == last_window["step"] > 0
    path = saved[0]["uri"][len("file://") :]
    assert json.loads(Path(path).read_text())["step"] == saved[0]["step"]
