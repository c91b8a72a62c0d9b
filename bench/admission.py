"""Pure admission decisions: ``jobs.admission.decide`` versus the naive re-implementation.

Both get the same snapshot (bench.workload: nodes, held runs placed on them) and must reach
the same decisions — admitted runs with their cluster, nodes and flags, preemptions, wait
reasons and positions, reservations with their nodes; the run stops if they do not. No
database: this isolates the decision itself.
"""

from bench.naive import MemoryLedger, naive_decide, outcome_of
from bench.report import Section, best_of, ms, quick, ratio
from bench.workload import make_snapshot
from jobs.admission import decide

SIZES = (1_000, 10_000, 100_000)  # queued runs
QUICK_SIZES = (1_000,)


def run(sizes: tuple[int, ...] | None = None) -> list[Section]:
    sizes = sizes or (QUICK_SIZES if quick() else SIZES)
    section = Section(
        title="Admission decision (pure)",
        intro=(
            "`jobs.admission.decide` on one snapshot: 100 tenants, 4 flavors, 10 clusters, "
            "1,000 nodes of 8 GPUs in 2 topology levels (8,000 GPUs; held runs placed on "
            "nodes, 85 % held after churn, some outside load, one drained node per cluster; "
            "a quarter of the multi-node runs require one leaf). Baseline: the same rules "
            "re-implemented naively (`bench/naive.py`), re-scanning the held runs for every "
            "usage and free-GPU question; its decisions, placements included, are asserted "
            "equal. Best of 5 (Gantry) and of 3 (baseline)."
        ),
        columns=[
            "queued runs", "admitted", "preempted", "reserved", "Gantry", "naive baseline",
            "speed-up",
        ],
    )  # fmt: skip
    for queued in sizes:
        snapshot = make_snapshot(queued=queued)
        decisions = decide(snapshot)

        def naive(snapshot=snapshot):
            return naive_decide(
                snapshot.queued,
                MemoryLedger(snapshot),
                now=snapshot.now,
                starvation_after_s=snapshot.starvation_after_s,
            )

        assert outcome_of(decisions) == naive(), f"decisions differ at {queued} queued runs"
        gantry = best_of(lambda snapshot=snapshot: decide(snapshot), repeat=5)
        baseline = best_of(naive, repeat=3)
        section.rows.append(
            [
                f"{queued:,}",
                f"{len(decisions.admitted):,}",
                f"{len(decisions.preempted):,}",
                f"{len(decisions.reservations):,}",
                ms(gantry),
                ms(baseline),
                ratio(baseline, gantry),
            ]
        )
    return [section]
