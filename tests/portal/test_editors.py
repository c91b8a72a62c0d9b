"""The structured editors of the submit and template forms (static/gantry/editors.js) in
headless Chromium: rows of labelled inputs written into the JSON field the form sends, the
JSON as an "Advanced: JSON" view that rebuilds the rows, the server's errors next to the
field, and nothing created when it refuses."""

import json
import re

from playwright.sync_api import Page, expect

from jobs.models import Experiment, ExperimentTemplate, Run
from jobs.services.templates import template_save
from tests.browser_support import screenshot
from tests.conftest import DIGEST_A

pytest_plugins = ["tests.browser_support"]

IMAGE = "registry.example.org/ml/pytorch@" + DIGEST_A
RUN_PAGE = re.compile(r"/runs/[0-9]+/$")


def fill_submit_form(page: Page, name: str) -> None:
    page.goto("/runs/new/")
    page.select_option("#id_project", "detection")
    page.select_option("#id_image", IMAGE)
    page.fill("#id_name", name)
    page.fill("#id_command", "python train.py --epochs 3")
    page.select_option("#id_flavor", "a100-80gb")
    page.fill("#id_gpus_per_node", "2")
    expect(page.locator("[data-preview-url]")).to_have_attribute("aria-busy", "false")


def editor(page: Page, field: str):
    """The wrapper of one form field (label, editor, JSON view, errors, help)."""
    return page.locator(f'.field[data-field="{field}"]')


def advanced(page: Page, field: str):
    """Open the field's "Advanced: JSON" view."""
    details = editor(page, field).locator("details.kv-advanced")
    if details.get_attribute("open") is None:
        details.locator("summary").click()
    expect(details).to_have_attribute("open", "")


def add_param(page: Page, number: int, name: str, type_: str, value: str) -> None:
    page.get_by_role("button", name="Add parameter").click()
    expect(page.get_by_label(f"Parameter {number} name")).to_be_focused()
    page.get_by_label(f"Parameter {number} name").fill(name)
    page.get_by_label(f"Parameter {number} type").select_option(type_)
    page.get_by_label(f"Parameter {number} value").fill(value)


def add_variable(page: Page, number: int, name: str, value: str) -> None:
    page.get_by_role("button", name="Add variable").click()
    page.get_by_label(f"Variable {number} name").fill(name)
    page.get_by_label(f"Variable {number} value").fill(value)


def test_rows_of_params_and_env_are_submitted_with_their_types(world, persona_page, tmp_path):
    page = persona_page(world.researcher_a)
    fill_submit_form(page, "rows")
    # Without values the rows say so; the JSON fields are behind their disclosures.
    expect(editor(page, "params").locator(".kv-empty")).to_have_text("No parameters.")
    expect(page.locator("#id_params")).to_be_hidden()
    expect(page.locator("#id_env")).to_be_hidden()

    add_param(page, 1, "lr", "number", "0.05")
    add_param(page, 2, "optimizer", "string", "adam")
    add_variable(page, 1, "GANTRY_SIM_DURATION_S", "600")

    expect(page.locator("#id_params")).to_have_value('{\n  "lr": 0.05,\n  "optimizer": "adam"\n}')
    expect(page.locator("#id_env")).to_have_value('{\n  "GANTRY_SIM_DURATION_S": "600"\n}')
    screenshot(page, "editors-submit-rows", tmp_path)
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)

    experiment = Run.objects.get().experiment
    assert experiment.params == {"lr": 0.05, "optimizer": "adam"}
    assert (type(experiment.params["lr"]), type(experiment.params["optimizer"])) == (float, str)
    assert experiment.env == {"GANTRY_SIM_DURATION_S": "600"}


