"""Other shapes of a run, the pure part (jobs.shapes): which shapes are named, and when each
would start from hand-built snapshots, by the forward simulation the start estimates use
(no database)."""

from dataclasses import replace

from jobs import estimates, shapes
from jobs.admission_types import ClusterNode, HeldRun, Pool, QueuedRun, Quota, Snapshot, nodes_of
from jobs.shapes import Shape

EXACT = {"resolution": 0.0, "min_step_s": 0.0}  # every end a step of its own
NOW = 1_000_000.0
HOUR = 3600.0


def probe(**changes) -> QueuedRun:
    run = QueuedRun(-1, "t", "a100", nodes=1, gpus_per_node=8, priority=50, submitted=NOW)
    return replace(run, **changes)


def forecasts(snapshot: Snapshot, *, expected: dict, latest: dict) -> dict:
    """flavor -> (expected, full limits) forecasts of ``snapshot``, as the refresh stores."""
    both = (
        estimates.simulate(snapshot, ends=expected, runtimes={}, **EXACT),
        estimates.simulate(snapshot, ends=latest, runtimes={}, **EXACT),
    )
    return dict.fromkeys({node.flavor for node in snapshot.nodes}, both)


def table(rows) -> list[tuple]:
    return [
        (row.shape.size, row.shape.flavor, row.shape.topology, row.expected.at,
         row.full_limits.at, row.asked, row.expected.why)
        for row in rows
    ]  # fmt: skip


def half_held() -> Snapshot:
    """Two 8-GPU A100 nodes, each half held by a run of tenant u: run 1 ends in an hour
    (two at the latest), run 2 in two (four at the latest)."""
    return Snapshot(
        queued=(),
        held=(
            HeldRun(1, "u", "a100", "c", 4, 50, 0.0, False, ("c-a100-00",)),
            HeldRun(2, "u", "a100", "c", 4, 50, 0.0, False, ("c-a100-01",)),
        ),
        nodes=nodes_of(Pool("c", "a100", 2, 8)),
        quotas={("t", "a100"): Quota(16), ("u", "a100"): Quota(16)},
        now=NOW,
    )


def test_two_by_four_starts_now_while_one_by_eight_waits_for_a_node_to_drain():
    snapshot = half_held()
    stored = forecasts(
        snapshot,
        expected={1: NOW + HOUR, 2: NOW + 2 * HOUR},
        latest={1: NOW + 2 * HOUR, 2: NOW + 4 * HOUR},
    )
    rows = shapes.shape_starts(snapshot, probe=probe(), forecasts=stored)
    # 4x2 and 8x1 are not named: the cluster has two nodes.
    assert table(rows) == [
        ("2×4", "a100", "any", NOW, NOW, False, ""),
        ("1×8", "a100", "any", NOW + HOUR, NOW + 2 * HOUR, True, ""),
    ]
    assert rows[0].now and not rows[1].now
    assert rows[0].expected.nodes == ("c-a100-00", "c-a100-01")
    # The shape asked for gets exactly the submit preview's estimate (first_fit on the
    # stored forecasts): nothing is decided differently for it.
    asked = rows[1]
    for forecast, start in zip(stored["a100"], (asked.expected, asked.full_limits), strict=True):
        assert start == estimates.first_fit(
            forecast, run=probe(), quota=Quota(16), nodes=snapshot.nodes, levels={}
        )


def test_another_flavor_free_now_comes_first_and_one_never_possible_comes_last():
    snapshot = replace(
        half_held(),
        held=(
            HeldRun(1, "u", "a100", "c", 8, 50, 0.0, False, ("c-a100-00",)),
            HeldRun(2, "u", "a100", "c", 8, 50, 0.0, False, ("c-a100-01",)),
        ),
        nodes=nodes_of(Pool("c", "a100", 2, 8), Pool("c", "h100", 1, 8), Pool("d", "v100", 4, 4)),
        quotas={
            ("t", "a100"): Quota(16),
            ("t", "h100"): Quota(8),
            ("t", "v100"): Quota(16, max_gpus_per_run=4),
            ("t", "l40s"): Quota(0),  # no quota: not named
            ("u", "a100"): Quota(16),
            ("u", "mi300"): Quota(8),  # another tenant's: not named
        },
    )
    stored = forecasts(
        snapshot, expected={1: NOW + HOUR, 2: NOW + 2 * HOUR}, latest={1: NOW + 3 * HOUR}
    )
    rows = shapes.shape_starts(snapshot, probe=probe(), forecasts=stored)
    assert table(rows) == [
        ("1×8", "h100", "any", NOW, NOW, False, ""),
        ("1×8", "a100", "any", NOW + HOUR, NOW + 3 * HOUR, True, ""),
        ("2×4", "a100", "any", NOW + 2 * HOUR, None, False,  ""),
        # v100 nodes have 4 GPUs: its fewest nodes for 8 GPUs are two, over the per-run cap.
        ("2×4", "v100", "any", None, None, False,
         "it is larger than the tenant's quota allows per run"),
    ]  # fmt: skip
    assert rows[3].never
    # Run 2 has no known end at full limits: the 2x4 needs both nodes.
    assert rows[2].full_limits.why == "it does not start within the 168 hours looked ahead"


