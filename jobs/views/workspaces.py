"""The workspace pages: the list, the launch form, a workspace's card, Extend and Stop.

Every workspace is fetched through ``workspace_get_viewable``: one the user may not see
(another tenant's, or another member's to a researcher) is 404, exactly like a missing one.
"""

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.http import ascii_id, or_404
from images.access import image_list_usable_by_tenants
from jobs.access import run_can_submit, template_list_usable
from jobs.forms import WorkspaceExtendForm, WorkspaceLaunchForm, workspace_initial_from_template
from jobs.models import Run
from jobs.selectors.estimates import run_start_estimate
from jobs.selectors.refusals import flavor_node_limits
from jobs.selectors.workspaces import (
    workspace_card_of,
    workspace_get_viewable,
    workspace_page_viewable,
)
from jobs.services.workspace_lifecycle import workspace_resume, workspace_suspend
from jobs.services.workspaces import workspace_extend, workspace_stop, workspace_submission
from jobs.views.params import page_cursor
from jobs.workspace_card import PHASES, Phase
from tenants.access import tenant_list_submittable
from tenants.selectors import project_list_submittable

WORKSPACES_PER_PAGE = 25
# A workspace's card refreshes itself this often until it has ended (htmx).
CARD_REFRESH_S = 5


@never_cache
@login_required
@require_GET
def workspace_list(request: HttpRequest) -> HttpResponse:
    """The user's workspaces, and for a tenant admin every workspace of their tenants
    (without Open: only the owner opens one), newest first."""
    before = page_cursor(request.GET.get("before", ""))
    after = None if before is not None else page_cursor(request.GET.get("after", ""))
    page = workspace_page_viewable(
        user=request.user, size=WORKSPACES_PER_PAGE, before=before, after=after
    )
    context = {
        "page": page,
        "paged": before is not None or after is not None,
        "can_launch": run_can_submit(user=request.user),
    }
    return render(request, "jobs/workspace_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def workspace_launch_page(request: HttpRequest) -> HttpResponse:
    """The launch form. ``?template=<id>`` starts it from an experiment template's tenant,
    image, flavor and GPUs; the form's one-time key makes a double POST one workspace."""
    tenants = list(tenant_list_submittable(user=request.user))
    if not tenants:
        raise Http404("Workspaces are for members of a tenant.")
    templates = list(template_list_usable(user=request.user))
    template_id = ascii_id(request.GET.get("template", ""))
    template = next((t for t in templates if t.pk == template_id), None)
    initial: dict = {"tenant": tenants[0].slug} if len(tenants) == 1 else {}
    if template is not None:
        initial |= workspace_initial_from_template(template)
    choices = {
        "tenants": tenants,
        "projects": project_list_submittable(user=request.user),
        "images": image_list_usable_by_tenants(tenants=tenants),
        "flavor_limits": flavor_node_limits(),
    }
    if request.method == "POST":
        form = WorkspaceLaunchForm(request.POST, **choices)
        if form.is_valid():
            key = form.cleaned_data["submission_key"]
            try:
                submitted = workspace_submission(
                    user=request.user, data=form.workspace_input(), submission_key=key
                )
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                run = submitted.run
                if submitted.replayed:
                    messages.info(
                        request,
                        f"This form already launched workspace {run.pk}: nothing new was queued.",
                    )
                else:
                    messages.success(request, f"Workspace {run.pk} is queued.")
                return redirect("jobs:workspace_detail", run_id=run.pk)
        status = 400
    else:
        form = WorkspaceLaunchForm(initial=initial | {"submission_key": uuid.uuid4()}, **choices)
        status = 200
    context = {"form": form, "templates": templates, "template": template}
    return render(request, "jobs/workspace_launch.html", context, status=status)


def _card_context(request: HttpRequest, run: Run) -> dict:
    card = workspace_card_of(user=request.user, run=run)
    estimate = run_start_estimate(run=run) if card.phase == Phase.QUEUED else None
    return {
        "card": card,
        "run": run,
        "Phase": Phase,
        "phases": PHASES,
        "start_estimate": estimate,
        "start_summary": estimate.summary(now=timezone.now()) if estimate else "",
        "refresh_s": None if card.phase == Phase.ENDED else CARD_REFRESH_S,
    }


@never_cache
@login_required
@require_GET
def workspace_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    """A workspace's card: its phase, each step's time, time left, Open, Extend and Stop.
    ``?partial=card`` is the card alone, which the page polls until the workspace ends."""
    run = or_404(workspace_get_viewable, user=request.user, run_id=run_id)
    context = _card_context(request, run)
    if request.GET.get("partial") == "card":
        return render(request, "jobs/_workspace_card.html", context)
    return render(request, "jobs/workspace_detail.html", context)


@login_required
@require_POST
def workspace_extend_page(request: HttpRequest, run_id: int) -> HttpResponse:
    run = or_404(workspace_get_viewable, user=request.user, run_id=run_id)
    form = WorkspaceExtendForm(request.POST)
    if not form.is_valid():
        messages.error(
            request,
            "Not extended: " + " ".join(str(error) for error in form.errors.get("hours", [])),
        )
        return redirect("jobs:workspace_detail", run_id=run.pk)
    hours = form.cleaned_data["hours"]
    # PermissionDenied propagates: the user can see the workspace, so a 403 leaks nothing.
    try:
        workspace_extend(run=run, actor=request.user, hours=hours)
    except ValidationError as exc:
        messages.error(request, "Not extended: " + " ".join(exc.messages))
    else:
        messages.success(request, f"Workspace {run.pk} has {hours} more hour{'s' * (hours > 1)}.")
    return redirect("jobs:workspace_detail", run_id=run.pk)


@login_required
@require_POST
def workspace_stop_page(request: HttpRequest, run_id: int) -> HttpResponse:
    run = or_404(workspace_get_viewable, user=request.user, run_id=run_id)
    # PermissionDenied propagates: the user can see the workspace, so a 403 leaks nothing.
    try:
        run = workspace_stop(run=run, actor=request.user)
    except ValidationError as exc:
        messages.error(request, "Not stopped: " + " ".join(exc.messages))
    else:
        if run.is_terminal:
            messages.success(request, f"Workspace {run.pk} is stopped.")
        else:
            messages.info(request, f"Workspace {run.pk} is stopping: its job is being cancelled.")
    return redirect("jobs:workspace_detail", run_id=run.pk)


@login_required
@require_POST
def workspace_suspend_page(request: HttpRequest, run_id: int) -> HttpResponse:
    run = or_404(workspace_get_viewable, user=request.user, run_id=run_id)
    # PermissionDenied propagates: the user can see the workspace, so a 403 leaks nothing.
    try:
        workspace_suspend(run=run, actor=request.user)
    except ValidationError as exc:
        messages.error(request, "Not suspended: " + " ".join(exc.messages))
    else:
        messages.info(
            request,
            f"Workspace {run.pk} is being suspended: its GPUs are released, its files kept.",
        )
    return redirect("jobs:workspace_detail", run_id=run.pk)


@login_required
@require_POST
def workspace_resume_page(request: HttpRequest, run_id: int) -> HttpResponse:
    run = or_404(workspace_get_viewable, user=request.user, run_id=run_id)
    try:
        workspace_resume(run=run, actor=request.user)
    except ValidationError as exc:
        messages.error(request, "Not resumed: " + " ".join(exc.messages))
    else:
        messages.success(request, f"Workspace {run.pk} is back in the queue.")
    return redirect("jobs:workspace_detail", run_id=run.pk)
