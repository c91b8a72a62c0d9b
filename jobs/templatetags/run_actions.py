"""``{% load run_actions %}``: which of a run's actions a person may take now, for the
buttons a page shows (the services check again when asked)."""

from django import template

from core.types import UserLike
from jobs.access import run_can_cancel
from jobs.models import Run
from jobs.services.restart import LIVE_RUN_STATES

register = template.Library()


@register.filter
def may_restart_excluding(run: Run, user: UserLike) -> bool:
    """Whether ``user`` may restart ``run`` without one of its nodes now: the run is on its
    nodes, no cancel was asked for, and they may cancel it."""
    return (
        run.state in LIVE_RUN_STATES
        and run.cancel_requested_at is None
        and user.is_authenticated
        and run_can_cancel(user=user, run=run)
    )