def leaves() -> Snapshot:
    """Four 8-GPU nodes under one spine, two per leaf; one node of each leaf held."""
    spine = [("s1", "l1"), ("s1", "l1"), ("s1", "l2"), ("s1", "l2")]
    return Snapshot(
        queued=(),
        held=(
            HeldRun(1, "u", "a100", "c", 8, 50, 0.0, False, ("n0",)),
            HeldRun(2, "u", "a100", "c", 8, 50, 0.0, False, ("n2",)),
        ),
        nodes=tuple(
            ClusterNode("c", "a100", f"n{i}", 8, path=path) for i, path in enumerate(spine)
        ),
        quotas={("t", "a100"): Quota(32), ("u", "a100"): Quota(32)},
        now=NOW,
        levels={"c": ("spine", "leaf")},
    )


def test_a_required_leaf_waits_where_the_spine_or_a_preference_starts_now():
    snapshot = leaves()
    stored = forecasts(
        snapshot, expected={1: NOW + HOUR, 2: NOW + 2 * HOUR}, latest={1: NOW + 2 * HOUR}
    )
    asked = probe(nodes=2, topology_level="leaf", topology_required=True)
    rows = shapes.shape_starts(snapshot, probe=asked, forecasts=stored)
    assert table(rows) == [
        ("2×8", "a100", "one spine, required", NOW, NOW, False, ""),
        ("2×8", "a100", "one leaf, preferred", NOW, NOW, False, ""),
        ("2×8", "a100", "one leaf, required", NOW + HOUR, NOW + 2 * HOUR, True, ""),
        ("4×4", "a100", "one leaf, required", None, None, False,
         "no single cluster has 4 nodes with 4 a100 GPUs each in one leaf"),
    ]  # fmt: skip
    assert rows[0].expected.nodes == ("n1", "n3")


def test_at_most_eight_shapes_each_kind_in_turn():
    snapshot = Snapshot(
        queued=(),
        held=(),
        nodes=tuple(
            replace(node, path=("s1", f"l{i // 4}"))
            for i, node in enumerate(
                nodes_of(*(Pool("c", flavor, 8, 8) for flavor in ("a", "b", "d", "e", "f", "g")))
            )
        ),
        quotas={("t", flavor): Quota(64) for flavor in ("a", "b", "d", "e", "f", "g")},
        now=NOW,
        levels={"c": ("spine", "leaf")},
    )
    asked = Shape("a", 1, 8, "leaf", True)
    assert shapes.alternatives(snapshot, asked=asked, tenant="t") == [
        asked,
        Shape("a", 1, 8, "spine", True),
        Shape("a", 2, 4, "leaf", True),
        Shape("b", 1, 8, "leaf", True),
        Shape("a", 1, 8, "leaf", False),
        Shape("a", 4, 2, "leaf", True),
        Shape("d", 1, 8, "leaf", True),
        Shape("a", 8, 1, "leaf", True),
    ]
    assert shapes.MAX_SHAPES == 8


def test_a_flavor_with_no_forecast_yet_and_a_quota_spent_say_so():
    snapshot = replace(
        half_held(),
        held=(HeldRun(1, "t", "a100", "c", 8, 50, 0.0, False, ("c-a100-00",)),),
        quotas={("t", "a100"): Quota(8)},
    )
    rows = shapes.shape_starts(snapshot, probe=probe(), forecasts={})
    assert table(rows) == [
        ("1×8", "a100", "any", None, None, True, "no start forecast of a100 yet"),
        ("2×4", "a100", "any", None, None, False, "no start forecast of a100 yet"),
    ]
