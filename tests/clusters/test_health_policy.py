"""clusters.health_policy: the policy's keys and values, and its decisions on exact cases
(the blast radius, flapping, stale sources, unknown XIDs, floods). No database."""

import math
from types import MappingProxyType, SimpleNamespace

import pytest

from clusters.health import DEFAULT_ACTIONS, Action, NodeHealth, Signal, SignalClass, Source
from clusters.health_policy import (
    DEFAULT_POLICY,
    POLICY_SCHEMA,
    Decision,
    HealthPolicy,
    NodeView,
    OnQuarantine,
    Outcome,
    Span,
    decide,
    flood_groups,
    policy_edit_problem,
    policy_from,
    policy_raw,
    quarantine_limit,
    signal_checked,
    signal_sentence,
)
from core.schema import JsonSchema, SchemaError

HEALTHY, SUSPECT, QUARANTINED = NodeHealth.HEALTHY, NodeHealth.SUSPECT, NodeHealth.QUARANTINED
T0 = 1_800_000_000.0


def xid79(node: str, at: float = T0, gpu: str = "3") -> Signal:
    return Signal(
        node=node,
        signal=SignalClass.GPU_LOST,
        source=Source.DCGM,
        at=at,
        gpu=gpu,
        code="79",
        detail="XID 79 GPU has fallen off the bus",
    )


def signal(node: str, klass: SignalClass, at: float = T0, **fields) -> Signal:
    return Signal(
        node=node, signal=klass, source=fields.pop("source", Source.DCGM), at=at, **fields
    )


def cluster(count: int, **health: NodeHealth) -> dict[str, NodeView]:
    nodes = {f"n{i}": NodeView(HEALTHY) for i in range(count)}
    nodes.update({name: NodeView(h, T0 - 3600) for name, h in health.items()})
    return nodes


# The policy's keys


def test_no_overrides_is_the_default_policy():
    policy = policy_from({})
    assert policy == HealthPolicy()
    assert dict(policy.actions) == DEFAULT_ACTIONS
    assert (policy.suspect_window_s, policy.suspect_tenants) == (3600, 2)
    assert (policy.max_quarantined_share, policy.fence_backend) == (0.25, True)
    assert (policy.on_quarantine, policy.release_needs_check) == ("requeue", False)
    assert (policy.max_platform_retries, policy.flood_window_s) == (3, 300)
    assert (policy.straggler_runs, policy.straggler_window_s) == (2, 604_800)
    assert policy.action(SignalClass.SLOW_RANKS) == Action.WARN
    assert policy_raw(policy) == {}


