"""Researcher pages: thin views over jobs.selectors and jobs.services.

Every run and experiment is fetched through a viewable-scoped selector: another tenant's
objects are 404, exactly like missing ones.
"""

import json
from itertools import groupby

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from images.selectors import image_list_usable_by_tenants
from jobs import capacity, services
from jobs.forms import (
    ClusterCapacityForm,
    RunPreviewForm,
    RunSubmitForm,
    initial_from_experiment,
)
from jobs.models import Cluster, RunState
from jobs.reproducibility import experiment_diff, runtime_rows
from jobs.selectors import (
    experiment_attempts,
    experiment_get_viewable,
    experiment_list_viewable,
    experiment_pair_get_viewable,
    experiment_record,
    flavor_node_limits,
    run_attempts,
    run_events,
    run_get_viewable,
    run_list_viewable,
)
from tenants.forms import QuotaForm, quota_initial
from tenants.roles import is_platform_admin
from tenants.selectors import (
    flavor_list_manageable,
    project_list_submittable,
    quota_get_manageable,
    quota_list_viewable,
    tenant_list_submittable,
    tenant_list_viewable,
)

RUNS_PER_PAGE = 25
QUOTAS_PER_PAGE = 50
CLUSTERS_PER_PAGE = 25
PREVIEW_FIELDS = ("tenant", "flavor", "nodes", "gpus_per_node", "priority")
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
        source_id = request.POST.get("cloned_from", "")
        if source_id.isdigit():
            # Only for the notice above the form; the service decides whether it is allowed.
            source = experiment_list_viewable(user=request.user).filter(pk=source_id).first()
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
    context = {"form": form, "tenants": tenants, "source": source}
    if tenants:
        context |= _preview_context(
            request.user, {name: form[name].value() for name in PREVIEW_FIELDS}
        )[0]
    return render(request, "jobs/run_submit.html", context, status=400 if form.errors else 200)


def _preview_context(user, data) -> tuple[dict, int]:
    """The preview panel's context and status: 400 when the values cannot be previewed."""
    form = RunPreviewForm(data)
    if not form.is_valid():
        problems = [message for errors in form.errors.values() for message in errors]
        return {"preview": None, "preview_problems": problems}, 400
    try:
        preview = services.admission_preview(user=user, **form.cleaned_data)
    except ValidationError as exc:
        return {"preview": None, "preview_problems": exc.messages}, 400
    return {"preview": preview, "preview_problems": []}, 200


@never_cache
@login_required
@require_GET
def run_preview(request: HttpRequest) -> HttpResponse:
    """The submit form's quota panel: would this run start now, borrow, or wait?"""
    context, status = _preview_context(request.user, request.GET)
    return render(request, "jobs/_run_preview.html", context, status=status)


def _status_context(request: HttpRequest, run) -> dict:
    return {
        "RunState": RunState,
        "run": run,
        "events": run_events(run=run),
        "attempts": run_attempts(run=run),
        "can_cancel": not run.is_terminal and services.run_can_cancel(user=request.user, run=run),
    }


def _attempt_records(attempts) -> list[tuple]:
    """Each attempt with its runtime report as rows to show."""
    return [(attempt, runtime_rows(attempt.runtime_env)) for attempt in attempts]


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = run_get_viewable(user=request.user, run_id=run_id)
    context = _status_context(request, run)
    context["logs"] = services.run_logs(run=run, tail=LOG_TAIL_LINES)
    context["log_tail_lines"] = LOG_TAIL_LINES
    context["attempt_records"] = _attempt_records(context["attempts"])
    context["can_rerun"] = services.experiment_can_rerun(
        user=request.user, experiment=run.experiment
    )
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
    attempts = experiment_attempts(experiment=experiment)
    return render(
        request,
        "jobs/experiment_detail.html",
        {
            "experiment": experiment,
            "runs": runs.defer(*_LIST_DEFERRED),
            "params_json": json.dumps(experiment.params, indent=2, sort_keys=True),
            "env_items": sorted(experiment.env.items()),
            "attempts_by_run": [
                (run_id, _attempt_records(group))
                for run_id, group in groupby(attempts, lambda attempt: attempt.run_id)
            ],
            "can_rerun": services.experiment_can_rerun(user=request.user, experiment=experiment),
        },
    )


@login_required
@require_POST
def experiment_rerun(request: HttpRequest, experiment_id: int) -> HttpResponse:
    """Queue a new run of the same experiment record, exactly as recorded."""
    experiment = experiment_get_viewable(user=request.user, experiment_id=experiment_id)
    # PermissionDenied propagates: the user can read the experiment, so a 403 leaks nothing.
    try:
        run = services.run_rerun(experiment=experiment, user=request.user)
    except ValidationError as exc:
        messages.error(request, "Not re-run: " + " ".join(exc.messages))
        return redirect("jobs:experiment_detail", experiment_id=experiment.pk)
    messages.success(request, f"Run {run.pk} re-runs experiment {experiment.pk} exactly.")
    return redirect("jobs:run_detail", run_id=run.pk)


def _positive_id(value: str) -> int:
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= services.MAX_ID:
        raise Http404("No such experiment")
    return int(value)


