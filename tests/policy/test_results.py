"""A what-if report's result as a reader sees it (policy.results): pure, no database."""

from jobs.replay_report import Fidelity, TenantFidelity
from jobs.replay_types import BudgetBurn, Outcome, TenantOutcome
from policy.results import (
    RESULT_VERSION,
    BudgetRow,
    TenantRow,
    gpu_hours_chart,
    queue_chart,
    report_view,
    result_to_json,
)

DAY = 86400.0


def outcome(*tenants: TenantOutcome, gpu_hours: float = 96.0, preemptions: int = 0) -> Outcome:
    return Outcome(
        start=0.0,
        end=DAY,
        tenants=tenants,
        capacity_gpu_hours=192.0,
        gpu_hours=gpu_hours,
        runs=sum(t.runs for t in tenants),
        started=sum(t.started for t in tenants),
        not_started=sum(t.not_started for t in tenants),
        preemptions=preemptions,
        lost_gpu_hours=0.0,
    )


def tenant(
    name: str, p50: float | None, p95: float | None, gpu_hours: float, **more
) -> TenantOutcome:
    runs = more.pop("runs", 0 if p50 is None else 4)
    return TenantOutcome(
        tenant=name,
        runs=runs,
        started=more.pop("started", runs),
        not_started=more.pop("not_started", 0),
        queue_p50_s=p50,
        queue_p95_s=p95,
        gpu_hours=gpu_hours,
        preemptions=more.pop("preemptions", 0),
        lost_gpu_hours=more.pop("lost_gpu_hours", 0.0),
        budgets=more.pop("budgets", ()),
    )


def result(observed: Outcome, baseline: Outcome, proposed: Outcome, reasons=()) -> dict:
    return result_to_json(observed=observed, baseline=baseline, proposed=proposed, reasons=reasons)


def test_a_result_keeps_the_three_outcomes_as_json_and_its_reasons_as_a_list():
    kept = result(outcome(), outcome(gpu_hours=90.0), outcome(gpu_hours=80.0), ("a", "b"))
    assert kept == {
        "version": RESULT_VERSION,
        "observed": outcome().to_json(),
        "baseline": outcome(gpu_hours=90.0).to_json(),
        "proposed": outcome(gpu_hours=80.0).to_json(),
        "reasons": ["a", "b"],
    }
    assert RESULT_VERSION == 1


def test_each_tenant_side_by_side_with_its_deltas_a_tenant_missing_on_one_side_has_nothing():
    observed = outcome(
        tenant("acme", 600.0, 1800.0, 40.0, preemptions=1, lost_gpu_hours=2.5),
        tenant("beta", 60.0, 120.0, 10.0),
    )
    proposed = outcome(
        tenant("acme", 300.0, 900.0, 46.0, preemptions=3, lost_gpu_hours=4.0),
        tenant("zeta", 0.0, 30.0, 2.0),
    )
    view = report_view(result(observed, observed, proposed), tenants=None)
    assert [row.tenant for row in view.rows] == ["acme", "beta", "zeta"]
    acme, beta, zeta = view.rows
    assert (acme.p50_delta_s, acme.p95_delta_s) == (-300.0, -900.0)
    assert (acme.gpu_hours_delta, acme.preemptions_delta, acme.lost_gpu_hours_delta) == (
        6.0,
        2,
        1.5,
    )
    # beta has no runs under the proposal; zeta had none in what happened.
    assert beta.proposed == TenantOutcome("beta", 0, 0, 0, None, None, 0.0, 0, 0.0)
    assert zeta.actual == TenantOutcome("zeta", 0, 0, 0, None, None, 0.0, 0, 0.0)
    assert (beta.p50_delta_s, beta.p95_delta_s, beta.gpu_hours_delta) == (None, None, -10.0)
    assert (zeta.p50_delta_s, zeta.p95_delta_s) == (None, None)


def test_a_tenant_admin_sees_their_own_rows_and_the_platform_totals_only():
    observed = outcome(tenant("acme", 600.0, 1800.0, 40.0), tenant("beta", 60.0, 120.0, 10.0))
    proposed = outcome(
        tenant("acme", 600.0, 1800.0, 40.0), tenant("beta", 6000.0, 9000.0, 1.0), gpu_hours=48.0
    )
    view = report_view(result(observed, observed, proposed, ("why",)), tenants={"acme"})
    assert [row.tenant for row in view.rows] == ["acme"]
    assert [t.tenant for t in view.actual.tenants] == ["acme"]
    assert [t.tenant for t in view.proposed.tenants] == ["acme"]
    assert [t.tenant for t in view.fidelity.tenants] == ["acme"]
    # Totals stay whole: 96 of 192 GPU-hours happened, 48 proposed.
    assert (view.actual.utilisation, view.proposed.utilisation) == (50.0, 25.0)
    assert view.utilisation_delta == -25.0
    assert "beta" not in " ".join(view.lines)
    assert view.fidelity.reasons == ("why",)


