"""Writing node-health events: a batch of signals as events (a flood as one event whose
count grows), and the rows of acts (a person's quarantine or release, Gantry's push to the
backend). Used by ``clusters.services.health``, under its lock."""

from datetime import UTC, datetime

from clusters.health import NodeHealth, Signal
from clusters.health_policy import (
    PERSON,
    Act,
    Decisions,
    FloodKey,
    HealthPolicy,
    NodeView,
    Outcome,
    Span,
    flood_groups,
    flood_key,
)
from clusters.models import Cluster, NodeHealthEvent
from core.types import UserLike
from tenants.models import max_length_of

OUTCOME_RANK: dict[str, int] = {
    Outcome.OBSERVE: 0,
    Outcome.WARN: 1,
    Outcome.REFUSED: 2,
    Outcome.QUARANTINE: 3,
}


def stamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def moment(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, tz=UTC)


def events_write(
    *,
    cluster: Cluster,
    policy: HealthPolicy,
    views: dict[str, NodeView],
    signals: list[Signal],
    decisions: Decisions,
    now: datetime,
) -> list[NodeHealthEvent]:
    """One event per flood group: new rows, or stored ones whose count and span grow."""
    window = policy.flood_window_s
    stored_rows = stored_events(cluster=cluster, views=views, signals=signals, window=window)
    groups = flood_groups(
        signals,
        window=window,
        stored={
            key: Span(row.observed_at.timestamp(), row.last_observed_at.timestamp(), row.count)
            for key, row in stored_rows.items()
        },
    )
    created, updated = [], []
    for group in groups:
        outcome = max((decisions.outcomes[i] for i in group.members), key=OUTCOME_RANK.__getitem__)
        if group.stored:
            row = stored_rows[group.key]
            row.observed_at, row.last_observed_at = (
                moment(group.span.first),
                moment(group.span.last),
            )
            row.count = group.span.count
            if OUTCOME_RANK.get(row.action, 0) < OUTCOME_RANK[outcome]:
                row.action = outcome.value
            row.save(update_fields=["observed_at", "last_observed_at", "count", "action"])
            updated.append(row)
            continue
        first = min(
            (signals[i] for i in group.members),
            key=lambda s: (s.at, s.source, s.detail),
        )
        created.append(
            NodeHealthEvent(
                cluster=cluster,
                node=first.node,
                gpu=first.gpu,
                source=str(first.source),
                signal=str(first.signal),
                code=first.code,
                detail=first.detail,
                observed_at=moment(group.span.first),
                last_observed_at=moment(group.span.last),
                count=group.span.count,
                recorded_at=now,
                action=outcome.value,
            )
        )
    return [*NodeHealthEvent.objects.bulk_create(created), *updated]


def stored_events(
    *, cluster: Cluster, views: dict[str, NodeView], signals: list[Signal], window: float
) -> dict[FloodKey, NodeHealthEvent]:
    """The latest stored event of each key of the batch that a signal of it could add to:
    seen within the window of the batch's earliest signal, and not before a person
    returned the node to service (a fault after that is a new event)."""
    keys = {flood_key(s) for s in signals}
    rows = NodeHealthEvent.objects.filter(
        cluster=cluster,
        node__in={key[0] for key in keys},
        signal__in={key[2] for key in keys},
        last_observed_at__gte=moment(min(s.at for s in signals) - window),
    ).order_by("-last_observed_at", "-id")
    found: dict[FloodKey, NodeHealthEvent] = {}
    for row in rows:
        key = (row.node, row.gpu, row.signal, row.code)
        if key not in keys or key in found:
            continue
        view = views.get(row.node)
        released = view is not None and view.health == NodeHealth.HEALTHY and view.since
        if released and row.last_observed_at.timestamp() < released:
            continue
        found[key] = row
    return found


def act_event(
    *,
    cluster: Cluster,
    node: str,
    act: Act,
    outcome: Outcome,
    actor: UserLike | None,
    note: str = "",
    detail: str = "",
    source: str = PERSON,
    now: datetime,
) -> NodeHealthEvent:
    return NodeHealthEvent.objects.create(
        cluster=cluster,
        node=node,
        source=source,
        signal=act.value,
        detail=detail[: max_length_of(NodeHealthEvent, "detail")],
        observed_at=now,
        last_observed_at=now,
        recorded_at=now,
        action=outcome.value,
        actor=actor if actor is not None and actor.is_authenticated else None,
        note=note,
    )
