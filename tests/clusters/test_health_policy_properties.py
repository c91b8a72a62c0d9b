"""clusters.health_policy's decisions on random clusters, policies and batches of signals:
the blast radius holds, health only gets worse on its own, observe never changes it, the
result does not depend on the batch's order, and floods group every signal once.

The examples are drawn at random locally and derandomized in CI (the ``ci`` profile of
tests/conftest.py, selected by CI=true, which `make mutation` sets too).
"""

from hypothesis import given
from hypothesis import strategies as st

from clusters.health import Action, NodeHealth, Signal, SignalClass, Source
from clusters.health_policy import (
    HealthPolicy,
    NodeView,
    Outcome,
    Span,
    decide,
    flood_groups,
    flood_key,
    health_rank,
    quarantine_limit,
)

T0 = 1_800_000_000.0
CLASSES = list(SignalClass)


@st.composite
def policies(draw) -> HealthPolicy:
    actions = {c: draw(st.sampled_from(list(Action))) for c in CLASSES}
    share = draw(st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 0.75, 1.0]))
    return HealthPolicy(actions=actions, max_quarantined_share=share)


@st.composite
def clusters(draw) -> dict[str, NodeView]:
    count = draw(st.integers(min_value=0, max_value=12))
    return {
        f"n{i}": NodeView(
            draw(st.sampled_from(list(NodeHealth))),
            draw(st.one_of(st.none(), st.floats(min_value=T0 - 100, max_value=T0 + 100))),
        )
        for i in range(count)
    }


def signals_on(names: list[str]) -> st.SearchStrategy[list[Signal]]:
    one = st.builds(
        Signal,
        node=st.sampled_from([*names, "elsewhere"]),
        signal=st.sampled_from(CLASSES),
        source=st.sampled_from(list(Source)),
        at=st.integers(min_value=-200, max_value=200).map(lambda s: T0 + s),
        gpu=st.sampled_from(["", "0", "1"]),
        code=st.sampled_from(["", "79", "48"]),
        detail=st.sampled_from(["", "a", "b"]),
    )
    return st.lists(one, max_size=30)


@st.composite
def cases(draw) -> tuple[HealthPolicy, dict[str, NodeView], list[Signal]]:
    nodes = draw(clusters())
    return draw(policies()), nodes, draw(signals_on(list(nodes)))


def after(nodes: dict[str, NodeView], policy, signals) -> dict[str, NodeHealth]:
    decisions = decide(policy, nodes=nodes, signals=signals)
    return {n: decisions.nodes[n].health if n in decisions.nodes else v.health
            for n, v in nodes.items()}  # fmt: skip


def quarantined(health: dict[str, NodeHealth]) -> int:
    return sum(1 for h in health.values() if h == NodeHealth.QUARANTINED)


@given(cases())
def test_the_policy_never_quarantines_beyond_the_blast_radius(case):
    policy, nodes, signals = case
    before = quarantined({n: v.health for n, v in nodes.items()})
    now = quarantined(after(nodes, policy, signals))
    limit = quarantine_limit(policy, len(nodes))
    assert now <= max(before, limit)
    assert limit <= policy.max_quarantined_share * len(nodes) + 1e-6
    if now > before:  # it quarantined some: within the share
        assert now <= policy.max_quarantined_share * len(nodes) + 1e-6


@given(cases())
def test_health_only_gets_worse_and_quarantine_is_never_left(case):
    policy, nodes, signals = case
    decisions = decide(policy, nodes=nodes, signals=signals)
    for name, decision in decisions.nodes.items():
        assert decision.before == nodes[name].health
        assert nodes[name].health != NodeHealth.QUARANTINED
        assert health_rank(decision.health) >= health_rank(decision.before)
        assert decision.reason
        mine = {o for s, o in zip(signals, decisions.outcomes, strict=True) if s.node == name}
        assert decision.refused == (Outcome.REFUSED in mine)
        if decision.refused:
            assert decision.health == NodeHealth.SUSPECT
    assert len(decisions.outcomes) == len(signals)


@given(cases())
def test_observe_never_changes_health(case):
    policy, nodes, signals = case
    observed = [s for s in signals if policy.action(s.signal) == Action.OBSERVE]
    decisions = decide(policy, nodes=nodes, signals=observed)
    assert decisions.nodes == {}
    assert set(decisions.outcomes) <= {Outcome.OBSERVE}


@given(cases(), st.randoms(use_true_random=False))
def test_decisions_do_not_depend_on_the_order_of_the_batch(case, random):
    policy, nodes, signals = case
    order = list(range(len(signals)))
    random.shuffle(order)
    first = decide(policy, nodes=nodes, signals=signals)
    again = decide(policy, nodes=nodes, signals=[signals[i] for i in order])
    assert again.nodes == first.nodes
    assert again.outcomes == tuple(first.outcomes[i] for i in order)
    assert decide(policy, nodes=nodes, signals=signals) == first


@given(
    signals_on(["n0", "n1"]),
    st.integers(min_value=1, max_value=120),
    st.dictionaries(
        st.tuples(
            st.sampled_from(["n0", "n1"]),
            st.sampled_from(["", "0"]),
            st.sampled_from(["gpu_lost", "nvlink"]),
            st.sampled_from(["", "79"]),
        ),
        st.tuples(st.integers(-300, 300), st.integers(0, 100), st.integers(1, 5)),
        max_size=4,
    ),
    st.randoms(use_true_random=False),
)
def test_floods_group_every_signal_once_whatever_the_order(signals, window, raw, random):
    stored = {k: Span(T0 + a, T0 + a + d, c) for k, (a, d, c) in raw.items()}
    groups = flood_groups(signals, window=window, stored=stored)
    members = sorted(i for g in groups for i in g.members)
    assert members == list(range(len(signals)))
    assert sum(1 for g in groups if g.stored) <= len(stored)
    for group in groups:
        times = [signals[i].at for i in group.members]
        assert all(flood_key(signals[i]) == group.key for i in group.members)
        base = stored[group.key] if group.stored else None
        assert group.span.count == len(times) + (base.count if base else 0)
        assert group.span.first == min([*times, *([base.first] if base else [])])
        assert group.span.last == max([*times, *([base.last] if base else [])])
    shuffled = list(signals)
    random.shuffle(shuffled)
    again = flood_groups(shuffled, window=window, stored=stored)
    assert sorted((g.key, g.stored, g.span) for g in again) == sorted(
        (g.key, g.stored, g.span) for g in groups
    )