def test_overrides_are_read_and_written_back_as_only_the_overrides():
    raw = {
        "actions": {"thermal_throttle": "observe", "xid_unknown": "warn"},
        "max_quarantined_share": 0.5,
        "fence_backend": False,
        "on_quarantine": "stop",
        "release_needs_check": True,
        "flood_window_s": 60,
        "suspect_window_s": 7200,
        "suspect_tenants": 3,
        "max_platform_retries": 5,
        "straggler_runs": 3,
        "straggler_window_s": 86_400,
    }
    policy = policy_from(raw)
    assert (policy.straggler_runs, policy.straggler_window_s) == (3, 86_400)
    assert (policy.suspect_window_s, policy.suspect_tenants) == (7200, 3)
    assert (policy.max_platform_retries, policy.flood_window_s) == (5, 60)
    assert (policy.fence_backend, policy.release_needs_check) == (False, True)
    assert policy.action(SignalClass.THERMAL_THROTTLE) == Action.OBSERVE
    assert policy.action(SignalClass.XID_UNKNOWN) == Action.WARN
    assert policy.action(SignalClass.GPU_LOST) == Action.QUARANTINE  # the default stays
    assert policy.on_quarantine is OnQuarantine.STOP
    assert policy.max_quarantined_share == 0.5
    assert policy_raw(policy) == raw
    # An override equal to the default is not kept: the default may change later.
    assert (
        policy_raw(policy_from({"actions": {"gpu_lost": "quarantine"}, "suspect_tenants": 2})) == {}
    )
    assert policy_raw(policy_from({"max_quarantined_share": 1})) == {"max_quarantined_share": 1.0}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"colour": 1},
            "unknown health policy key: colour (allowed: actions, suspect_window_s, "
            "suspect_tenants, max_quarantined_share, fence_backend, on_quarantine, "
            "release_needs_check, max_platform_retries, flood_window_s, straggler_runs, "
            "straggler_window_s)",
        ),
        (
            {"actions": {"gpu_lost": "quarantine", "fan": "warn"}},
            "unknown signal class in actions: fan (the classes: ecc_uncorrectable, "
            "row_remap_failure, gpu_lost, nvlink, gpu_reset_needed, ecc_page_retirement, "
            "thermal_throttle, power_throttle, pcie_replay, nvlink_errors, xid_application, "
            "xid_unknown, "
            "node_down, node_condition, attempt_failures, slow_ranks, health_check_failed)",
        ),
        (
            {"actions": {"nvlink": "drain"}},
            "actions.nvlink must be one of observe, warn, quarantine, not 'drain'",
        ),
        ({"actions": []}, "actions must be an object of signal class: action, not list"),
        (
            {"max_quarantined_share": 1.5},
            "max_quarantined_share must be a number from 0 to 1 (a share of the cluster's "
            "nodes), not 1.5",
        ),
        (
            {"max_quarantined_share": math.nan},
            "max_quarantined_share must be a number from 0 to 1 (a share of the cluster's "
            "nodes), not nan",
        ),
        (
            {"suspect_tenants": True},
            "suspect_tenants must be a whole number from 1 to 1,000, not True",
        ),
        (
            {"suspect_window_s": 1.5},
            "suspect_window_s must be a whole number from 60 to 2,592,000 (30 days), not 1.5",
        ),
        (
            {"suspect_window_s": 3600.5},
            "suspect_window_s must be a whole number from 60 to 2,592,000 (30 days), not 3600.5",
        ),
        (
            {"max_platform_retries": -1},
            "max_platform_retries must be a whole number from 0 to 100, not -1",
        ),
        (
            {"max_platform_retries": 2.5},
            "max_platform_retries must be a whole number from 0 to 100, not 2.5",
        ),
        (
            {"flood_window_s": 86401},
            "flood_window_s must be a whole number from 1 to 86,400 (a day), not 86401",
        ),
        ({"release_needs_check": 1}, "release_needs_check must be true or false, not 1"),
        ({"straggler_runs": 0}, "straggler_runs must be a whole number from 1 to 1,000, not 0"),
        (
            {"straggler_runs": 1.5},
            "straggler_runs must be a whole number from 1 to 1,000, not 1.5",
        ),
        (
            {"straggler_window_s": 3599},
            "straggler_window_s must be a whole number from 3,600 (an hour) to 2,592,000 "
            "(30 days), not 3599",
        ),
        (
            {"straggler_window_s": 2_592_001},
            "straggler_window_s must be a whole number from 3,600 (an hour) to 2,592,000 "
            "(30 days), not 2592001",
        ),
        (
            {"flood_window_s": 0},
            "flood_window_s must be a whole number from 1 to 86,400 (a day), not 0",
        ),
        (
            {"on_quarantine": "kill"},
            "on_quarantine must be one of requeue, finish, stop, not 'kill'",
        ),
        ({"fence_backend": "no"}, "fence_backend must be true or false, not 'no'"),
        ([], "the health policy must be a JSON object, not list"),
    ],
)
def test_bad_policies_are_refused_by_name(raw, message):
    with pytest.raises(SchemaError) as refused:
        policy_from(raw)
    assert str(refused.value) == message


def test_a_policy_made_in_code_with_some_classes_takes_the_defaults_for_the_others():
    partial = HealthPolicy(actions={SignalClass.NVLINK: Action.WARN})
    assert partial.action(SignalClass.NVLINK) == Action.WARN
    assert partial.action(SignalClass.GPU_LOST) == Action.QUARANTINE
    assert partial.action(SignalClass.XID_APPLICATION) == Action.OBSERVE


def test_the_schema_is_a_valid_draft_2020_12_schema():
    JsonSchema(POLICY_SCHEMA).check_schema()


