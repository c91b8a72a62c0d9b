"""The Gantry job-side reporter: buffered, best-effort, never in the training loop's way.

Standard library only, Python 3.8 syntax (training images often ship older Pythons).

A training process reports through one :class:`Reporter`:

* events (``ready``, ``step_window``, ``checkpoint_saved``, ``checkpoint_restored``) go to a
  bounded in-memory queue; a daemon thread posts them in batches to
  ``{GANTRY_API_URL}/attempts/events/``; the caller never waits on the network;
* the runtime environment (driver, CUDA, cuDNN, NCCL, framework versions, host, GPUs) goes
  to ``{GANTRY_API_URL}/attempts/report/`` from a background thread.

Both authenticate with ``Authorization: Attempt <GANTRY_ATTEMPT_TOKEN>``. The token is
never logged, printed or put in an exception message. Without the two variables (a run on
a laptop) the reporter is a no-op and the training script works unchanged.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import json
import logging
import math
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref

__all__ = [
    "EVENTS_PATH",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_EVENTS",
    "REPORT_PATH",
    "Reporter",
    "StepTimer",
    "collect_runtime_env",
]

SDK_VERSION = "0.1.0"

API_URL_ENV = "GANTRY_API_URL"
ATTEMPT_TOKEN_ENV = "GANTRY_ATTEMPT_TOKEN"  # noqa: S105 (a variable name)
RESUME_FROM_ENV = "GANTRY_RESUME_FROM"
RESUME_STEP_ENV = "GANTRY_RESUME_STEP"
# Optional tuning: seconds between background flushes (default 5), and how long the exit
# hook may wait for the last events (default 5).
FLUSH_INTERVAL_ENV = "GANTRY_SDK_FLUSH_INTERVAL"
EXIT_TIMEOUT_ENV = "GANTRY_SDK_EXIT_TIMEOUT"
# The ranks a launcher may set; only rank 0 reports unless ``all_ranks=True``.
RANK_ENVS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")

EVENTS_PATH = "/attempts/events/"
REPORT_PATH = "/attempts/report/"

# Wire limits of one batch (docs/sdk.md): the server may refuse anything larger.
MAX_BATCH_EVENTS = 500
MAX_BATCH_BYTES = 256 * 1024
MAX_URI_CHARS = 2048
# The runtime report's limits (jobs/serializers.py): strings of at most 200 characters.
MAX_REPORT_TEXT = 200
MAX_REPORT_ITEMS = 1024
MAX_REPORT_FRAMEWORKS = 64

EVENT_TYPES = ("ready", "step_window", "checkpoint_saved", "checkpoint_restored")

logger = logging.getLogger("gantry_sdk")

# Every live reporter, for the fork and exit hooks (weak: a dropped reporter goes away).
_REPORTERS = weakref.WeakSet()


# --- HTTP -----------------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is for us: following it would carry the
    token's header to wherever the redirect points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _post(url, token, body, timeout):
    """POST ``body`` (bytes of JSON); return ``(status, retry_after_seconds)``.

    Never raises. Status 0 means the request did not get an HTTP answer (refused,
    timed out, DNS…). Nothing here mentions the token: it travels in a header only.
    """
    request = urllib.request.Request(  # noqa: S310 (the scheme is checked in Reporter)
        url,
        data=body,
        method="POST",
        headers={
            "Authorization": "Attempt " + token,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "gantry-sdk/" + SDK_VERSION,
        },
    )
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(65536)
            return response.status, None
    except urllib.error.HTTPError as exc:
        retry_after = None
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            retry_after = float(exc.headers.get("Retry-After", ""))
        try:
            exc.read(65536)
            exc.close()
        except Exception:  # noqa: S110 (closing an error body is best-effort)
            pass
        return exc.code, retry_after
    except Exception as exc:
        logger.debug("gantry_sdk: POST %s failed: %s", url, type(exc).__name__)
        return 0, None


def _retryable(status):
    return status == 0 or status in (408, 425, 429) or status >= 500


def _url_ok(url):
    return url.startswith(("http://", "https://")) and not any(c.isspace() for c in url)


def _token_ok(token):
    # A header value: printable ASCII without spaces (the server splits on whitespace).
    return bool(token) and all(33 <= ord(c) < 127 for c in token)


# --- values ----------------------------------------------------------------------------------


def _seconds(value, name):
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0")
    return value


def _count(value, name):
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be an integer >= 0")
    return int(value)


def _timestamp(value, name):
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a unix time in seconds")
    return value


def _uri(value):
    value = str(value)
    if not value or len(value) > MAX_URI_CHARS:
        raise ValueError(f"uri must have 1 to {MAX_URI_CHARS} characters")
    return value


def _env_rank(environ):
    for name in RANK_ENVS:
        raw = environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def _env_resume_step(environ):
    raw = environ.get(RESUME_STEP_ENV, "").strip()
    if raw.isdigit():
        return int(raw)
    if raw:
        logger.warning("gantry_sdk: ignoring %s=%r (not an integer)", RESUME_STEP_ENV, raw)
    return None


# --- the reporter -------------------------------------------------------------------------------


class Reporter:
    """Reports one attempt's events to Gantry; a no-op when ``api_url`` or ``token`` is empty.

    No method of a reporter raises into the caller or waits on the network, except
    :meth:`flush` and :meth:`close`, which wait at most their ``timeout``.
    """

    def __init__(
        self,
        api_url=None,
        token=None,
        resume_from=None,
        resume_step=None,
        rank=None,
        flush_interval=5.0,
        batch_events=MAX_BATCH_EVENTS,
        max_queue=10000,
        timeout=5.0,
        backoff_initial=1.0,
        backoff_max=60.0,
        source=None,
        clock=time.time,
        background=True,
    ):
        self.resume_from = resume_from or None
        self.resume_step = resume_step
        self.rank = rank
        self.source = source or uuid.uuid4().hex
        self.flush_interval = max(0.01, float(flush_interval))
        self.batch_events = max(1, min(int(batch_events), MAX_BATCH_EVENTS))
        self.max_queue = max(1, int(max_queue))
        self.timeout = float(timeout)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self._clock = clock
        self._background = bool(background)
        api_url = (api_url or "").strip().rstrip("/")
        token = (token or "").strip()
        self._api_url = api_url
        self._token = token
        self.enabled = bool(api_url and token)
        if self.enabled and not _url_ok(api_url):
            logger.warning("gantry_sdk: %s is not an http(s) URL; reporting disabled", API_URL_ENV)
            self.enabled = False
        if self.enabled and not _token_ok(token):
            logger.warning("gantry_sdk: %s is malformed; reporting disabled", ATTEMPT_TOKEN_ENV)
            self.enabled = False
        # Counters, readable at any time (see stats()).
        self.sent = 0  # events the server accepted
        self.dropped = 0  # events pushed out of a full queue
        self.rejected = 0  # events the server refused for good (4xx) or that were invalid
        self.failures = 0  # POSTs that failed (and were retried)
        self._init_state()
        if self.enabled:
            _REPORTERS.add(self)

    def _init_state(self):
        self._lock = threading.RLock()  # reentrant: a signal handler may emit mid-emit
        self._queue = collections.deque()
        self._carry = collections.deque()  # taken off the queue, not yet in a request
        self._seq = itertools.count(1)
        self._inflight = None  # (bytes, number of events) being sent or retried
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._thread = None
        self._side_threads = []
        self._stopped_events = False  # the server said the endpoint is not for us
        self._warned = set()

    # --- construction ---

    @classmethod
    def from_env(cls, environ=None, all_ranks=False, **kwargs):
        """The reporter a job gets from Gantry's variables.

        Reads ``GANTRY_API_URL``, ``GANTRY_ATTEMPT_TOKEN``, ``GANTRY_RESUME_FROM`` and
        ``GANTRY_RESUME_STEP`` (and ``GANTRY_SDK_FLUSH_INTERVAL``, seconds, if set).
        Without URL or token it is a no-op. A process whose rank (``RANK``,
        ``SLURM_PROCID``, …) is not 0 gets a no-op reporter too, unless ``all_ranks`` is
        true; every rank still sees ``resume_step`` / ``resume_uri``.
        """
        environ = os.environ if environ is None else environ
        if "flush_interval" not in kwargs:
            with contextlib.suppress(ValueError):
                kwargs["flush_interval"] = float(environ.get(FLUSH_INTERVAL_ENV, "") or 5.0)
        rank = _env_rank(environ)
        api_url = environ.get(API_URL_ENV, "")
        token = environ.get(ATTEMPT_TOKEN_ENV, "")
        if rank not in (None, 0) and not all_ranks:
            api_url = token = ""
        if not (api_url.strip() and token.strip()):
            logger.info("gantry_sdk: not running under Gantry (or rank != 0); reporting is off")
        return cls(
            api_url=api_url,
            token=token,
            resume_from=environ.get(RESUME_FROM_ENV, "").strip() or None,
            resume_step=_env_resume_step(environ),
            rank=rank,
            **kwargs,
        )

    @property
    def resume_uri(self):
        """Where to resume from (``GANTRY_RESUME_FROM``), or None on a fresh start."""
        return self.resume_from

    @property
    def events_url(self):
        return self._api_url + EVENTS_PATH

    @property
    def report_url(self):
        return self._api_url + REPORT_PATH

    def __repr__(self):
        # Never the token.
        return "<Reporter {} source={}>".format(
            self._api_url if self.enabled else "disabled",
            self.source,
        )

    # --- events ---

    def ready(self):
        """The job finished its setup (model built, checkpoint restored) and starts work."""
        self._emit("ready", None)

    def step_window(
        self,
        steps,
        step_time_s,
        data_wait_s=0.0,
        comm_wait_s=0.0,
        checkpoint_s=0.0,
        start=None,
        end=None,
        step=None,
    ):
        """A window of training: ``steps`` steps of ``step_time_s`` seconds on average
        (wall time, waits included), of which ``data_wait_s`` in total waited on input and
        ``comm_wait_s`` on communication; ``checkpoint_s`` blocked on checkpoints outside
        the steps. ``start`` / ``end`` are unix seconds (``end`` defaults to now, ``start``
        to ``end - steps * step_time_s - checkpoint_s``). ``step`` is the global step
        reached at the window's end, if known."""
        try:
            fields = {
                "steps": _count(steps, "steps"),
                "step_time_s": _seconds(step_time_s, "step_time_s"),
                "data_wait_s": _seconds(data_wait_s, "data_wait_s"),
                "comm_wait_s": _seconds(comm_wait_s, "comm_wait_s"),
                "checkpoint_s": _seconds(checkpoint_s, "checkpoint_s"),
            }
            end = self._clock() if end is None else _timestamp(end, "end")
            if start is None:
                busy = fields["steps"] * fields["step_time_s"] + fields["checkpoint_s"]
                start = end - busy
            start = _timestamp(start, "start")
            if start > end:
                raise ValueError("start must not be after end")
            fields["start"] = start
            fields["end"] = end
            fields["step"] = None if step is None else _count(step, "step")
        except (TypeError, ValueError) as exc:
            self._invalid("step_window", exc)
            return
        self._emit("step_window", fields)

    def checkpoint_saved(self, step, uri, seconds):
        """A checkpoint of global ``step`` was written to ``uri``; saving blocked training
        for ``seconds``."""
        self._checkpoint("checkpoint_saved", step, uri, seconds)

    def checkpoint_restored(self, step, uri, seconds):
        """The job resumed from the checkpoint of ``step`` at ``uri``; loading took
        ``seconds``."""
        self._checkpoint("checkpoint_restored", step, uri, seconds)

    def _checkpoint(self, kind, step, uri, seconds):
        try:
            fields = {
                "step": _count(step, "step"),
                "uri": _uri(uri),
                "seconds": _seconds(seconds, "seconds"),
            }
        except (TypeError, ValueError) as exc:
            self._invalid(kind, exc)
            return
        self._emit(kind, fields)

    def step_timer(self, window_seconds=30.0, step=None):
        """A :class:`StepTimer` that reports to this reporter."""
        return StepTimer(self, window_seconds=window_seconds, step=step)

    def _invalid(self, kind, exc):
        with self._lock:
            self.rejected += 1
        self._warn_once("invalid:" + kind, "gantry_sdk: %s not reported: %s", kind, exc)

    def _emit(self, kind, fields):
        if not self.enabled:
            return
        try:
            with self._lock:
                if self._closed:
                    return
                if self._stopped_events:
                    self.rejected += 1
                    return
                event = {"type": kind, "seq": next(self._seq), "ts": self._clock()}
                if fields:
                    event.update(fields)
                if len(self._queue) >= self.max_queue:
                    self._queue.popleft()
                    self.dropped += 1
                self._queue.append(event)
                queued = len(self._queue)
                if self._thread is None and self._background:
                    self._start_thread()
            if queued >= self.batch_events:
                self._wake.set()
        except Exception as exc:  # never into the training loop
            self._warn_once("emit", "gantry_sdk: event not queued: %s", type(exc).__name__)

    # --- runtime environment ---

    def runtime_env(self, extra=None, wait=False):
        """Collect the runtime environment (see :func:`collect_runtime_env`), merge
        ``extra`` (e.g. ``{"node_list": [...]}``) over it, and send it to the runtime-report
        endpoint from a background thread (a few retries). Returns at once unless
        ``wait`` is true; :meth:`flush` and :meth:`close` wait for it too."""
        if not self.enabled:
            return
        try:
            thread = threading.Thread(
                target=self._send_runtime_env,
                args=(dict(extra or {}),),
                name="gantry-sdk-runtime-env",
                daemon=True,
            )
            with self._lock:
                self._side_threads = [t for t in self._side_threads if t.is_alive()]
                self._side_threads.append(thread)
            thread.start()
            if wait:
                thread.join(self.timeout * 4 + 10)
        except Exception as exc:
            self._warn_once("runtime_env", "gantry_sdk: runtime env not sent: %s", exc)

    def _send_runtime_env(self, extra):
        try:
            report = collect_runtime_env()
            report.update(extra)
            report = clean_runtime_report(report)
            body = json.dumps(report, separators=(",", ":"), sort_keys=True).encode()
        except Exception as exc:
            self._warn_once("runtime_env", "gantry_sdk: runtime env not collected: %s", exc)
            return
        delay = self.backoff_initial
        for _ in range(5):
            status, retry_after = _post(self.report_url, self._token, body, self.timeout)
            if 200 <= status < 300:
                return
            if not _retryable(status):
                self._warn_once(
                    "runtime_env",
                    "gantry_sdk: the portal refused the runtime report (HTTP %s)",
                    status,
                )
                return
            if self._closed:
                break
            time.sleep(self._backoff(delay, retry_after))
            delay = min(delay * 2, self.backoff_max)
        self._warn_once("runtime_env", "gantry_sdk: runtime report not delivered (portal down?)")

    # --- delivery ---

    def _start_thread(self):
        self._thread = threading.Thread(target=self._run, name="gantry-sdk-flusher", daemon=True)
        self._thread.start()

    def _backoff(self, delay, retry_after=None):
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, self.backoff_max)
        return delay * random.uniform(0.8, 1.2)

    def _take_batch(self):
        """The next request body, ``(bytes, number of events)``, or None when nothing is
        queued: at most ``batch_events`` events and ``MAX_BATCH_BYTES``. Only the flusher
        (or ``send_once``) calls it; events are encoded outside the lock, so a caller's
        ``_emit`` never waits on JSON encoding."""
        while True:
            with self._lock:
                room = self.batch_events - len(self._carry)
                while room > 0 and self._queue:
                    self._carry.append(self._queue.popleft())
                    room -= 1
                events = list(self._carry)
                head = {
                    "source": self.source,
                    "sdk": "gantry-sdk/" + SDK_VERSION,
                    "dropped": self.dropped,
                    "rank": self.rank,
                }
            if not events:
                return None
            parts = []
            size = 300  # the envelope
            used = bad = 0
            for event in events:
                try:
                    part = json.dumps(event, separators=(",", ":"), allow_nan=False).encode()
                except (TypeError, ValueError):
                    part = None
                if part is not None and parts and size + len(part) + 1 > MAX_BATCH_BYTES:
                    break  # the rest goes in the next batch
                used += 1
                if part is None or size + len(part) + 1 > MAX_BATCH_BYTES:
                    bad += 1  # cannot be encoded, or too large even alone
                    continue
                parts.append(part)
                size += len(part) + 1
            batch = None
            if parts:
                envelope = json.dumps(head, separators=(",", ":")).encode()
                batch = (envelope[:-1] + b',"events":[' + b",".join(parts) + b"]}", len(parts))
            with self._lock:
                # In one step with taking them off ``_carry``, so flush() never sees them
                # nowhere.
                for _ in range(used):
                    self._carry.popleft()
                self.rejected += bad
                if batch is not None:
                    self._inflight = batch
                    return batch

    def _run(self):
        delay = self.backoff_initial
        wait = self.flush_interval
        while True:
            self._wake.wait(wait)
            self._wake.clear()
            wait = self.flush_interval
            while True:
                with self._lock:
                    if self._stopped_events:
                        self.rejected += len(self._queue) + len(self._carry)
                        self.rejected += self._inflight[1] if self._inflight else 0
                        self._queue.clear()
                        self._carry.clear()
                        self._inflight = None
                    batch = self._inflight
                if batch is None and not self._stopped_events:
                    batch = self._take_batch()  # encodes outside the lock
                if batch is None:
                    with self._lock:
                        self._idle.notify_all()
                    break
                status, retry_after = _post(self.events_url, self._token, batch[0], self.timeout)
                with self._lock:
                    if 200 <= status < 300:
                        self.sent += batch[1]
                        self._inflight = None
                        delay = self.backoff_initial
                        continue
                    self.failures += 1
                    if not _retryable(status):
                        # Resending the same batch cannot help: count it and move on.
                        self.rejected += batch[1]
                        self._inflight = None
                        if status in (401, 403, 404, 410):
                            self._stopped_events = True
                        self._warn_once(
                            f"http{status}",
                            "gantry_sdk: the portal refused %d event(s) (HTTP %s)%s",
                            batch[1],
                            status,
                            "; no more events will be sent" if self._stopped_events else "",
                        )
                        continue
                    # Transient: keep the batch byte for byte (same source and seq, so the
                    # server can de-duplicate a resend) and try again after a backoff.
                    self._warn_once(
                        "transient",
                        "gantry_sdk: portal unreachable or busy (HTTP %s); retrying with backoff",
                        status or "no answer",
                    )
                    wait = self._backoff(delay, retry_after)
                    delay = min(delay * 2, self.backoff_max)
                    self._idle.notify_all()
                    if self._closed:
                        return
                break
            if self._closed and not self._pending():
                return

    def send_once(self, timeout=None):
        """Post what is queued in one request (at most one batch) from the calling thread,
        without retrying; for the CLI and for reporters made with ``background=False``.
        Returns the HTTP status (0: no answer, None: nothing to send or disabled)."""
        if not self.enabled:
            return None
        with self._lock:
            batch = self._inflight
        if batch is None:
            batch = self._take_batch()
        if batch is None:
            return None
        timeout = self.timeout if timeout is None else float(timeout)
        status, _ = _post(self.events_url, self._token, batch[0], timeout)
        with self._lock:
            if 200 <= status < 300:
                self.sent += batch[1]
                self._inflight = None
            elif not _retryable(status):
                self.rejected += batch[1]
                self._inflight = None
            else:
                self.failures += 1
        return status

    def send_runtime_env(self, report, timeout=None):
        """Post a runtime report (cleaned to the accepted keys) once, from the calling
        thread. Returns the HTTP status (0: no answer, None: disabled)."""
        if not self.enabled:
            return None
        body = json.dumps(clean_runtime_report(report), separators=(",", ":"), sort_keys=True)
        timeout = self.timeout if timeout is None else float(timeout)
        status, _ = _post(self.report_url, self._token, body.encode(), timeout)
        return status

    def _pending(self):
        return bool(self._queue or self._carry) or self._inflight is not None

    def flush(self, timeout=5.0):
        """Send what is queued now, at once (skipping a backoff); wait at most ``timeout``
        seconds. True when everything queued, and the runtime report, was delivered or
        settled (refused for good)."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + max(0.0, float(timeout))
        try:
            with self._lock:
                if self._pending():
                    if self._thread is None or not self._thread.is_alive():
                        self._start_thread()
                    self._wake.set()
                while self._pending():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._idle.wait(left)
            return self._join_side(deadline)
        except Exception:
            return False

    def _join_side(self, deadline):
        for thread in list(self._side_threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._side_threads)

    def close(self, timeout=5.0):
        """Flush (at most ``timeout`` seconds) and stop. Called at interpreter exit."""
        if not self.enabled or self._closed:
            return True
        done = self.flush(timeout)
        with self._lock:
            self._closed = True
            self._wake.set()
        return done

    def stats(self):
        """Counters: queued, sent, dropped (queue overflow), rejected, failures (POSTs)."""
        with self._lock:
            queued = len(self._queue) + len(self._carry)
            queued += self._inflight[1] if self._inflight else 0
            return {
                "queued": queued,
                "sent": self.sent,
                "dropped": self.dropped,
                "rejected": self.rejected,
                "failures": self.failures,
            }

    def _warn_once(self, key, message, *args):
        if key in self._warned:
            logger.debug(message, *args)
            return
        self._warned.add(key)
        logger.warning(message, *args)

    def _after_fork_in_child(self):
        # A forked child (a DataLoader worker, a launcher) starts clean: its own source and
        # sequence, an empty queue, and no flusher until it emits.
        self.source = uuid.uuid4().hex
        self._init_state()
        self.sent = self.dropped = self.rejected = self.failures = 0


def _after_fork():
    for reporter in list(_REPORTERS):
        reporter._after_fork_in_child()


def _at_exit():
    try:
        budget = float(os.environ.get(EXIT_TIMEOUT_ENV, "") or 5.0)
    except ValueError:
        budget = 5.0
    deadline = time.monotonic() + budget
    for reporter in list(_REPORTERS):
        reporter.close(max(0.0, deadline - time.monotonic()))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
atexit.register(_at_exit)


# --- step timing -----------------------------------------------------------------------------


class _Section:
    __slots__ = ("_add", "_t0", "_timer")

    def __init__(self, timer, add):
        self._timer = timer
        self._add = add
        self._t0 = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self._add(time.perf_counter() - self._t0)
        return False


class StepTimer:
    """Accumulates per-step timings and reports a ``step_window`` every ``window_seconds``.

    ::

        timer = reporter.step_timer(window_seconds=30, step=start_step)
        for batch_index in range(start_step, total_steps):
            with timer.step():
                with timer.data():
                    batch = next(loader)
                loss = model(batch)
                with timer.comm():
                    loss.backward()  # or the all-reduce you can time
                optimizer.step()
            if batch_index % 1000 == 0:
                with timer.checkpoint():
                    save(...)
        timer.close()

    Windows are contiguous: each starts where the previous one ended (the first at the
    first step), so time spent outside steps (evaluation, logging) stays inside a window
    but outside ``steps * step_time_s``.
    """

    def __init__(self, reporter, window_seconds=30.0, step=None):
        self.reporter = reporter
        self.window_seconds = float(window_seconds)
        self.step_number = step
        self._reset(None)

    def _reset(self, window_start):
        self._window_start = window_start  # unix seconds, None until the first step
        self._steps = 0
        self._step_total = 0.0
        self._data = 0.0
        self._comm = 0.0
        self._checkpoint = 0.0

    def _add_step(self, seconds):
        self._steps += 1
        self._step_total += seconds
        if self.step_number is not None:
            self.step_number += 1
        if time.time() - self._window_start >= self.window_seconds:
            self.flush()

    def _add_data(self, seconds):
        self._data += seconds

    def _add_comm(self, seconds):
        self._comm += seconds

    def _add_checkpoint(self, seconds):
        self._checkpoint += seconds

    def step(self):
        """Time one whole step (data wait and communication included)."""
        if self._window_start is None:
            self._window_start = time.time()
        return _Section(self, self._add_step)

    def data(self):
        """Time waiting for the next batch."""
        return _Section(self, self._add_data)

    def comm(self):
        """Time waiting on communication (all-reduce, barriers)."""
        return _Section(self, self._add_comm)

    def checkpoint(self):
        """Time blocked saving or loading a checkpoint (outside the steps)."""
        if self._window_start is None:
            self._window_start = time.time()
        return _Section(self, self._add_checkpoint)

    def flush(self):
        """Report the current window now (if it has anything) and start the next one."""
        now = time.time()
        if self._window_start is not None and (self._steps or self._checkpoint):
            steps = self._steps
            self.reporter.step_window(
                steps=steps,
                step_time_s=self._step_total / steps if steps else 0.0,
                data_wait_s=self._data,
                comm_wait_s=self._comm,
                checkpoint_s=self._checkpoint,
                start=self._window_start,
                end=max(now, self._window_start),
                step=self.step_number,
            )
        self._reset(now if self._window_start is not None else None)

    close = flush


# --- runtime environment ---------------------------------------------------------------------


def _text(value):
    return str(value).strip()[:MAX_REPORT_TEXT]


def _run(argv, timeout):
    """stdout of a command, or "" if it is missing, fails or takes longer than ``timeout``."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except Exception:
        return ""
    if done.returncode != 0:
        return ""
    return done.stdout.decode("utf-8", "replace")


