"""The pure admission function: gang fit, guarantees, priority/FIFO, reasons, positions."""

from jobs.admission import Pool, QueuedRun, Snapshot, Wait, decide


def run(id, tenant="vision", flavor="a100", nodes=1, gpn=8, priority=50, submitted=None):
    return QueuedRun(
        id=id,
        tenant=tenant,
        flavor=flavor,
        nodes=nodes,
        gpus_per_node=gpn,
        priority=priority,
        submitted=float(id if submitted is None else submitted),
    )


def snapshot(queued, pools=None, guaranteed=None, usage=None):
    return Snapshot(
        queued=tuple(queued),
        pools=tuple(pools or [Pool("c1", "a100", nodes=4, gpus_per_node=8, used_gpus=0)]),
        guaranteed=guaranteed or {("vision", "a100"): 32, ("nlp", "a100"): 32},
        tenant_usage=usage or {},
    )


def test_gang_is_all_or_nothing_and_the_rest_waits_with_position():
    decisions = decide(snapshot([run(1, nodes=3), run(2, nodes=2, tenant="nlp")]))
    assert [(a.run_id, a.cluster) for a in decisions.admitted] == [(1, "c1")]
    assert [(w.run_id, w.reason, w.position) for w in decisions.waiting] == [(2, Wait.CAPACITY, 1)]
    assert decisions.waiting[0].message == (
        "needs 16 a100 GPUs (2×8) on one cluster; the most idle cluster has 8"
    )


def test_guarantee_limits_a_tenant_and_says_how_much_it_uses():
    decisions = decide(
        snapshot(
            [run(1, gpn=4)], guaranteed={("vision", "a100"): 16}, usage={("vision", "a100"): 14}
        )
    )
    assert decisions.admitted == ()
    assert decisions.waiting[0].reason == Wait.QUOTA
    assert decisions.waiting[0].message == (
        "tenant vision uses 14 of 16 guaranteed a100 GPUs; this run needs 4"
    )


def test_priority_first_then_fifo():
    pools = [Pool("c1", "a100", nodes=1, gpus_per_node=8, used_gpus=0)]
    queued = [run(1, gpn=8), run(2, gpn=8, priority=90), run(3, gpn=8, tenant="nlp")]
    decisions = decide(snapshot(queued, pools=pools))
    assert [a.run_id for a in decisions.admitted] == [2]
    assert [(w.run_id, w.position) for w in decisions.waiting] == [(1, 1), (3, 2)]


def test_a_blocked_head_holds_its_tenant_but_not_others():
    pools = [Pool("c1", "a100", nodes=2, gpus_per_node=8, used_gpus=8)]
    queued = [run(1, nodes=2), run(2, gpn=1), run(3, tenant="nlp", gpn=1)]
    decisions = decide(snapshot(queued, pools=pools))
    assert [a.run_id for a in decisions.admitted] == [3]
    reasons = {w.run_id: w.reason for w in decisions.waiting}
    assert reasons == {1: Wait.CAPACITY, 2: Wait.BEHIND_HEAD}


def test_no_quota_for_flavor_waits_with_its_own_reason():
    decisions = decide(snapshot([run(1, tenant="audio")]))
    assert decisions.waiting[0].reason == Wait.NO_QUOTA
    assert decisions.waiting[0].message == "tenant audio has no quota for a100"


def test_best_fit_prefers_the_pool_left_fullest_and_respects_node_shape():
    pools = [
        Pool("big", "a100", nodes=4, gpus_per_node=8, used_gpus=0),
        Pool("small", "a100", nodes=1, gpus_per_node=8, used_gpus=4),
        Pool("narrow", "a100", nodes=8, gpus_per_node=2, used_gpus=0),
    ]
    decisions = decide(snapshot([run(1, gpn=4), run(2, gpn=4)], pools=pools))
    assert [(a.run_id, a.cluster) for a in decisions.admitted] == [(1, "small"), (2, "big")]


def test_same_snapshot_same_decisions():
    queued = [run(i, tenant=("vision", "nlp")[i % 2], gpn=1 + i % 8) for i in range(200)]
    first = decide(snapshot(queued))
    assert decide(snapshot(list(reversed(queued)))) == first
