"""Two outcomes of one window side by side, in plain words (``jobs.replay``).

``compare(actual, proposed)``: who wins and who loses under a proposal. ``fidelity(history,
observed, replayed)``: how closely the replay of the policy in force reproduces what
happened, and why it may not (outside load, failures, runs cancelled by people).

Pure: no ORM, no clock, no I/O.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from jobs.replay_types import Ending, History, Outcome, TenantOutcome

# A tenant wins or loses when its p95 queue time moves by more than this share, and a
# minute at least (shorter changes are an admission cycle's timing).
NOTICEABLE_SHARE = 0.05
NOTICEABLE_S = 60.0
# Point 2 of issue 38: the replay of the policy in force reproduces the observed p50
# queue time per tenant within 10 % and the utilisation within 3 points.
P50_TOLERANCE = 0.10
UTILISATION_TOLERANCE_POINTS = 3.0


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def change(before: float | None, after: float | None) -> str:
    """ "(−71 %)", "(+12 %)"; "" when either is missing or the base is 0."""
    if before is None or after is None or before == 0:
        return ""
    share = (after - before) / before * 100
    sign = "−" if share < 0 else "+"
    return f" ({sign}{abs(share):.0f} %)"


def _noticeable_move(before: float | None, after: float | None) -> float:
    """``after - before`` when it is noticeable; 0 when about the same or either is missing."""
    if before is None or after is None:
        return 0.0
    moved = after - before
    return moved if abs(moved) > max(NOTICEABLE_S, NOTICEABLE_SHARE * before) else 0.0


def _tenant_lines(name: str, a: TenantOutcome | None, b: TenantOutcome | None) -> list[str]:
    a = a or TenantOutcome.nothing(name)
    b = b or TenantOutcome.nothing(name)
    lines = [
        f"{name}: p95 queue time {duration(a.queue_p95_s)} → {duration(b.queue_p95_s)}"
        f"{change(a.queue_p95_s, b.queue_p95_s)}; p50 {duration(a.queue_p50_s)} → "
        f"{duration(b.queue_p50_s)}{change(a.queue_p50_s, b.queue_p50_s)}",
        f"{name}: {a.gpu_hours:,.1f} → {b.gpu_hours:,.1f} GPU-hours delivered"
        f"{change(a.gpu_hours, b.gpu_hours)}",
    ]
    if a.not_started or b.not_started:
        lines.append(
            f"{name}: runs not started by the window's end {a.not_started} → {b.not_started}"
        )
    if a.preemptions or b.preemptions:
        lines.append(
            f"{name}: preemptions {a.preemptions} → {b.preemptions}, work lost "
            f"{a.lost_gpu_hours:,.1f} → {b.lost_gpu_hours:,.1f} GPU-hours"
        )
    burn_before = {(x.flavor, x.month): x for x in a.budgets}
    for burn in b.budgets:
        was = burn_before.get((burn.flavor, burn.month))
        used_before = f"{was.used_gpu_hours:,.0f}" if was else "—"
        lines.append(
            f"{name}: {burn.flavor} budget {burn.month}: {used_before} → "
            f"{burn.used_gpu_hours:,.0f} of {burn.budget_gpu_hours:,.0f} GPU-hours"
        )
    return lines


def compare(actual: Outcome, proposed: Outcome) -> list[str]:
    """Plain-words lines: who wins and who loses (by p95 queue time), then each tenant's
    figures before → after, then the platform's."""
    names = sorted({t.tenant for t in actual.tenants} | {t.tenant for t in proposed.tenants})
    winners, losers = [], []
    for name in names:
        a, b = actual.tenant(name), proposed.tenant(name)
        moved = _noticeable_move(
            None if a is None else a.queue_p95_s, None if b is None else b.queue_p95_s
        )
        if moved < 0:
            winners.append(name)
        elif moved:
            losers.append(name)
    lines = [
        f"Wins (shorter p95 queue time): {', '.join(winners) or 'nobody'}.",
        f"Loses (longer p95 queue time): {', '.join(losers) or 'nobody'}.",
    ]
    for name in names:
        lines.extend(_tenant_lines(name, actual.tenant(name), proposed.tenant(name)))
    lines.append(
        f"Platform: utilisation {actual.utilisation:.1f} % → {proposed.utilisation:.1f} %; "
        f"{actual.gpu_hours:,.1f} → {proposed.gpu_hours:,.1f} GPU-hours of "
        f"{actual.capacity_gpu_hours:,.0f} → {proposed.capacity_gpu_hours:,.0f}; preemptions "
        f"{actual.preemptions} → {proposed.preemptions}; runs not started "
        f"{actual.not_started} → {proposed.not_started}"
    )
    return lines


