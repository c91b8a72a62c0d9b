"""Whose fault an ended attempt's end was, and the evidence (design §10). Pure: plain facts
in, (cause class, evidence) out; no ORM, no clock.

Three classes (``jobs.models.CauseClass`` carries the same values):

- *hardware*: a fault signal of a hardware class (``clusters.health.HARDWARE_CLASSES``) on
  one of the attempt's nodes, or one of its GPUs, during the attempt (plus ``GRACE_S``
  after its end: DCGM and the backend report a fault a scrape or a sync after the job
  died of it); or the backend says a GPU or the node failed (``GPU_XID``,
  ``NODE_FAILURE``) even with no signal to back it: its words are the evidence.
- *platform*: Gantry or the cluster ended it, not the program: preempted, lost by the
  backend, the backend's own error, the node drained or quarantined by a person.
- *user*: the program ended it (its exit, out of memory in the program, a bad command or
  image, its time limit).

Hardware comes first: a preempted or lost attempt whose GPU fell off the bus meanwhile was
the hardware's. Succeeded and cancelled attempts get no class ("").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from clusters.health import HARDWARE_CLASSES, SignalClass, xid_class
from clusters.health_policy import PERSON, Act

USER = "user"
PLATFORM = "platform"
HARDWARE = "hardware"

# Seconds after an attempt's end in which a fault signal still counts as its cause.
GRACE_S = 120.0

# A person's acts (NodeHealthEvent rows of source PERSON, clusters.health_policy) that take
# a node out of service. Gantry's own push to the backend (source GANTRY: the drain or
# cordon that follows a quarantine) is no cause of its own: the quarantine before it is.
PERSON_REMOVALS = frozenset({Act.QUARANTINE.value})
# The evidence's signal of an attempt taken off its nodes because a person restarted its run
# without one of them (``jobs.services.restart``): the platform's, like a quarantine.
RESTART_EXCLUDING = "restart_excluding"

# Any other failure reason (OOM_GPU, OOM_HOST, USER_EXIT, TIMEOUT, IMAGE_PULL, NCCL,
# UNKNOWN) is the program's: nothing is credited on a guess.
_PLATFORM_REASONS = frozenset({"PREEMPTED", "LOST"})
# The backend's failure reason that blames the hardware, and the class it stands for.
_HARDWARE_REASONS = {"GPU_XID": SignalClass.GPU_LOST, "NODE_FAILURE": SignalClass.NODE_DOWN}
_NO_CLASS_STATES = frozenset({"SUCCEEDED", "CANCELLED"})

# An XID number in a backend's or the runtime's words ("Xid 79", "XID: 48").
_XID = re.compile(r"\bxid\W{0,3}(\d{1,4})\b", re.IGNORECASE)
# What a CUDA runtime error at exit says when the GPU itself failed (the CUDA runtime API's
# cudaErrorECCUncorrectable, and the driver's "fallen off the bus"); any other CUDA error is
# the program's (an illegal address, a launch failure of its own kernel).
_HARDWARE_WORDS = re.compile(
    r"uncorrectable ECC|ECC error|fallen off the bus|GPU is lost|NVLink error", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """One node-health event as recorded (``clusters.models.NodeHealthEvent``)."""

    node: str
    signal: str  # a SignalClass value, or an act's (clusters.health_policy.Act)
    at: float  # unix seconds, first observed
    gpu: str = ""
    code: str = ""
    detail: str = ""
    source: str = ""


@dataclass(frozen=True, slots=True)
class EndedAttempt:
    """The plain facts of an ended attempt."""

    state: str  # AttemptState value: SUCCEEDED, FAILED, CANCELLED, PREEMPTED, LOST
    ended: float  # unix seconds
    failure_reason: str = ""  # FailureReason value
    exit_code: int | None = None
    message: str = ""  # the backend's words about the end
    runtime_error: str = ""  # the SDK runtime report's error at exit, if it sent one
    nodes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # its GPUs (index or UUID, as the events name them)
    started: float | None = None  # None: it never started
    backend_error: bool = False  # the backend refused or failed it, not the program


Evidence = dict[str, str]


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat()


def _evidence(event: HealthEvent) -> Evidence:
    return {
        "node": event.node,
        "gpu": event.gpu,
        "signal": event.signal,
        "code": event.code,
        "at": _iso(event.at),
        "detail": event.detail,
    }


def _is_uuid(gpu: str) -> bool:
    return gpu.startswith(("GPU-", "MIG-"))


def _concerns(attempt: EndedAttempt, event: HealthEvent) -> bool:
    """Whether the event is about the attempt's nodes (or GPUs) during it. A GPU-level
    event counts only for the attempt's own GPUs when they are known: another job's GPU on
    a shared node failing says nothing about this one. An attempt with no node list is
    concerned by no event."""
    if event.node not in attempt.nodes:
        return False
    # Named the same way (UUIDs, or indexes) and not one of its own: another job's GPU.
    # Named otherwise (an index against the UUIDs the job reported), nobody can tell: it
    # counts, as a node-level event would.
    if (
        event.gpu
        and attempt.gpus
        and event.gpu not in attempt.gpus
        and _is_uuid(event.gpu) == _is_uuid(attempt.gpus[0])
    ):
        return False
    start = attempt.started if attempt.started is not None else attempt.ended
    return start <= event.at <= attempt.ended + GRACE_S


def _backend_words(attempt: EndedAttempt, signal: str) -> Evidence:
    """Evidence from the backend's (or the runtime's) words when no signal backs them."""
    return {
        "node": attempt.nodes[0] if len(attempt.nodes) == 1 else "",
        "gpu": "",
        "signal": signal,
        "code": attempt.failure_reason,
        "at": _iso(attempt.ended),
        "detail": (attempt.message or attempt.runtime_error)[:500],
    }


def attribute(attempt: EndedAttempt, events: Iterable[HealthEvent]) -> tuple[str, Evidence]:
    """The cause class of the attempt's end and its evidence (``{"node", "gpu", "signal",
    "code", "at", "detail"}``); ("", {}) for a success or a cancel."""
    if attempt.state in _NO_CLASS_STATES:
        return "", {}
    mine = sorted(
        (event for event in events if _concerns(attempt, event)),
        key=lambda e: (e.at, e.node, e.gpu, e.signal, e.code),
    )
    for event in mine:
        if event.signal in HARDWARE_CLASSES:
            return HARDWARE, _evidence(event)
    for event in mine:
        if event.source == PERSON and event.signal in PERSON_REMOVALS:
            return PLATFORM, _evidence(event)
    reason = attempt.failure_reason
    if attempt.state in ("PREEMPTED", "LOST") or reason in _PLATFORM_REASONS:
        return PLATFORM, _backend_words(attempt, reason.lower() or attempt.state.lower())
    if attempt.backend_error:
        return PLATFORM, _backend_words(attempt, "backend_error")
    words = f"{attempt.message} {attempt.runtime_error}"
    if reason in _HARDWARE_REASONS:
        xid = _XID.search(words)
        if xid is not None:
            signal = xid_class(int(xid.group(1)))
            if signal == SignalClass.XID_APPLICATION:
                # NVIDIA's catalog: these XIDs are the application's (restart it), not
                # the GPU's: the program's fault, whatever the backend called it.
                return USER, {**_backend_words(attempt, signal), "code": f"XID {xid.group(1)}"}
            return HARDWARE, {**_backend_words(attempt, signal), "code": f"XID {xid.group(1)}"}
        return HARDWARE, _backend_words(attempt, _HARDWARE_REASONS[reason])
    if _HARDWARE_WORDS.search(attempt.runtime_error):
        return HARDWARE, _backend_words(attempt, "runtime_error")
    # NCCL with no hardware signal on its nodes: the program's. A link or NIC that fails
    # shows in the NVLink / PCIe counters or as an XID (a hardware event above); without
    # one, NCCL errors come from the job itself far more often (mismatched collectives, a
    # rank that hung or died first, a wrong interface or environment).
    return USER, _backend_words(attempt, (reason or "exit").lower())


# What a researcher reads about a platform end, by the evidence's signal.
_PLATFORM_WORDS = {
    "preempted": "preempted to make room",
    "lost": "lost by the cluster",
    "backend_error": "an error of the cluster",
    Act.QUARANTINE.value: "its node was taken out of service",
    RESTART_EXCLUDING: "restarted without one of its nodes, as a person asked",
}


def cause_words(cause: str, evidence: Evidence) -> str:
    """The cause in a researcher's words, e.g. "a hardware fault on its node (XID 79 on
    GPU 3)": no other tenant, run or job is ever named."""
    signal, code, gpu = evidence.get("signal", ""), evidence.get("code", ""), evidence.get("gpu")
    if cause == HARDWARE:
        if code.isdigit() and signal not in (SignalClass.NODE_DOWN, SignalClass.NODE_CONDITION):
            what = f"XID {code}"
        elif code.startswith("XID"):
            what = code
        else:
            what = signal.replace("_", " ")
        where = f" on GPU {gpu}" if gpu else ""
        said = f"{what}{where}".strip()
        return f"a hardware fault on its node ({said})" if said else "a hardware fault on its node"
    if cause == PLATFORM:
        return "the platform: " + _PLATFORM_WORDS.get(signal, "not the program")
    if cause == USER:
        return "the program"
    return ""
