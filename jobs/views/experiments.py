"""The experiment pages: the list and its filters, an experiment's page, its spec, re-running it
and comparing two.

Every experiment is fetched through a viewable-scoped selector: another tenant's
experiments are 404, exactly like missing ones.
"""

import json
import uuid
from itertools import groupby

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from core.http import ascii_id, or_404
from jobs.access import (
    experiment_can_rerun,
    run_list_viewable,
)
from jobs.models import RunKind
from jobs.reproducibility import experiment_diff
from jobs.selectors.experiments import (
    ExperimentFilters,
    experiment_attempts,
    experiment_compare_choices,
    experiment_filter_projects,
    experiment_filter_templates,
    experiment_get_viewable,
    experiment_page_viewable,
    experiment_pair_get_viewable,
    experiment_record,
)
from jobs.services import submission
from jobs.services.specs import experiment_spec
from jobs.views.params import page_cursor, positive_id
from jobs.views.runs import RUNS_PER_PAGE, attempt_records

EXPERIMENTS_PER_PAGE = 25
# The experiments offered to compare with on an experiment page; the experiments list
# (in its compare mode) finds any other.
COMPARE_CHOICES = 50
# Large experiment fields a list never shows.
_LIST_DEFERRED = ("experiment__command", "experiment__params", "experiment__env")
# Longer than any stored value of its field: the filter could match nothing longer.
_FILTER_MAX_CHARS = {"name": 200, "owner": 150, "image": 400, "commit": 40}


@login_required
@require_GET
def experiment_list(request: HttpRequest) -> HttpResponse:
    """The experiments the user may read, newest first, searched by name and filtered by
    owner, project, image, commit and template (all in the query string). With
    ``compare=<id>`` it picks the other side of a comparison: the experiments of that
    one's tenant, each with a link to the diff."""
    query = request.GET
    texts = {name: query.get(name, "").strip()[:limit] for name, limit in _FILTER_MAX_CHARS.items()}
    project, template = ascii_id(query.get("project")), ascii_id(query.get("template"))
    unknown = [
        label
        for label, field, value in (
            ("project", "project", project),
            ("template", "template", template),
        )
        if query.get(field) and value is None
    ]
    compare_with = None
    if query.get("compare"):
        compare_with = or_404(
            experiment_get_viewable, user=request.user, experiment_id=positive_id(query["compare"])
        )
    filters = ExperimentFilters(
        **texts,
        mine=query.get("mine") == "1",
        project=project,
        template=template,
        tenant=compare_with.tenant_id if compare_with else None,
    )
    before = page_cursor(query.get("before", ""))
    after = None if before is not None else page_cursor(query.get("after", ""))
    page = experiment_page_viewable(
        user=request.user, size=EXPERIMENTS_PER_PAGE, filters=filters, before=before, after=after
    )
    return render(
        request,
        "jobs/experiment_list.html",
        {
            "page": page,
            "rows": page.rows,
            "filters": filters,
            "filtered": filters.any,
            "unknown": unknown,
            "projects": experiment_filter_projects(tenants=page.tenants),
            "templates": experiment_filter_templates(tenants=page.tenants),
            "compare_with": compare_with,
            "paged": before is not None or after is not None,
        },
    )


@login_required
@require_GET
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=experiment_id)
    runs = run_list_viewable(user=request.user).filter(experiment=experiment)
    page = Paginator(runs.defer(*_LIST_DEFERRED), RUNS_PER_PAGE).get_page(request.GET.get("page"))
    # The attempt records of the runs on this page only: an experiment re-run for months
    # would otherwise load every attempt it ever had.
    attempts = experiment_attempts(experiment=experiment).filter(
        run__in=[run.pk for run in page.object_list]
    )
    return render(
        request,
        "jobs/experiment_detail.html",
        {
            "experiment": experiment,
            "page_obj": page,
            "runs": page.object_list,
            "params_json": json.dumps(experiment.params, indent=2, sort_keys=True),
            "env_items": sorted(experiment.env.items()),
            "attempts_by_run": [
                (run_id, attempt_records(group))
                for run_id, group in groupby(attempts, lambda attempt: attempt.run_id)
            ],
            # A workspace's experiment is launched anew, never re-run (run_rerun refuses).
            "can_rerun": experiment_can_rerun(user=request.user, experiment=experiment)
            and not any(run.kind == RunKind.INTERACTIVE for run in page.object_list),
            "submission_key": uuid.uuid4(),  # of the re-run form
            "compare_choices": experiment_compare_choices(
                experiment=experiment, limit=COMPARE_CHOICES
            ),
            "compare_choices_limit": COMPARE_CHOICES,
        },
    )


@login_required
@require_GET
def experiment_spec_download(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """The experiment's spec as YAML, to edit and submit again (CLI or API)."""
    experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=experiment_id)
    document = yaml.safe_dump(experiment_spec(experiment), sort_keys=False, allow_unicode=True)
    response = HttpResponse(document, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="experiment-{experiment.pk}.yaml"'
    return response


@login_required
@require_POST
def experiment_rerun(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Queue a new run of the same experiment record, exactly as recorded."""
    experiment = or_404(experiment_get_viewable, user=request.user, experiment_id=experiment_id)
    try:
        key = (
            uuid.UUID(request.POST["submission_key"]) if "submission_key" in request.POST else None
        )
    except ValueError:
        messages.error(request, "Not re-run: the form is damaged. Reload the page and try again.")
        return redirect("jobs:experiment_detail", experiment_id=experiment.pk)
    # PermissionDenied propagates: the user can read the experiment, so a 403 leaks nothing.
    try:
        submitted = submission.submission_once(
            user=request.user,
            submission_key=key,
            create=lambda: submission.run_rerun_record(
                experiment=experiment, user=request.user, submission_key=key
            ),
        )
    except ValidationError as exc:
        messages.error(request, "Not re-run: " + " ".join(exc.messages))
        return redirect("jobs:experiment_detail", experiment_id=experiment.pk)
    run = submitted.run
    if submitted.replayed:
        messages.info(request, f"Already re-run as run {run.pk}: nothing new was queued.")
    else:
        messages.success(request, f"Run {run.pk} re-runs experiment {experiment.pk} exactly.")
    return redirect("jobs:run_detail", run_id=run.pk)


@login_required
@require_GET
def experiment_compare(request: HttpRequest) -> HttpResponse:
    """Two experiments of one tenant side by side (``?a=&b=``), every differing field
    highlighted; ``only=changed`` leaves out the fields that are the same."""
    a, b = or_404(
        experiment_pair_get_viewable,
        user=request.user,
        a_id=positive_id(request.GET.get("a", "")),
        b_id=positive_id(request.GET.get("b", "")),
    )
    rows = experiment_diff(experiment_record(a), experiment_record(b))
    only_changed = request.GET.get("only") == "changed"
    return render(
        request,
        "jobs/experiment_diff.html",
        {
            "a": a,
            "b": b,
            "rows": [row for row in rows if row.differs] if only_changed else rows,
            "differing": sum(row.differs for row in rows),
            "total": len(rows),
            "only_changed": only_changed,
        },
    )
