"""The versions every rank of an attempt reports (issue 36): NCCL, driver and CUDA, which
must agree across the ranks of a job, and the host each rank runs on.

Rank 0 sends the full runtime report (``backend_sync.attempt_report_runtime``), which
records its versions here too; every other rank sends a small one of its own once
(``attempt_report_rank_runtime``). A rank is a row (``AttemptRankRuntime``), so what an
attempt keeps is bounded by its GPU count, and a report is one statement that locks no
row but its own: ten thousand ranks starting together never queue on the attempt's row.
"""

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from jobs.models import RANK_REPORT_FIELDS, Attempt, AttemptRankRuntime


def rank_refusal(*, rank: int, gpus: int) -> str | None:
    """Why an attempt of ``gpus`` GPUs cannot have a rank ``rank``, or None."""
    if rank < gpus:
        return None
    return (
        f"Rank {rank} is not one of the attempt's {gpus} GPU{'s' if gpus != 1 else ''} "
        f"(ranks 0 to {gpus - 1}): Gantry runs one rank per GPU."
    )


def attempt_report_rank_runtime(
    *, attempt: Attempt, rank: int, report: dict[str, str], now: datetime | None = None
) -> bool:
    """Keep what rank ``rank`` of ``attempt`` (with its run) reports: its host and its NCCL,
    driver and CUDA versions (``RANK_REPORT_FIELDS``; a field not sent is kept blank). Returns
    whether anything changed: a rank reporting the same again writes nothing, and one
    reporting other values replaces its own row, so it counts once either way.

    Refused (``ValidationError`` on ``rank``, nothing stored) for a rank not below the
    attempt's GPU count. The caller checked the attempt's token, so the attempt was live;
    one that ends meanwhile still keeps what its ranks said."""
    refusal = rank_refusal(rank=rank, gpus=attempt.run.gpus)
    if refusal is not None:
        raise ValidationError({"rank": refusal})
    return rank_runtime_record(attempt_id=attempt.pk, rank=rank, report=report, now=now)


def rank_runtime_record(
    *, attempt_id: int, rank: int, report: dict[str, Any], now: datetime | None = None
) -> bool:
    """Insert or replace the row of (``attempt_id``, ``rank``) with ``report``'s
    ``RANK_REPORT_FIELDS``, unless it already holds those values; True if it wrote. One
    statement: ``ON CONFLICT`` settles two reports of one rank racing, ``RETURNING`` says
    whether it wrote."""
    now = now or timezone.now()
    quote = connection.ops.quote_name
    table = quote(AttemptRankRuntime._meta.db_table)
    columns = ("attempt_id", "rank", *RANK_REPORT_FIELDS, "reported_at")
    replaced = ("reported_at", *RANK_REPORT_FIELDS)
    differs = " OR ".join(
        f"{table}.{quote(name)} <> excluded.{quote(name)}" for name in RANK_REPORT_FIELDS
    )
    sql = (
        f"INSERT INTO {table} ({', '.join(quote(name) for name in columns)}) "  # noqa: S608 (names of the model, values as parameters)
        f"VALUES ({', '.join(['%s'] * len(columns))}) "
        f"ON CONFLICT ({quote('attempt_id')}, {quote('rank')}) DO UPDATE SET "
        + ", ".join(f"{quote(name)} = excluded.{quote(name)}" for name in replaced)
        + f" WHERE {differs} RETURNING {quote('rank')}"
    )
    values = [str(report.get(name) or "") for name in RANK_REPORT_FIELDS]
    with connection.cursor() as cursor:
        cursor.execute(sql, [attempt_id, rank, *values, now])
        return bool(cursor.fetchall())
