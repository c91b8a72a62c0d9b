"""The synthetic platform both admission benchmarks use, as a pure ``Snapshot``.

10 clusters × 4 flavors, each pool 25 nodes × 8 GPUs (1,000 nodes, 8,000 GPUs); 100
tenants with a quota on every flavor; pools 85 % full with held runs, of which those beyond
their tenant's guarantee are borrowed (preemptible); a queue submitted over the last two
hours, so the oldest runs are past the starvation bound and reserve GPUs.
"""

import random

from jobs.admission import HeldRun, Pool, QueuedRun, Quota, Snapshot

TENANTS = 100
FLAVORS = 4
CLUSTERS = 10
NODES_PER_POOL = 25
GPUS_PER_NODE = 8
HELD_FILL = 0.85
STARVATION_AFTER_S = 1800.0
NOW = 1_767_225_600.0  # 2026-01-01 00:00 UTC
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (1, 8), (2, 8), (4, 8))  # (nodes, GPUs per node)


def tenant_name(i: int) -> str:
    return f"tenant-{i:03d}"


def flavor_name(i: int) -> str:
    return f"flavor-{i}"


def cluster_name(i: int) -> str:
    return f"cluster-{i:02d}"


def make_quotas(rng: random.Random) -> dict[tuple[str, str], Quota]:
    quotas = {}
    for t in range(TENANTS):
        for f in range(FLAVORS):
            budget_kind = rng.random()
            budget = 1_000.0 if budget_kind < 0.2 else None
            quotas[(tenant_name(t), flavor_name(f))] = Quota(
                guaranteed=rng.randrange(4, 32),  # sums to about 1,750 of 2,000 per flavor
                borrow_limit=rng.choice((0, 16, 32, 64, 128)),
                max_gpus_per_run=rng.choice((None, None, None, 16)),
                budget_gpu_hours=budget,
                budget_hard=budget_kind < 0.1,
                weight=rng.choice((1, 1, 2, 4)),
            )
    return quotas


def make_snapshot(*, queued: int, seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    quotas = make_quotas(rng)
    pools = tuple(
        Pool(cluster_name(c), flavor_name(f), nodes=NODES_PER_POOL, gpus_per_node=GPUS_PER_NODE)
        for c in range(CLUSTERS)
        for f in range(FLAVORS)
    )
    held: list[HeldRun] = []
    usage: dict[tuple[str, str], int] = {}
    next_id = 1
    for pool in pools:
        filled = 0
        while filled < pool.capacity * HELD_FILL:
            tenant = tenant_name(rng.randrange(TENANTS))
            gpus = rng.choice((1, 2, 4, 8, 8, 16))
            key = (tenant, pool.flavor)
            usage[key] = usage.get(key, 0) + gpus
            held.append(
                HeldRun(
                    id=next_id, tenant=tenant, flavor=pool.flavor, cluster=pool.cluster, gpus=gpus,
                    priority=rng.choice((10, 50, 50, 90)),
                    admitted=round(NOW - rng.uniform(600, 86_400), 3),
                    borrowed=usage[key] > quotas[key].guaranteed,
                )
            )  # fmt: skip
            filled += gpus
            next_id += 1
    runs = []
    for _ in range(queued):
        nodes, per_node = rng.choice(SHAPES)
        runs.append(
            QueuedRun(
                id=next_id,
                tenant=tenant_name(rng.randrange(TENANTS)),
                flavor=flavor_name(rng.randrange(FLAVORS)),
                nodes=nodes,
                gpus_per_node=per_node,
                priority=rng.choice((10, 50, 50, 50, 90)),
                submitted=round(NOW - rng.uniform(0, 7_200), 3),
            )
        )
        next_id += 1
    budget_used = {
        key: rng.choice((500.0, 1_500.0)) for key, q in quotas.items() if q.budget_gpu_hours
    }
    decayed = {key: rng.uniform(0, 3_600 * 64) for key in quotas}
    return Snapshot(
        queued=tuple(runs),
        held=tuple(held),
        pools=pools,
        quotas=quotas,
        budget_used=budget_used,
        decayed_usage=decayed,
        now=NOW,
        starvation_after_s=STARVATION_AFTER_S,
    )
