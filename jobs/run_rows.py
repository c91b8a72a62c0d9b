"""The run list's rows: each row is what it shows, already formatted (``RunRow``), and its
HTML is a function of that alone.

A row's template reads nothing but its ``RunRow``, so the HTML of equal rows is equal: it
is rendered once per process and served from memory while the row shows the same (a
bounded LRU keyed by the row itself; a row that shows anything new is a new key). The
same values give the list its version: a digest of every row and of what the list shows
around them, which its live poll compares with the version the page shows, to answer
"nothing changed" without rendering anything.
"""

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from functools import lru_cache

from django.template.defaultfilters import date, floatformat
from django.template.loader import get_template
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince
from django.utils.timezone import get_current_timezone, localtime

from jobs.models import Run, RunKind, RunState, WaitReason
from jobs.selectors.estimates import StartRecord, shows_full_limits, when

# What a row reads of its run, the run's experiment, project, flavor and cluster, and
# what runs_usage and runs_place_in_line read: the list loads no other column.
RUN_ROW_FIELDS = (
    *("experiment", "tenant", "flavor", "cluster", "submitted_by", "gpus", "state", "kind"),
    *("borrowed", "over_budget", "wait_reason", "wait_message", "start_note"),
    *("submitted_at", "started_at", "finished_at", "start_full_limits_at", "start_expected_at"),
    *("experiment__name", "experiment__nodes", "experiment__gpus_per_node"),
    *("experiment__project__slug", "flavor__slug", "cluster__name"),
)
# As ``get_state_display`` and ``get_wait_reason_display`` say them, for less.
_STATE_LABELS: dict[str, str] = dict(RunState.choices)
_WAIT_REASON_LABELS: dict[str, str] = dict(WaitReason.choices)
# Rows of recently shown lists, per process: ~2 KB each. A list page shows 25.
ROWS_REMEMBERED = 2048


@dataclass(frozen=True, slots=True)
class RunRow:
    """Everything one row of the run list shows, as shown. Text that is not part of the row
    (a queued run's place in line, a start estimate) is empty, so two rows that look the
    same are equal."""

    id: int
    url: str
    experiment_url: str
    experiment: str
    tenant: str
    project: str
    state: str
    state_label: str
    workspace: bool  # a run of kind interactive: the list tags it
    borrowed: bool
    over_budget: bool
    nodes: int
    gpus_per_node: int
    flavor: str
    cluster: str
    queued: bool  # waiting for admission: the wait cell shows the line and estimates
    wait_reason: str
    wait_message: str  # outside the queue, shown only while the run waits elsewhere
    queue_position: int | None
    starts_about: str
    starts_by: str
    start_record: str  # the full-limits estimate's track record, beside it
    start_note: str
    duration_kind: str
    duration_text: str
    duration_label: str
    gpu_hours: str  # empty for none
    submitted_iso: str
    submitted_title: str
    submitted_ago: str
    submitter: str


def run_row(run: Run, *, now: datetime, records: dict[str, StartRecord]) -> RunRow:
    """The row of ``run``, which ``runs_usage`` and ``runs_place_in_line`` have seen, as
    the list shows it at ``now`` in the current time zone; ``records``: the track records
    of the list (``start_records_shown``), by flavor."""
    assert run.duration is not None  # set by runs_usage
    queued = run.state == RunState.QUEUED
    waiting_elsewhere = (
        bool(run.wait_message)
        and not run.is_terminal
        and run.state not in (RunState.RUNNING, RunState.PREEMPTED)
    )
    shows_wait = queued or waiting_elsewhere
    full, expected = run.start_full_limits_at, run.start_expected_at
    starts_about = starts_by = start_record = ""
    if shows_full_limits(run) and full is not None:
        # Stored by the last refresh: never shown as a time already past.
        full = max(full, now)
        expected = max(min(expected or full, full), now)
        starts_about = when(expected, now=now)
        if full > expected:
            starts_by = when(full, now=now)
        start_record = records[run.flavor.slug].summary(now=now)
    submitted_iso, submitted_title = _submitted(run.submitted_at, get_current_timezone())
    experiment = run.experiment
    return RunRow(
        id=run.pk,
        url=_path("jobs:run_detail", run.pk),
        experiment_url=_path("jobs:experiment_detail", run.experiment_id),
        experiment=experiment.name,
        tenant=run.tenant.slug,
        project=experiment.project.slug,
        state=run.state,
        state_label=_STATE_LABELS.get(run.state, run.state),
        workspace=run.kind == RunKind.INTERACTIVE,
        borrowed=run.borrowed,
        over_budget=run.over_budget,
        nodes=experiment.nodes,
        gpus_per_node=experiment.gpus_per_node,
        flavor=run.flavor.slug,
        cluster=run.cluster.name if run.cluster is not None else "",
        queued=queued,
        wait_reason=_WAIT_REASON_LABELS.get(run.wait_reason, run.wait_reason) if shows_wait else "",
        wait_message=run.wait_message if shows_wait else "",
        queue_position=run.queue_position if queued else None,
        starts_about=starts_about,
        starts_by=starts_by,
        start_record=start_record,
        start_note=run.start_note if queued and run.start_full_limits_at is None else "",
        duration_kind=run.duration.kind,
        duration_text=run.duration.text,
        duration_label=run.duration.label,
        gpu_hours=floatformat(run.gpu_hours, 2) if run.gpu_hours else "",
        submitted_iso=submitted_iso,
        submitted_title=submitted_title,
        submitted_ago=timesince(run.submitted_at, now),
        submitter=run.submitted_by.get_username(),
    )


# The parts of a row that cost the most to compute and change the least, remembered by
# every input they have (the script prefix, URLconf and time zone are request state).
def _path(name: str, pk: int) -> str:
    return _reversed(name, pk, get_script_prefix(), get_urlconf())


@lru_cache(maxsize=ROWS_REMEMBERED)
def _reversed(name: str, pk: int, script_prefix: str, urlconf: str | None) -> str:
    return reverse(name, args=[pk], urlconf=urlconf)


@lru_cache(maxsize=ROWS_REMEMBERED)
def _submitted(moment: datetime, zone: tzinfo) -> tuple[str, str]:
    """A submission time as the list shows it: ISO 8601, and in full for its title."""
    local = localtime(moment, zone)
    return date(local, "c"), date(local, "Y-m-d H:i:s T")


@lru_cache(maxsize=ROWS_REMEMBERED)
def run_row_html(row: RunRow) -> SafeString:
    """The row's ``<tr>``, from its template with the row alone in the context."""
    html = get_template("jobs/_run_row.html").render({"row": row})
    # The file's last line break is the file's: the list lays out its rows itself.
    return mark_safe(html.removesuffix("\n"))  # noqa: S308 (the template's output)


def run_rows_version(rows: Iterable[RunRow], *shown_around: object) -> str:
    """A digest of the rows and of what the list shows around them (pages, count, the
    query its links keep): equal exactly when the list would render the same."""
    content = repr((tuple(rows), shown_around)).encode()
    return hashlib.blake2b(content, digest_size=8).hexdigest()
