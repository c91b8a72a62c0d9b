"""Step timing: a :class:`StepTimer` adds up the time of steps, data waits, communication
and checkpoints, and reports one ``step_window`` per window to its reporter."""

from __future__ import annotations

import time


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
