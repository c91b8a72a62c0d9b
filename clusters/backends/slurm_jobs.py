"""What Slurm prints about jobs, and what it means for a run.

Parsers for ``sbatch --parsable``, ``squeue --json`` / REST ``/jobs``, ``sacct -P`` and
slurmdbd REST ``/jobs``; Slurm's error numbers and messages; ``job_status``: a Slurm job
record mapped to the run lifecycle and the failure taxonomy. Pure: no Django, no processes.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from clusters.backends.base import JobStatus
from clusters.backends.slurm_hostlist import expand_hostlist
from clusters.backends.slurm_tres import gpus_of_tres, gpus_per_node_of

# sacct columns the backend reads, in this order (``sacct -P -o …``).
SACCT_FIELDS = (
    "JobIDRaw",
    "JobName",
    "Comment",
    "State",
    "Reason",
    "ExitCode",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "NodeList",
    "User",
)

JOB_ID = re.compile(r"^[0-9]+$")

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
_PENDING_STATES = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
)
_RUNNING_STATES = frozenset(
    {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
)
# Slurm state → (lifecycle state, failure reason) for jobs that ended.
_FINISHED = {
    "COMPLETED": ("SUCCEEDED", ""),
    "FAILED": ("FAILED", "USER_EXIT"),
    "SPECIAL_EXIT": ("FAILED", "USER_EXIT"),
    "OUT_OF_MEMORY": ("FAILED", "OOM_HOST"),
    "NODE_FAIL": ("FAILED", "NODE_FAILURE"),
    "BOOT_FAIL": ("FAILED", "NODE_FAILURE"),
    "TIMEOUT": ("FAILED", "TIMEOUT"),
    "DEADLINE": ("FAILED", "TIMEOUT"),
    "PREEMPTED": ("PREEMPTED", "PREEMPTED"),
    "CANCELLED": ("CANCELLED", "CANCELLED"),
    "REVOKED": ("CANCELLED", "CANCELLED"),
}
# Pending reasons of a job Slurm refused at submission (it still gets an id and a record).
REFUSED_REASONS = frozenset({"BadConstraints"})
NOTHING_FOUND = 9003  # slurmdbd REST error number for an empty result


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job as squeue, sacct or slurmrestd describe it."""

    job_id: str
    name: str
    state: str  # Slurm's base state: "CANCELLED by 0" → "CANCELLED"
    comment: str = ""
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    start: datetime | None = None
    end: datetime | None = None
    elapsed_s: int | None = None
    nodes: tuple[str, ...] = ()
    gpus: int | None = None  # allocated, from AllocTRES gres/gpu
    user: str = ""
    source: str = ""  # squeue, sacct, rest, slurmdb
    # Slurm's pending reason in full ("ReqNodeNotAvail, UnavailableNodes:gpu-node2") where
    # ``reason`` has only its code ("ReqNodeNotAvail").
    reason_detail: str = ""
    gpus_per_node: Mapping[str, int] = field(default_factory=dict)  # GPU type → count

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def refused(self) -> bool:
        """Slurm refused it at submission; the record exists only to carry the refusal."""
        return self.state == "FAILED" and self.reason in REFUSED_REASONS and not self.nodes


