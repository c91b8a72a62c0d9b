"""The replay engine (``jobs.replay_engine``) on its own: the nodes' free GPUs, where a gang
goes between clusters, and a small simulation whose every figure is worked out by hand."""

import math
from collections import Counter
from dataclasses import replace

import pytest

from jobs.admission_types import ClusterNode, QueuedRun, Queueing, Quota
from jobs.replay_engine import Gantry, Held, Nodes

HOUR = 3600.0


def queued(id: int, tenant: str, *, at: float = 0.0, nodes: int = 1, gpus: int = 8, **more):
    return QueuedRun(
        id=id, tenant=tenant, flavor="a100", nodes=nodes, gpus_per_node=gpus, priority=50,
        submitted=at, **more,
    )  # fmt: skip


def test_free_gpus_leave_out_outside_load_and_whole_nodes_are_counted_per_flavor():
    nodes = Nodes(
        [
            ClusterNode("east", "a100", "e0", 8),
            ClusterNode("east", "a100", "e1", 8, outside=2),
            ClusterNode("west", "a100", "w0", 8),
            ClusterNode("west", "h100", "w1", 4, schedulable=False),
        ]
    )
    assert nodes.capacity() == {"a100": 24, "h100": 4}
    assert nodes.free == {("east", "e0"): 8, ("east", "e1"): 6, ("west", "w0"): 8,
                          ("west", "w1"): 4}  # fmt: skip
    assert nodes.whole == Counter({"a100": 2})
    assert nodes.clusters == {"a100": ["east", "west"], "h100": ["west"]}
    nodes.change("east", ["e0"], -4)
    assert (nodes.free[("east", "e0")], nodes.whole["a100"], nodes.version["east"]) == (4, 1, 1)
    nodes.change("east", ["e0"], 4)
    assert (nodes.free[("east", "e0")], nodes.whole["a100"], nodes.version["east"]) == (8, 2, 2)
    nodes.change("west", ["w0"], -8)
    nodes.change("west", ["w0"], 2)
    assert (nodes.whole["a100"], nodes.version["west"]) == (1, 2)
    with pytest.raises(AssertionError):  # e1 has 6 GPUs of its 8 for Gantry, all free
        nodes.change("east", ["e1"], 1)


def test_a_gang_goes_to_the_tightest_placement_then_the_fewest_gpus_left_then_the_cluster_name():
    nodes = Nodes(
        [
            ClusterNode("east", "a100", "e0", 8),
            ClusterNode("east", "a100", "e1", 8, outside=2),
            ClusterNode("west", "a100", "w0", 8),
            ClusterNode("west", "a100", "w1", 8, schedulable=False),
        ]
    )
    both = ["east", "west"]
    assert nodes.place(queued(1, "a", gpus=4), both) == ("east", ("e1",))  # 2 left, not 4
    assert nodes.place(queued(1, "a", gpus=8), both) == ("east", ("e0",))  # a tie: the name
    assert nodes.place(queued(1, "a", gpus=8), ["west"]) == ("west", ("w0",))
    assert nodes.place(queued(1, "a", nodes=2, gpus=8), both) is None
    nodes.change("east", ["e0"], -1)  # nowhere on east for 8 GPUs: on to west
    assert nodes.place(queued(1, "a", gpus=8), both) == ("west", ("w0",))
    nodes.change("east", ["e0"], 1)
    assert nodes.place(queued(1, "a", nodes=2, gpus=6), both) == ("east", ("e0", "e1"))
    assert nodes.place(replace(queued(1, "a", gpus=1), flavor="h100"), both) is None


def test_between_clusters_as_tight_the_fewer_gpus_left_wins_over_the_name():
    nodes = Nodes(
        [ClusterNode("aaa", "a100", "a0", 8), ClusterNode("zzz", "a100", "z0", 8, outside=2)]
    )
    assert nodes.place(queued(1, "a", gpus=4), ["aaa", "zzz"]) == ("zzz", ("z0",))


def test_between_clusters_a_gang_under_one_leaf_beats_one_spread_over_the_spine():
    def pair(cluster: str, leaves: tuple[str, str]) -> list[ClusterNode]:
        return [
            ClusterNode(cluster, "a100", f"{cluster}{i}", 8, path=("spine", leaf))
            for i, leaf in enumerate(leaves)
        ]

    nodes = Nodes([*pair("aaa", ("l1", "l2")), *pair("zzz", ("l1", "l1"))])
    assert nodes.place(queued(1, "a", nodes=2, gpus=8), ["aaa", "zzz"]) == (
        "zzz",
        ("zzz0", "zzz1"),
    )
    # One node: as tight anywhere, whatever the depth of its topology; then the name.
    flat = Nodes([ClusterNode("aaa", "a100", "a0", 8), *pair("zzz", ("l1", "l1"))])
    assert flat.place(queued(1, "a", gpus=8), ["aaa", "zzz"]) == ("aaa", ("a0",))