@login_required
@require_GET
def experiment_compare(request: HttpRequest) -> HttpResponse:
    """Two experiments of one tenant side by side (``?a=&b=``), every differing field
    highlighted; ``only=changed`` leaves out the fields that are the same."""
    a, b = experiment_pair_get_viewable(
        user=request.user,
        a_id=_positive_id(request.GET.get("a", "")),
        b_id=_positive_id(request.GET.get("b", "")),
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


# --- quotas and capacity -------------------------------------------------------------------


@login_required
@require_GET
def quota_list(request: HttpRequest) -> HttpResponse:
    """Quotas, use and budget burn of every tenant the user may read."""
    tenants = list(tenant_list_viewable(user=request.user))
    quotas = quota_list_viewable(user=request.user)
    slug = request.GET.get("tenant", "")
    tenant = next((t for t in tenants if t.slug == slug), None)
    if slug:
        quotas = quotas.filter(tenant__slug=slug)
    page = Paginator(quotas, QUOTAS_PER_PAGE).get_page(request.GET.get("page"))
    can_manage = is_platform_admin(request.user)
    return render(
        request,
        "jobs/quota_list.html",
        {
            "page_obj": page,
            "usages": capacity.quota_usage_list(quotas=list(page.object_list), tenant=tenant),
            "tenants": tenants,
            "tenant": slug,
            "can_manage": can_manage,
            "flavors": flavor_list_manageable(user=request.user) if can_manage else (),
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def quota_edit(request: HttpRequest) -> HttpResponse:
    """Create or change the quota of ``?tenant=`` for ``?flavor=`` (platform admins)."""
    tenant, flavor, quota = quota_get_manageable(
        user=request.user,
        tenant_slug=request.GET.get("tenant", ""),
        flavor_slug=request.GET.get("flavor", ""),
    )
    if request.method == "POST":
        form = QuotaForm(request.POST)
        if form.is_valid():
            try:
                change = capacity.quota_update_checked(
                    tenant=tenant, flavor=flavor, actor=request.user, **form.cleaned_data
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(request, f"Saved the {flavor.slug} quota of {tenant.slug}.")
                if change.beyond_guarantee:
                    messages.warning(
                        request,
                        f"{tenant.slug} now uses {change.in_use} of "
                        f"{change.quota.guaranteed_gpus} guaranteed {flavor.slug} GPUs: "
                        f"{change.beyond_guarantee} beyond the guarantee. Running runs keep "
                        "their GPUs; new runs can only borrow until use drops below it.",
                    )
                return redirect(f"{reverse('jobs:quota_list')}?tenant={tenant.slug}")
    else:
        form = QuotaForm(initial=quota_initial(quota))
    usage = capacity.quota_usage_list(quotas=[quota], tenant=tenant)[0] if quota else None
    return render(
        request,
        "jobs/quota_edit.html",
        {"form": form, "tenant": tenant, "flavor": flavor, "quota": quota, "usage": usage},
        status=400 if form.errors else 200,
    )


@login_required
@require_GET
def cluster_list(request: HttpRequest) -> HttpResponse:
    clusters = capacity.cluster_list_manageable(user=request.user)
    page = Paginator(clusters, CLUSTERS_PER_PAGE).get_page(request.GET.get("page"))
    held = capacity.held_gpus_by_pool(clusters=page.object_list)
    rows = [
        (
            cluster,
            [(pool, held.get((cluster.pk, pool.flavor_id), 0)) for pool in cluster.flavors.all()],
        )
        for cluster in page.object_list
    ]
    return render(
        request,
        "jobs/cluster_list.html",
        {"page_obj": page, "rows": rows, "Backend": Cluster.Backend},
    )


@login_required
@require_POST
def cluster_test(request: HttpRequest, name: str) -> HttpResponse:
    cluster = capacity.cluster_get_manageable(user=request.user, name=name)
    ok, message = capacity.cluster_test_connection(cluster=cluster)
    (messages.success if ok else messages.error)(request, message)
    return redirect("jobs:cluster_list")


@login_required
@require_http_methods(["GET", "POST"])
def cluster_capacity(request: HttpRequest, name: str) -> HttpResponse:
    """Edit a simulator cluster's GPUs per flavor; other clusters report theirs."""
    cluster = capacity.cluster_get_manageable(user=request.user, name=name)
    editable = cluster.backend == Cluster.Backend.SIMULATOR
    if request.method == "POST":
        form = ClusterCapacityForm(request.POST)
        if form.is_valid():
            try:
                pool = capacity.cluster_capacity_set(
                    cluster=cluster, actor=request.user, **form.cleaned_data
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(
                    request,
                    f"{cluster.name} now has {pool.nodes} × {pool.gpus_per_node} "
                    f"{pool.flavor.slug} GPUs ({pool.capacity_gpus} in all).",
                )
                return redirect("jobs:cluster_list")
    else:
        pools = {pool.flavor.slug: pool for pool in cluster.flavors.all()}
        chosen = pools.get(request.GET.get("flavor", ""))
        initial = (
            {"flavor": chosen.flavor, "nodes": chosen.nodes, "gpus_per_node": chosen.gpus_per_node}
            if chosen
            else {"nodes": 1, "gpus_per_node": 8}
        )
        form = ClusterCapacityForm(initial=initial)
    return render(
        request,
        "jobs/cluster_capacity.html",
        {"cluster": cluster, "form": form, "editable": editable},
        status=400 if form.errors else 200,
    )
