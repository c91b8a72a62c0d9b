"""The experiment's fields are defined once (jobs/experiment_fields.py): what cannot be
derived from the table is held to it here, so a field added there and forgotten elsewhere
fails."""

import dataclasses

from jobs.experiment_fields import (
    BY_NAME,
    FIELDS,
    FORM_ROWS,
    INPUT_FIELDS,
    PREVIEW_FIELDS,
    RECORD_ORDER,
    REQUIRED,
)
from jobs.forms import FORM_FIELDS, RunPreviewForm, RunSubmitForm
from jobs.models import Experiment, TopologyMode
from jobs.services.submission import ExperimentInput
from tenants.models import GpuFlavor, Project, Tenant, max_length_of

# Whose an experiment is and where it came from: kept with it, not a row of its record.
NOT_IN_THE_RECORD = {"tenant", "project", "name", "cloned_from"}


def test_experiment_input_has_the_tables_fields_and_defaults():
    fields = dataclasses.fields(ExperimentInput)

    assert {field.name for field in fields} == {field.name for field in INPUT_FIELDS}
    for field in fields:
        if field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        elif field.default is dataclasses.MISSING:
            default = REQUIRED
        else:
            default = field.default
        assert BY_NAME[field.name].default == default, field.name


def test_max_lengths_are_those_of_the_columns_a_value_is_stored_in_or_looked_up_by():
    columns = {
        "tenant": max_length_of(Tenant, "slug"),
        "project": max_length_of(Project, "slug"),
        "flavor": max_length_of(GpuFlavor, "slug"),
        "image": max_length_of(Experiment, "image_reference"),
    }
    for field in FIELDS:
        if field.max_length is not None:
            expected = columns.get(field.name) or max_length_of(Experiment, field.name)
            assert field.max_length == expected, field.name


def test_the_topology_modes_are_the_models():
    assert BY_NAME["topology_mode"].choices == tuple(TopologyMode.values)


def test_the_record_holds_every_field_but_whose_the_experiment_is():
    assert len(set(RECORD_ORDER)) == len(RECORD_ORDER)
    assert set(RECORD_ORDER) == {field.name for field in FIELDS} - NOT_IN_THE_RECORD


def test_the_submit_form_shows_every_field_a_request_gives_in_a_row_of_the_page():
    form = RunSubmitForm(tenants=[], projects=[], images=[], flavor_limits={})

    assert {field.form_row for field in FORM_FIELDS} == set(FORM_ROWS)
    assert [field.name for field in FORM_FIELDS] == [
        field.name for field in INPUT_FIELDS if field.name != "cloned_from"
    ]
    assert list(form.fields) == [field.name for field in FORM_FIELDS] + [
        "cloned_from",
        "submission_key",
    ]


def test_the_quota_check_parses_the_fields_the_table_sends_it():
    assert set(RunPreviewForm.base_fields) == set(PREVIEW_FIELDS)