def test_fidelity_is_each_tenants_p50_within_ten_percent_and_utilisation_within_three_points():
    observed = outcome(
        tenant("acme", 1000.0, 2000.0, 40.0),
        tenant("beta", 1000.0, 2000.0, 10.0),
        tenant("idle", None, None, 0.0),
        tenant("gone", 500.0, 500.0, 1.0),
        gpu_hours=96.0,
    )
    baseline = outcome(
        tenant("acme", 1100.0, 2000.0, 40.0),  # exactly 10 % more: within
        tenant("beta", 899.0, 2000.0, 10.0),  # 10.1 % less: outside
        tenant("idle", None, None, 0.0),
        gpu_hours=101.76,  # 53.0 % against 50.0 %: 3 points, within
    )
    view = report_view(result(observed, baseline, observed, ("outside load",)), tenants=None)
    assert view.fidelity == Fidelity(
        tenants=(
            TenantFidelity("acme", 1000.0, 1100.0, True),
            TenantFidelity("beta", 1000.0, 899.0, False),
            TenantFidelity("idle", None, None, True),
            TenantFidelity("gone", 500.0, None, False),
        ),
        observed_utilisation=50.0,
        replayed_utilisation=53.0,
        reasons=("outside load",),
    )
    assert view.fidelity.utilisation_within is True
    assert view.fidelity.within is False


def test_a_result_kept_without_reasons_has_none():
    kept = result(outcome(), outcome(), outcome())
    del kept["reasons"]
    view = report_view(kept, tenants=None)
    assert view.fidelity.reasons == ()
    assert view.fidelity.within is True


def test_budgets_side_by_side_per_flavor_and_month_the_proposals_budget_shown():
    jan = BudgetBurn("a100", "2027-01", 80.0, 100.0, True)
    feb = BudgetBurn("a100", "2027-02", 20.0, 100.0, True)
    h100 = BudgetBurn("h100", "2027-01", 5.0, 50.0, False)
    observed = outcome(tenant("acme", 60.0, 60.0, 10.0, budgets=(jan, feb)))
    proposed = outcome(
        tenant(
            "acme",
            60.0,
            60.0,
            10.0,
            budgets=(BudgetBurn("a100", "2027-01", 95.0, 120.0, False), h100),
        )
    )
    view = report_view(result(observed, observed, proposed), tenants=None)
    assert view.budgets == (
        BudgetRow("acme", "a100", "2027-01", 80.0, 95.0, 120.0, False),
        BudgetRow("acme", "a100", "2027-02", 20.0, None, 100.0, True),
        BudgetRow("acme", "h100", "2027-01", None, 5.0, 50.0, False),
    )


def test_the_lines_compare_what_happened_with_the_proposal():
    observed = outcome(tenant("acme", 600.0, 1800.0, 40.0))
    proposed = outcome(tenant("acme", 300.0, 900.0, 40.0))
    view = report_view(result(observed, observed, proposed), tenants=None)
    assert view.lines == (
        "Wins (shorter p95 queue time): acme.",
        "Loses (longer p95 queue time): nobody.",
        "acme: p95 queue time 30 min → 15 min (−50 %); p50 10 min → 5 min (−50 %)",
        "acme: 40.0 → 40.0 GPU-hours delivered (+0 %)",
        "Platform: utilisation 50.0 % → 50.0 %; 96.0 → 96.0 GPU-hours of 192 → 192; "
        "preemptions 0 → 0; runs not started 0 → 0",
    )


def test_the_queue_chart_is_each_tenant_with_runs_p95_in_minutes():
    observed = outcome(tenant("acme", 60.0, 1234.0, 4.0), tenant("idle", None, None, 0.0))
    proposed = outcome(tenant("acme", 60.0, 90.0, 4.0), tenant("new", 0.0, None, 1.0, runs=2))
    view = report_view(result(observed, observed, proposed), tenants=None)
    assert queue_chart(view) == {
        "orientation": "v",
        "categories": ["acme", "new"],
        "unit": "min",
        "x_title": "Tenant",
        "y_title": "p95 queue time (minutes)",
        "traces": [
            {"name": "What happened", "values": [20.6, None]},
            {"name": "Proposed", "values": [1.5, None]},
        ],
    }


def test_the_gpu_hours_chart_is_each_tenant_that_held_gpus_on_either_side():
    observed = outcome(tenant("acme", 60.0, 60.0, 12.34), tenant("none", 60.0, 60.0, 0.0))
    proposed = outcome(tenant("acme", 60.0, 60.0, 0.0), tenant("new", 60.0, 60.0, 3.06))
    view = report_view(result(observed, observed, proposed), tenants=None)
    assert gpu_hours_chart(view) == {
        "orientation": "v",
        "categories": ["acme", "new"],
        "unit": "GPU-h",
        "x_title": "Tenant",
        "y_title": "GPU-hours delivered",
        "traces": [
            {"name": "What happened", "values": [12.3, 0.0]},
            {"name": "Proposed", "values": [0.0, 3.1]},
        ],
    }


def test_no_chart_without_a_tenant_to_show():
    observed = outcome(tenant("idle", None, None, 0.0))
    view = report_view(result(observed, observed, observed), tenants=None)
    assert (queue_chart(view), gpu_hours_chart(view)) == (None, None)
    assert view.rows == (TenantRow("idle", observed.tenants[0], observed.tenants[0]),)
