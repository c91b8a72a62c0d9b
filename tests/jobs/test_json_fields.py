"""The JSON fields of the submit and template forms (params, env, template defaults, locks
and ranges) as a browser without JavaScript sends them: the structured editors of
static/gantry/editors.js are an enhancement of these textareas (tests/portal/test_editors.py),
so the JSON path is the contract both share. Round trips keep values and their types; a bad
key is an error next to its field that names it, and nothing is saved."""

import html
import json
import re

import pytest
from django.urls import reverse

from jobs import spec
from jobs.forms import ENV_NAME_PATTERN, RunSubmitForm, TemplateForm
from jobs.models import Experiment, ExperimentTemplate, Run
from jobs.services.templates import template_save
from tests.conftest import DIGEST_A
from tests.jobs.test_web import field_html, form_data, submit

pytestmark = pytest.mark.django_db

SUBMIT = reverse("jobs:run_submit")
IMAGE = "registry.example.org/ml/pytorch@" + DIGEST_A


def textarea_text(page: str, name: str) -> str:
    """What a browser shows in the named textarea (the newline after the tag is markup)."""
    match = re.search(rf'<textarea name="{name}"[^>]*>\n?(.*?)</textarea>', page, re.S)
    assert match is not None, name
    return html.unescape(match.group(1))


def counts() -> tuple[int, int]:
    return Run.objects.count(), Experiment.objects.count()


# --- what the editors read from the markup -------------------------------------------------


def test_the_json_textareas_name_their_editor_and_what_it_may_offer():
    submit_form = RunSubmitForm(tenants=[], projects=[], images=[], flavor_limits={})
    template_form = TemplateForm()

    assert submit_form.fields["params"].widget.attrs["data-editor"] == "params"
    assert submit_form.fields["env"].widget.attrs["data-editor"] == "env"
    assert ENV_NAME_PATTERN == "^[A-Za-z_][A-Za-z0-9_]{0,127}$"
    assert submit_form.fields["env"].widget.attrs["data-key-pattern"] == ENV_NAME_PATTERN
    fields = json.loads(template_form.fields["values"].widget.attrs["data-fields"])
    assert [field["name"] for field in fields] == list(spec.TEMPLATE_FIELDS)
    assert {field["name"]: field for field in fields}["resources.topology_mode"] == {
        "name": "resources.topology_mode",
        "type": "string",
        "choices": ["preferred", "required"],
    }
    assert {field["name"]: field for field in fields}["resources.nodes"] == {
        "name": "resources.nodes",
        "type": "integer",
    }
    assert {field["name"]: field for field in fields}["command"] == {
        "name": "command",
        "type": "string",
        "multiline": True,
    }
    assert json.loads(template_form.fields["locked"].widget.attrs["data-fields"]) == list(
        spec.TEMPLATE_FIELDS
    )
    assert json.loads(template_form.fields["ranges"].widget.attrs["data-fields"]) == [
        "resources.nodes",
        "resources.gpus_per_node",
        "resources.max_runtime_minutes",
        "priority",
        "max_restarts",
    ]


def test_the_submit_page_sends_the_json_textareas_and_loads_the_editors(client, world):
    client.force_login(world.researcher_a)

    page = client.get(SUBMIT).content.decode()

    assert textarea_text(page, "params") == "{}"
    assert textarea_text(page, "env") == "{}"
    assert 'data-editor="params"' in field_html(page, "params")
    assert 'data-key-pattern="^[A-Za-z_][A-Za-z0-9_]{0,127}$"' in field_html(page, "env")
    assert '<script src="/static/gantry/editors.js" defer></script>' in page
    assert '<link rel="stylesheet" href="/static/gantry/editors.css">' in page


# --- the submit form ------------------------------------------------------------------------


def test_json_sent_without_script_creates_the_experiment_with_those_types(client, world):
    client.force_login(world.researcher_a)

    response = client.post(
        SUBMIT,
        form_data(
            world,
            params='{"lr": 0.05, "epochs": 3, "optimizer": "adam", "warmup": true, '
            '"layers": [1, 2], "scheduler": null}',
            env='{"OMP_NUM_THREADS": "8", "RUN_NAME": "a b"}',
        ),
    )

    assert response.status_code == 302
    experiment = Experiment.objects.get()
    assert experiment.params == {
        "lr": 0.05,
        "epochs": 3,
        "optimizer": "adam",
        "warmup": True,
        "layers": [1, 2],
        "scheduler": None,
    }
    assert [type(experiment.params[key]) for key in ("lr", "epochs", "warmup")] == [
        float,
        int,
        bool,
    ]
    assert experiment.env == {"OMP_NUM_THREADS": "8", "RUN_NAME": "a b"}