@pytest.mark.parametrize(
    ("share", "nodes", "limit"),
    [(0.25, 8, 2), (0.25, 7, 1), (0.25, 2, 0), (0.5, 2, 1), (0.29, 100, 29), (1.0, 3, 3),
     (0.0, 10, 0), (0.25, 0, 0)],
)  # fmt: skip
def test_quarantine_limit_rounds_down(share, nodes, limit):
    assert quarantine_limit(HealthPolicy(max_quarantined_share=share), nodes) == limit


# Decisions


def test_one_fault_quarantines_a_healthy_node():
    decisions = decide(DEFAULT_POLICY, nodes=cluster(8), signals=[xid79("n1")])
    assert decisions.nodes == {
        "n1": Decision("n1", HEALTHY, QUARANTINED, "GPU 3: XID 79 GPU has fallen off the bus")
    }
    assert decisions.outcomes == (Outcome.QUARANTINE,)


def test_an_unknown_xid_is_recorded_and_does_nothing():
    unknown = signal("n1", SignalClass.XID_UNKNOWN, code="999", detail="XID 999")
    decisions = decide(DEFAULT_POLICY, nodes=cluster(8), signals=[unknown])
    assert decisions.nodes == {}
    assert decisions.outcomes == (Outcome.OBSERVE,)


def test_a_warning_makes_a_node_suspect_once():
    hot = signal("n2", SignalClass.THERMAL_THROTTLE, gpu="0", code="0x40", detail="HW thermal")
    decisions = decide(DEFAULT_POLICY, nodes=cluster(4), signals=[hot])
    assert decisions.nodes == {"n2": Decision("n2", HEALTHY, SUSPECT, "GPU 0: HW thermal")}
    assert decisions.outcomes == (Outcome.WARN,)
    again = decide(DEFAULT_POLICY, nodes=cluster(4, n2=SUSPECT), signals=[hot])
    assert again.nodes == {}
    assert again.outcomes == (Outcome.WARN,)


def test_the_blast_radius_refuses_a_quarantine_beyond_the_share():
    nodes = cluster(8, n0=QUARANTINED, n1=QUARANTINED)  # 2 of 8: the limit at 0.25
    decisions = decide(DEFAULT_POLICY, nodes=nodes, signals=[xid79("n5")])
    assert decisions.nodes == {
        "n5": Decision(
            "n5",
            HEALTHY,
            SUSPECT,
            "GPU 3: XID 79 GPU has fallen off the bus: not quarantined, 2 of 8 nodes are "
            "quarantined already, the most max_quarantined_share 0.25 allows: waits for a "
            "person",
            refused=True,
        )
    }
    assert decisions.outcomes == (Outcome.REFUSED,)


def test_faults_on_half_a_cluster_at_once_quarantine_the_first_up_to_the_limit():
    signals = [xid79("n3", T0 + 3), xid79("n0", T0 + 9), xid79("n6", T0 + 1), xid79("n1", T0 + 1)]
    decisions = decide(DEFAULT_POLICY, nodes=cluster(8), signals=signals)
    # n1 and n6 came first (n1 before n6 at the same time, by name); n3 and n0 wait.
    assert {n: d.health for n, d in decisions.nodes.items()} == {
        "n1": QUARANTINED, "n6": QUARANTINED, "n3": SUSPECT, "n0": SUSPECT
    }  # fmt: skip
    assert [d.refused for d in decisions.nodes.values()] == [False, False, True, True]
    assert decisions.outcomes == (
        Outcome.REFUSED, Outcome.REFUSED, Outcome.QUARANTINE, Outcome.QUARANTINE
    )  # fmt: skip


def test_a_small_cluster_needs_a_larger_share_to_quarantine_on_its_own():
    assert decide(DEFAULT_POLICY, nodes=cluster(2), signals=[xid79("n1")]).nodes["n1"].refused
    half = HealthPolicy(max_quarantined_share=0.5)
    assert decide(half, nodes=cluster(2), signals=[xid79("n1")]).nodes["n1"].health == QUARANTINED


