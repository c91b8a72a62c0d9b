"""A cluster's node-health policy and what it decides (design §10, docs/node-health.md).
Pure: no Django, no clock (the callers pass the time).

``Cluster.health_policy`` keeps only what differs from ``HealthPolicy()``; ``policy_from``
checks it against ``POLICY_SCHEMA`` (unknown keys and bad values refused, by name) and
``policy_raw`` writes it back.

The decision (``decide``), for a batch of signals and every node of the cluster:

- each signal's class has an action: observe (recorded only), warn (the node becomes
  *suspect*) or quarantine (no new work from Gantry; pushed to the backend as a drain or a
  cordon and taint);
- health only ever gets worse on its own: healthy -> suspect -> quarantined. Leaving
  quarantine, or suspicion, is a person's act (``node_release``), so a node whose signals
  flap does not flip in and out of service, and a source that goes silent (stale) makes
  nothing healthy: silence is no evidence either way;
- the blast radius (NVSentinel's circuit breaker, docs/node-health.md): the policy never
  brings the cluster's quarantined nodes above ``max_quarantined_share`` of its nodes. A
  quarantine beyond it is refused: the node is made suspect with the reason, and waits
  for a person.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from clusters.health import DEFAULT_ACTIONS, Action, NodeHealth, Signal, SignalClass, Source
from core.schema import JsonSchema

# NodeHealthEvent.source of what is not a signal: a person's act, and Gantry's own push
# to the backend.
PERSON = "person"
GANTRY = "gantry"


class Act(StrEnum):
    """NodeHealthEvent.signal of the rows that record an act rather than a signal."""

    QUARANTINE = "quarantine"  # a person took the node out of service
    RELEASE = "release"  # a person returned it to service
    FENCE = "fence"  # Gantry drained / cordoned it on the backend
    UNFENCE = "unfence"
    CHECK_PASSED = "health_check_passed"  # an active health check passed on the node


class Outcome(StrEnum):
    """NodeHealthEvent.action: what Gantry did about a signal, or the act."""

    OBSERVE = "observe"  # recorded only
    WARN = "warn"  # the node is suspect
    QUARANTINE = "quarantine"  # the node is quarantined
    REFUSED = "quarantine_refused"  # the blast radius held it back: waits for a person
    RELEASE = "release"
    FENCED = "fenced"
    FENCE_FAILED = "fence_failed"
    UNFENCED = "unfenced"
    UNFENCE_FAILED = "unfence_failed"


class OnQuarantine(StrEnum):
    """What happens to the runs on a node that gets quarantined."""

    REQUEUE = "requeue"  # checkpoint and requeue on other nodes (the preemption signal)
    FINISH = "finish"  # let them run to their end
    STOP = "stop"  # stop them now


_RANK = {NodeHealth.HEALTHY: 0, NodeHealth.SUSPECT: 1, NodeHealth.QUARANTINED: 2}
_ACTION_RANK = {Action.OBSERVE: 0, Action.WARN: 1, Action.QUARANTINE: 2}


def health_rank(health: NodeHealth) -> int:
    """0 healthy, 1 suspect, 2 quarantined: the policy only ever moves a node up."""
    return _RANK[health]


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """A cluster's node-health policy; the defaults are the policy of a cluster that sets
    none."""

    actions: Mapping[SignalClass, Action] = field(
        default_factory=lambda: MappingProxyType(dict(DEFAULT_ACTIONS))
    )
    # Attempts of this many tenants failing on one node within the window: suspect.
    suspect_window_s: int = 3600
    suspect_tenants: int = 2
    # The blast radius: the policy never quarantines beyond this share of the nodes.
    max_quarantined_share: float = 0.25
    # May Gantry drain / cordon nodes on the backend? False where another system owns
    # node state: Gantry then only keeps them out of its own placement.
    fence_backend: bool = True
    on_quarantine: OnQuarantine = OnQuarantine.REQUEUE
    # Return to service only after a health check passed since the quarantine.
    release_needs_check: bool = False
    # Hardware or platform ends of one run retried without counting against max_restarts.
    max_platform_retries: int = 3
    # The same node, GPU, class and code again within this: one event, its count grows.
    flood_window_s: int = 300
    # Ranks on one node flagged as stragglers (slow GPU or unknown cause) in this many
    # distinct runs within the window: the slow-ranks signal (telemetry.straggler_flags).
    straggler_runs: int = 2
    straggler_window_s: int = 7 * 86_400

    def action(self, signal: SignalClass) -> Action:
        """The action for ``signal``; the default where ``actions`` does not say (a policy
        made in code with only some classes)."""
        return self.actions.get(signal, DEFAULT_ACTIONS[signal])


DEFAULT_POLICY = HealthPolicy()

_CLASSES = ", ".join(c.value for c in SignalClass)
_ACTIONS = ", ".join(a.value for a in Action)
_ON_QUARANTINE = ", ".join(o.value for o in OnQuarantine)


# Written out, not built by helpers: the schema is made once, at import (mutation testing
# cannot reach code that runs only then).
_WHOLE = "$path must be a whole number from "
_FLAG = {"type": "boolean", "message": "$path must be true or false, not $value"}
POLICY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "messages": {
        "type": "the health policy must be a JSON object, not $type",
        "additionalProperties": "unknown health policy key$s: $unknown (allowed: $allowed)",
    },
    "properties": {
        "actions": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                c.value: {
                    "enum": [a.value for a in Action],
                    "message": f"$path must be one of {_ACTIONS}, not $value",
                }
                for c in SignalClass
            },
            "messages": {
                "type": "actions must be an object of signal class: action, not $type",
                "additionalProperties": f"unknown signal class$s in actions: $unknown "
                f"(the classes: {_CLASSES})",
            },
        },
        "suspect_window_s": {
            "type": "integer",
            "minimum": 60,
            "maximum": 2_592_000,
            "message": _WHOLE + "60 to 2,592,000 (30 days), not $value",
        },
        "suspect_tenants": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1000,
            "message": _WHOLE + "1 to 1,000, not $value",
        },
        "max_quarantined_share": {
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "message": "max_quarantined_share must be a number from 0 to 1 (a share of the "
            "cluster's nodes), not $value",
        },
        "fence_backend": _FLAG,
        "on_quarantine": {
            "enum": [o.value for o in OnQuarantine],
            "message": f"on_quarantine must be one of {_ON_QUARANTINE}, not $value",
        },
        "release_needs_check": _FLAG,
        "max_platform_retries": {
            "type": "integer",
            "minimum": 0,
            "maximum": 100,
            "message": _WHOLE + "0 to 100, not $value",
        },
        "flood_window_s": {
            "type": "integer",
            "minimum": 1,
            "maximum": 86_400,
            "message": _WHOLE + "1 to 86,400 (a day), not $value",
        },
        "straggler_runs": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1000,
            "message": _WHOLE + "1 to 1,000, not $value",
        },
        "straggler_window_s": {
            "type": "integer",
            "minimum": 3600,
            "maximum": 2_592_000,
            "message": _WHOLE + "3,600 (an hour) to 2,592,000 (30 days), not $value",
        },
    },
}
_SCHEMA = JsonSchema(POLICY_SCHEMA)


def policy_from(raw: Mapping[str, Any]) -> HealthPolicy:
    """The policy that ``raw`` (only what differs from the defaults) describes; raises
    ``core.schema.SchemaError`` naming the key when it is not one."""
    value = _SCHEMA.validate(dict(raw) if isinstance(raw, Mapping) else raw)
    actions = dict(DEFAULT_ACTIONS)
    actions.update({SignalClass(k): Action(v) for k, v in value.get("actions", {}).items()})
    return HealthPolicy(
        actions=MappingProxyType(actions),
        suspect_window_s=value.get("suspect_window_s", DEFAULT_POLICY.suspect_window_s),
        suspect_tenants=value.get("suspect_tenants", DEFAULT_POLICY.suspect_tenants),
        max_quarantined_share=float(
            value.get("max_quarantined_share", DEFAULT_POLICY.max_quarantined_share)
        ),
        fence_backend=value.get("fence_backend", DEFAULT_POLICY.fence_backend),
        on_quarantine=OnQuarantine(value.get("on_quarantine", DEFAULT_POLICY.on_quarantine)),
        release_needs_check=value.get("release_needs_check", DEFAULT_POLICY.release_needs_check),
        max_platform_retries=value.get("max_platform_retries", DEFAULT_POLICY.max_platform_retries),
        flood_window_s=value.get("flood_window_s", DEFAULT_POLICY.flood_window_s),
        straggler_runs=value.get("straggler_runs", DEFAULT_POLICY.straggler_runs),
        straggler_window_s=value.get("straggler_window_s", DEFAULT_POLICY.straggler_window_s),
    )


def policy_raw(policy: HealthPolicy) -> dict[str, Any]:
    """What ``Cluster.health_policy`` stores of ``policy``: only what differs from the
    defaults, so a later change of a default reaches every cluster that did not set it."""
    raw: dict[str, Any] = {}
    actions = {
        c.value: policy.action(c).value
        for c in SignalClass
        if policy.action(c) != DEFAULT_ACTIONS[c]
    }
    if actions:
        raw["actions"] = actions
    for f in fields(HealthPolicy):
        if f.name == "actions":
            continue
        value = getattr(policy, f.name)
        if value != getattr(DEFAULT_POLICY, f.name):
            raw[f.name] = value.value if isinstance(value, StrEnum) else value
    return raw


def quarantine_limit(policy: HealthPolicy, nodes: int) -> int:
    """The most nodes of a cluster of ``nodes`` the policy may leave quarantined on its own:
    ``max_quarantined_share`` of them, rounded down (a quarantine never takes the share
    over the limit; 0.25 of 2 nodes is none: such a cluster needs 0.5)."""
    # Rounded first, so 0.29 of 100 nodes (28.999999999999996 in floating point) is 29.
    return max(0, math.floor(round(policy.max_quarantined_share * nodes, 9)))


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the decision needs it: its health, and since when (Unix seconds)."""

    health: NodeHealth
    since: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The new health of one node a batch of signals was about."""

    node: str
    before: NodeHealth
    health: NodeHealth
    reason: str  # why it is suspect or quarantined ("" when the node stays healthy)
    refused: bool = False  # a quarantine the blast radius held back: waits for a person

    @property
    def changed(self) -> bool:
        return self.health != self.before


@dataclass(frozen=True, slots=True)
class Decisions:
    nodes: dict[str, Decision]  # the known nodes whose health or reason changes
    outcomes: tuple[Outcome, ...]  # per signal, in the order given


def signal_sentence(signal: Signal) -> str:
    """A signal for a person, one line: ``GPU 3: XID 79 GPU has fallen off the bus``."""
    text = signal.detail or " ".join(
        part for part in (str(signal.signal), signal.code, f"from {signal.source}") if part
    )
    text = " ".join(text.split())
    return f"GPU {signal.gpu}: {text}" if signal.gpu else text


def _order(signal: Signal) -> tuple[float, str, str, str, str, str]:
    return (signal.at, signal.signal, signal.gpu, signal.code, signal.source, signal.detail)


def _counts(node: NodeView, signal: Signal) -> bool:
    """Whether ``signal`` may change ``node``'s health: not one observed before a person
    returned the node to service (they decided knowing it)."""
    return not (
        node.health == NodeHealth.HEALTHY and node.since is not None and signal.at < node.since
    )


def decide(
    policy: HealthPolicy, *, nodes: Mapping[str, NodeView], signals: Sequence[Signal]
) -> Decisions:
    """What a batch of signals does to the cluster whose every node is in ``nodes``.

    Deterministic whatever the order of ``signals``: nodes to be quarantined are taken in
    the order of their earliest quarantining signal (then by name), so where the blast
    radius stops, the first faults are the ones quarantined. Signals about a node not in
    ``nodes`` (not, or no longer, in the inventory) change nothing."""
    limit = quarantine_limit(policy, len(nodes))
    quarantined = sum(1 for view in nodes.values() if view.health == NodeHealth.QUARANTINED)
    by_node: dict[str, list[Signal]] = {}
    for signal in signals:
        view = nodes.get(signal.node)
        if view is not None and _counts(view, signal):
            by_node.setdefault(signal.node, []).append(signal)
    strongest: dict[str, tuple[Action, Signal]] = {}
    for name, found in by_node.items():
        first = min(found, key=lambda s: (-_ACTION_RANK[policy.action(s.signal)], _order(s)))
        strongest[name] = (policy.action(first.signal), first)
    decided: dict[str, Decision] = {}
    for name, (action, first) in sorted(strongest.items(), key=lambda i: (i[1][1].at, i[0])):
        view = nodes[name]
        sentence = signal_sentence(first)
        if action == Action.OBSERVE or view.health == NodeHealth.QUARANTINED:
            continue
        if action == Action.WARN:
            if view.health == NodeHealth.HEALTHY:
                decided[name] = Decision(name, view.health, NodeHealth.SUSPECT, sentence)
            continue
        if quarantined + 1 <= limit:
            quarantined += 1
            decided[name] = Decision(name, view.health, NodeHealth.QUARANTINED, sentence)
            continue
        reason = (
            f"{sentence}: not quarantined, {quarantined} of {len(nodes)} nodes are "
            f"quarantined already, the most max_quarantined_share "
            f"{policy.max_quarantined_share:g} allows: waits for a person"
        )
        decided[name] = Decision(name, view.health, NodeHealth.SUSPECT, reason, refused=True)
    return Decisions(
        nodes=decided, outcomes=tuple(_outcome(policy, nodes, decided, s) for s in signals)
    )


def _outcome(
    policy: HealthPolicy,
    nodes: Mapping[str, NodeView],
    decided: Mapping[str, Decision],
    signal: Signal,
) -> Outcome:
    """What Gantry did about one signal of the batch."""
    view = nodes.get(signal.node)
    action = policy.action(signal.signal)
    if view is None or action == Action.OBSERVE or not _counts(view, signal):
        return Outcome.OBSERVE
    if action == Action.WARN:
        return Outcome.WARN
    decision = decided.get(signal.node)
    if decision is not None and decision.refused:
        return Outcome.REFUSED
    return Outcome.QUARANTINE


def policy_edit_problem(
    policy: HealthPolicy,
    *,
    nodes: Mapping[str, NodeView],
    recent: Iterable[tuple[str, SignalClass]],
) -> str | None:
    """Why ``policy`` may not be set now, or None: the signals of its window
    (``suspect_window_s``) would, under it, quarantine more nodes than its blast radius
    allows. (An edit does not act on past signals; this says what their recurrence would
    do.)"""
    would = sorted(
        {
            node
            for node, signal in recent
            if node in nodes
            and nodes[node].health != NodeHealth.QUARANTINED
            and policy.action(signal) == Action.QUARANTINE
        }
    )
    if not would:
        return None
    already = sum(1 for view in nodes.values() if view.health == NodeHealth.QUARANTINED)
    limit = quarantine_limit(policy, len(nodes))
    if already + len(would) <= limit:
        return None
    named = ", ".join(would[:5]) + (f" and {len(would) - 5} more" if len(would) > 5 else "")
    return (
        f"Refused: under this policy the signals of the last {policy.suspect_window_s:,} s "
        f"would quarantine {len(would)} more node{'s' if len(would) > 1 else ''} ({named}), "
        f"{already + len(would)} of {len(nodes)} in all, more than max_quarantined_share "
        f"{policy.max_quarantined_share:g} allows ({limit}). Quarantine nodes by hand if "
        "you mean it, or raise max_quarantined_share."
    )


# Flood: the same node, GPU, class and code again within ``flood_window_s`` is one event.
FloodKey = tuple[str, str, str, str]


def flood_key(signal: Signal) -> FloodKey:
    return (signal.node, signal.gpu, str(signal.signal), signal.code)


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """One event's time span and count: the first and last time its signal was seen."""

    first: float
    last: float
    count: int


