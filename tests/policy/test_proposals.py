"""A proposal's JSON (policy.proposals): read into the replay's Proposal and written back,
every wrong shape refused with the value it names."""

import pytest

from jobs.admission_types import Queueing, Quota
from jobs.replay_types import NodeChange, Proposal
from policy.proposals import (
    ProposalShapeError,
    proposal_from_json,
    proposal_is_empty,
    proposal_tenants,
)

FULL = {
    "quotas": [
        {
            "tenant": "vision",
            "flavor": "a100-80gb",
            "guaranteed": 24,
            "borrow_limit": 4,
            "max_gpus_per_run": 16,
            "budget_gpu_hours": 1000,
            "budget_hard": False,
            "weight": 2,
        },
        {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8},
    ],
    "nodes": [{"cluster": "sim-1", "flavor": "h100-80gb", "count": -1}],
    "preemption": False,
    "starvation_after_s": 3600,
    "queueing": {"sim-1": "strict"},
    "tenant_queueing": {"nlp": "best-effort"},
    "fair_share_half_life_s": 43200,
}


def test_a_full_proposal_is_read_with_defaults_for_what_a_quota_leaves_out():
    proposal = proposal_from_json(FULL)
    assert proposal == Proposal(
        quotas={
            ("vision", "a100-80gb"): Quota(
                guaranteed=24,
                borrow_limit=4,
                max_gpus_per_run=16,
                budget_gpu_hours=1000.0,
                budget_hard=False,
                weight=2,
            ),
            ("nlp", "a100-80gb"): Quota(guaranteed=8),
        },
        nodes=(NodeChange("sim-1", "h100-80gb", -1),),
        preemption=False,
        starvation_after_s=3600.0,
        queueing={"sim-1": Queueing.STRICT},
        tenant_queueing={"nlp": Queueing.BEST_EFFORT},
        fair_share_half_life_s=43200.0,
    )
    assert proposal_tenants(proposal) == {"vision", "nlp"}
    assert not proposal_is_empty(proposal)


def test_a_report_keeps_the_proposal_in_the_replays_own_json_and_reads_it_back():
    proposal = proposal_from_json(FULL)
    kept = proposal.to_json()
    assert [(q["tenant"], q["guaranteed"], q["borrow_limit"]) for q in kept["quotas"]] == [
        ("nlp", 8, 0),
        ("vision", 24, 4),
    ]
    assert Proposal.from_json(kept) == proposal
    # What a report keeps is also valid input: a client may send it back as it is.
    assert proposal_from_json(kept) == proposal


def test_an_empty_object_proposes_nothing():
    proposal = proposal_from_json({})
    assert proposal == Proposal()
    assert proposal_is_empty(proposal)
    assert proposal_tenants(proposal) == set()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "The proposal must be an object."),
        ({"quota": []}, "The proposal has unknown keys: quota."),
        ({"quotas": {}}, "quotas must be a list."),
        ({"quotas": [{"tenant": "vision"}]}, "quotas[0] needs flavor, guaranteed."),
        (
            {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": "8"}]},
            "quotas[0].guaranteed must be a whole number.",
        ),
        (
            {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": True}]},
            "quotas[0].guaranteed must be a whole number.",
        ),
        (
            {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 2**31}]},
            "quotas[0].guaranteed must be a whole number.",
        ),
        (
            {"quotas": [{"tenant": "", "flavor": "a100-80gb", "guaranteed": 8}]},
            "quotas[0].tenant must be a name: lowercase letters, digits, dots and dashes.",
        ),
        (
            {"quotas": [{"tenant": "vision\x00", "flavor": "a100-80gb", "guaranteed": 8}]},
            "quotas[0].tenant must be a name: lowercase letters, digits, dots and dashes.",
        ),
        (
            {"nodes": [{"cluster": "Sim 1", "flavor": "a100-80gb", "count": 1}]},
            "nodes[0].cluster must be a name: lowercase letters, digits, dots and dashes.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8, "budget_hard": "no"}]},
            "quotas[0].budget_hard must be true or false.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8, "budget_gpu_hours": "x"}]},
            "quotas[0].budget_gpu_hours must be a number.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8, "colour": "red"}]},
            "quotas[0] has unknown keys: colour.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8}] * 2},
            "quotas[1]: v a is proposed twice.",
        ),
        ({"nodes": [{"cluster": "sim-1", "count": 2}]}, "nodes[0] needs flavor."),
        (
            {"nodes": [{"cluster": "sim-1", "flavor": "a", "count": 1.5}]},
            "nodes[0].count must be a whole number.",
        ),
        ({"preemption": "off"}, "preemption must be true, false or null."),
        (
            {"queueing": {"sim-1": "fifo"}},
            "queueing.sim-1 must be one of: strict, backfill, best-effort.",
        ),
        ({"tenant_queueing": []}, "tenant_queueing must be an object."),
        (
            {"tenant_queueing": {"NLP": "strict"}},
            "tenant_queueing key must be a name: lowercase letters, digits, dots and dashes.",
        ),
        ({"starvation_after_s": float("nan")}, "starvation_after_s must be a number."),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8, "size": 1, "colour": 2}]},
            "quotas[0] has unknown keys: colour, size.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "A100", "guaranteed": 8}]},
            "quotas[0].flavor must be a name: lowercase letters, digits, dots and dashes.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8, "borrow_limit": "2"}]},
            "quotas[0].borrow_limit must be a whole number.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8, "max_gpus_per_run": 1.5}]},
            "quotas[0].max_gpus_per_run must be a whole number.",
        ),
        (
            {"quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 8, "weight": None}]},
            "quotas[0].weight must be a whole number.",
        ),
        ({"nodes": {}}, "nodes must be a list."),
        ({"nodes": [8]}, "nodes[0] must be an object."),
        ({"nodes": [{"count": 2}]}, "nodes[0] needs cluster, flavor."),
        (
            {"nodes": [{"cluster": "sim-1", "flavor": "H100", "count": 1}]},
            "nodes[0].flavor must be a name: lowercase letters, digits, dots and dashes.",
        ),
        (
            {"nodes": [{"cluster": "sim-1", "flavor": "a", "count": 1, "gpus_per_node": "8"}]},
            "nodes[0].gpus_per_node must be a whole number.",
        ),
    ],
)
def test_a_wrong_shape_is_refused_naming_the_value(data, message):
    with pytest.raises(ProposalShapeError) as refused:
        proposal_from_json(data)
    assert str(refused.value) == message


def test_the_largest_whole_number_is_postgresqls_integer_and_a_new_nodes_gpus_are_read():
    proposal = proposal_from_json(
        {
            "quotas": [{"tenant": "v", "flavor": "a", "guaranteed": 2**31 - 1}],
            "nodes": [{"cluster": "sim-1", "flavor": "h100", "count": 2, "gpus_per_node": 8}],
        }
    )
    assert proposal.quotas == {("v", "a"): Quota(guaranteed=2**31 - 1)}
    assert proposal.nodes == (NodeChange("sim-1", "h100", 2, 8),)
