"""Straggler flags (issue 36, points 2 and 4; docs/stragglers.md, "Flags"): the periodic scan
of attempts' rank windows that stores each flagged rank (``StragglerFlag``), and the
slow-ranks signal it sends node health for a node slow in several runs.

An attempt is scanned when windows newer than its last scan have arrived while it is live,
and once more after it ended (its last windows may arrive with its end); never again after
that. A scan reads only the look-back (``telemetry.selectors.stragglers``), so its cost does
not grow with the attempt's length. Flags are upserted by (attempt, rank): a rank flagged
again has its figures updated; a rank no longer flagged keeps its row (it was slow).

One scan of an attempt at a time (a transaction-scoped advisory lock on PostgreSQL): two
passes that overlap do not both write its flags."""

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from clusters.health import NodeHealth, Signal, SignalClass, Source
from clusters.models import Cluster, ClusterNode, NodeHealthEvent
from clusters.selectors import cluster_health_policy
from clusters.services.health import node_signals_record
from jobs.models import ENDED_ATTEMPT_STATES, LIVE_ATTEMPT_STATES, Attempt
from telemetry.models import RankStepWindow, StragglerFlag, StragglerScan
from telemetry.selectors.stragglers import COUNTING_CAUSES, attempt_straggler_inputs
from telemetry.stragglers import Cause, Straggler, detect

logger = logging.getLogger(__name__)

# pg_advisory_xact_lock(SCAN_LOCK_KEY, attempt id): one scan of an attempt at a time.
SCAN_LOCK_KEY = 0x736C6F77
# Attempts scanned per pass at most (the task runs every minute; the rest wait their turn).
SCAN_LIMIT = 200
# An attempt that ended is scanned once more if it ended this recently: windows that arrive
# a day after the end are not looked for.
FINAL_SCAN_WITHIN = timedelta(days=1)


@dataclass(slots=True)
class ScanSummary:
    """What a pass did: attempts scanned, flags created and updated, nodes signalled."""

    scanned: int = 0
    created: int = 0
    updated: int = 0
    signalled: list[str] = field(default_factory=list)


def _scan_lock(attempt_id: int) -> None:
    """Within a transaction: wait for the attempt's scan lock. SQLite serialises writers at
    BEGIN already."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # The two-key form takes two int4: attempt ids are bigint, so the second key is the
        # id's low 31 bits. Two attempts that share them only wait for each other's scan.
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [SCAN_LOCK_KEY, attempt_id % 2**31])


def attempts_due(*, now: datetime, limit: int = SCAN_LIMIT) -> list[Attempt]:
    """The attempts to scan now, oldest first: live ones with a window that ended after the
    last scan's latest, and those ended within ``FINAL_SCAN_WITHIN`` with windows and no
    final scan yet. One query: the latest window end is read per candidate from the index
    (attempt, end), in the select list only, so attempts that are no candidate cost none."""
    latest = RankStepWindow.objects.filter(attempt_id=OuterRef("pk")).order_by("-end")
    candidates = (
        Attempt.objects.filter(
            Q(state__in=LIVE_ATTEMPT_STATES)
            | Q(state__in=ENDED_ATTEMPT_STATES, finished_at__gte=now - FINAL_SCAN_WITHIN)
        )
        .exclude(straggler_scan__final=True)
        .annotate(
            latest_end=Subquery(latest.values("end")[:1]),
            scanned_until=F("straggler_scan__windows_until"),
        )
        .select_related("run", "cluster")
        .order_by("pk")
    )
    due: list[Attempt] = []
    for attempt in candidates:
        latest_end, scanned = attempt.latest_end, attempt.scanned_until
        if latest_end is None:
            continue
        if scanned is None or latest_end > scanned or attempt.is_ended:
            due.append(attempt)
            if len(due) == limit:
                break
    return due


def _one_per_rank(stragglers: Iterable[Straggler]) -> dict[int, Straggler]:
    """A rank flagged in two world sizes (an elastic restart) keeps its latest run of slow
    windows."""
    kept: dict[int, Straggler] = {}
    for straggler in stragglers:
        earlier = kept.get(straggler.rank)
        if earlier is None or straggler.first_window > earlier.first_window:
            kept[straggler.rank] = straggler
    return kept


@dataclass(frozen=True, slots=True)
class AttemptScan:
    """One attempt's scan: the flags it wrote (new and updated)."""

    created: int
    updated: int
    flags: tuple[tuple[str, Cause], ...]  # (node, cause) of every flag it wrote


