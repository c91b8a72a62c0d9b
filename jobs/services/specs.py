"""Experiment spec files (v1): submit one, or write one from an experiment."""

from uuid import UUID

from django.core.exceptions import ValidationError

from core.types import UserLike
from jobs import spec
from jobs.models import (
    Experiment,
    Run,
)
from jobs.selectors.templates import template_of_spec
from jobs.services.submission import (
    ExperimentInput,
    experiment_input_of,
    experiment_validate,
    run_record,
    submission_once,
)
from jobs.services.templates import template_run_record


def spec_submit(*, user: UserLike, document, submission_key: UUID | None = None) -> Run:
    """Submit a spec document: parse it, apply its template (the tenant's own of that name,
    else a global one), then run_submit. ValidationError names dotted spec fields. A
    repeated ``submission_key`` returns the run its first request queued, before any check
    (``submission_once``)."""
    return submission_once(
        user=user,
        submission_key=submission_key,
        create=lambda: _spec_record(user=user, document=document, submission_key=submission_key),
    ).run


def _spec_record(*, user: UserLike, document, submission_key: UUID | None) -> Run:
    values, errors = spec.spec_parse(document)
    if values is None:
        raise ValidationError(_with_rule_errors(user=user, document=document, errors=errors))
    try:
        return _spec_record_parsed(
            user=user, document=document, values=values, submission_key=submission_key
        )
    except ValidationError as exc:  # by field: told in the document's names
        raise ValidationError(spec.errors_to_spec(exc.message_dict)) from None


def _spec_record_parsed(
    *, user: UserLike, document, values: dict, submission_key: UUID | None
) -> Run:
    name = spec.spec_template_name(document)
    if name is None:
        return run_record(
            user=user, data=ExperimentInput(**values), submission_key=submission_key, template=None
        )
    template = template_of_spec(user=user, tenant=values["tenant"], name=name)
    if template is None:
        raise ValidationError(
            {"template": [f"No template {name} for tenant {values['tenant']}, nor a global one."]}
        )
    return template_run_record(
        user=user, template=template, values=values, submission_key=submission_key
    )


def experiment_spec(experiment: Experiment) -> dict:
    """The spec that submits this experiment again, as recorded."""
    return spec.spec_of(vars(experiment_input_of(experiment)))


# What experiment_validate needs for the fields a refused spec did not give right: values
# whose own errors are dropped below, so they only let the other fields be judged.
_PLACEHOLDERS = {
    "tenant": "",
    "project": "",
    "image": "",
    "command": "",
    "flavor": "",
    "nodes": 1,
    "gpus_per_node": 1,
}


def _with_rule_errors(
    *, user: UserLike, document, errors: dict[str, list[str]]
) -> dict[str, list[str]]:
    """``errors`` (keys and types) plus what the submit rules say of the fields the spec
    gave right, by dotted name. A spec with a template is judged after the template is
    applied, so only its key and type errors are named."""
    typed = spec.spec_values_typed(document)
    if not typed or spec.spec_template_name(document) is not None:
        return errors
    try:
        experiment_validate(user=user, data=ExperimentInput(**{**_PLACEHOLDERS, **typed}))
    except ValidationError as exc:
        given = {spec.BY_FIELD[field].spec for field in typed if field in spec.BY_FIELD}
        for name, messages in spec.errors_to_spec(exc.message_dict).items():
            if name in given and name not in errors:
                errors[name] = messages
    return errors
