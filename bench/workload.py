"""The synthetic platform the admission benchmarks use, as a pure ``Snapshot`` with nodes.

10 clusters × 4 flavors, each pool 25 nodes × 8 GPUs (1,000 nodes, 8,000 GPUs), every
cluster with two topology levels (3 leaves of 5 nodes in the first of 2 blocks, 2 in the
second); 100 tenants with a quota on every flavor. About one node in 20 has 1–4 GPUs used by
jobs from outside Gantry, and one node per cluster is drained (its runs stay). Held runs sit
on concrete nodes, placed the way Gantry places them (``jobs.placement``, best fit) until
each pool is 95 % full, then some end at random down to 85 %, so free GPUs are scattered as
after a day of churn; a held run is borrowed (preemptible) when it took its tenant beyond
its guarantee. The queue was submitted over the last two hours, so the oldest runs are past
the starvation bound and reserve nodes; a quarter of the multi-node runs require one leaf.

``as_count_based`` gives the same platform as the count-based admission of
``bench/count_based.py`` saw it: one pool per cluster and flavor, GPUs counted.
"""

import random
from collections import defaultdict
from dataclasses import asdict, replace

from bench import count_based
from jobs import placement
from jobs.admission_types import ClusterNode, HeldRun, Pool, QueuedRun, Quota, Snapshot

TENANTS = 100
FLAVORS = 4
CLUSTERS = 10
NODES_PER_POOL = 25
GPUS_PER_NODE = 8
LEVELS = ("block", "leaf")
NODES_PER_LEAF = 5
LEAVES_PER_BLOCK = 3
OUTSIDE_SHARE = 0.05  # of the nodes, with some GPUs used by jobs from outside Gantry
FILL_BEFORE_CHURN = 0.95
HELD_FILL = 0.85
STARVATION_AFTER_S = 1800.0
NOW = 1_767_225_600.0  # 2026-01-01 00:00 UTC
HELD_SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (1, 8), (2, 8))  # (nodes, GPUs per node)
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (1, 8), (2, 8), (4, 8))
REQUIRED_SHARE = 0.25  # of the multi-node queued runs: all nodes in one leaf


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


def node_path(index: int) -> tuple[str, str]:
    leaf = index // NODES_PER_LEAF
    return (f"block-{leaf // LEAVES_PER_BLOCK}", f"leaf-{leaf}")


def make_nodes(rng: random.Random) -> tuple[ClusterNode, ...]:
    nodes = []
    for c in range(CLUSTERS):
        for f in range(FLAVORS):
            pool = Pool(cluster_name(c), flavor_name(f), NODES_PER_POOL, GPUS_PER_NODE)
            for index, node in enumerate(pool.expand()):
                outside = rng.choice((1, 2, 4)) if rng.random() < OUTSIDE_SHARE else 0
                drained = f == c % FLAVORS and index == NODES_PER_POOL - 1
                nodes.append(
                    replace(
                        node, outside=outside, path=node_path(index), schedulable=not drained,
                        reason="drained: bench" if drained else "",
                    )
                )  # fmt: skip
    return tuple(nodes)


def fill(
    rng: random.Random, nodes: list[ClusterNode], start_id: int
) -> list[tuple[int, str, tuple[str, ...], int]]:
    """Runs placed on one pool's ``nodes`` (drained ones too: their runs started before the
    drain): (id, tenant, nodes, GPUs), 95 % full by best fit, then runs ended at random down
    to 85 %."""
    free = {node.name: node.gpus - node.outside for node in nodes}
    capacity = sum(node.gpus for node in nodes)
    placed: list[tuple[int, str, tuple[str, ...], int]] = []
    filled, next_id, misses = 0, start_id, 0
    while filled < capacity * FILL_BEFORE_CHURN and misses < 20:
        count, per_node = rng.choice(HELD_SHAPES)
        view = [placement.Node(n.name, n.gpus, free[n.name], path=n.path) for n in nodes]
        where = placement.place(view, placement.Gang(count, per_node))
        if where is None:
            misses += 1
            continue
        for name in where.nodes:
            free[name] -= per_node
        placed.append((next_id, tenant_name(rng.randrange(TENANTS)), where.nodes, count * per_node))
        filled += count * per_node
        next_id += 1
    while filled > capacity * HELD_FILL:
        ended = placed.pop(rng.randrange(len(placed)))
        filled -= ended[3]
    return placed


