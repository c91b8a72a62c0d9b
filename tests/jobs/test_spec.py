"""The experiment spec: pure parsing and export, and the spec API (submit, export, schema)."""

import copy

import jsonschema
import pytest
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from jobs import spec
from jobs.models import Experiment, Run
from jobs.services.specs import experiment_spec
from jobs.services.submission import run_submit
from tenants.services.tokens import api_token_create
from tests.conftest import COMMIT, DIGEST_A, experiment_input

SPECS = reverse("api:spec-submit")
SCHEMA = reverse("api:spec-schema")
IMAGE = "registry.example.org/ml/pytorch@" + DIGEST_A

FULL_SPEC = {
    "version": 1,
    "kind": "experiment",
    "tenant": "vision",
    "project": "detection",
    "name": "yolo-baseline",
    "image": IMAGE,
    "command": "python train.py --epochs 3",
    "resources": {
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 2,
        "max_runtime_minutes": 1440,
    },
    "code": {"repository": "https://git.example.org/x.git", "commit": COMMIT},
    "dataset": {"uri": "s3://datasets/coco", "version": "v3"},
    "params": {"batch_size": 64, "lr": 0.001},
    "env": {"GANTRY_SIM_DURATION_S": "600"},
    "priority": 50,
    "max_restarts": 0,
    "checkpoint_dir": "s3://ckpt/yolo",
}
MINIMAL_SPEC = {
    "version": 1,
    "kind": "experiment",
    "tenant": "vision",
    "project": "detection",
    "image": IMAGE,
    "command": "python train.py",
    "resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 1},
}
TEMPLATE_SPEC = {
    "version": 1,
    "kind": "experiment",
    "tenant": "vision",
    "project": "detection",
    "template": "pytorch-1node",
    "resources": {"gpus_per_node": 2},
}
EXAMPLES = [FULL_SPEC, MINIMAL_SPEC, TEMPLATE_SPEC]


def spec_with(**changes) -> dict:
    document = copy.deepcopy(FULL_SPEC)
    document.update(changes)
    return document


def client_for(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def counts() -> tuple[int, int]:
    return Run.objects.count(), Experiment.objects.count()


# --- pure: spec_parse -----------------------------------------------------------------------


def test_parse_full_spec_gives_experiment_input_values():
    values, errors = spec.spec_parse(FULL_SPEC)

    assert errors == {}
    assert values == {
        "tenant": "vision",
        "project": "detection",
        "name": "yolo-baseline",
        "image": IMAGE,
        "command": "python train.py --epochs 3",
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 2,
        "max_runtime_minutes": 1440,
        "code_repository": "https://git.example.org/x.git",
        "code_commit": COMMIT,
        "dataset_uri": "s3://datasets/coco",
        "dataset_version": "v3",
        "params": {"batch_size": 64, "lr": 0.001},
        "env": {"GANTRY_SIM_DURATION_S": "600"},
        "priority": 50,
        "max_restarts": 0,
        "checkpoint_dir": "s3://ckpt/yolo",
    }


def test_parse_names_unknown_keys_at_every_level():
    document = spec_with(gpus=4, resources={**FULL_SPEC["resources"], "gpu": 2})

    values, errors = spec.spec_parse(document)

    assert values is None
    assert errors == {
        "gpus": [
            "Unknown field; known fields: version, kind, tenant, project, name, template, "
            "image, command, resources, code, dataset, params, env, priority, max_restarts, "
            "checkpoint_dir."
        ],
        "resources.gpu": [
            "Unknown field; known fields: flavor, nodes, gpus_per_node, max_runtime_minutes, "
            "topology_level, topology_mode."
        ],
    }


def test_parse_names_wrong_types_by_dotted_field():
    document = spec_with(
        resources={**FULL_SPEC["resources"], "gpus_per_node": "2", "nodes": True},
        code={"repository": "https://git.example.org/x.git", "commit": 123},
        priority=1.5,
        params=[1],
        env={"A": 1},
        dataset="s3://x",
    )

    values, errors = spec.spec_parse(document)

    assert values is None
    assert errors == {
        "resources.gpus_per_node": ["Expected an integer, got a string."],
        "resources.nodes": ["Expected an integer, got a boolean."],
        "code.commit": ["Expected a string, got an integer."],
        "priority": ["Expected an integer, got a number."],
        "params": ["Expected an object, got an array."],
        "env": ["The value of A must be a string, not an integer."],
        "dataset": ["Expected an object, got a string."],
    }


def test_parse_names_missing_required_fields():
    values, errors = spec.spec_parse({"version": 1, "resources": {"nodes": 1}})

    assert values is None
    assert errors == {
        "kind": ["This field is required."],
        "tenant": ["This field is required."],
        "project": ["This field is required."],
        "image": ["This field is required."],
        "command": ["This field is required."],
        "resources.flavor": ["This field is required."],
        "resources.gpus_per_node": ["This field is required."],
    }


def test_parse_with_a_template_leaves_required_values_to_it():
    values, errors = spec.spec_parse(TEMPLATE_SPEC)

    assert errors == {}
    assert values == {"tenant": "vision", "project": "detection", "gpus_per_node": 2}
    assert spec.spec_template_name(TEMPLATE_SPEC) == "pytorch-1node"


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ([], {"non_field_errors": ["Expected an object, got an array."]}),
        (spec_with(version=2), {"version": ["Unsupported version 2; this server reads 1."]}),
        (spec_with(version="1"), {"version": ["Expected an integer, got a string."]}),
        (spec_with(kind="job"), {"kind": ['Must be "experiment".']}),
        (spec_with(template=3), {"template": ["Expected a string, got an integer."]}),
        (spec_with(template=None), {"template": ["Expected a string, got null."]}),
    ],
)
def test_parse_rejects_bad_documents(document, expected):
    assert spec.spec_parse(document) == (None, expected)


