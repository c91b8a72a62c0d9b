"""Reads of a run's logs from its backend: tails and whole downloads."""

from collections.abc import Iterator, Sequence

from clusters.backends import (
    JobRef,
    TransientBackendError,
    backend_for,
)
from clusters.backends.calls import backend_call
from jobs.models import (
    Attempt,
    Run,
)


def _latest_submitted_attempt(
    run: Run, attempts: Sequence[Attempt] | None = None
) -> Attempt | None:
    """``attempts``: all the run's attempts in number order (with their clusters), when the
    caller has them already."""
    if attempts is None:
        attempt = run.attempts.select_related("cluster").order_by("-number").first()
    else:
        attempt = attempts[-1] if attempts else None
    return attempt if attempt is not None and attempt.backend_job_id else None


def run_logs(*, run: Run, tail: int = 200, attempts: Sequence[Attempt] | None = None) -> str:
    attempt = _latest_submitted_attempt(run, attempts)
    if attempt is None:
        return ""
    try:
        with backend_call(cluster=attempt.cluster.name, operation="logs"):
            return backend_for(attempt.cluster).logs(
                JobRef(attempt.name, attempt.backend_job_id), tail=tail
            )
    except TransientBackendError as exc:
        return f"(logs unavailable: {exc})"


def text_tail(text: str, *, max_chars: int) -> tuple[str, bool]:
    """At most the last ``max_chars`` characters of ``text``, from a line start where the
    cut leaves one, and whether anything was cut."""
    if len(text) <= max_chars:
        return text, False
    tail = text[-max_chars:]
    newline = tail.find("\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1 :]
    return tail, True


def run_log_tail(
    *, run: Run, lines: int, max_chars: int, attempts: Sequence[Attempt] | None = None
) -> tuple[str, bool]:
    """The end of the latest attempt's log for a page: ``lines`` lines at most, and no more
    than ``max_chars`` characters however long they are (a multi-MB log must not become a
    multi-MB page); with whether it was cut to ``max_chars``. ``attempts``: all the run's
    attempts in number order, when the caller has them (no query for the latest)."""
    return text_tail(run_logs(run=run, tail=lines, attempts=attempts), max_chars=max_chars)


# Backends that cannot stream a whole log give this many of its last lines for a download.
LOG_DOWNLOAD_MAX_LINES = 1_000_000


def run_log_download(*, run: Run) -> tuple[str, Iterator[bytes]] | None:
    """The latest attempt's whole log, as a file name and chunks to stream; None while the
    backend has none. A backend that can (``log_chunks``) streams it from its start; the
    others give their last LOG_DOWNLOAD_MAX_LINES lines. TransientBackendError propagates."""
    attempt = _latest_submitted_attempt(run)
    if attempt is None:
        return None
    backend = backend_for(attempt.cluster)
    ref = JobRef(attempt.name, attempt.backend_job_id)
    log_chunks = getattr(backend, "log_chunks", None)
    if log_chunks is not None:
        chunks = log_chunks(ref)
    else:
        with backend_call(cluster=attempt.cluster.name, operation="logs"):
            text = backend.logs(ref, tail=LOG_DOWNLOAD_MAX_LINES)
        chunks = iter([text.encode()]) if text else None
    if chunks is None:
        return None
    return f"run-{run.pk}-attempt-{attempt.number}.log", chunks