@dataclass(frozen=True, slots=True)
class FloodGroup:
    """The signals of a batch that make one event: ``stored`` is the key of a stored event
    they add to (None: a new event), ``span`` what the event is after them, ``members``
    the indices of the signals in the batch."""

    key: FloodKey
    stored: bool
    span: Span
    members: tuple[int, ...]


def flood_groups(
    signals: Sequence[Signal], *, window: float, stored: Mapping[FloodKey, Span]
) -> list[FloodGroup]:
    """Group a batch into events: a signal within ``window`` of an event of its key (a
    stored one, the latest per key, or one of the batch) adds to it; otherwise it starts
    one. In the order of each key's times, so the result does not depend on the batch's
    order."""
    order = sorted(range(len(signals)), key=lambda i: (flood_key(signals[i]), signals[i].at))
    groups: list[FloodGroup] = []
    latest: dict[FloodKey, int] = {}  # key -> index in groups of its latest event
    stored_open: dict[FloodKey, int] = {}  # key -> index in groups of its stored event

    def fits(span: Span, at: float) -> bool:
        return span.first - window <= at <= span.last + window

    for index in order:
        signal = signals[index]
        key, at = flood_key(signal), signal.at
        # In time order, only the stored event and the batch's latest one can take it.
        candidates = [i for i in (stored_open.get(key), latest.get(key)) if i is not None]
        target = next((i for i in candidates if fits(groups[i].span, at)), None)
        if target is None and key in stored and key not in stored_open and fits(stored[key], at):
            groups.append(FloodGroup(key, True, stored[key], ()))
            target = stored_open[key] = len(groups) - 1
        if target is None:
            groups.append(FloodGroup(key, False, Span(at, at, 1), (index,)))
            latest[key] = len(groups) - 1
            continue
        group = groups[target]
        span = group.span
        groups[target] = FloodGroup(
            key,
            group.stored,
            Span(min(span.first, at), max(span.last, at), span.count + 1),
            (*group.members, index),
        )
    return groups


