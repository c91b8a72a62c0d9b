"""Writes of the telemetry app: SDK events and per-attempt accounting.

Every write is idempotent: SDK events and step windows are keyed by (attempt, source, seq),
minute rollups by (attempt, host, GPU, minute), accounting by attempt; running a write
again gives the same rows.
"""

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Count
from django.db.models.functions import TruncHour
from django.utils import timezone

from clusters.backends import CheckpointReport
from core.metrics import SDK_RANK_WINDOWS_REFUSED
from jobs.models import Attempt
from jobs.selectors.runs import attempt_token_refusal
from jobs.services.backend_sync import checkpoints_record
from telemetry import accounting, rank_windows, sdk_events
from telemetry.models import (
    CREDITED_CAUSES,
    SOURCE_MAX_LENGTH,
    AttemptAccounting,
    RankStepWindow,
    SdkEvent,
    StepWindow,
)
from telemetry.rank_windows import HeldGpus, RankWindowIn, Refusal
from telemetry.selectors.finished_attempts import attempts_pending_accounting
from telemetry.selectors.rank_windows import attempt_held_gpus
from telemetry.selectors.timeline import attempt_timeline

MAX_EVENTS_PER_BATCH = 500
MAX_EVENTS_BODY_BYTES = 256 * 1024
# Distinct refusal messages an answer lists (the counts cover all of them).
MAX_REFUSAL_MESSAGES = 10
# What each attempt holds, kept a few minutes per process: its 1,024 ranks post within a
# minute or two, and reading it again for each would double the queries of a request. The
# key holds what changes while an attempt runs (its nodes, its GPUs' UUIDs, its job).
HELD_GPUS_KEEP_S = 300.0
MAX_HELD_GPUS_KEPT = 4096
_held_gpus_kept: dict[int, tuple[float, tuple, HeldGpus]] = {}


class AttemptClosed(Exception):
    """The attempt is no longer live: its events (checkpoints above all, which a requeued
    run resumes from) are settled, as its token is dead."""


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    rejected: int  # malformed, unknown or refused: not stored
    refused: dict[str, int] = field(default_factory=dict)  # rank windows, by reason
    messages: list[str] = field(default_factory=list)  # why: each distinct refusal once


# --- SDK events -------------------------------------------------------------------------