def test_errors_translate_from_input_to_spec_names():
    errors = {"gpus_per_node": ["x"], "code_commit": ["y"], "cloned_from": ["z"]}

    dotted = spec.errors_to_spec(errors)

    assert dotted == {"resources.gpus_per_node": ["x"], "code.commit": ["y"], "cloned_from": ["z"]}


# --- pure: spec_of --------------------------------------------------------------------------


def test_spec_of_parsed_values_is_the_document_in_canonical_order():
    values, _ = spec.spec_parse(FULL_SPEC)

    exported = spec.spec_of(values)

    assert exported == FULL_SPEC
    assert list(exported) == list(FULL_SPEC)
    assert list(exported["resources"]) == list(FULL_SPEC["resources"])


def test_spec_of_omits_empty_optional_values_and_sorts_params():
    values, _ = spec.spec_parse(MINIMAL_SPEC)
    values |= {"name": "", "params": {"b": 1, "a": {"z": 1, "y": 2}}, "env": {}, "priority": 50}

    exported = spec.spec_of(values)

    assert exported == {**MINIMAL_SPEC, "params": {"a": {"y": 2, "z": 1}, "b": 1}, "priority": 50}
    assert list(exported["params"]) == ["a", "b"]
    assert list(exported["params"]["a"]) == ["y", "z"]


# --- pure: template_apply -------------------------------------------------------------------

TEMPLATE_VALUES = {"image": IMAGE, "command": "python train.py", "flavor": "a100-80gb", "nodes": 1}
LOCKED = ["image", "resources.nodes"]
RANGES = {"resources.gpus_per_node": {"min": 1, "max": 4}, "priority": {"min": 10, "max": 60}}


def apply(submitted: dict, ranges=RANGES):
    defaults = {**TEMPLATE_VALUES, "gpus_per_node": 1, "priority": 50}
    return spec.template_apply(defaults, LOCKED, ranges, submitted, template_name="pt")


def test_template_apply_overlays_submitted_values_on_the_defaults():
    merged, errors = apply({"tenant": "vision", "gpus_per_node": 4, "nodes": 1})

    assert errors == {}
    assert merged == {**TEMPLATE_VALUES, "gpus_per_node": 4, "priority": 50, "tenant": "vision"}


def test_template_apply_names_changed_locked_fields():
    _, errors = apply({"image": "other/image:1", "nodes": 2})

    assert errors == {
        "image": [f"Locked by template pt: must be {IMAGE}."],
        "nodes": ["Locked by template pt: must be 1."],
    }


def test_template_apply_names_values_out_of_range():
    _, errors = apply({"gpus_per_node": 8, "priority": 5})

    assert errors == {
        "gpus_per_node": ["Must be between 1 and 4 (template pt)."],
        "priority": ["Must be between 10 and 60 (template pt)."],
    }


def test_template_apply_checks_ranges_on_the_merged_result():
    _, errors = apply({}, ranges={"priority": {"min": 60, "max": 100}})

    assert errors == {"priority": ["Must be between 60 and 100 (template pt)."]}


def test_template_apply_requires_what_neither_gives():
    _, errors = spec.template_apply({"image": IMAGE}, [], {}, {"command": "x"})

    assert errors == {
        "flavor": ["This field is required."],
        "nodes": ["This field is required."],
        "gpus_per_node": ["This field is required."],
    }