def _packed_version(version):
    """``8907`` → ``8.9.7`` (major * 1000 + …); ``90100`` → ``9.1.0`` (major * 10000 + …,
    cuDNN 9+ and NCCL 2.9+)."""
    major_unit = 10000 if version >= 10000 else 1000
    return f"{version // major_unit}.{version % major_unit // 100}.{version % 100}"


def _cudnn_text(version):
    return _packed_version(int(version))


def _nccl_text(version):
    if isinstance(version, (tuple, list)):
        return ".".join(str(part) for part in version)
    return _packed_version(int(version))


def _torch_facts(report, import_torch):
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch
        except Exception:
            return
    if torch is None:
        return
    with contextlib.suppress(Exception):
        report.setdefault("framework", {})["torch"] = _text(torch.__version__)
    try:
        if torch.version.cuda:
            report["cuda_version"] = _text(torch.version.cuda)
    except Exception:  # noqa: S110
        pass
    try:
        cudnn = torch.backends.cudnn.version()
        if cudnn:
            report["cudnn_version"] = _cudnn_text(cudnn)
    except Exception:  # noqa: S110
        pass
    try:
        if torch.cuda.is_available():
            report["nccl_version"] = _nccl_text(torch.cuda.nccl.version())
    except Exception:  # noqa: S110
        pass