def test_a_bad_env_name_is_hinted_then_refused_next_to_the_field(world, persona_page, tmp_path):
    page = persona_page(world.researcher_a)
    fill_submit_form(page, "bad-env")
    add_variable(page, 1, "FOO BAR", "1")
    hint = editor(page, "env").locator(".kv-hints li")
    expect(hint).to_have_text(
        "FOO BAR is not a valid variable name: letters, digits and _, not starting with a "
        "digit, at most 128 characters."
    )
    # A hint only: the server decides.
    page.get_by_role("button", name="Submit").click()
    page.wait_for_load_state()

    errors = editor(page, "env").locator(".errorlist li")
    expect(errors).to_have_text(
        "'FOO BAR' is not a valid variable name: letters, digits and _, not starting with a "
        "digit, at most 128 characters."
    )
    expect(page.locator(".message-error")).to_have_text(
        "The run was not submitted: please correct the fields marked below."
    )
    # The rows come back as sent, and the JSON view is open beside the error.
    expect(page.get_by_label("Variable 1 name")).to_have_value("FOO BAR")
    expect(page.locator("#id_env")).to_be_visible()
    assert (Run.objects.count(), Experiment.objects.count()) == (0, 0)
    screenshot(page, "editors-env-refused", tmp_path)


def test_a_row_that_is_not_json_yet_keeps_the_form_from_being_sent(world, persona_page):
    page = persona_page(world.researcher_a)
    fill_submit_form(page, "not-a-number")
    add_param(page, 1, "lr", "number", "fast")

    page.get_by_role("button", name="Submit").click()

    value = page.get_by_label("Parameter 1 value")
    expect(value).to_be_focused()
    expect(value).to_have_attribute("aria-invalid", "true")
    expect(editor(page, "params").locator(".kv-hint-error")).to_have_text(
        'lr: "fast" is not a number.'
    )
    # The JSON keeps the last rows it could be written from (a string, before the type).
    expect(page.locator("#id_params")).to_have_value('{\n  "lr": ""\n}')
    expect(editor(page, "params").locator(".kv-status")).to_have_text(
        "The JSON is written again once the marked rows are fixed."
    )
    assert page.url.endswith("/runs/new/")
    assert Run.objects.count() == 0

    value.fill("3")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)
    assert Run.objects.get().experiment.params == {"lr": 3}


def test_the_json_view_shows_the_rows_and_editing_it_rebuilds_them(world, persona_page, tmp_path):
    page = persona_page(world.researcher_a)
    fill_submit_form(page, "json-view")
    add_param(page, 1, "lr", "number", "0.1")
    advanced(page, "params")
    params = page.locator("#id_params")
    expect(params).to_have_value('{\n  "lr": 0.1\n}')

    # JSON typed in the view becomes rows, each value with its type; 1.0 keeps its text.
    params.fill('{"epochs": 1.0, "warmup": true, "layers": [1, 2], "note": "a\\nb"}')
    for number, (name, type_, value) in enumerate(
        [
            ("epochs", "number", "1.0"),
            ("warmup", "boolean", "true"),
            ("layers", "json", "[1,2]"),
            ("note", "json", '"a\\nb"'),
        ],
        start=1,
    ):
        expect(page.get_by_label(f"Parameter {number} name")).to_have_value(name)
        expect(page.get_by_label(f"Parameter {number} type")).to_have_value(type_)
        expect(page.get_by_label(f"Parameter {number} value")).to_have_value(value)

    # Removing a row by keyboard rewrites the JSON and moves the focus to the next row.
    page.get_by_role("button", name="Remove parameter 2").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Parameter 2 name")).to_have_value("layers")
    expect(page.get_by_label("Parameter 2 name")).to_be_focused()
    expect(params).to_have_value('{\n  "epochs": 1.0,\n  "layers": [1,2],\n  "note": "a\\nb"\n}')

    # JSON that does not parse leaves the rows hidden and says so.
    params.fill('{"epochs": ')
    expect(editor(page, "params").locator(".kv-status")).to_contain_text(
        "The JSON does not parse: "
    )
    expect(editor(page, "params").locator(".kv-json-only")).to_have_text(
        "Shown as JSON only: the JSON does not parse. Edit it under Advanced: JSON."
    )
    expect(page.get_by_role("button", name="Add parameter")).to_be_hidden()
    params.fill('{"epochs": 2}')
    expect(editor(page, "params").locator(".kv-status")).to_have_text("")
    expect(page.get_by_label("Parameter 1 name")).to_have_value("epochs")

    # An env the rows cannot show unchanged stays JSON; the server reads it as sent.
    advanced(page, "env")
    page.locator("#id_env").fill('{"SEED": 7}')
    expect(editor(page, "env").locator(".kv-json-only")).to_have_text(
        "Shown as JSON only: The value of SEED is not a string. Edit it under Advanced: JSON."
    )
    page.locator("#id_env").fill('{"SEED": "7"}')
    expect(page.get_by_label("Variable 1 value")).to_have_value("7")
    screenshot(page, "editors-json-view", tmp_path)

    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)
    experiment = Run.objects.get().experiment
    assert (experiment.params, experiment.env) == ({"epochs": 2}, {"SEED": "7"})


