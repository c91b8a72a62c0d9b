"""Researcher pages: thin views over jobs.selectors and jobs.services.

Every run and experiment is fetched through a viewable-scoped selector: another tenant's
objects are 404, exactly like missing ones.
"""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from images.selectors import image_list_usable_by_tenants
from jobs import services
from jobs.forms import RunSubmitForm, initial_from_experiment
from jobs.models import RunState
from jobs.selectors import (
    experiment_get_viewable,
    flavor_node_limits,
    run_attempts,
    run_events,
    run_get_viewable,
    run_list_viewable,
)
from tenants.selectors import (
    project_list_submittable,
    tenant_list_submittable,
    tenant_list_viewable,
)

RUNS_PER_PAGE = 25
LOG_TAIL_LINES = 200
# Large experiment fields a list never shows.
_LIST_DEFERRED = ("experiment__command", "experiment__params", "experiment__env")


@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    runs = run_list_viewable(user=request.user).defer(*_LIST_DEFERRED)
    state = request.GET.get("state", "")
    invalid_state = state if state and state not in RunState.values else ""
    if state and not invalid_state:
        runs = runs.filter(state=state)
    tenant = request.GET.get("tenant", "")
    if tenant:
        runs = runs.filter(tenant__slug=tenant)
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "jobs/run_list.html",
        {
            "page_obj": page,
            "runs": page.object_list,
            "RunState": RunState,
            "states": RunState.choices,
            "state": "" if invalid_state else state,
            "invalid_state": invalid_state,
            "tenants": tenant_list_viewable(user=request.user),
            "tenant": tenant,
            "filtered": bool(state or tenant),
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def run_submit(request: HttpRequest) -> HttpResponse:
    tenants = list(tenant_list_submittable(user=request.user))
    choices = {
        "tenants": tenants,
        "projects": project_list_submittable(user=request.user),
        "images": image_list_usable_by_tenants(tenants=tenants),
        "flavor_limits": flavor_node_limits(),
    }
    source = None
    if request.method == "POST":
        form = RunSubmitForm(request.POST, **choices)
        if form.is_valid():
            try:
                run = services.run_submit(user=request.user, data=form.experiment_input())
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(request, f"Run {run.pk} is queued.")
                return redirect("jobs:run_detail", run_id=run.pk)
    else:
        initial = {"tenant": tenants[0].slug} if len(tenants) == 1 else {}
        source_id = request.GET.get("from", "")
        if source_id.isdigit():
            source = experiment_get_viewable(user=request.user, experiment_id=int(source_id))
            initial = initial_from_experiment(source)
        form = RunSubmitForm(initial=initial, **choices)
    return render(
        request,
        "jobs/run_submit.html",
        {"form": form, "tenants": tenants, "source": source},
        status=400 if form.errors else 200,
    )


def _status_context(request: HttpRequest, run) -> dict:
    return {
        "RunState": RunState,
        "run": run,
        "events": run_events(run=run),
        "attempts": run_attempts(run=run),
        "can_cancel": not run.is_terminal and services.run_can_cancel(user=request.user, run=run),
    }


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = run_get_viewable(user=request.user, run_id=run_id)
    context = _status_context(request, run)
    context["logs"] = services.run_logs(run=run, tail=LOG_TAIL_LINES)
    context["log_tail_lines"] = LOG_TAIL_LINES
    return render(request, "jobs/run_detail.html", context)


@never_cache
@login_required
@require_GET
def run_status(request: HttpRequest, run_id: int) -> HttpResponse:
    """The live part of the run page, polled by gantry.js until the run is terminal."""
    run = run_get_viewable(user=request.user, run_id=run_id)
    return render(request, "jobs/_run_status.html", _status_context(request, run))


@login_required
@require_POST
def run_cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    run = run_get_viewable(user=request.user, run_id=run_id)
    # PermissionDenied propagates: the user can see the run, so a 403 leaks nothing.
    try:
        run = services.run_cancel(run=run, actor=request.user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        if run.state == RunState.CANCELLED:
            messages.success(request, f"Run {run.pk} is cancelled.")
        else:
            messages.info(request, f"Cancel requested: the cluster is stopping run {run.pk}.")
    return redirect("jobs:run_detail", run_id=run.pk)


@login_required
@require_GET
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = experiment_get_viewable(user=request.user, experiment_id=experiment_id)
    runs = run_list_viewable(user=request.user).filter(experiment=experiment)
    return render(
        request,
        "jobs/experiment_detail.html",
        {
            "experiment": experiment,
            "runs": runs.defer(*_LIST_DEFERRED),
            "params_json": json.dumps(experiment.params, indent=2, sort_keys=True),
            "env_items": sorted(experiment.env.items()),
        },
    )