def parse_sbatch_job_id(stdout: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``."""
    first = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = first.split(";", 1)[0].strip()
    if not JOB_ID.match(job_id):
        raise ValueError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")
    return job_id


def _epoch(value: object) -> datetime | None:
    if isinstance(value, bool) or value in (None, "", 0):
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC) if value > 0 else None
    text = str(value).strip()
    if text.isdigit():
        return datetime.fromtimestamp(int(text), UTC) if int(text) > 0 else None
    return None


def _wait_status(status: object) -> tuple[int | None, int | None]:
    """squeue/REST ``exit_code`` is a wait(2) status: 768 is exit 3, 15 is SIGTERM."""
    if isinstance(status, bool) or not isinstance(status, int):
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, 0


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct's ``ExitCode`` is ``<return code>:<signal>``."""
    code, colon, sig = (text or "").partition(":")
    if not code.strip().isdigit():
        return None, None
    return int(code), int(sig) if colon and sig.strip().isdigit() else 0


def base_state(state: str) -> str:
    return (state or "").split(" ", 1)[0].strip().upper()


def parse_squeue_json(payload: Mapping[str, Any], *, source: str = "squeue") -> list[SlurmJob]:
    """Jobs from ``squeue --json`` or slurmrestd ``GET /slurm/v0.0.38/jobs`` (one shape).

    Raises ValueError with Slurm's words when the answer carries errors and no jobs:
    ``squeue --json`` exits 0 even when it could not reach slurmctld.
    """
    errors = payload.get("errors") or []
    jobs = payload.get("jobs")
    if errors and not jobs:
        raise ValueError(describe_errors(errors))
    result = []
    for job in jobs or []:
        state = base_state(str(job.get("job_state", "")))
        code, sig = _wait_status(job.get("exit_code"))
        start = _epoch(job.get("start_time")) if state not in _PENDING_STATES else None
        end = _epoch(job.get("end_time")) if state in TERMINAL_STATES else None
        result.append(
            SlurmJob(
                job_id=str(job.get("job_id", "")),
                name=str(job.get("name") or ""),
                state=state,
                comment=str(job.get("comment") or ""),
                reason=str(job.get("state_reason") or ""),
                exit_code=code,
                signal=sig,
                start=start,
                end=end,
                elapsed_s=int((end - start).total_seconds()) if start and end else None,
                nodes=tuple(expand_hostlist(str(job.get("nodes") or ""))),
                gpus=gpus_of_tres(str(job.get("tres_alloc_str") or "")),
                user=str(job.get("user_name") or ""),
                source=source,
                reason_detail=str(job.get("state_description") or ""),
                gpus_per_node=gpus_per_node_of(str(job.get("tres_per_node") or "")),
            )
        )
    return result


def parse_sacct(text: str) -> list[SlurmJob]:
    """Rows of ``sacct -X -P -n -o <SACCT_FIELDS>`` with ``SLURM_TIME_FORMAT=%s``.

    ``-P`` separates fields with ``|`` and ends rows with a newline; only the comment (our
    own name here, or a foreign job's free text) could contain either, so a row whose field
    count is off is joined back into the comment.
    """
    jobs = []
    n = len(SACCT_FIELDS)
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) < n:
            continue
        if len(cells) > n:  # a "|" inside the comment (field 3)
            extra = len(cells) - n
            cells = [*cells[:2], "|".join(cells[2 : 3 + extra]), *cells[3 + extra :]]
        row = dict(zip(SACCT_FIELDS, cells, strict=True))
        code, sig = parse_exit_code(row["ExitCode"])
        start, end = _epoch(row["Start"]), _epoch(row["End"])
        elapsed = row["ElapsedRaw"].strip()
        jobs.append(
            SlurmJob(
                job_id=row["JobIDRaw"].strip(),
                name=row["JobName"],
                state=base_state(row["State"]),
                comment=row["Comment"],
                reason=row["Reason"],
                exit_code=code,
                signal=sig,
                start=start,
                end=end,
                elapsed_s=int(elapsed) if elapsed.isdigit() else None,
                nodes=tuple(expand_hostlist(row["NodeList"])),
                gpus=gpus_of_tres(row["AllocTRES"]),
                user=row["User"],
                source="sacct",
            )
        )
    return jobs


def parse_slurmdb_jobs(payload: Mapping[str, Any]) -> list[SlurmJob]:
    """Jobs from slurmrestd ``GET /slurmdb/v0.0.38/jobs``.

    22.05's JSON reports a job that exited 3 as ``{"status": "SUCCESS", "return_code": 0}``
    (sacct -P says ``FAILED 3:0``): a failed job's exit code is taken as unknown here.
    """
    # 9003 "Nothing found" is how slurmdbd's API answers an empty result.
    errors = [e for e in payload.get("errors") or [] if error_numbers([e]) != [NOTHING_FOUND]]
    jobs = payload.get("jobs")
    if errors and not jobs:
        raise ValueError(describe_errors(errors))
    result = []
    for job in jobs or []:
        state_field = job.get("state") or {}
        state = base_state(str(state_field.get("current", "")))
        exit_field = job.get("exit_code") or {}
        code = exit_field.get("return_code") if isinstance(exit_field, Mapping) else None
        sig_field = exit_field.get("signal") if isinstance(exit_field, Mapping) else None
        sig = sig_field.get("signal_id") if isinstance(sig_field, Mapping) else None
        if state != "COMPLETED" and code == 0 and not sig:
            code = None
        times = job.get("time") or {}
        start, end = _epoch(times.get("start")), _epoch(times.get("end"))
        allocated = (job.get("tres") or {}).get("allocated") or []
        gpus = next(
            (
                int(t.get("count") or 0)
                for t in allocated
                if t.get("type") == "gres" and t.get("name") == "gpu"
            ),
            None,
        )
        comment = job.get("comment") or {}
        result.append(
            SlurmJob(
                job_id=str(job.get("job_id", "")),
                name=str(job.get("name") or ""),
                state=state,
                comment=str((comment.get("job") if isinstance(comment, Mapping) else "") or ""),
                reason=str(state_field.get("reason") or ""),
                exit_code=code if isinstance(code, int) else None,
                signal=sig if isinstance(sig, int) else 0,
                start=start,
                end=end,
                elapsed_s=times.get("elapsed") if isinstance(times.get("elapsed"), int) else None,
                nodes=tuple(expand_hostlist(str(job.get("nodes") or ""))),
                gpus=gpus,
                user=str(job.get("user") or ""),
                source="slurmdb",
            )
        )
    return result