def test_template_defaults_locks_and_ranges_are_saved_from_rows_and_shown_again(
    world, persona_page, tmp_path
):
    page = persona_page(world.tenant_admin_a)
    page.goto("/templates/new/")
    page.select_option("#id_tenant", "vision")
    page.fill("#id_name", "rows-template")

    page.get_by_role("button", name="Add default").click()
    page.get_by_label("Default 1 field").select_option("image")
    page.get_by_label("Default 1 value").fill(IMAGE)
    page.get_by_role("button", name="Add default").click()
    page.get_by_label("Default 2 field").select_option("resources.gpus_per_node")
    page.get_by_label("Default 2 value").fill("2")
    page.get_by_role("button", name="Add default").click()
    page.get_by_label("Default 3 field").select_option("params")
    page.get_by_label("Default 3 value").fill('{"lr": 0.1}')

    # A lock without a default is hinted until the default is there.
    page.get_by_role("checkbox", name="resources.flavor").check()
    locks = editor(page, "locked")
    expect(locks.locator(".kv-hints li")).to_have_text(
        "resources.flavor: give the value it is locked to."
    )
    page.get_by_role("checkbox", name="resources.flavor").uncheck()
    page.get_by_role("checkbox", name="image", exact=True).check()
    expect(locks.locator(".kv-hints li")).to_have_count(0)

    page.get_by_role("button", name="Add range").click()
    page.get_by_label("Range 1 field").select_option("resources.gpus_per_node")
    page.get_by_label("Range 1 min").fill("4")
    page.get_by_label("Range 1 max").fill("1")
    expect(editor(page, "ranges").locator(".kv-hints li")).to_have_text(
        "resources.gpus_per_node: min must not be greater than max."
    )
    page.get_by_label("Range 1 min").fill("3")
    page.get_by_label("Range 1 max").fill("4")
    expect(editor(page, "ranges").locator(".kv-hints li")).to_have_text(
        "resources.gpus_per_node: the default 2 is outside the range."
    )
    page.get_by_label("Range 1 min").fill("1")
    expect(editor(page, "ranges").locator(".kv-hints li")).to_have_count(0)

    advanced(page, "values")
    expect(page.locator("#id_values")).to_have_value(
        "{\n"
        f'  "image": "{IMAGE}",\n'
        '  "resources": {\n'
        '    "gpus_per_node": 2\n'
        "  },\n"
        '  "params": {"lr": 0.1}\n'
        "}"
    )
    screenshot(page, "editors-template-rows", tmp_path)
    page.get_by_role("button", name="Save template").click()
    page.wait_for_url("**/templates/")
    expect(page.locator(".messages")).to_have_text("Template rows-template is saved.")

    template = ExperimentTemplate.objects.get()
    assert template.values == {
        "image": IMAGE,
        "resources": {"gpus_per_node": 2},
        "params": {"lr": 0.1},
    }
    assert template.locked == ["image"]
    assert template.ranges == {"resources.gpus_per_node": {"min": 1, "max": 4}}

    page.goto(f"/templates/{template.pk}/")
    # In the order PostgreSQL's jsonb keeps keys: shorter first.
    for number, (field, value) in enumerate(
        [("image", IMAGE), ("params", '{"lr":0.1}'), ("resources.gpus_per_node", "2")], start=1
    ):
        expect(page.get_by_label(f"Default {number} field")).to_have_value(field)
        expect(page.get_by_label(f"Default {number} value")).to_have_value(value)
    expect(page.get_by_role("checkbox", name="image", exact=True)).to_be_checked()
    expect(page.get_by_role("checkbox", name="resources.flavor")).not_to_be_checked()
    expect(page.get_by_label("Range 1 field")).to_have_value("resources.gpus_per_node")
    expect(page.get_by_label("Range 1 min")).to_have_value("1")
    expect(page.get_by_label("Range 1 max")).to_have_value("4")