def _moment(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


Parsed = StepWindow | SdkEvent | RankWindowIn


def _parse_event(raw, *, attempt: Attempt, source: str) -> tuple[int, Parsed] | None:
    """One event of a batch as an unsaved row (a rank window as plain data, checked
    against the attempt later), or None when it is unknown or malformed
    (``sdk_events.EVENT_SCHEMA``, and a window may not end before it starts)."""
    if not sdk_events.EVENT.is_valid(raw):
        return None
    seq, ts, kind = raw["seq"], _moment(raw["ts"]), raw["type"]
    if kind == sdk_events.RANK_WINDOW:
        window = rank_windows.rank_window_in(raw)
        return None if window.start > window.end else (seq, window)
    if kind == sdk_events.STEP_WINDOW:
        start, end = _moment(raw["start"]), _moment(raw["end"])
        if start > end:
            return None
        return seq, StepWindow(
            attempt=attempt,
            source=source,
            seq=seq,
            start=start,
            end=end,
            steps=raw["steps"],
            step_time_s=float(raw["step_time_s"]),
            data_wait_s=float(raw.get("data_wait_s", 0.0)),
            comm_wait_s=float(raw.get("comm_wait_s", 0.0)),
            checkpoint_s=float(raw.get("checkpoint_s", 0.0)),
            step=raw.get("step"),
        )
    payload = {}
    if kind != sdk_events.READY:
        payload = {"step": raw["step"], "uri": raw["uri"], "seconds": float(raw["seconds"])}
    return seq, SdkEvent(attempt=attempt, source=source, seq=seq, type=kind, ts=ts, payload=payload)


def sdk_events_ingest(*, attempt: Attempt, source: str, events: list) -> IngestResult:
    """Store one SDK batch of ``attempt``: valid new events are kept, a ``seq`` already
    stored for (attempt, source) is a duplicate, anything malformed or unknown is rejected.
    New ``checkpoint_saved`` events are recorded as the run's checkpoints too, which a
    requeued run resumes from. Raises ``AttemptClosed`` once the attempt is no longer live,
    so an ended attempt adds no checkpoint a later attempt could resume from."""
    if not 1 <= len(source) <= SOURCE_MAX_LENGTH:
        raise ValueError("source must be 1-64 characters")
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise ValueError(f"At most {MAX_EVENTS_PER_BATCH} events per batch.")
    attempt.refresh_from_db(fields=["state"])
    refusal = attempt_token_refusal(attempt)
    if refusal is not None:
        raise AttemptClosed(refusal)
    rejected = 0
    parsed: dict[int, Parsed] = {}
    repeated = 0
    for raw in events:
        row = _parse_event(raw, attempt=attempt, source=source)
        if row is None:
            rejected += 1
        elif row[0] in parsed:
            repeated += 1  # the same seq twice in one batch: keep the first
        else:
            parsed[row[0]] = row[1]
    ranked = [row for row in parsed.values() if isinstance(row, RankWindowIn)]
    parsed = {seq: row for seq, row in parsed.items() if not isinstance(row, RankWindowIn)}
    with transaction.atomic():
        ranked_stored, ranked_repeated, refusals = _rank_windows_store(attempt, ranked)
        stored = set(
            StepWindow.objects.filter(
                attempt=attempt, source=source, seq__among=list(parsed)
            ).values_list("seq", flat=True)
        ) | set(
            SdkEvent.objects.filter(
                attempt=attempt, source=source, seq__among=list(parsed)
            ).values_list("seq", flat=True)
        )
        new = [row for seq, row in parsed.items() if seq not in stored]
        StepWindow.objects.bulk_create(
            [row for row in new if isinstance(row, StepWindow)], ignore_conflicts=True
        )
        SdkEvent.objects.bulk_create(
            [row for row in new if isinstance(row, SdkEvent)], ignore_conflicts=True
        )
        checkpoints_record(
            attempt=attempt,
            reports=[
                CheckpointReport(
                    step=row.payload["step"],
                    uri=row.payload["uri"],
                    saved_at=row.ts,
                    save_seconds=row.payload["seconds"],
                )
                for row in new
                if isinstance(row, SdkEvent) and row.type == SdkEvent.Type.CHECKPOINT_SAVED
            ],
        )
    refused = Counter(refusal.code for refusal in refusals)
    for code, count in refused.items():
        SDK_RANK_WINDOWS_REFUSED.labels(reason=code).inc(count)
    return IngestResult(
        accepted=len(new) + ranked_stored,
        duplicates=repeated + len(parsed) - len(new) + ranked_repeated,
        rejected=rejected + len(refusals),
        refused=dict(sorted(refused.items())),
        messages=list(dict.fromkeys(refusal.message for refusal in refusals))[
            :MAX_REFUSAL_MESSAGES
        ],
    )


def _rank_hour_counts(attempt: Attempt, windows: list[RankWindowIn]) -> dict[tuple[int, int], int]:
    """How many windows each rank of ``windows`` stored per clock hour its windows end in.
    One query."""
    first = min(window.hour for window in windows) * rank_windows.HOUR_S
    last = (max(window.hour for window in windows) + 1) * rank_windows.HOUR_S
    per_hour = (
        RankStepWindow.objects.filter(
            attempt=attempt,
            rank__among=sorted({window.rank for window in windows}),
            end__gte=_moment(first),
            end__lt=_moment(last),
        )
        .annotate(hour=TruncHour("end", tzinfo=UTC))
        .values("rank", "hour")
        .annotate(count=Count("id"))
        .order_by()
    )
    return {
        (row["rank"], int(row["hour"].timestamp()) // rank_windows.HOUR_S): row["count"]
        for row in per_hour
    }


def _new_rank_windows(attempt: Attempt, windows: list[RankWindowIn]) -> list[RankWindowIn]:
    """Those of ``windows`` not stored yet. One query."""
    stored = set(
        RankStepWindow.objects.filter(
            attempt=attempt,
            rank__among=sorted({window.rank for window in windows}),
            seq__among=sorted({window.seq for window in windows}),
        ).values_list("rank", "seq")
    )
    return [window for window in windows if (window.rank, window.seq) not in stored]


RANK_WINDOW_COLUMNS = (
    "attempt_id", "rank", "seq", "world_size", "local_rank", "host", "gpu", "start", "end",
    "steps", "step_time_s", "data_wait_s", "comm_wait_s",
)  # fmt: skip


def _rank_windows_insert(attempt: Attempt, windows: list[RankWindowIn]) -> int:
    """Insert ``windows``, skipping any (attempt, rank, seq) already stored; returns how
    many were new. One statement (``RETURNING`` tells the new from the duplicates)."""
    if not windows:
        return 0
    quote = connection.ops.quote_name
    row = "(" + ", ".join(["%s"] * len(RANK_WINDOW_COLUMNS)) + ")"
    sql = (
        f"INSERT INTO {quote(RankStepWindow._meta.db_table)} "  # noqa: S608 (names of the model, values as parameters)
        f"({', '.join(quote(column) for column in RANK_WINDOW_COLUMNS)}) "
        f"VALUES {', '.join([row] * len(windows))} "
        f"ON CONFLICT ({quote('attempt_id')}, {quote('rank')}, {quote('seq')}) DO NOTHING "
        f"RETURNING {quote('seq')}"
    )
    params: list[Any] = []
    for window in windows:
        params += [
            attempt.pk, window.rank, window.seq, window.world_size, window.local_rank,
            window.host, window.gpu, _moment(window.start), _moment(window.end), window.steps,
            window.step_time_s, window.data_wait_s, window.comm_wait_s,
        ]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return len(cursor.fetchall())


def _held_gpus(attempt: Attempt) -> HeldGpus:
    key = (tuple(attempt.node_list or ()), tuple(attempt.gpu_uuids or ()), attempt.backend_job_id)
    now = time.monotonic()
    kept = _held_gpus_kept.get(attempt.pk)
    if kept is not None and kept[0] > now and kept[1] == key:
        return kept[2]
    held = attempt_held_gpus(attempt=attempt)
    if len(_held_gpus_kept) >= MAX_HELD_GPUS_KEPT:
        _held_gpus_kept.clear()
    _held_gpus_kept[attempt.pk] = (now + HELD_GPUS_KEEP_S, key, held)
    return held


def _rank_windows_store(
    attempt: Attempt, windows: list[RankWindowIn]
) -> tuple[int, int, list[Refusal]]:
    """Store the new ones of ``windows`` (rank windows of one batch of ``attempt``): those
    the attempt's GPUs and the hourly cap admit, once per (rank, seq). Returns how many were
    stored, how many were duplicates, and the refusals. Two statements; a third only when a
    rank's hour may reach the cap, to tell its new windows from resent ones."""
    if not windows:
        return 0, 0, []
    held = _held_gpus(attempt)
    refusals: list[Refusal] = []
    admitted: dict[tuple[int, int], RankWindowIn] = {}
    repeated = 0
    for window in windows:
        refusal = rank_windows.refusal(window, held)
        if refusal is not None:
            refusals.append(refusal)
        elif (window.rank, window.seq) in admitted:
            repeated += 1
        else:
            admitted[(window.rank, window.seq)] = window
    if not admitted:
        return 0, repeated, refusals
    candidates = sorted(admitted.values(), key=lambda w: (w.end, w.rank, w.seq))
    per_hour = _rank_hour_counts(attempt, candidates)
    capped: list[RankWindowIn] = []
    if rank_windows.over_cap(candidates, per_hour):
        # Only new windows count against the cap: a resent one is a duplicate, not refused.
        new = _new_rank_windows(attempt, candidates)
        capped = rank_windows.over_cap(new, per_hour)
        refusals += [rank_windows.cap_refusal(window) for window in capped]
        candidates = [window for window in new if window not in capped]
    stored = _rank_windows_insert(attempt, candidates)
    return stored, repeated + len(admitted) - len(capped) - stored, refusals


# --- accounting ------------------------------------------------------------------------------


def accounting_compute(*, attempt: Attempt, now: datetime | None = None) -> AttemptAccounting:
    """Compute the attempt's accounting from its telemetry and store it, replacing the
    previous result. Recomputing from the same data gives the same values. The credit
    follows the attempt's cause class as it is now: a cause stored later makes the attempt
    pending again (``attempts_pending_accounting``), and the recomputation replaces the
    credit, never adds to it."""
    now = now or timezone.now()  # taken before reading: later data makes it pending again
    attempt = Attempt.objects.select_related("run").get(pk=attempt.pk)
    timeline = attempt_timeline(attempt=attempt)
    result = accounting.account(timeline)
    whole = result.whole_seconds()
    credited = accounting.credited_whole(
        whole, outcome=timeline.outcome, ours=attempt.cause_class in CREDITED_CAUSES
    )
    values = {
        "allocated_gpu_s": whole["allocated"],
        "effective_gpu_s": whole["effective"],
        **{f"{name}_gpu_s": whole[name] for name in accounting.WASTE},
        "activity_weighted_gpu_s": round(result.active_gpu_hours * 3600, 3),
        "queue_s": None if result.queue_s is None else round(float(result.queue_s), 3),
        "cause_class": attempt.cause_class,
        "credited_gpu_s": credited,
        "computed_at": now,
    }
    row, _ = AttemptAccounting.objects.update_or_create(attempt=attempt, defaults=values)
    return row


def accounting_compute_pending(*, limit: int = 200) -> int:
    """Account finished attempts that have no accounting yet or whose data changed since
    (new step windows, events or minutes, or a next attempt that may resume from one of
    their checkpoints). Returns how many were computed."""
    computed = 0
    for attempt in attempts_pending_accounting(limit=limit):
        accounting_compute(attempt=attempt)
        computed += 1
    return computed