def make_held(
    rng: random.Random, nodes: tuple[ClusterNode, ...], quotas: dict[tuple[str, str], Quota]
) -> tuple[HeldRun, ...]:
    by_pool: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
    for node in nodes:
        by_pool[(node.cluster, node.flavor)].append(node)
    runs = []
    next_id = 1
    for (cluster, flavor), pool_nodes in sorted(by_pool.items()):
        for run_id, tenant, on, gpus in fill(rng, pool_nodes, next_id):
            runs.append(
                HeldRun(
                    id=run_id, tenant=tenant, flavor=flavor, cluster=cluster, gpus=gpus,
                    priority=rng.choice((10, 50, 50, 90)),
                    admitted=round(NOW - rng.uniform(600, 86_400), 3), borrowed=False, nodes=on,
                )
            )  # fmt: skip
            next_id = run_id + 1
    # Borrowed: admitted when its tenant already held its guarantee of the flavor.
    usage: dict[tuple[str, str], int] = defaultdict(int)
    held = []
    for run in sorted(runs, key=lambda r: (r.admitted, r.id)):
        key = (run.tenant, run.flavor)
        usage[key] += run.gpus
        held.append(replace(run, borrowed=usage[key] > quotas[key].guaranteed))
    return tuple(sorted(held, key=lambda r: r.id))


def make_snapshot(*, queued: int, seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    quotas = make_quotas(rng)
    nodes = make_nodes(rng)
    held = make_held(rng, nodes, quotas)
    next_id = max(run.id for run in held) + 1
    runs = []
    for _ in range(queued):
        count, per_node = rng.choice(SHAPES)
        required = count > 1 and rng.random() < REQUIRED_SHARE
        runs.append(
            QueuedRun(
                id=next_id,
                tenant=tenant_name(rng.randrange(TENANTS)),
                flavor=flavor_name(rng.randrange(FLAVORS)),
                nodes=count,
                gpus_per_node=per_node,
                priority=rng.choice((10, 50, 50, 50, 90)),
                submitted=round(NOW - rng.uniform(0, 7_200), 3),
                topology_level="leaf" if required else "",
                topology_required=required,
            )
        )
        next_id += 1
    budget_used = {
        key: rng.choice((500.0, 1_500.0)) for key, q in quotas.items() if q.budget_gpu_hours
    }
    decayed = {key: rng.uniform(0, 3_600 * 64) for key in quotas}
    return Snapshot(
        queued=tuple(runs),
        held=held,
        nodes=nodes,
        quotas=quotas,
        budget_used=budget_used,
        decayed_usage=decayed,
        now=NOW,
        starvation_after_s=STARVATION_AFTER_S,
        levels={cluster_name(c): LEVELS for c in range(CLUSTERS)},
    )


def as_count_based(snapshot: Snapshot) -> count_based.Snapshot:
    """``snapshot`` as the count-based admission saw a platform: per cluster and flavor, its
    nodes and their largest GPU count; no nodes for held runs, no outside load, no drains,
    no topology."""
    pools: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
    for node in snapshot.nodes:
        pools[(node.cluster, node.flavor)].append(node)
    return count_based.Snapshot(
        queued=tuple(
            count_based.QueuedRun(
                r.id, r.tenant, r.flavor, r.nodes, r.gpus_per_node, r.priority, r.submitted
            )
            for r in snapshot.queued
        ),
        held=tuple(
            count_based.HeldRun(
                r.id, r.tenant, r.flavor, r.cluster, r.gpus, r.priority, r.admitted, r.borrowed
            )
            for r in snapshot.held
        ),
        pools=tuple(
            count_based.Pool(cluster, flavor, len(members), max(n.gpus for n in members))
            for (cluster, flavor), members in sorted(pools.items())
        ),
        quotas={key: count_based.Quota(**asdict(q)) for key, q in snapshot.quotas.items()},
        budget_used=dict(snapshot.budget_used),
        decayed_usage=dict(snapshot.decayed_usage),
        now=snapshot.now,
        starvation_after_s=snapshot.starvation_after_s,
    )
