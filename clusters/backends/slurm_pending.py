"""Jobs from outside Gantry that wait in Slurm's queue for GPUs: what Slurm starts on GPUs
as they come free, read from ``squeue -t PD`` (CLI) or slurmrestd's ``GET /jobs``. Pure:
text or JSON in, ``PendingClaim`` rows and the reason the answer cannot be trusted out.

An answer Gantry cannot read whole (a line with fields missing, a state that is not
PENDING, a count that is no number) is not guessed at: the claims come back with an error,
and admission then preempts nothing on that cluster that depends on them.
"""

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from clusters.backends.base import PendingClaim
from clusters.backends.slurm_hostlist import expand_hostlist
from clusters.backends.slurm_jobs import SlurmJob
from clusters.backends.slurm_nodes import is_gantry_job
from clusters.backends.slurm_settings import SlurmSettings
from clusters.backends.slurm_tres import gpus_per_node_of

# ``SLURM_TIME_FORMAT=%s squeue -a -h -t PD -o SQUEUE_PENDING_FORMAT``: id, state, priority,
# node count, GPUs per node (tres-per-node), expected start (``--start``), the nodes Slurm
# plans to start it on, the nodes it requires, partitions, reason, then name and comment
# last (free text: they may hold the separator).
SQUEUE_PENDING_FORMAT = "%i|%T|%Q|%D|%b|%S|%Y|%n|%P|%r|%j|%k"
_FIELDS = 12
# The reasons of a job that starts when GPUs free: it waits for resources, or behind jobs
# of higher priority, or has not been looked at yet. Jobs held, waiting for a dependency,
# a begin time, a reservation or their own limits do not take freed GPUs.
WAITS_FOR_GPUS = frozenset({"None", "Resources", "Priority"})
_NONE = ("", "(null)", "N/A", "None", "Unknown")


class PendingError(ValueError):
    """Slurm's answer about pending jobs cannot be read whole."""


def _number(value: object, what: str, job: str, *, least: int = 0) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < least:
        raise PendingError(f"job {job}: {what} {text!r} is not a number of at least {least}")
    return int(text)


def _start(value: object) -> datetime | None:
    text = str(value if value is not None else "").strip()
    if text in _NONE or text == "0":
        return None
    if not text.isdigit():
        raise PendingError(f"expected start {text!r} is not a time in seconds")
    return datetime.fromtimestamp(int(text), UTC)


def _nodes(value: object) -> tuple[str, ...]:
    text = str(value if value is not None else "").strip()
    if text in _NONE:
        return ()
    try:
        return tuple(expand_hostlist(text))
    except ValueError as exc:
        raise PendingError(str(exc)) from None


def _claims(
    *,
    job: str,
    partitions: Iterable[str],
    nodes: int,
    gpus: Mapping[str, int],
    settings: SlurmSettings,
    priority: int | None,
    start: datetime | None,
    expected: tuple[str, ...],
    eligible: tuple[str, ...],
) -> list[PendingClaim]:
    """The claim of one pending job on each flavor it could run on: its GPU type (an
    untyped request fits every flavor) in a partition the flavor's nodes are in."""
    partitions = set(partitions)
    claims = []
    for flavor, mapping in sorted(settings.flavors.items()):
        partition = mapping.partition or settings.partition
        if partition and partitions and partition not in partitions:
            continue
        per_node = gpus.get(mapping.gres_type, 0) or gpus.get("", 0)
        if per_node <= 0:
            continue
        claims.append(
            PendingClaim(
                job=f"Slurm job {job}",
                flavor=flavor,
                nodes=nodes,
                gpus_per_node=per_node,
                priority=priority,
                expected_start=start,
                expected_nodes=expected,
                eligible=eligible,
            )
        )
    return claims


def parse_squeue_pending(text: str, settings: SlurmSettings) -> list[PendingClaim]:
    """Rows of ``squeue -a -h -t PD -o SQUEUE_PENDING_FORMAT`` (``SLURM_TIME_FORMAT=%s``):
    the claims of outside jobs that wait for GPUs. Raises ``PendingError`` naming the line
    that cannot be read."""
    claims: list[PendingClaim] = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        cells = line.split("|", _FIELDS - 1)
        if len(cells) != _FIELDS:
            raise PendingError(
                f"line {number} has {len(cells)} of squeue's {_FIELDS} fields: {line[:120]!r}"
            )
        job_id, state, priority, count, tres, start, planned, required, parts, reason = cells[:10]
        name, comment = cells[10], cells[11]
        job_id = job_id.strip()
        if not job_id.isdigit():
            raise PendingError(f"line {number}: job id {job_id!r} is not a number")
        state = state.strip().upper()
        if state != "PENDING":
            raise PendingError(f"job {job_id}: state {state!r}, where only PENDING was asked for")
        gantry = SlurmJob(job_id=job_id, name=name, state=state, comment=comment.strip())
        if is_gantry_job(gantry) or reason.strip() not in WAITS_FOR_GPUS:
            continue
        gpus = gpus_per_node_of("" if tres.strip() in _NONE else tres.strip())
        if not gpus:
            continue
        try:
            begins, expected, eligible = _start(start), _nodes(planned), _nodes(required)
        except PendingError as exc:
            raise PendingError(f"job {job_id}: {exc}") from None
        claims += _claims(
            job=job_id,
            partitions=parts.strip().split(","),
            nodes=_number(count, "node count", job_id, least=1),
            gpus=gpus,
            settings=settings,
            priority=_number(priority, "priority", job_id),
            start=begins,
            expected=expected,
            eligible=eligible,
        )
    return claims


def parse_rest_pending(payload: Mapping[str, Any], settings: SlurmSettings) -> list[PendingClaim]:
    """The same from slurmrestd ``GET /slurm/v0.0.38/jobs`` (every job; the pending ones
    count). v0.0.38 has no planned nodes; ``start_time`` of a pending job is its expected
    start, ``required_nodes`` the nodes it must run on."""
    claims: list[PendingClaim] = []
    for job in payload.get("jobs") or []:
        if not isinstance(job, Mapping):
            raise PendingError("a job in slurmrestd's answer is not an object")
        job_id = str(job.get("job_id", "")).strip()
        if not job_id.isdigit():
            raise PendingError(f"a job in slurmrestd's answer has job id {job_id!r}")
        state = str(job.get("job_state") or "").strip().upper()
        if not state:
            raise PendingError(f"job {job_id} has no job_state")
        if state != "PENDING":
            continue
        name, comment = str(job.get("name") or ""), str(job.get("comment") or "")
        gantry = SlurmJob(job_id=job_id, name=name, state=state, comment=comment)
        if is_gantry_job(gantry) or str(job.get("state_reason") or "None") not in WAITS_FOR_GPUS:
            continue
        gpus = gpus_per_node_of(str(job.get("tres_per_node") or ""))
        if not gpus:
            continue
        try:
            begins, eligible = _start(job.get("start_time")), _nodes(job.get("required_nodes"))
        except PendingError as exc:
            raise PendingError(f"job {job_id}: {exc}") from None
        claims += _claims(
            job=job_id,
            partitions=str(job.get("partition") or "").split(","),
            nodes=_number(job.get("node_count"), "node_count", job_id, least=1),
            gpus=gpus,
            settings=settings,
            priority=_number(job.get("priority"), "priority", job_id),
            start=begins,
            expected=(),
            eligible=eligible,
        )
    return claims