def test_a_flapping_node_stays_quarantined_until_a_person_releases_it():
    policy, nodes = DEFAULT_POLICY, cluster(4)
    batches = [
        [signal("n1", SignalClass.NODE_DOWN, T0, source=Source.BACKEND, code="DOWN")],
        [],  # back up: the backend says nothing
        [signal("n1", SignalClass.NODE_CONDITION, T0 + 60, source=Source.BACKEND, code="GpuXid")],
        [],
        [signal("n1", SignalClass.NODE_DOWN, T0 + 120, source=Source.BACKEND, code="DOWN")],
        [signal("n1", SignalClass.POWER_THROTTLE, T0 + 180)],
    ]
    seen = []
    for batch in batches:
        decisions = decide(policy, nodes=nodes, signals=batch)
        for name, decision in decisions.nodes.items():
            nodes[name] = NodeView(decision.health, T0)
        seen.append(nodes["n1"].health)
    assert seen == [SUSPECT, SUSPECT, QUARANTINED, QUARANTINED, QUARANTINED, QUARANTINED]


def test_silence_is_neither_healthy_nor_faulty():
    nodes = cluster(4, n1=SUSPECT, n2=QUARANTINED)
    decisions = decide(DEFAULT_POLICY, nodes=nodes, signals=[])
    assert (decisions.nodes, decisions.outcomes) == ({}, ())


def test_a_signal_from_before_a_release_does_not_quarantine_again():
    nodes = {"n0": NodeView(HEALTHY, since=T0), "n1": NodeView(HEALTHY), "n2": NodeView(HEALTHY)}
    half = HealthPolicy(max_quarantined_share=1.0)
    late = decide(half, nodes=nodes, signals=[xid79("n0", T0 - 1)])
    assert (late.nodes, late.outcomes) == ({}, (Outcome.OBSERVE,))
    fresh = decide(half, nodes=nodes, signals=[xid79("n0", T0 + 1)])
    assert fresh.nodes["n0"].health == QUARANTINED
    # Seen at the very moment of the release: after it, as far as anyone can tell.
    same = decide(half, nodes=nodes, signals=[xid79("n0", T0)])
    assert (same.nodes["n0"].health, same.outcomes) == (QUARANTINED, (Outcome.QUARANTINE,))


def test_a_signal_about_a_node_not_in_the_inventory_changes_nothing():
    decisions = decide(DEFAULT_POLICY, nodes=cluster(4), signals=[xid79("gone")])
    assert (decisions.nodes, decisions.outcomes) == ({}, (Outcome.OBSERVE,))


def test_the_strongest_signal_of_a_node_decides_and_gives_the_reason():
    batch = [
        signal("n1", SignalClass.THERMAL_THROTTLE, T0, detail="hot"),
        signal("n1", SignalClass.ECC_UNCORRECTABLE, T0 + 5, gpu="1", code="48", detail="DBE"),
        signal("n1", SignalClass.XID_APPLICATION, T0, code="13"),
    ]
    decisions = decide(DEFAULT_POLICY, nodes=cluster(4), signals=batch)
    assert decisions.nodes == {"n1": Decision("n1", HEALTHY, QUARANTINED, "GPU 1: DBE")}
    assert decisions.outcomes == (Outcome.WARN, Outcome.QUARANTINE, Outcome.OBSERVE)


def test_a_policy_can_silence_a_class():
    quiet = policy_from({"actions": {"gpu_lost": "observe"}})
    decisions = decide(quiet, nodes=cluster(4), signals=[xid79("n1")])
    assert (decisions.nodes, decisions.outcomes) == ({}, (Outcome.OBSERVE,))


def test_sentences_without_a_detail_name_the_class_code_and_source():
    assert signal_sentence(signal("n1", SignalClass.PCIE_REPLAY, code="12")) == (
        "pcie_replay 12 from dcgm"
    )
    assert signal_sentence(signal("n1", SignalClass.NVLINK, gpu="2", detail="link\n 3 down")) == (
        "GPU 2: link 3 down"
    )


# A policy edit