class Tiny(Gantry):
    """Runs given whole; the preemptions and each cycle's decisions kept."""

    half_life_s = 1e15  # fair-share usage that does not decay: GPU-seconds
    checkpoint_every_s = 300.0

    def __init__(self, runs, work, nodes, **more) -> None:
        self.runs = {run.id: run for run in runs}
        super().__init__([(r.submitted, r.id) for r in runs], work, nodes, **more)
        self.losses: list[tuple[int, float, float]] = []
        self.cycles: list[tuple[float, int, int]] = []
        self.waits: list[tuple[float, int, str]] = []

    def queued_run(self, run_id: int) -> QueuedRun:
        return self.runs[run_id]

    def preempted(self, run_id: int, held: Held, *, lost_gpu_s: float) -> None:
        self.losses.append((run_id, held.started, lost_gpu_s))

    def decided(self, decisions) -> None:
        self.cycles.append((self.now, len(decisions.admitted), len(decisions.preempted)))
        self.waits.extend((self.now, w.run_id, w.message) for w in decisions.waiting)


NODE = (ClusterNode("east", "a100", "n0", 8),)
QUOTAS = {("a", "a100"): Quota(8), ("b", "a100"): Quota(0, borrow_limit=8)}


def test_a_borrowed_run_preempted_for_a_guarantee_loses_the_work_since_its_checkpoint():
    runs = [queued(1, "b", at=100.0, max_runtime_s=2 * HOUR), queued(2, "a", at=1000.0)]
    sim = Tiny(runs, {1: HOUR, 2: HOUR}, NODE, quotas=QUOTAS)
    sim.checkpoint_every_s = 400.0
    assert sim.queueing_of == {"east": Queueing.STRICT}
    sim.run()
    # Run 1 ran 900 s from 100 s, kept 800 (checkpoints every 400 s): 100 s on 8 GPUs lost.
    assert sim.losses == [(1, 100.0, 800.0)]
    assert sim.waited == {1: 3600.0, 2: 0.0}  # back at 1,000 s, again at 4,600 s
    assert sim.attempts == Counter({1: 2, 2: 1})
    assert sim.now == 4600.0 + 2800.0
    assert (sim.placed_gpus, sim.held, sim.as_held, sim.queued) == (0, {}, {}, {})
    assert sim.remaining == {1: 0.0, 2: 0.0}
    assert sim.decayed == {
        ("b", "a100"): pytest.approx(8 * (900.0 + 2800.0)),
        ("a", "a100"): pytest.approx(8 * 3600.0),
    }
    assert sim.holding == {("a", "a100"): 0, ("b", "a100"): 0}
    # (when, admitted, preempted): run 1's first completion, at 3,700 s, is stale and
    # admits nothing; run 1 waits then, with admission's words for it.
    assert sim.cycles == [
        (100.0, 1, 0), (1000.0, 1, 1), (3700.0, 0, 0), (4600.0, 1, 0),
    ]  # fmt: skip
    assert sim.waits == [
        (
            3700.0,
            1,
            "tenant b uses 0 of 0 guaranteed a100 GPUs; to borrow idle ones, this run needs 8 "
            "a100 GPUs on one node; 0 a100 GPUs are free, at most 0 on any node (n0: 0)",
        )
    ]


def test_a_run_preempted_before_the_backend_started_it_loses_nothing():
    sim = Tiny([queued(1, "b")], {1: HOUR}, NODE, quotas=QUOTAS)
    sim.enqueue(1)
    sim.admitted(1, "east", borrowed=True)
    assert (sim.backend.keys(), sim.holding[("b", "a100")]) == ({1}, 8)
    sim.preempt(1)
    assert sim.losses == [(1, None, 0.0)]
    assert (sim.remaining[1], list(sim.queued), sim.backend, sim.held) == (HOUR, [1], {}, {})
    assert sim.holding[("b", "a100")] == 0


def test_a_run_left_without_its_work_done_breaks_the_engines_invariant():
    sim = Tiny([queued(1, "a", at=10.0)], {1: HOUR}, NODE, quotas=QUOTAS, until=5.0)
    with pytest.raises(AssertionError, match=r"^a run ended without doing its work$"):
        sim.run()


