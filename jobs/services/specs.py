"""Experiment spec files (v1): submit one, or write one from an experiment."""

from django.core.exceptions import ValidationError
from django.db.models import F, Q

from jobs import spec
from jobs.access import template_list_usable
from jobs.models import (
    Experiment,
    Run,
)
from jobs.services.submission import experiment_input_of, run_submit_values
from jobs.services.templates import template_submit
from tenants.types import UserLike


def spec_submit(*, user: UserLike, document) -> Run:
    """Submit a spec document: parse it, apply its template (the tenant's own of that name,
    else a global one), then run_submit. ValidationError names dotted spec fields."""
    values, errors = spec.spec_parse(document)
    if values is None:
        raise ValidationError(errors)
    name = spec.spec_template_name(document)
    if name is None:
        return run_submit_values(user=user, values=values)
    template = (
        template_list_usable(user=user)
        .filter(Q(tenant__slug=values["tenant"]) | Q(tenant__isnull=True), name=name)
        .order_by(F("tenant").asc(nulls_last=True))
        .first()
    )
    if template is None:
        raise ValidationError(
            {"template": [f"No template {name} for tenant {values['tenant']}, nor a global one."]}
        )
    return template_submit(user=user, template=template, values=values)


def experiment_spec(experiment: Experiment) -> dict:
    """The spec that submits this experiment again, as recorded."""
    return spec.spec_of(vars(experiment_input_of(experiment)))
