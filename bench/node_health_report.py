"""The node-health benchmark's table and goals (bench/node_health.py measures)."""

from collections import Counter

from bench.node_health import (
    CHECKPOINT_EVERY_S,
    COMPRESSION,
    DAY_S,
    LEMON_EVERY_S,
    MAX_LATENCY_S,
    POLICY,
    PRECISION_GOAL,
    RECALL_GOAL,
    SEED,
    SYNC_S,
    Figures,
)
from bench.report import Section
from clusters.sim_faults import Fault, Lemon
from telemetry.kpis.metrics import Ratio, percentile


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _ettr(ratio: Ratio) -> str:
    return "—" if ratio.percent is None else f"{ratio.percent:.2f} %"


def _goal(met: bool) -> str:
    return "met" if met else "NOT met"


def section(
    figures: list[Figures], lemons: dict[str, Lemon], faults: list[Fault], *, nodes, tasks, until
) -> Section:
    guarded, bare, free = figures
    gpus = sum(n.gpus for n in nodes)
    by_class = Counter(f.signal.value for f in faults if not f.lemon)
    counts = ", ".join(f"{signal} {n}" for signal, n in sorted(by_class.items()))
    table = Section(
        title="Node health: quarantine and attribution on a month of faults (issue 34, point 9)",
        intro=(
            f"`openb_pod_list_default.csv` ({len(tasks):,} GPU tasks, arrivals {COMPRESSION}× "
            f"faster) on {len(nodes):,} nodes ({gpus:,} GPUs) of the trace's node list, "
            f"{until / DAY_S:.0f} simulated days, admission by `jobs.admission.decide`. Faults "
            "by `clusters.sim_faults` (seed "
            f"{SEED}) at the Llama 3 paper's rates per GPU-day (54 days, 16,384 H100: faulty "
            "GPU 148 → gpu_lost, HBM3 72 + SRAM 19 → ecc_uncorrectable, GSP 17 → "
            "gpu_reset_needed, software bug 54 → an application XID that ends the program, the "
            f"user's), × each node's GPUs: {counts} at random; plus 3 lemons "
            f"({', '.join(f'{name} {lemon.signal.value}' for name, lemon in sorted(lemons.items()))}"  # noqa: E501
            f", every {LEMON_EVERY_S // 3600} h). *With the policy*: "
            "`clusters.health_policy.decide` (the default policy, but `max_quarantined_share` "
            "0.5: some clusters have 2 or 3 nodes) on each fault's DCGM signal at the "
            f"next sync (every {SYNC_S} s), quarantined nodes out of placement, their runs "
            "requeued, every ended attempt classed by `jobs.attribution.attribute`, hardware "
            "and platform ends requeued from the last checkpoint (every "
            f"{CHECKPOINT_EVERY_S // 60} min) with the node excluded, at most "
            f"{POLICY.max_platform_retries} times. *Without*: the same faults end the "
            "same runs, which requeue from their checkpoint; nodes stay in service. ETTR "
            "(`telemetry.kpis.reliability.ettr`) over every run admitted in the month: Σ GPUs × "
            "work done ÷ Σ GPUs × (end, or the month's end, − first admission). Method: "
            "benchmarks-notes.md."
        ),
        columns=[
            "replay", "hardware faults (lemons')", "attempts ended by them", "GPU-h lost to faults",
            "GPU-h lost to quarantine requeues", "ETTR", "attempts failed again on the same node",
            "placements on quarantined nodes", "quarantines (refused)",
            "fault → quarantine p50 / max", "attribution precision / recall", "runs given up",
            "wall time",
        ],
    )  # fmt: skip
    for f in figures:
        latency = (
            f"{percentile(f.latencies, 50):.0f} s / {max(f.latencies):.0f} s"
            if f.latencies
            else "—"
        )
        table.rows.append(
            [
                f.label,
                f"{f.faults:,} ({f.lemon_faults:,})",
                f"{f.hit_attempts:,}",
                f"{f.lost_fault_gpu_s / 3600:,.1f}",
                f"{f.lost_requeue_gpu_s / 3600:,.1f}",
                _ettr(f.ettr),
                f"{f.failed_again_same_node:,}",
                f"{f.placements_on_quarantined:,}",
                f"{f.quarantines:,} ({f.refused:,})",
                latency,
                f"{_pct(f.precision)} / {_pct(f.recall)}",
                f"{f.given_up:,}",
                f"{f.seconds:.0f} s",
            ]
        )
    lost_with = guarded.lost_fault_gpu_s + guarded.lost_requeue_gpu_s
    lost_without = bare.lost_fault_gpu_s + bare.lost_requeue_gpu_s
    worst = max(guarded.latencies, default=0.0)
    goals = [
        (
            "placements on quarantined nodes 0",
            guarded.placements_on_quarantined == 0,
            f"{guarded.placements_on_quarantined}",
        ),
        (
            f"fault → quarantine ≤ one sync ({SYNC_S} s) and ≤ 2 min",
            worst <= min(SYNC_S, MAX_LATENCY_S),
            f"max {worst:.0f} s",
        ),
        (
            "attribution precision ≥ 95 % (with the policy; on the baseline's ends)",
            min(guarded.precision or 0, bare.precision or 0) >= PRECISION_GOAL,
            f"{_pct(guarded.precision)}; {_pct(bare.precision)}",
        ),
        (
            "attribution recall ≥ 95 % (with the policy; on the baseline's ends)",
            min(guarded.recall or 0, bare.recall or 0) >= RECALL_GOAL,
            f"{_pct(guarded.recall)}; {_pct(bare.recall)}",
        ),
        (
            "false quarantines on the fault-free replay 0",
            free.quarantines == 0,
            f"{free.quarantines}",
        ),
    ]
    ratio = f"{lost_without / lost_with:,.1f}×" if lost_with else "—"
    table.notes += [
        f"GPU-hours lost to faults and quarantine requeues: {lost_with / 3600:,.1f} with the "
        f"policy, {lost_without / 3600:,.1f} without ({ratio} less with it); ETTR "
        f"{_ettr(guarded.ettr)} with, {_ettr(bare.ettr)} without, "
        f"{_ettr(free.ettr)} fault-free ({guarded.runs_ended:,}, {bare.runs_ended:,} and "
        f"{free.runs_ended:,} runs ended in the month; {guarded.given_up} given up with the "
        "policy after too many hardware or platform ends).",
        f"Attribution (`jobs.attribution.attribute` on every ended attempt, with the signals "
        f"recorded): with the policy {guarded.true_pos} true positives, {guarded.false_pos} false "
        f"positives, {guarded.false_neg} false negatives, of "
        f"{guarded.true_pos + guarded.false_neg:,} positives and {guarded.negatives:,} "
        "negatives; on the baseline's ends (signals recorded, nobody acting on them) "
        f"{bare.true_pos}, "
        f"{bare.false_pos} and {bare.false_neg}, of {bare.true_pos + bare.false_neg:,} and "
        f"{bare.negatives:,}. An attempt ended by an injected hardware fault, or requeued off a "
        "node quarantined for one, is a positive; every other ended attempt (the trace's failed "
        "pods, which end as the program's failure; application XIDs; admission's preemptions) "
        "a negative.",
        *(f"Goal: {what}: {value} — {_goal(met)}." for what, met, value in goals),
    ]
    return table
