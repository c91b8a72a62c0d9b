"""core.schema_check: the compiled yes/no check says what jsonschema says, for every schema."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters.backends import k8s_settings, slurm_settings
from core.schema import _TYPE_CHECKS, JsonSchema
from core.schema_check import compile_check
from telemetry import sdk_events, source_settings
from tests.core.test_schema import SCHEMA

# Values at the edges of what the schemas allow, beside arbitrary JSON.
EDGES = st.sampled_from(
    [
        0, 1, -1, 1.0, 0.0, -0.0, True, False, None, "", "\x00", "a\x00b", "x" * 2049,
        math.nan, math.inf, -math.inf, sdk_events.MAX_SEQ, sdk_events.MAX_SEQ + 1,
        sdk_events.MAX_STEPS, sdk_events.MAX_STEPS + 1, sdk_events.EARLIEST_TS,
        sdk_events.EARLIEST_TS - 1, sdk_events.LATEST_TS, sdk_events.LATEST_TS + 0.5,
        sdk_events.READY, sdk_events.STEP_WINDOW, sdk_events.CHECKPOINT_SAVED,
        sdk_events.CHECKPOINT_RESTORED, "dcgm", "prometheus", "simulator",
        "http://10.0.0.5:9400/metrics", "ftp://b", "http://p:9090?q=1", '{job="dcgm"}', "T",
        [], {}, ["http://a:1/metrics"],
    ]
)  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | EDGES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
T = 1_760_000_000.0
VALID = {
    sdk_events.EVENT: [
        {"seq": 1, "ts": T, "type": "ready"},
        {"seq": 2, "ts": T, "type": "step_window", "start": T - 10, "end": T, "steps": 20,
         "step_time_s": 0.5, "data_wait_s": 0.01, "comm_wait_s": 0, "checkpoint_s": 0.0,
         "step": None},
        {"seq": 3, "ts": T, "type": "checkpoint_saved", "step": 7, "uri": "s3://b/c",
         "seconds": 2.5},
        {"seq": 4, "ts": T, "type": "checkpoint_restored", "step": 7, "uri": "s3://b/c",
         "seconds": 1},
    ],
    source_settings.SETTINGS: [
        {"source": "simulator"},
        {"source": "dcgm", "targets": ["http://10.0.0.5:9400/metrics"], "timeout_s": 5},
        {"source": "prometheus", "url": "http://prometheus:9090", "step_s": 60,
         "selector": '{job="dcgm"}', "token_env": None},
    ],
    k8s_settings.SETTINGS: [{"url": "https://k8s:6443", "token_env": "T"}],
    slurm_settings.SETTINGS: [
        {"transport": "cli", "job_dir": "/shared", "flavors": {"a100": {"gres_type": "a100"}},
         "topology_levels": ["spine", "leaf"], "submit_users": ["root", "slurm"]},
        {"transport": "rest", "job_dir": "/j", "flavors": {"a": {"gres_type": "a100"}},
         "rest_url": "http://slurm-head:6820", "rest_user": "slurm", "rest_token_env": "T",
         "topology": ["SwitchName=s1 Nodes=n[1-2]"], "topology_levels": ["leaf"]},
    ],
    SCHEMA: [{"gpus": 2, "seconds": 1.5, "users": ["ann"]}],
}  # fmt: skip
COMPILED = {
    schema: compile_check(schema.schema, type_checks=_TYPE_CHECKS, formats=schema.formats)
    for schema in VALID
}


@st.composite
def values(draw, schema: JsonSchema):
    """A valid value of ``schema`` with a few keys replaced, removed or added; or any JSON."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)
    value = dict(draw(st.sampled_from(VALID[schema])))
    for _ in range(draw(st.integers(0, 3))):
        keys = sorted(value)
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace" and keys:
            value[draw(st.sampled_from(keys))] = draw(EDGES | JSON)
        elif action == "remove" and keys:
            del value[draw(st.sampled_from(keys))]
        else:
            value[draw(st.text(max_size=6) | st.sampled_from(keys or ["seq"]))] = draw(JSON)
    return value


def test_the_schemas_in_use_compile_and_others_fall_back_to_jsonschema():
    assert all(check is not None for check in COMPILED.values())
    for schema in ({"enum": [1, "a"]}, {"uniqueItems": True}, {"uniqueItems": True, "items": {}}):
        assert compile_check(schema, type_checks=_TYPE_CHECKS, formats={}) is None


@pytest.mark.parametrize("schema", list(VALID), ids=["sdk event", "source", "k8s", "slurm", "test"])
@settings(max_examples=400, derandomize=True, deadline=None)
@given(data=st.data())
def test_the_compiled_check_agrees_with_jsonschema(schema, data):
    value = data.draw(values(schema))
    check = COMPILED[schema]
    assert check is not None

    assert check(value) is schema._validator().is_valid(value)


def test_every_valid_example_is_valid():
    for schema, examples in VALID.items():
        for example in examples:
            assert schema.is_valid(example), example


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        (source_settings.SETTINGS, {"source": "dcgm", "targets": ["ftp://b"]}),
        (source_settings.SETTINGS, {"source": "prometheus", "url": "ftp://b"}),
        (source_settings.SETTINGS, {"source": "prometheus", "url": "http://p:9090?q=1"}),
        (k8s_settings.SETTINGS, {**VALID[k8s_settings.SETTINGS][0], "node_selector": {"a b": "x"}}),
        (k8s_settings.SETTINGS, {**VALID[k8s_settings.SETTINGS][0], "timeout_s": 0}),
        (sdk_events.EVENT, {**VALID[sdk_events.EVENT][2], "uri": "x" * 2049}),
        (sdk_events.EVENT, {**VALID[sdk_events.EVENT][2], "uri": "x" * 2048}),
        (sdk_events.EVENT, {**VALID[sdk_events.EVENT][2], "uri": "s3://\x00"}),
    ],
)  # fmt: skip
def test_near_misses_are_answered_alike(schema, value):
    assert COMPILED[schema](value) is schema._validator().is_valid(value)


@pytest.mark.parametrize(
    "schema",
    [
        {"not": {"type": "string"}},
        {"exclusiveMaximum": 3},
        {"maxItems": 1},
        {"minProperties": 1},
        {"propertyNames": {"maxLength": 1}},
        {"additionalProperties": {"type": "integer"}, "properties": {"a": {}}},
        {"anyOf": [{"type": "null"}, {"const": "a"}]},
        {"if": {"type": "array"}, "else": {"type": "null"}},
        {"format": "even", "items": {"format": "even"}},
        {"format": "unknown"},
        {"items": {"type": "string"}, "uniqueItems": True},
        {"items": {"type": "string"}, "uniqueItems": False},
    ],
)
@pytest.mark.parametrize(
    "value",
    [
        None, 2, 3, 3.5, "a", "ab", [], [2], [2, 3], [2, 2], ["a", "a"], ["a", "ab"],
        ["a", 2, "a"], [[1], [1]], {}, {"a": "x"}, {"b": 1, "cd": 2},
    ],
)  # fmt: skip
def test_each_keyword_means_what_it_means_to_jsonschema(schema, value):
    def even(number: object) -> bool:
        if isinstance(number, int) and number % 2:
            raise ValueError("odd")
        return True

    compiled = JsonSchema(schema, formats={"even": even})
    check = compile_check(schema, type_checks=_TYPE_CHECKS, formats=compiled.formats)
    assert check is not None

    assert check(value) is compiled._validator().is_valid(value)
