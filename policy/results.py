"""A what-if report's result: what it keeps (JSON) and what a reader is shown of it (pure: no
Django).

A finished replay keeps three outcomes of its window (``jobs.replay_types.Outcome``): what
happened (observed), the replay of the policy that was in force (the baseline, which says
how closely the replay reproduces reality), and the replay of the proposal; and the reasons
replay and reality differ (``jobs.replay_report.differences``). Everything shown is derived
from those on reading, for the tenants the reader may see (``ReportView``): a tenant admin's
view holds their own tenants' rows and the platform totals, and its plain-words lines are
computed from those rows alone, so no other tenant's figure or name reaches them.
"""

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from jobs.replay_report import Fidelity, compare, outcomes_fidelity
from jobs.replay_types import Outcome, TenantOutcome

RESULT_VERSION = 1
SECONDS_PER_MINUTE = 60


def result_to_json(
    *, observed: Outcome, baseline: Outcome, proposed: Outcome, reasons: Collection[str]
) -> dict[str, Any]:
    """What a report keeps of a finished replay."""
    return {
        "version": RESULT_VERSION,
        "observed": observed.to_json(),
        "baseline": baseline.to_json(),
        "proposed": proposed.to_json(),
        "reasons": list(reasons),
    }


@dataclass(frozen=True)
class TenantRow:
    """One tenant side by side: what happened, and under the proposal."""

    tenant: str
    actual: TenantOutcome
    proposed: TenantOutcome

    @property
    def p50_delta_s(self) -> float | None:
        return _delta(self.actual.queue_p50_s, self.proposed.queue_p50_s)

    @property
    def p95_delta_s(self) -> float | None:
        return _delta(self.actual.queue_p95_s, self.proposed.queue_p95_s)

    @property
    def gpu_hours_delta(self) -> float:
        return self.proposed.gpu_hours - self.actual.gpu_hours

    @property
    def preemptions_delta(self) -> int:
        return self.proposed.preemptions - self.actual.preemptions

    @property
    def lost_gpu_hours_delta(self) -> float:
        return self.proposed.lost_gpu_hours - self.actual.lost_gpu_hours


@dataclass(frozen=True)
class BudgetRow:
    """A tenant's budget of a flavor in one month: used as it happened, and proposed."""

    tenant: str
    flavor: str
    month: str
    actual_used: float | None  # None: no budget then
    proposed_used: float | None
    budget: float
    hard: bool


@dataclass(frozen=True)
class ReportView:
    """What one reader is shown of a result."""

    rows: tuple[TenantRow, ...]
    budgets: tuple[BudgetRow, ...]
    actual: Outcome  # the platform totals (utilisation, GPU-hours, preemptions) are whole
    proposed: Outcome
    lines: tuple[str, ...]
    # The replay of the policy in force against what happened (its tenants: the reader's).
    fidelity: Fidelity

    @property
    def utilisation_delta(self) -> float:
        return self.proposed.utilisation - self.actual.utilisation


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _only(outcome: Outcome, tenants: Collection[str] | None) -> Outcome:
    """``outcome`` with the rows of ``tenants`` alone (None: all); totals unchanged."""
    if tenants is None:
        return outcome
    return replace(outcome, tenants=tuple(t for t in outcome.tenants if t.tenant in tenants))


def report_view(result: Mapping[str, Any], *, tenants: Collection[str] | None) -> ReportView:
    """``result`` as shown to a reader of ``tenants``' rows (None: every tenant)."""
    observed = _only(Outcome.from_json(result["observed"]), tenants)
    baseline = _only(Outcome.from_json(result["baseline"]), tenants)
    proposed = _only(Outcome.from_json(result["proposed"]), tenants)
    names = sorted({t.tenant for t in observed.tenants} | {t.tenant for t in proposed.tenants})
    rows = tuple(
        TenantRow(
            tenant=name,
            actual=observed.tenant(name) or TenantOutcome.nothing(name),
            proposed=proposed.tenant(name) or TenantOutcome.nothing(name),
        )
        for name in names
    )
    budgets = []
    for row in rows:
        before = {(b.flavor, b.month): b for b in row.actual.budgets}
        after = {(b.flavor, b.month): b for b in row.proposed.budgets}
        for key in sorted(set(before) | set(after)):
            shown = after.get(key) or before[key]
            budgets.append(
                BudgetRow(
                    tenant=row.tenant,
                    flavor=key[0],
                    month=key[1],
                    actual_used=before[key].used_gpu_hours if key in before else None,
                    proposed_used=after[key].used_gpu_hours if key in after else None,
                    budget=shown.budget_gpu_hours,
                    hard=shown.hard,
                )
            )
    return ReportView(
        rows=rows,
        budgets=tuple(budgets),
        actual=observed,
        proposed=proposed,
        lines=tuple(compare(observed, proposed)),
        fidelity=outcomes_fidelity(observed, baseline, reasons=result.get("reasons", ())),
    )


def _minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / SECONDS_PER_MINUTE, 1)


def queue_chart(view: ReportView) -> dict[str, Any] | None:
    """p95 queue time per tenant, what happened and proposed, in minutes (for the KPI
    charts' script: static/gantry/kpis.js)."""
    rows = [row for row in view.rows if row.actual.runs or row.proposed.runs]
    return _tenant_chart(rows, "min", "p95 queue time (minutes)", lambda t: _minutes(t.queue_p95_s))


def gpu_hours_chart(view: ReportView) -> dict[str, Any] | None:
    """GPU-hours delivered per tenant, what happened and proposed."""
    rows = [row for row in view.rows if row.actual.gpu_hours or row.proposed.gpu_hours]
    return _tenant_chart(rows, "GPU-h", "GPU-hours delivered", lambda t: round(t.gpu_hours, 1))


def _tenant_chart(
    rows: list[TenantRow],
    unit: str,
    title: str,
    value: Callable[[TenantOutcome], float | None],
) -> dict[str, Any] | None:
    """A bar pair per tenant of ``rows``, what happened and proposed; None without rows."""
    if not rows:
        return None
    return {
        "orientation": "v",
        "categories": [row.tenant for row in rows],
        "unit": unit,
        "x_title": "Tenant",
        "y_title": title,
        "traces": [
            {"name": "What happened", "values": [value(r.actual) for r in rows]},
            {"name": "Proposed", "values": [value(r.proposed) for r in rows]},
        ],
    }