# Signals stamped this far ahead of Gantry's clock are taken as seen now (skewed clocks).
CLOCK_SKEW_S = 5.0


def signal_checked(signal: Signal, *, now: float) -> tuple[Signal | None, str]:
    """A signal as it can be recorded, and what was wrong with it ("" when nothing was).

    Never raises: a class nobody knows is recorded as XID_UNKNOWN (no action by default)
    with the class it came with as its code; a time that is no number is now; a time
    ahead of ``now`` (the source's clock is ahead of ours) is now. None for a signal that
    names no node: there is nothing to attach it to."""
    problems = []
    node = str(getattr(signal, "node", "") or "").strip()[:253]
    if not node:
        return None, "a signal that names no node was dropped"
    raw_class = getattr(signal, "signal", "")
    code = str(getattr(signal, "code", "") or "")
    try:
        klass = SignalClass(raw_class)
    except ValueError:
        klass = SignalClass.XID_UNKNOWN
        code = code or str(raw_class)
        problems.append(f"unknown signal class {str(raw_class)[:40]!r}, recorded as xid_unknown")
    raw_source = getattr(signal, "source", "")
    try:
        source = Source(raw_source)
    except ValueError:
        source = None
        problems.append(f"unknown source {str(raw_source)[:40]!r}")
    at = getattr(signal, "at", None)
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        problems.append(f"no valid time ({str(at)[:40]}), taken as now")
        at = now
    elif at > now + CLOCK_SKEW_S:
        problems.append(f"stamped {at - now:.0f} s ahead of Gantry's clock, taken as now")
        at = now
    clean = Signal(
        node=node,
        signal=klass,
        source=source if source is not None else str(raw_source)[:16],  # type: ignore[arg-type]
        at=float(at),
        gpu=str(getattr(signal, "gpu", "") or "")[:64],
        code=code[:64],
        detail=str(getattr(signal, "detail", "") or "")[:500],
    )
    return clean, "; ".join(problems)