def collect_runtime_env(import_torch=True, nvidia_smi_timeout=5.0, environ=None):
    """The runtime report of this process, best-effort, in the keys the runtime-report
    endpoint accepts (every value a string, lists of strings for ``node_list`` and
    ``gpu_uuids``, ``framework`` a name → version map). Never raises."""
    environ = os.environ if environ is None else environ
    report = {"python_version": platform.python_version()}
    with contextlib.suppress(Exception):
        report["hostname"] = _text(socket.gethostname())
    with contextlib.suppress(Exception):
        report["kernel_version"] = _text(platform.release())
    with contextlib.suppress(Exception):
        _torch_facts(report, import_torch)
    for name in ("jax", "tensorflow", "transformers", "deepspeed", "lightning"):
        module = sys.modules.get(name)  # only what the job already imported
        version = getattr(module, "__version__", None) if module else None
        if version:
            report.setdefault("framework", {})[name] = _text(version)
    smi = _run(
        ["nvidia-smi", "--query-gpu=driver_version,uuid", "--format=csv,noheader"],
        nvidia_smi_timeout,
    )
    uuids = []
    for line in smi.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 2 and parts[1]:
            report.setdefault("driver_version", _text(parts[0]))
            uuids.append(_text(parts[1]))
    if uuids:
        report["gpu_uuids"] = uuids[:MAX_REPORT_ITEMS]
    nodelist = environ.get("SLURM_JOB_NODELIST", "").strip()
    if nodelist:
        hosts = _run(["scontrol", "show", "hostnames", nodelist], nvidia_smi_timeout).split()
        report["node_list"] = [_text(h) for h in hosts[:MAX_REPORT_ITEMS]] or [_text(nodelist)]
    return report


def clean_runtime_report(report):
    """Only the keys and shapes the runtime-report endpoint accepts; the rest dropped."""
    clean = {}
    for name in (
        "driver_version",
        "cuda_version",
        "cudnn_version",
        "nccl_version",
        "python_version",
        "hostname",
        "kernel_version",
    ):
        value = report.get(name)
        if value is not None and _text(value):
            clean[name] = _text(value)
    framework = report.get("framework")
    if isinstance(framework, dict):
        items = [(_text(k), _text(v)) for k, v in framework.items() if _text(k) and _text(v)]
        if items:
            clean["framework"] = dict(items[:MAX_REPORT_FRAMEWORKS])
    for name in ("node_list", "gpu_uuids"):
        value = report.get(name)
        if isinstance(value, (list, tuple)):
            clean[name] = [_text(v) for v in value if _text(v)][:MAX_REPORT_ITEMS]
    return clean