@transaction.atomic
def attempt_stragglers_scan(*, attempt: Attempt, now: datetime) -> AttemptScan:
    """Scan ``attempt`` (loaded with its run): detect its stragglers over the look-back and
    upsert their flags; record how far it was scanned. Does nothing if a scan since saw
    every window it has (the final scan of an ended attempt then only marks it final)."""
    _scan_lock(attempt.pk)
    scan = StragglerScan.objects.filter(attempt=attempt).first()
    inputs = attempt_straggler_inputs(attempt=attempt, now=now)
    if inputs.latest_end is None:
        return AttemptScan(0, 0, ())
    final = attempt.is_ended
    if scan is not None and inputs.latest_end <= scan.windows_until:
        if final and not scan.final:
            StragglerScan.objects.filter(pk=scan.pk).update(final=True, scanned_at=now)
        return AttemptScan(0, 0, ())
    detection = detect(
        inputs.windows,
        evidence=inputs.evidence,
        placement=inputs.placement,
        attempt_gpus=inputs.attempt_gpus,
    )
    existing = {flag.rank: flag for flag in StragglerFlag.objects.filter(attempt=attempt)}
    created, updated, written = [], [], []
    for rank, straggler in sorted(_one_per_rank(detection.stragglers).items()):
        node = inputs.nodes.get(straggler.host, straggler.host)
        figures = {
            "node": node,
            "gpu": straggler.gpu,
            "world_size": straggler.world_size,
            "cause": straggler.cause.value,
            "slowdown": straggler.slowdown,
            "windows": straggler.windows,
            "evidence": dict(straggler.evidence),
            "updated_at": now,
        }
        written.append((node, straggler.cause))
        flag = existing.get(rank)
        if flag is None:
            created.append(
                StragglerFlag(
                    attempt=attempt,
                    run_id=attempt.run_id,
                    cluster_id=attempt.cluster_id,
                    rank=rank,
                    first_window=straggler.first_window,
                    detected_at=now,
                    **figures,
                )
            )
            continue
        # Slow since the earliest window any scan saw it slow in: a later look-back may
        # begin after it.
        figures["first_window"] = min(flag.first_window, straggler.first_window)
        for name, value in figures.items():
            setattr(flag, name, value)
        updated.append(flag)
    StragglerFlag.objects.bulk_create(created)
    if updated:
        StragglerFlag.objects.bulk_update(
            updated,
            ["node", "gpu", "world_size", "cause", "slowdown", "windows", "first_window",
             "evidence", "updated_at"],
        )  # fmt: skip
    StragglerScan.objects.update_or_create(
        attempt=attempt,
        defaults={
            "windows_until": inputs.latest_end,
            "scanned_at": now,
            "final": final,
            "notes": list(detection.notes),
        },
    )
    return AttemptScan(len(created), len(updated), tuple(written))


