"""The events half of a :class:`~gantry_sdk.client.Reporter`: the bounded queue, the
daemon thread that posts it in batches, resends with backoff, and ``flush`` / ``close``.

``_emit`` only queues (under a lock, never on the network); the flusher thread, or
``send_once`` from the caller's thread, takes a batch, posts it, and settles it: sent,
refused for good (counted as rejected), or kept byte for byte to be sent again.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import random
import threading
import time

from .transport import MAX_BATCH_BYTES, SDK_VERSION, post, retryable

logger = logging.getLogger("gantry_sdk")


class EventDelivery:
    """The queue and the flusher of a reporter, as a base class of ``Reporter``.

    It sets up the queue's state (``_init_state``) and keeps the reporter's counters
    (``sent``, ``dropped``, ``rejected``, ``failures``); the reporter gives it ``enabled``,
    ``source``, ``rank``, ``events_url``, ``_token``, ``_clock``, ``_background`` and the
    tuning (``flush_interval``, ``batch_events``, ``max_queue``, ``timeout``,
    ``backoff_initial``, ``backoff_max``).
    """

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
        if getattr(self, "spread_flushes", False):
            # Ranks that started together flush at different moments of the interval.
            wait *= random.uniform(0.5, 1.0)
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
                status, retry_after = post(self.events_url, self._token, batch[0], self.timeout)
                with self._lock:
                    if 200 <= status < 300:
                        self.sent += batch[1]
                        self._inflight = None
                        delay = self.backoff_initial
                        continue
                    self.failures += 1
                    if not retryable(status):
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
        status, _ = post(self.events_url, self._token, batch[0], timeout)
        with self._lock:
            if 200 <= status < 300:
                self.sent += batch[1]
                self._inflight = None
            elif not retryable(status):
                self.rejected += batch[1]
                self._inflight = None
            else:
                self.failures += 1
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