@dataclass(frozen=True, slots=True)
class TenantFidelity:
    tenant: str
    observed_p50_s: float | None
    replayed_p50_s: float | None
    within: bool  # within P50_TOLERANCE (or ``slack_s``)


@dataclass(frozen=True, slots=True)
class Fidelity:
    tenants: tuple[TenantFidelity, ...]
    observed_utilisation: float  # percent
    replayed_utilisation: float
    reasons: tuple[str, ...]  # where replay and reality differ, in plain words

    @property
    def utilisation_within(self) -> bool:
        return (
            abs(self.observed_utilisation - self.replayed_utilisation)
            <= UTILISATION_TOLERANCE_POINTS
        )

    @property
    def within(self) -> bool:
        return self.utilisation_within and all(t.within for t in self.tenants)


def fidelity(
    history: History, observed: Outcome, replayed: Outcome, *, slack_s: float = 0.0
) -> Fidelity:
    """The replay of the policy in force against what happened: each tenant's p50 queue
    time within 10 % (or ``slack_s``: a queue time of seconds is an admission cycle's
    timing), utilisation within 3 points; and what the replay does not model, counted."""
    return outcomes_fidelity(observed, replayed, reasons=differences(history), slack_s=slack_s)


def outcomes_fidelity(
    observed: Outcome, replayed: Outcome, *, reasons: Iterable[str], slack_s: float = 0.0
) -> Fidelity:
    """``fidelity`` with the reasons already written (a report keeps them with its outcomes)."""
    tenants = []
    for t in observed.tenants:
        r = replayed.tenant(t.tenant)
        after = None if r is None else r.queue_p50_s
        before = t.queue_p50_s
        within = (before is None and after is None) or (
            before is not None
            and after is not None
            and abs(after - before) <= max(P50_TOLERANCE * before, slack_s)
        )
        tenants.append(TenantFidelity(t.tenant, before, after, within))
    return Fidelity(
        tenants=tuple(tenants),
        observed_utilisation=observed.utilisation,
        replayed_utilisation=replayed.utilisation,
        reasons=tuple(reasons),
    )


def differences(history: History) -> list[str]:
    """Where the replay departs from reality, for this window, in numbers."""
    reasons = []
    outside = sum(n.outside for n in history.nodes)
    if outside:
        reasons.append(
            f"Outside load: jobs from outside Gantry use {outside} GPUs now; the replay "
            f"assumes they did for the whole window ({outside * history.seconds / 3600:,.0f} "
            "GPU-hours), as the node inventory keeps no history."
        )
    failed = [s for s in history.submissions if s.failed_attempts_s]
    if failed:
        attempts = sum(len(s.failed_attempts_s) for s in failed)
        hours = sum(s.gpus * sum(s.failed_attempts_s) for s in failed) / 3600
        reasons.append(
            f"Failures: {attempts} attempts of {len(failed)} runs failed and were retried "
            f"({hours:,.1f} GPU-hours); the replay fails them after the same time and "
            "requeues them, wherever they run."
        )
    cancelled = [s for s in history.submissions if s.ended == Ending.CANCELLED]
    if cancelled:
        by_people = sum(1 for s in cancelled if s.cancelled_by)
        queued = sum(1 for s in cancelled if s.cancelled_at is not None)
        reasons.append(
            f"Cancelled runs: {len(cancelled)} ({by_people} by people); {queued} while "
            "waiting, cancelled at the same moment in the replay, the others after the "
            "time they really ran."
        )
    unfinished = sum(1 for s in history.submissions if s.ended == Ending.UNFINISHED)
    if unfinished:
        reasons.append(
            f"Still going: {unfinished} runs had not ended when the history was read; the "
            "replay lets them run to their time limit."
        )
    reasons.extend(history.notes)
    return reasons