def test_the_snapshot_is_the_simulated_platform_now():
    runs = [queued(1, "b", max_runtime_s=2 * HOUR), queued(2, "a", at=10.0, gpus=4)]
    # Run 2 arrives after the end (no work asked of it): enqueued by hand below.
    sim = Tiny(runs, {1: HOUR, 2: 0.0}, NODE, quotas=QUOTAS, until=5.0)
    sim.starvation_after_s = 600.0
    sim.run()
    assert (sim.now, sim.placed_gpus, sim.cycles) == (5.0, 8, [(0.0, 1, 0)])
    sim.enqueue(2)
    snapshot = sim.snapshot()
    assert snapshot.queued == (runs[1],)
    (held,) = snapshot.held
    assert (held.id, held.tenant, held.flavor, held.cluster, held.gpus, held.priority) == (
        1, "b", "a100", "east", 8, 50,
    )  # fmt: skip
    assert (held.admitted, held.borrowed, held.nodes, held.latest_end) == (
        0.0, True, ("n0",), 2 * HOUR,
    )  # fmt: skip
    assert snapshot.nodes == NODE
    assert snapshot.quotas == QUOTAS
    assert snapshot.decayed_usage == {("b", "a100"): pytest.approx(8 * 5.0)}
    assert (snapshot.now, snapshot.starvation_after_s) == (5.0, 600.0)
    assert snapshot.queueing == {"east": Queueing.STRICT}
    # The run still holds its GPUs at the end: its work is not done, it is still running.
    assert sim.remaining[1] == HOUR and sim.running(1)


def test_fair_share_counts_every_moment_held_however_short():
    runs = [queued(1, "b", gpus=4), queued(2, "b", at=0.5, gpus=4)]
    sim = Tiny(runs, {1: 0.25, 2: 0.5}, NODE, quotas=QUOTAS)
    sim.run()
    assert sim.decayed == {("b", "a100"): pytest.approx(4 * 0.25 + 4 * 0.5)}
    assert sim.waited == {1: 0.0, 2: 0.0}


def test_a_run_without_a_maximum_runtime_has_no_latest_end():
    sim = Tiny([queued(1, "a")], {1: HOUR}, NODE, quotas=QUOTAS, until=10.0)
    sim.run()
    assert (sim.as_held[1].latest_end, sim.as_held[1].admitted) == (None, 0.0)


def test_a_runs_queue_time_is_every_wait_and_without_checkpoints_a_preemption_loses_all():
    sim = Tiny([queued(1, "b")], {1: HOUR}, NODE, quotas=QUOTAS)
    sim.checkpoint_every_s = None
    sim.enqueue(1)
    sim.now = 50.0
    sim.admitted(1, "east", borrowed=True)
    sim.start(1, ("n0",))
    sim.now = 100.0
    sim.preempt(1)
    assert sim.losses == [(1, 50.0, 8 * 50.0)]
    assert sim.remaining[1] == HOUR
    sim.now = 130.0
    sim.admitted(1, "east", borrowed=True)
    sim.start(1, ("n0",))
    assert sim.waited == {1: 50.0 + 30.0}
    assert sim.attempts[1] == 2


def test_fair_share_decays_with_its_half_life_and_adds_up_runs_held_at_once():
    sim = Tiny([queued(1, "b")], {1: HOUR}, NODE, quotas=QUOTAS, until=2 * HOUR)
    sim.half_life_s = HOUR
    sim.run()
    # 8 GPUs for one half-life: 8 tau (1 - 1/2); then idle for one more: halved.
    tau = HOUR / math.log(2)
    assert sim.decayed[("b", "a100")] == pytest.approx(2 * tau)
    both = Tiny([queued(1, "b", gpus=4), queued(2, "b", gpus=4)], {1: 1.0, 2: 2.0}, NODE,
                quotas=QUOTAS)  # fmt: skip
    both.run()
    assert both.decayed == {("b", "a100"): pytest.approx(4 * 1.0 + 4 * 2.0)}


def test_a_run_that_ends_at_the_windows_end_lets_the_next_one_start_then():
    runs = [queued(1, "a"), queued(2, "a")]
    sim = Tiny(runs, {1: HOUR, 2: HOUR}, NODE, quotas=QUOTAS, until=HOUR)
    sim.explain = False  # no words for the waiting run
    sim.run()
    assert (sim.attempts[2], sim.waited[2], sim.running(2)) == (1, HOUR, True)
    assert sim.waits == [(0.0, 2, "")]