def test_a_policy_edit_that_would_quarantine_half_a_cluster_is_refused():
    strict = policy_from({"actions": {"thermal_throttle": "quarantine"}})
    recent = [(f"n{i}", SignalClass.THERMAL_THROTTLE) for i in range(4)]
    recent.append(("n0", SignalClass.POWER_THROTTLE))
    assert policy_edit_problem(strict, nodes=cluster(8), recent=recent) == (
        "Refused: under this policy the signals of the last 3,600 s would quarantine 4 more "
        "nodes (n0, n1, n2, n3), 4 of 8 in all, more than max_quarantined_share 0.25 allows "
        "(2). Quarantine nodes by hand if you mean it, or raise max_quarantined_share."
    )
    assert policy_edit_problem(DEFAULT_POLICY, nodes=cluster(8), recent=recent) is None
    within = policy_from(
        {"actions": {"thermal_throttle": "quarantine"}, "max_quarantined_share": 0.5}
    )
    assert policy_edit_problem(within, nodes=cluster(8), recent=recent) is None
    # Nodes quarantined already count, and are not counted twice.
    nodes = cluster(8, n0=QUARANTINED, n7=QUARANTINED)
    assert policy_edit_problem(within, nodes=nodes, recent=recent) == (
        "Refused: under this policy the signals of the last 3,600 s would quarantine 3 more "
        "nodes (n1, n2, n3), 5 of 8 in all, more than max_quarantined_share 0.5 allows "
        "(4). Quarantine nodes by hand if you mean it, or raise max_quarantined_share."
    )


def test_a_refused_edit_names_five_nodes_and_counts_the_others():
    strict = policy_from({"actions": {"pcie_replay": "quarantine"}})
    for count, named in (
        (6, "n0, n1, n2, n3, n4 and 1 more"),
        (7, "n0, n1, n2, n3, n4 and 2 more"),
    ):
        recent = [(f"n{i}", SignalClass.PCIE_REPLAY) for i in range(count)]
        problem = policy_edit_problem(strict, nodes=cluster(10), recent=recent)
        assert problem is not None
        assert f"would quarantine {count} more nodes ({named}), {count} of 10" in problem
    five = [(f"n{i}", SignalClass.PCIE_REPLAY) for i in range(5)]
    assert "(n0, n1, n2, n3, n4), 5 of 10" in (
        policy_edit_problem(strict, nodes=cluster(10), recent=five) or ""
    )
    one = policy_edit_problem(
        HealthPolicy(actions=strict.actions, max_quarantined_share=0.0),
        nodes=cluster(4),
        recent=[("n2", SignalClass.PCIE_REPLAY)],
    )
    assert one is not None and "would quarantine 1 more node (n2), 1 of 4" in one


# Floods


def test_a_flood_from_one_gpu_is_one_event_whose_count_grows():
    flood = [xid79("n1", T0 + i) for i in range(1000)]
    groups = flood_groups(flood, window=300, stored={})
    assert [(g.stored, g.span, len(g.members)) for g in groups] == [
        (False, Span(T0, T0 + 999, 1000), 1000)
    ]
    key = ("n1", "3", "gpu_lost", "79")
    more = flood_groups(
        [xid79("n1", T0 + 1200)], window=300, stored={key: Span(T0, T0 + 999, 1000)}
    )
    assert [(g.stored, g.span, g.members) for g in more] == [
        (True, Span(T0, T0 + 1200, 1001), (0,))
    ]


def test_signals_apart_by_more_than_the_window_are_separate_events():
    batch = [xid79("n1", T0), xid79("n1", T0 + 301), xid79("n1", T0 + 302, gpu="4")]
    groups = flood_groups(batch, window=300, stored={})
    assert sorted((g.key[1], g.span, g.members) for g in groups) == [
        ("3", Span(T0, T0, 1), (0,)),
        ("3", Span(T0 + 301, T0 + 301, 1), (1,)),
        ("4", Span(T0 + 302, T0 + 302, 1), (2,)),
    ]
    within = flood_groups([xid79("n1", T0), xid79("n1", T0 + 300)], window=300, stored={})
    assert [(g.span, g.members) for g in within] == [(Span(T0, T0 + 300, 2), (0, 1))]
    far = flood_groups(
        batch[:1], window=300, stored={("n1", "3", "gpu_lost", "79"): Span(T0 - 1000, T0 - 400, 7)}
    )
    assert [(g.stored, g.span) for g in far] == [(False, Span(T0, T0, 1))]