def test_a_template_refused_by_the_server_shows_its_errors_and_saves_nothing(world, persona_page):
    page = persona_page(world.tenant_admin_a)
    page.goto("/templates/new/")
    page.select_option("#id_tenant", "vision")
    page.fill("#id_name", "bad-env")
    page.get_by_role("button", name="Add default").click()
    page.get_by_label("Default 1 field").select_option("env")
    page.get_by_label("Default 1 value").fill('{"LD_PRELOAD": "x.so"}')
    page.get_by_role("button", name="Save template").click()
    page.wait_for_load_state()

    expect(editor(page, "values").locator(".errorlist li")).to_have_text(
        "env: LD_PRELOAD is read by the cluster's launcher, the dynamic loader or the shell "
        "outside your container, not only by your program; Gantry does not pass such names. "
        "Set it inside your command instead (e.g. 'export NAME=value; python train.py')."
    )
    expect(page.get_by_label("Default 1 value")).to_have_value('{"LD_PRELOAD":"x.so"}')
    assert ExperimentTemplate.objects.count() == 0


def test_a_locked_env_is_shown_as_read_only_rows(world, persona_page):
    template = template_save(
        actor=world.tenant_admin_a,
        tenant=world.vision,
        name="pinned-env",
        description="",
        values={"env": {"OMP_NUM_THREADS": "8"}},
        locked=["env"],
        ranges={},
    )
    page = persona_page(world.researcher_a)
    page.goto(f"/runs/new/?template={template.pk}")

    expect(page.get_by_label("Variable 1 name")).to_have_value("OMP_NUM_THREADS")
    expect(page.get_by_label("Variable 1 value")).to_be_disabled()
    expect(editor(page, "env").get_by_role("button")).to_have_count(0)
    assert json.loads(page.locator("#id_env").input_value()) == {"OMP_NUM_THREADS": "8"}


def test_the_quota_check_follows_the_fields_it_sends_and_a_template_locks(world, persona_page):
    """htmx asks for the quota check again after a field that decides admission changes (a
    400 says what is missing), not after any other; a field the template locks is sent
    although its input is disabled."""
    page = persona_page(world.researcher_a)
    asked: list[str] = []
    page.on(
        "request", lambda request: asked.append(request.url) if "/preview/" in request.url else None
    )
    fill_submit_form(page, "quota-check")
    verdict = page.locator("[data-verdict]")
    expect(verdict).to_have_attribute("data-verdict", "start")
    expect(page.locator(".preview .facts dd").first).to_have_text("2 a100-80gb GPUs of vision")

    page.select_option("#id_flavor", "")
    expect(page.locator(".preview-problems li")).to_have_text("Choose a GPU flavor.")
    expect(page.locator("[data-preview-url]")).to_have_attribute("aria-busy", "false")
    sent = len(asked)
    page.fill("#id_name", "renamed")
    page.fill("#id_command", "python train.py --epochs 4")
    page.wait_for_timeout(600)  # twice the check's delay
    assert len(asked) == sent

    template = template_save(
        actor=world.tenant_admin_a,
        tenant=world.vision,
        name="pinned-flavor",
        description="",
        values={"resources": {"flavor": "a100-80gb", "nodes": 1}},
        locked=["resources.flavor"],
        ranges={},
    )
    page.goto(f"/runs/new/?template={template.pk}")
    expect(page.locator("#id_flavor")).to_be_disabled()
    page.fill("#id_gpus_per_node", "4")
    expect(page.locator("[data-preview-url]")).to_have_attribute("aria-busy", "false")
    expect(page.locator(".preview .facts dd").first).to_have_text("4 a100-80gb GPUs of vision")
    assert "flavor=a100-80gb" in asked[-1]
