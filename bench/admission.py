"""Admission decision time: Gantry's single pass versus a naive re-scan per run.

The naive baseline is what a first implementation tends to do: for every queued run,
recompute the tenant's usage and every pool's idle GPUs from the list of runs admitted so
far. Both produce the same decisions (checked); only the cost differs.
"""

import random
import time

from jobs.admission import Pool, QueuedRun, Snapshot, decide, queue_order


def make_snapshot(*, queued: int, tenants: int, flavors: int, nodes: int, seed: int = 7):
    rng = random.Random(seed)
    flavor_names = [f"flavor-{i}" for i in range(flavors)]
    clusters = [f"cluster-{i}" for i in range(10)]
    pools = []
    for flavor in flavor_names:
        for cluster in clusters:
            pools.append(
                Pool(cluster, flavor, nodes=nodes // (flavors * len(clusters)), gpus_per_node=8,
                     used_gpus=rng.randrange(0, 64))
            )  # fmt: skip
    runs = tuple(
        QueuedRun(
            id=i,
            tenant=f"tenant-{rng.randrange(tenants)}",
            flavor=rng.choice(flavor_names),
            nodes=rng.choice((1, 1, 1, 2, 4)),
            gpus_per_node=rng.choice((1, 2, 4, 8)),
            priority=rng.choice((10, 50, 50, 50, 90)),
            submitted=float(i),
        )
        for i in range(queued)
    )
    guaranteed = {
        (f"tenant-{t}", f): rng.randrange(8, 64) for t in range(tenants) for f in flavor_names
    }
    return Snapshot(queued=runs, pools=tuple(pools), guaranteed=guaranteed, tenant_usage={})


def naive_admitted(snapshot: Snapshot) -> list[tuple[int, str]]:
    admitted: list[tuple[QueuedRun, Pool]] = []
    blocked = set()
    for run in sorted(snapshot.queued, key=queue_order):
        key = (run.tenant, run.flavor)
        if key in blocked:
            continue
        in_use = snapshot.tenant_usage.get(key, 0) + sum(
            r.gpus for r, _ in admitted if (r.tenant, r.flavor) == key
        )
        guaranteed = snapshot.guaranteed.get(key, 0)
        if guaranteed == 0 or in_use + run.gpus > guaranteed:
            blocked.add(key)
            continue
        best, best_left = None, 0
        for pool in sorted(snapshot.pools, key=lambda p: p.cluster):
            if pool.flavor != run.flavor:
                continue
            if run.gpus_per_node > pool.gpus_per_node or run.nodes > pool.nodes:
                continue
            used = pool.used_gpus + sum(r.gpus for r, p in admitted if p == pool)
            left = pool.capacity - used - run.gpus
            if left >= 0 and (best is None or left < best_left):
                best, best_left = pool, left
        if best is None:
            blocked.add(key)
            continue
        admitted.append((run, best))
    return [(r.id, p.cluster) for r, p in admitted]


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run() -> list[dict]:
    results = []
    for queued in (1_000, 10_000):
        snapshot = make_snapshot(queued=queued, tenants=100, flavors=4, nodes=1000)
        decisions = decide(snapshot)
        assert [(a.run_id, a.cluster) for a in decisions.admitted] == naive_admitted(snapshot)
        gantry = best_of(lambda s=snapshot: decide(s), repeat=5)
        naive = best_of(lambda s=snapshot: naive_admitted(s), repeat=1)
        results.append(
            {
                "name": f"admission decision, {queued:,} queued runs, 100 tenants, 4 flavors, "
                "1,000 nodes",
                "gantry_s": gantry,
                "baseline": "naive re-scan per run",
                "baseline_s": naive,
                "admitted": len(decisions.admitted),
            }
        )
    return results