def test_a_late_sample_joins_the_stored_event_it_belongs_to():
    key = ("n1", "3", "gpu_lost", "79")
    groups = flood_groups(
        [xid79("n1", T0 - 2000), xid79("n1", T0 + 10)], window=300, stored={key: Span(T0, T0, 5)}
    )
    assert sorted((g.stored, g.span, g.members) for g in groups) == [
        (False, Span(T0 - 2000, T0 - 2000, 1), (0,)),
        (True, Span(T0, T0 + 10, 6), (1,)),
    ]


# Bad signals


def test_bad_signals_are_repaired_not_raised():
    now = T0
    cases = [
        (
            Signal("n1", "fan_fault", Source.BACKEND, T0, code=""),  # type: ignore[arg-type]
            Signal("n1", SignalClass.XID_UNKNOWN, Source.BACKEND, T0, code="fan_fault"),
            "unknown signal class 'fan_fault', recorded as xid_unknown",
        ),
        (
            Signal("n1", SignalClass.GPU_LOST, Source.DCGM, math.nan),
            Signal("n1", SignalClass.GPU_LOST, Source.DCGM, now),
            "no valid time (nan), taken as now",
        ),
        (
            Signal("n1", SignalClass.GPU_LOST, Source.DCGM, T0 + 3600),
            Signal("n1", SignalClass.GPU_LOST, Source.DCGM, now),
            "stamped 3600 s ahead of Gantry's clock, taken as now",
        ),
        (
            Signal("n1", SignalClass.GPU_LOST, Source.DCGM, T0 + 4),  # within the skew
            Signal("n1", SignalClass.GPU_LOST, Source.DCGM, T0 + 4),
            "",
        ),
        (
            Signal(" n1 ", SignalClass.NVLINK, "syslog", T0, gpu=7, code="74"),  # type: ignore[arg-type]
            Signal("n1", SignalClass.NVLINK, "syslog", T0, gpu="7", code="74"),  # type: ignore[arg-type]
            "unknown source 'syslog'",
        ),
        (
            SimpleNamespace(node="n2", signal="gpu_lost", at=T0),  # no source, GPU or code
            Signal("n2", SignalClass.GPU_LOST, "", T0),  # type: ignore[arg-type]
            "unknown source ''",
        ),
    ]
    for given, wanted, problem in cases:
        assert signal_checked(given, now=now) == (wanted, problem)
    clean, _ = signal_checked(Signal("n1", SignalClass.NVLINK, Source.DCGM, T0), now=now)
    assert clean is not None and type(clean.source) is Source  # the enum, not its text
    long = "s" * 50
    assert signal_checked(Signal("n1", SignalClass.NVLINK, long, T0), now=now)[1] == (  # type: ignore[arg-type]
        f"unknown source '{'s' * 40}'"
    )
    assert signal_checked(Signal("", SignalClass.NVLINK, Source.DCGM, T0), now=now) == (
        None,
        "a signal that names no node was dropped",
    )


def test_the_policy_is_frozen():
    assert isinstance(DEFAULT_POLICY.actions, MappingProxyType)
    with pytest.raises(TypeError):
        DEFAULT_POLICY.actions[SignalClass.GPU_LOST] = Action.OBSERVE  # type: ignore[index]


def test_nvlink_counters_warn_where_xid_74_quarantines():
    """Growing NVLink CRC / replay / recovery counters (a link that retried and recovered)
    make a node suspect; the driver's fatal NVLink XIDs quarantine it."""
    from clusters.health import HARDWARE_CLASSES, xid_class

    assert DEFAULT_ACTIONS[SignalClass.NVLINK_ERRORS] == Action.WARN
    assert SignalClass.NVLINK_ERRORS not in HARDWARE_CLASSES
    assert [xid_class(code) for code in (74, 144, 150)] == [SignalClass.NVLINK] * 3
    assert DEFAULT_ACTIONS[SignalClass.NVLINK] == Action.QUARANTINE
    nodes = cluster(4)
    counters = signal(
        "n1", SignalClass.NVLINK_ERRORS, T0, code="DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    )
    decisions = decide(DEFAULT_POLICY, nodes=nodes, signals=[counters])
    assert (decisions.nodes["n1"].health, decisions.outcomes) == (SUSPECT, (Outcome.WARN,))
    strict = policy_from({"actions": {"nvlink_errors": "quarantine"}})
    assert strict.action(SignalClass.NVLINK_ERRORS) == Action.QUARANTINE