def test_template_rules_check_exact_errors():
    values = {"image": IMAGE, "nodes": 1}

    errors = spec.template_rules_check(
        values,
        ["image", "resources.flavor", "bogus"],
        {
            "resources.nodes": {"min": 2, "max": 4},
            "resources.gpus_per_node": {"min": 1, "max": 2},
            "priority": {"min": 9, "max": 1},
            "name": {"min": 1, "max": 2},
            "max_restarts": {"min": "0", "max": 1},
        },
    )

    assert errors == {
        "locked": [
            "resources.flavor: give the value it is locked to.",
            "bogus: unknown field; known: " + ", ".join(spec.TEMPLATE_FIELDS) + ".",
        ],
        "ranges": [
            "resources.nodes: the default 1 is outside the range.",
            "resources.gpus_per_node: give a default value inside the range.",
            "priority: min must not be greater than max.",
            "name: not a numeric field; known: " + ", ".join(spec.RANGE_FIELDS) + ".",
            'max_restarts: expected {"min": <integer>, "max": <integer>}.',
        ],
    }


# --- schema ---------------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12_and_every_example_validates():
    jsonschema.Draft202012Validator.check_schema(spec.SPEC_SCHEMA)
    validator = jsonschema.Draft202012Validator(spec.SPEC_SCHEMA)
    for document in EXAMPLES:
        validator.validate(document)
    assert not validator.is_valid(spec_with(resources={"gpu": 1}))
    assert not validator.is_valid(spec_with(priority="50"))


def test_schema_endpoint_returns_the_spec_schema(world):
    response = client_for(world.researcher_b).get(SCHEMA)

    assert response.status_code == 200
    assert response.json() == spec.SPEC_SCHEMA


def test_schema_endpoint_needs_authentication(world):
    assert APIClient().get(SCHEMA).status_code == 401


def test_openapi_schema_publishes_the_spec_without_warnings(db, tmp_path):
    target = tmp_path / "openapi.yaml"

    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(target))

    document = target.read_text()
    assert "ExperimentSpec:" in document
    assert "/api/v1/specs/" in document
    assert "/api/v1/experiments/{id}/spec/" in document


# --- API: submit and export -----------------------------------------------------------------


def test_submit_spec_creates_the_run(world):
    response = client_for(world.researcher_a).post(SPECS, FULL_SPEC, format="json")

    assert response.status_code == 201, response.json()
    run = Run.objects.get()
    assert response.json()["id"] == run.pk
    assert response.json()["experiment_name"] == "yolo-baseline"
    assert response["Location"].endswith(reverse("api:run-detail", args=[run.pk]))
    assert experiment_spec(run.experiment) == FULL_SPEC


def test_round_trip_export_submit_export_is_identical(world):
    source = run_submit(user=world.researcher_a, data=experiment_input(world)).experiment
    client = client_for(world.researcher_a)

    exported = client.get(reverse("api:experiment-spec", args=[source.pk]))
    assert exported.status_code == 200
    submitted = client.post(SPECS, exported.json(), format="json")

    assert submitted.status_code == 201, submitted.json()
    copy_id = submitted.json()["experiment"]
    again = client.get(reverse("api:experiment-spec", args=[copy_id])).json()
    assert copy_id != source.pk
    assert again == exported.json()
    assert list(again) == list(exported.json())
    jsonschema.validate(again, spec.SPEC_SCHEMA)


def test_export_of_another_tenants_experiment_is_404(world):
    run = run_submit(user=world.researcher_a, data=experiment_input(world))

    response = client_for(world.researcher_b).get(
        reverse("api:experiment-spec", args=[run.experiment_id])
    )

    assert response.status_code == 404


@pytest.mark.parametrize(
    ("document", "field", "message"),
    [
        (spec_with(foo=1), "foo", "Unknown field; known fields: version"),
        (
            spec_with(resources={**FULL_SPEC["resources"], "gpus_per_node": "2"}),
            "resources.gpus_per_node",
            "Expected an integer, got a string.",
        ),
        ({k: v for k, v in FULL_SPEC.items() if k != "project"}, "project", "required"),
        (
            spec_with(resources={**FULL_SPEC["resources"], "gpus_per_node": 9}),
            "resources.gpus_per_node",
            "at most 8 GPUs",
        ),
        (spec_with(code={"repository": "x", "commit": "abc"}), "code.commit", "40 lowercase"),
        (spec_with(project="nope"), "project", "Unknown project"),
    ],
)
def test_bad_spec_is_400_naming_the_dotted_field_and_creates_nothing(
    world, document, field, message
):
    before = counts()

    response = client_for(world.researcher_a).post(SPECS, document, format="json")

    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert message in " ".join(response.json()[field])
    assert counts() == before


def test_spec_for_a_tenant_the_user_is_not_in_is_400_and_creates_nothing(world):
    response = client_for(world.researcher_b).post(SPECS, FULL_SPEC, format="json")

    assert response.status_code == 400
    assert response.json() == {"tenant": ["Unknown tenant, or you are not a member."]}
    assert counts() == (0, 0)


def test_submit_spec_needs_authentication(world):
    assert APIClient().post(SPECS, FULL_SPEC, format="json").status_code == 401
    assert counts() == (0, 0)
