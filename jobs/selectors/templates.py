"""Reads of experiment templates: which a user may use or manage."""

from django.db.models import F, Q

from core.types import UserLike
from jobs.access import template_list_manageable, template_list_usable
from jobs.models import ExperimentTemplate


def template_get_usable(*, user: UserLike, template_id: int) -> ExperimentTemplate:
    """The template, or DoesNotExist alike for a missing one and one of another tenant."""
    return template_list_usable(user=user).get(pk=template_id)


def template_get_manageable(*, user: UserLike, template_id: int) -> ExperimentTemplate:
    return template_list_manageable(user=user).get(pk=template_id)


def template_of_spec(*, user: UserLike, tenant: str, name: str) -> ExperimentTemplate | None:
    """The template a spec names: the tenant's own of that name, else a global one; None
    when the user may use neither."""
    return (
        template_list_usable(user=user)
        .filter(Q(tenant__slug=tenant) | Q(tenant__isnull=True), name=name)
        .order_by(F("tenant").asc(nulls_last=True))
        .first()
    )