def test_a_clone_shows_the_json_that_submits_the_same_values(client, world):
    params = {"lr": 0.05, "batch_size": 256, "warmup": False, "note": "a\nb", "nested": {"k": [1]}}
    source = submit(world, params=params, env={"OMP_NUM_THREADS": "8"})
    client.force_login(world.researcher_a)

    page = client.get(f"{SUBMIT}?from={source.experiment_id}").content.decode()
    shown_params, shown_env = textarea_text(page, "params"), textarea_text(page, "env")
    assert shown_params == json.dumps(params, indent=2, sort_keys=True)
    assert shown_env == '{\n  "OMP_NUM_THREADS": "8"\n}'
    response = client.post(
        SUBMIT, form_data(world, name="clone", params=shown_params, env=shown_env)
    )

    assert response.status_code == 302
    clone = Experiment.objects.get(name="clone")
    assert (clone.params, clone.env) == (params, {"OMP_NUM_THREADS": "8"})
    assert type(clone.params["lr"]) is float


@pytest.mark.parametrize(
    ("field", "text", "message"),
    [
        ("params", '{"lr": 0.1, "lr": 0.2}', "lr is given twice: give each name once."),
        ("params", '{"opt": {"beta": 1, "beta": 2}}', "beta is given twice: give each name once."),
        ("env", '{"SEED": "1", "SEED": "2"}', "SEED is given twice: give each name once."),
        (
            "env",
            '{"FOO BAR": "1"}',
            "&#x27;FOO BAR&#x27; is not a valid variable name: letters, digits and _, not "
            "starting with a digit, at most 128 characters.",
        ),
        ("env", '{"SEED": 1}', "The value of SEED must be a string."),
        ("env", '{"SLURM_JOB_ID": "7"}', "SLURM_JOB_ID is read by the cluster&#x27;s launcher"),
    ],
    ids=["params-twice", "nested-twice", "env-twice", "env-name", "env-value", "env-host-side"],
)
def test_a_bad_key_is_an_error_next_to_its_field_that_names_it(client, world, field, text, message):
    client.force_login(world.researcher_a)

    response = client.post(SUBMIT, form_data(world, **{field: text}))

    assert response.status_code == 400
    content = response.content.decode()
    assert message in field_html(content, field)
    assert f'<div class="field field-invalid" data-field="{field}">' in content
    assert textarea_text(content, field) == text  # shown again as sent, to correct
    assert counts() == (0, 0)


# --- the template form ----------------------------------------------------------------------


def test_a_template_round_trips_through_its_json_fields(client, world):
    template = template_save(
        actor=world.tenant_admin_a,
        tenant=world.vision,
        name="round-trip",
        description="",
        values={
            "image": IMAGE,
            "resources": {"flavor": "a100-80gb", "gpus_per_node": 2},
            "params": {"lr": 0.1},
            "env": {"OMP_NUM_THREADS": "8"},
        },
        locked=["image", "resources.flavor"],
        ranges={"resources.gpus_per_node": {"min": 1, "max": 4}},
    )
    edit = reverse("jobs:template_edit", args=[template.pk])
    client.force_login(world.tenant_admin_a)

    page = client.get(edit).content.decode()
    shown = {name: textarea_text(page, name) for name in ("values", "locked", "ranges")}
    assert shown["locked"] == "image\nresources.flavor"
    assert json.loads(shown["ranges"]) == {"resources.gpus_per_node": {"min": 1, "max": 4}}
    response = client.post(edit, {"name": "round-trip", "description": ""} | shown)

    assert response.status_code == 302
    saved = ExperimentTemplate.objects.get()
    assert saved.values == template.values
    assert type(saved.values["params"]["lr"]) is float
    assert (saved.locked, saved.ranges) == (template.locked, template.ranges)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        (
            {"values": '{"env": {"FOO BAR": "1"}}'},
            "values",
            "env: &#x27;FOO BAR&#x27; is not a valid variable name",
        ),
        (
            {"values": '{"resources": {"nodes": 1, "nodes": 2}}'},
            "values",
            "nodes is given twice: give each name once.",
        ),
        (
            {"values": '{"resources": {"nodes": "2"}}'},
            "values",
            "resources.nodes: Expected an integer, got a string.",
        ),
        ({"locked": "image"}, "locked", "image: give the value it is locked to."),
        (
            {"values": '{"priority": 70}', "ranges": '{"priority": {"min": 10, "max": 60}}'},
            "ranges",
            "priority: the default 70 is outside the range.",
        ),
        (
            {"ranges": '{"priority": {"min": 10, "max": 60}, "priority": {"min": 1, "max": 2}}'},
            "ranges",
            "priority is given twice: give each name once.",
        ),
    ],
    ids=["env-name", "twice", "type", "lock", "range", "range-twice"],
)
def test_a_bad_template_row_is_an_error_that_names_it_and_saves_nothing(
    client, world, changes, field, message
):
    client.force_login(world.tenant_admin_a)
    data = {"tenant": "vision", "name": "bad", "values": "{}", "locked": "", "ranges": "{}"}

    response = client.post(reverse("jobs:template_create"), data | changes)

    assert response.status_code == 400
    assert message in field_html(response.content.decode(), field)
    assert ExperimentTemplate.objects.count() == 0
