"""The Gantry job-side reporter: buffered, best-effort, never in the training loop's way.

Standard library only, Python 3.8 syntax (training images often ship older Pythons).

A training process reports through one :class:`Reporter`:

* every rank of a multi-process job sends one small ``rank_window`` per step window (its
  rank, host, GPU and timings), so Gantry can tell which rank is slow; only rank 0 sends
  the other events;
* events (``ready``, ``step_window``, ``checkpoint_saved``, ``checkpoint_restored``) go to a
  bounded in-memory queue; a daemon thread posts them in batches to
  ``{GANTRY_API_URL}/attempts/events/``; the caller never waits on the network;
* the runtime environment (driver, CUDA, cuDNN, NCCL, framework versions, host, GPUs) goes
  to ``{GANTRY_API_URL}/attempts/report/`` from a background thread; every other rank
  sends its own NCCL, driver and CUDA versions and host, once, to
  ``{GANTRY_API_URL}/attempts/rank-report/`` (so Gantry can tell ranks that differ).

All authenticate with ``Authorization: Attempt <GANTRY_ATTEMPT_TOKEN>``. The token is
never logged, printed or put in an exception message. Without the two variables (a run on
a laptop) the reporter is a no-op and the training script works unchanged.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import uuid
import weakref

from .delivery import EventDelivery
from .events import checkpoint_fields, rank_window_fields, step_window_fields
from .ranks import env_rank, rank_identity, ranks_enabled
from .runtime_env import clean_runtime_report, collect_rank_versions, collect_runtime_env
from .step_timer import StepTimer
from .transport import (
    EVENTS_PATH,
    MAX_BATCH_EVENTS,
    RANK_REPORT_PATH,
    REPORT_PATH,
    post,
    retryable,
    token_ok,
    url_ok,
)

__all__ = ["Reporter"]

API_URL_ENV = "GANTRY_API_URL"
ATTEMPT_TOKEN_ENV = "GANTRY_ATTEMPT_TOKEN"  # noqa: S105 (a variable name)
RESUME_FROM_ENV = "GANTRY_RESUME_FROM"
RESUME_STEP_ENV = "GANTRY_RESUME_STEP"
# Optional tuning: seconds between background flushes (default 5; 120 on ranks other than
# 0, which send only their rank windows: a few windows per request spares the portal), and
# how long the exit hook may wait for the last events (default 5).
FLUSH_INTERVAL_ENV = "GANTRY_SDK_FLUSH_INTERVAL"
RANK_FLUSH_INTERVAL_ENV = "GANTRY_SDK_RANK_FLUSH_INTERVAL"
RANK_FLUSH_INTERVAL = 120.0
EXIT_TIMEOUT_ENV = "GANTRY_SDK_EXIT_TIMEOUT"

logger = logging.getLogger("gantry_sdk")

# Every live reporter, for the fork and exit hooks (weak: a dropped reporter goes away).
_REPORTERS = weakref.WeakSet()


# --- Gantry's variables -----------------------------------------------------------------------


def _env_seconds(environ, name, default):
    try:
        return float(environ.get(name, "") or default)
    except ValueError:
        return default


def _env_resume_step(environ):
    raw = environ.get(RESUME_STEP_ENV, "").strip()
    if raw.isdigit():
        return int(raw)
    if raw:
        logger.warning("gantry_sdk: ignoring %s=%r (not an integer)", RESUME_STEP_ENV, raw)
    return None


# --- the reporter -------------------------------------------------------------------------------


class Reporter(EventDelivery):
    """Reports one attempt's events to Gantry; a no-op when ``api_url`` or ``token`` is empty.

    No method of a reporter raises into the caller or waits on the network, except
    :meth:`flush` and :meth:`close`, which wait at most their ``timeout``.

    ``identity`` (``rank``, ``local_rank``, ``world_size``, ``host``, ``gpu``; see
    ``gantry_sdk.ranks.rank_identity``) makes every step window also go out as a
    ``rank_window``. A reporter that is not ``primary`` (a rank other than 0) sends only
    those, and its rank report (:meth:`runtime_env`): ``ready``, ``step_window``,
    checkpoints and the runtime report are left to rank 0.
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
        identity=None,
        primary=True,
    ):
        self.identity = dict(identity) if identity else None
        self.primary = bool(primary)
        self._rank_reported = False  # a rank other than 0 sends its versions once
        self._windows = 0  # rank windows numbered so far
        # 1,024 ranks started together would post in the same second every interval.
        self.spread_flushes = not self.primary
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
        if self.enabled and not url_ok(api_url):
            logger.warning("gantry_sdk: %s is not an http(s) URL; reporting disabled", API_URL_ENV)
            self.enabled = False
        if self.enabled and not token_ok(token):
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

    # --- construction ---

    @classmethod
    def from_env(cls, environ=None, all_ranks=False, ranks=None, **kwargs):
        """The reporter a job gets from Gantry's variables.

        Reads ``GANTRY_API_URL``, ``GANTRY_ATTEMPT_TOKEN``, ``GANTRY_RESUME_FROM`` and
        ``GANTRY_RESUME_STEP`` (and ``GANTRY_SDK_FLUSH_INTERVAL``, seconds, if set).
        Without URL or token it is a no-op. Rank 0 (or a process without a rank) reports
        everything; a process of another rank (``RANK``, ``SLURM_PROCID``, …) reports only
        its rank windows (every ``GANTRY_SDK_RANK_FLUSH_INTERVAL`` seconds, default 120)
        and its versions (:meth:`runtime_env`), unless ``ranks`` is false or
        ``GANTRY_SDK_RANKS=0``, which makes it a no-op; ``all_ranks=True`` makes every rank
        report every event (the runtime report stays rank 0's). Every rank still sees
        ``resume_step`` / ``resume_uri``.
        """
        environ = os.environ if environ is None else environ
        rank = env_rank(environ)
        primary = rank in (None, 0) or bool(all_ranks)
        ranks = ranks_enabled(environ) if ranks is None else bool(ranks)
        identity = rank_identity(environ) if ranks else None
        if "flush_interval" not in kwargs:
            if primary:
                kwargs["flush_interval"] = _env_seconds(environ, FLUSH_INTERVAL_ENV, 5.0)
            else:
                interval = _env_seconds(environ, RANK_FLUSH_INTERVAL_ENV, RANK_FLUSH_INTERVAL)
                kwargs["flush_interval"] = interval
        api_url = environ.get(API_URL_ENV, "")
        token = environ.get(ATTEMPT_TOKEN_ENV, "")
        if not primary and identity is None:
            api_url = token = ""
        if not (api_url.strip() and token.strip()):
            logger.info("gantry_sdk: not running under Gantry (or rank != 0); reporting is off")
        return cls(
            api_url=api_url,
            token=token,
            resume_from=environ.get(RESUME_FROM_ENV, "").strip() or None,
            resume_step=_env_resume_step(environ),
            rank=rank,
            identity=identity,
            primary=primary,
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

    @property
    def rank_report_url(self):
        return self._api_url + RANK_REPORT_PATH

    def __repr__(self):
        # Never the token.
        return "<Reporter {} source={}>".format(
            self._api_url if self.enabled else "disabled",
            self.source,
        )

    # --- events ---

    def ready(self):
        """The job finished its setup (model built, checkpoint restored) and starts work."""
        if self.primary:
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
        reached at the window's end, if known. With a rank ``identity`` the window also goes
        out as a ``rank_window`` (the only event of a rank other than 0)."""
        try:
            fields = step_window_fields(
                steps,
                step_time_s,
                data_wait_s,
                comm_wait_s,
                checkpoint_s,
                start,
                end,
                step,
                self._clock,
            )
        except (TypeError, ValueError) as exc:
            self._invalid("step_window", exc)
            return
        if self.primary:
            self._emit("step_window", fields)
        if self.identity is not None:
            self._windows += 1
            self._emit("rank_window", rank_window_fields(self.identity, self._windows, fields))

    def checkpoint_saved(self, step, uri, seconds):
        """A checkpoint of global ``step`` was written to ``uri``; saving blocked training
        for ``seconds``."""
        self._checkpoint("checkpoint_saved", step, uri, seconds)

    def checkpoint_restored(self, step, uri, seconds):
        """The job resumed from the checkpoint of ``step`` at ``uri``; loading took
        ``seconds``."""
        self._checkpoint("checkpoint_restored", step, uri, seconds)

    def _checkpoint(self, kind, step, uri, seconds):
        if not self.primary:
            return
        try:
            fields = checkpoint_fields(step, uri, seconds)
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

    # --- runtime environment ---

    def runtime_env(self, extra=None, wait=False):
        """Collect the runtime environment (see :func:`collect_runtime_env`), merge
        ``extra`` (e.g. ``{"node_list": [...]}``) over it, and send it to the runtime-report
        endpoint from a background thread (a few retries). Returns at once unless
        ``wait`` is true; :meth:`flush` and :meth:`close` wait for it too.

        On a rank other than 0 it sends that rank's report instead, once per process: its
        rank, host and NCCL, driver and CUDA versions (:func:`collect_rank_versions`), to
        the rank-report endpoint; nothing if per-rank reporting is off
        (``GANTRY_SDK_RANKS=0``) or no version is found. ``extra`` is rank 0's only."""
        if not self.enabled:
            return
        rank = self.identity["rank"] if self.identity is not None else self.rank
        if rank not in (None, 0):
            with self._lock:
                if self.identity is None or self._rank_reported:
                    return
                self._rank_reported = True
            self._side_thread(self._send_rank_report, (), "gantry-sdk-rank-report", wait)
        elif self.primary:
            self._side_thread(
                self._send_runtime_env, (dict(extra or {}),), "gantry-sdk-runtime-env", wait
            )

    def _side_thread(self, target, args, name, wait):
        try:
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
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
        self._post_report(self.report_url, body, "runtime report")

    def _send_rank_report(self):
        try:
            versions = collect_rank_versions()
            if not versions:
                logger.info("gantry_sdk: no NCCL, driver or CUDA version found; no rank report")
                return
            report = clean_runtime_report(dict(versions, hostname=self.identity["host"]))
            report["rank"] = self.identity["rank"]
            body = json.dumps(report, separators=(",", ":"), sort_keys=True).encode()
        except Exception as exc:
            self._warn_once("runtime_env", "gantry_sdk: rank report not collected: %s", exc)
            return
        self._post_report(self.rank_report_url, body, "rank report")

    def _post_report(self, url, body, what):
        """POST a report, retrying what may pass later (a few tries, with backoff)."""
        delay = self.backoff_initial
        for _ in range(5):
            status, retry_after = post(url, self._token, body, self.timeout)
            if 200 <= status < 300:
                return
            if not retryable(status):
                self._warn_once(
                    "runtime_env", "gantry_sdk: the portal refused the %s (HTTP %s)", what, status
                )
                return
            if self._closed:
                break
            time.sleep(self._backoff(delay, retry_after))
            delay = min(delay * 2, self.backoff_max)
        self._warn_once("runtime_env", "gantry_sdk: %s not delivered (portal down?)", what)

    def send_runtime_env(self, report, timeout=None):
        """Post a runtime report (cleaned to the accepted keys) once, from the calling
        thread. Returns the HTTP status (0: no answer, None: disabled)."""
        if not self.enabled:
            return None
        body = json.dumps(clean_runtime_report(report), separators=(",", ":"), sort_keys=True)
        timeout = self.timeout if timeout is None else float(timeout)
        status, _ = post(self.report_url, self._token, body.encode(), timeout)
        return status

    def _after_fork_in_child(self):
        # A forked child (a DataLoader worker, a launcher) starts clean: its own source and
        # sequence, an empty queue, and no flusher until it emits.
        self.source = uuid.uuid4().hex
        self._windows = 0
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
