"""Ids read from the query string, shared by the run, experiment and submit pages."""

from django.http import Http404

from core.http import ascii_id

MAX_ID = 2**63 - 1  # a BigAutoField


def page_cursor(value: str) -> int | None:
    """An id to page from; anything else shows the newest rows, as a stale link should."""
    row_id = ascii_id(value)
    return row_id if row_id is not None and row_id <= MAX_ID else None


def positive_id(value: str) -> int:
    """An experiment (or template) id; 404 for anything else."""
    experiment_id = ascii_id(value)
    if experiment_id is None:
        raise Http404("No such experiment")
    return experiment_id