def straggler_flags_scan(*, now: datetime | None = None, limit: int = SCAN_LIMIT) -> ScanSummary:
    """One pass: scan the attempts due (``attempts_due``), then check the nodes their flags
    name for the slow-ranks signal. An attempt whose scan fails is logged and left for the
    next pass; the others go on."""
    now = now or timezone.now()
    summary = ScanSummary()
    counted: dict[int, set[str]] = defaultdict(set)  # cluster id -> nodes to check
    clusters: dict[int, Cluster] = {}
    for attempt in attempts_due(now=now, limit=limit):
        try:
            result = attempt_stragglers_scan(attempt=attempt, now=now)
        except Exception:  # one attempt's bad data must not stop the scan of the others
            logger.exception("attempt %s: straggler scan failed", attempt.pk)
            continue
        summary.scanned += 1
        summary.created += result.created
        summary.updated += result.updated
        for node, cause in result.flags:
            if cause in COUNTING_CAUSES:
                counted[attempt.cluster_id].add(node)
                clusters[attempt.cluster_id] = attempt.cluster
    for cluster_id, nodes in sorted(counted.items()):
        signals = slow_ranks_check(cluster=clusters[cluster_id], nodes=nodes, now=now)
        summary.signalled += [signal.node for signal in signals]
    return summary


def _window_words(seconds: int) -> str:
    days, rest = divmod(seconds, 86_400)
    if not rest:
        return f"{days} day{'s' if days != 1 else ''}"
    hours = seconds / 3600
    return f"{hours:g} hour{'s' if hours != 1 else ''}"


def slow_ranks_check(*, cluster: Cluster, nodes: Iterable[str], now: datetime) -> list[Signal]:
    """Signal node health (SLOW_RANKS, the policy's action: suspect by default) for each of
    ``nodes`` where ranks were flagged with a cause that counts (``COUNTING_CAUSES``) in at
    least ``straggler_runs`` distinct runs within ``straggler_window_s``, once per node
    and window: none if such a signal was recorded for it within the window already.

    A person who returned the node to service since decided knowing those runs: only flags
    seen slow after the release count, and only a signal after it. Nodes the inventory does
    not have are left alone. Three queries, and the recording. Returns the signals sent."""
    policy = cluster_health_policy(cluster=cluster)
    needed, window = policy.straggler_runs, policy.straggler_window_s
    since = now - timedelta(seconds=window)
    cuts = {
        name: max(since, health_since)
        if health == NodeHealth.HEALTHY and health_since is not None
        else since
        for name, health, health_since in ClusterNode.objects.filter(
            cluster=cluster, name__in=sorted(set(nodes))
        ).values_list("name", "health", "health_since")
    }
    if not cuts:
        return []
    runs: dict[str, set[int]] = defaultdict(set)
    gpus: dict[str, set[str]] = defaultdict(set)
    for node, run_id, gpu, seen in StragglerFlag.objects.filter(
        cluster=cluster,
        node__in=list(cuts),
        cause__in=[cause.value for cause in COUNTING_CAUSES],
        updated_at__gte=since,
    ).values_list("node", "run_id", "gpu", "updated_at"):
        if seen >= cuts[node]:
            runs[node].add(run_id)
            gpus[node].add(gpu)
    signalled = set()
    for node, observed in NodeHealthEvent.objects.filter(
        cluster=cluster,
        node__in=list(cuts),
        signal=SignalClass.SLOW_RANKS.value,
        observed_at__gte=since,
    ).values_list("node", "observed_at"):
        if observed >= cuts[node]:
            signalled.add(node)
    signals = [
        Signal(
            node=node,
            signal=SignalClass.SLOW_RANKS,
            source=Source.ATTEMPTS,
            at=now.timestamp(),
            detail=f"ranks on it were slower than their gang in {len(runs[node])} runs within "
            f"{_window_words(window)} (a slow GPU, or no other cause found; GPU "
            f"{', '.join(sorted(gpus[node]))})",
        )
        for node in sorted(cuts)
        if len(runs[node]) >= needed and node not in signalled
    ]
    if signals:
        try:
            with transaction.atomic():  # a savepoint: the flags stay whatever happens here
                node_signals_record(cluster=cluster, signals=signals, now=now)
        except Exception:  # the next pass sends it again: no event was recorded
            logger.exception("cluster %s: slow-ranks signal not recorded", cluster.name)
            return []
    return signals
