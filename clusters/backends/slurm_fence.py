"""Gantry's drain of a Slurm node and what a node's state says about its health. Pure: no
Django, no processes.

Gantry drains a node with ``scontrol update NodeName=<node> State=DRAIN Reason="gantry: …"``
and resumes it with ``State=RESUME`` (scontrol.1, "NODES - SPECIFICATIONS FOR UPDATE
COMMAND"); both are for Slurm administrators only. The reason's ``gantry:`` prefix is how a
drain is known to be Gantry's: Gantry never resumes a node that someone drained, or took
down, for a reason of their own.
"""

import re

from clusters.health import Signal, SignalClass, Source

# A node Gantry names in a command: one Slurm node name, never a host list ("gpu[1-4]") and
# nothing a shell or scontrol's parser would read as more than a name.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
GANTRY_REASON_PREFIX = "gantry: "
# Slurm keeps the reason whole, but ``sinfo -R`` shows 20 characters and people read it in
# one line: long enough for "XID 79 on GPU 1 (fallen off the bus)", bounded all the same.
MAX_REASON = 160
# States in which a node already takes no new work on Slurm's side (``scontrol -o show node``
# flags, lower case, base state first).
_UNSCHEDULABLE_FLAGS = frozenset({"drain", "fail"})
# scontrol's words for a user who is not a Slurm administrator.
_PERMISSION = re.compile(r"invalid user id|access/permission denied|permission denied", re.I)


class FenceError(ValueError):
    """A node name or reason Gantry will not put in a command."""


def node_name(node: str) -> str:
    """``node`` if it is one plain Slurm node name, else FenceError."""
    if not isinstance(node, str) or not NODE_NAME.match(node):
        raise FenceError(
            f"{node!r} is not a Slurm node name (letters, digits, '.', '_' and '-', one node)"
        )
    return node


def fence_reason(reason: str) -> str:
    """Gantry's drain reason: ``gantry: `` and the reason on one line, control characters
    and double quotes (scontrol strips a quote at either end of a value) replaced, at most
    ``MAX_REASON`` characters. A reason that carries the prefix already (node health's
    push says ``gantry: …`` to every backend) gets it once."""
    text = re.sub(r"[\x00-\x1f\x7f\"]+", " ", str(reason or ""))
    text = " ".join(text.split())
    if is_gantry_reason(text):
        text = text[len(GANTRY_REASON_PREFIX.rstrip()) :].lstrip()
    text = text or "node health"
    if len(text) > MAX_REASON:
        text = text[: MAX_REASON - 1].rstrip() + "…"
    return GANTRY_REASON_PREFIX + text


def is_gantry_reason(reason: str) -> bool:
    """The reason (as ``scontrol show node`` gives it, without ``[user@time]``) is Gantry's."""
    return (reason or "").startswith(GANTRY_REASON_PREFIX.rstrip())


def fence_argv(node: str, reason: str) -> list[str]:
    """The drain, as an argument list (no shell): one argument per ``Key=Value``."""
    return [
        "scontrol",
        "update",
        f"NodeName={node_name(node)}",
        "State=DRAIN",
        f"Reason={fence_reason(reason)}",
    ]


def unfence_argv(node: str) -> list[str]:
    """The resume: DRAIN, DRAINED and DOWN become IDLE (or what the node's jobs make it)."""
    return ["scontrol", "update", f"NodeName={node_name(node)}", "State=RESUME"]


def state_parts(state: str) -> tuple[str, frozenset[str]]:
    """``idle+drain`` → ("idle", {"drain"}); sinfo's ``down*`` marks a node not responding."""
    base, *rest = (state or "").lower().split("+")
    flags = set(rest)
    if base.endswith("*"):
        base = base.rstrip("*")
        flags.add("not_responding")
    return base, frozenset(flags)


def takes_work(state: str) -> bool:
    """Slurm may start new jobs on a node in ``state`` (not drained, down or failing)."""
    base, flags = state_parts(state)
    return base != "down" and not flags & _UNSCHEDULABLE_FLAGS


def is_drained(state: str) -> bool:
    """Drained, draining or failing: Slurm starts nothing there until it is resumed."""
    return bool(state_parts(state)[1] & _UNSCHEDULABLE_FLAGS)


def is_permission_error(message: str) -> bool:
    return bool(_PERMISSION.search(message or ""))


def node_signals(name: str, state: str, reason: str, *, at: float) -> tuple[Signal, ...]:
    """What a node's Slurm state says about its health: DOWN, FAIL or NOT_RESPONDING is
    ``NODE_DOWN`` (code: the state as Slurm prints it, ``DOWN+NOT_RESPONDING``; detail: the
    reason). A drain is no signal: Gantry's own comes from a decision already made, and one
    for another reason already keeps Slurm from starting work there (a person's call, which
    says nothing Gantry can class)."""
    base, flags = state_parts(state)
    if base == "down" or flags & {"fail", "failing", "not_responding"}:
        code = "+".join([base.upper(), *sorted(f.upper() for f in flags)])
        return (
            Signal(
                node=name,
                signal=SignalClass.NODE_DOWN,
                source=Source.BACKEND,
                at=at,
                code=code,
                detail=reason or f"Slurm reports the node {code}",
            ),
        )
    return ()