def describe_errors(errors: Iterable[object]) -> str:
    """Slurm's JSON errors as one line: ``Invalid job id specified (2017)``."""
    parts = []
    for error in errors:
        if not isinstance(error, Mapping):
            parts.append(str(error))
            continue
        text = str(error.get("error") or "error")
        detail = str(error.get("description") or "")
        number = error.get("error_number", error.get("error_code"))
        item = text
        if detail and detail != text:
            item += f": {detail}"
        if number not in (None, ""):
            item += f" ({number})"
        parts.append(item)
    return "; ".join(parts) or "unknown error"


def error_numbers(errors: Iterable[object]) -> list[int]:
    numbers = []
    for error in errors:
        if isinstance(error, Mapping):
            number = error.get("error_number", error.get("error_code"))
            if isinstance(number, int):
                numbers.append(number)
    return numbers


# Slurm error numbers that mean "could not talk to a daemon" (slurm_errno.h): generic
# failures (-1, how slurmrestd reports an unreachable slurmctld), communication errors,
# slurmctld communication errors, socket errors.
def is_transient_error_number(number: int) -> bool:
    return (
        number == -1
        or 1000 <= number < 1100
        or 1800 <= number < 1900
        or 5000 <= number < 5100
        or number in (2016, 2047)  # nodes busy; "unable to create job record, try again"
    )


_TRANSIENT_TEXT = re.compile(
    r"unable to contact slurm controller|socket timed out|zero bytes were transmitted|"
    r"connection refused|connection timed out|communication connection failure|"
    r"backup controller|problem talking to the database|slurmdbd|temporarily|try again|"
    r"unable to establish|no route to host|transport endpoint|not responding|"
    r"failed while looking for jobs|unable to load",
    re.IGNORECASE,
)


def is_transient_text(text: str) -> bool:
    return bool(_TRANSIENT_TEXT.search(text or ""))


def slurm_message(stderr: str) -> str:
    """The meaningful part of a Slurm client's error output."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    picked = [
        re.sub(
            r"^(sbatch|squeue|sacct|scancel|scontrol|sacctmgr|sinfo): (error: )?"
            r"(Batch job submission failed: )?",
            "",
            line,
        )
        for line in lines
        if "warning" not in line.lower()
    ] or lines
    return " ".join(picked)[:1000]


# --- the run lifecycle ---------------------------------------------------------------------


def job_status(job: SlurmJob) -> JobStatus:
    """A Slurm job mapped to the run lifecycle and the failure taxonomy."""
    nodes = list(job.nodes)
    where = f" on {', '.join(nodes)}" if nodes else ""
    gpus = f", {job.gpus} GPUs" if job.gpus else ""
    if job.state in _PENDING_STATES:
        # Slurm's own words for why it waits; its state while it has none to give yet.
        reason = job.reason_detail or job.reason
        return JobStatus(
            state="PENDING",
            backend_job_id=job.job_id,
            message=reason if reason and reason != "None" else job.state,
            # Only a configuring job (its nodes booting) has been given nodes.
            node_list=nodes if job.state == "CONFIGURING" else [],
        )
    if job.state in _RUNNING_STATES:
        return JobStatus(
            state="RUNNING",
            backend_job_id=job.job_id,
            started_at=job.start,
            node_list=nodes,
            message=f"Slurm job {job.job_id} {job.state}{where}{gpus}",
        )
    state, reason = _FINISHED.get(job.state, ("FAILED", "UNKNOWN"))
    exit_code = job.exit_code
    if job.signal:
        exit_code = 128 + job.signal
    detail = ""
    if job.exit_code is not None or job.signal:
        detail = f", exit code {job.exit_code or 0}:{job.signal or 0}"
    elif state == "FAILED":
        detail = ", exit code unknown"
    if job.state == "FAILED" and job.exit_code == 0 and not job.signal:
        reason = "UNKNOWN"  # e.g. JobLaunchFailure: the program never ran
    if job.reason and job.reason not in ("None", "NonZeroExitCode"):
        detail += f" ({job.reason})"
    if state == "SUCCEEDED":
        exit_code = 0
    return JobStatus(
        state=state,
        backend_job_id=job.job_id,
        started_at=job.start,
        finished_at=job.end or job.start,
        exit_code=exit_code,
        failure_reason=reason,
        node_list=nodes,
        message=f"Slurm job {job.job_id} {job.state}{detail}{where}{gpus}",
    )


# Slurm's "nothing to do" answers to a cancel: the job ended or is unknown.
ALREADY_DONE = ("already completing or completed", "invalid job id specified")


def is_ours(job: SlurmJob, name: str) -> bool:
    """A job Gantry submitted for ``name``: name and comment both carry it (accounting
    stores the comment only when the job ends), and Slurm did not refuse it at submission
    (a refused job still gets a record)."""
    return job.name == name and job.comment in (name, "") and not job.refused
