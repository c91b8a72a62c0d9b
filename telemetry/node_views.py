"""The Node health pages (platform admins; everyone else gets 404, as on every platform
page): every node's state and figures, the worst offenders and the reliability figures,
one node's history, and a person's quarantine and return to service with a note.

Thin: check access, call the selectors, render; the two acts call the clusters app's
services (``clusters.services.health``) and redirect back."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from clusters.health import NodeHealth
from clusters.models import ClusterNode
from clusters.selectors import node_health_checks
from clusters.services.health import node_quarantine, node_release
from clusters.services.health_checks import node_health_check_request
from core.http import or_404
from jobs.models import CauseClass
from telemetry.kpis import node_health
from telemetry.kpis.metrics import Ratio
from telemetry.kpis.reliability_reads import (
    CAUSES,
    ettr_by_tenant,
    failures_by_month,
    lost_and_credited_by_cause,
)
from tenants.access import require_platform_admin

MONTHS_SHOWN = 6
NOTE_MAX_LENGTH = 2000


class NodeActForm(forms.Form):
    """A person's act on a node: the note says why (kept in the node's history)."""

    note = forms.CharField(max_length=NOTE_MAX_LENGTH, strip=True, widget=forms.Textarea)


@login_required
@require_GET
def node_list(request: HttpRequest) -> HttpResponse:
    or_404(require_platform_admin, request.user)
    now = timezone.now()
    overview = node_health.node_overview(now=now)
    ettr = ettr_by_tenant(since=overview.since, until=now)
    return render(
        request,
        "telemetry/node_health.html",
        {
            "overview": overview,
            "days": node_health.NODE_WINDOW_DAYS,
            "ettr_by_tenant": ettr,
            "ettr_total": sum(ettr.values(), start=Ratio()),
            "causes": [CauseClass(cause).label for cause in CAUSES],
            "by_month": failures_by_month(today=timezone.localdate(now), months=MONTHS_SHOWN),
            "by_cause": lost_and_credited_by_cause(since=overview.since, until=now),
        },
    )


@login_required
@require_GET
def node_detail(request: HttpRequest, cluster: str, node: str) -> HttpResponse:
    or_404(require_platform_admin, request.user)
    detail = or_404(node_health.node_detail, cluster=cluster, node=node, now=timezone.now())
    return render(request, "telemetry/node_detail.html", _detail_context(detail, NodeActForm()))


def _detail_context(detail: node_health.NodeDetail, form: NodeActForm) -> dict:
    return {
        "detail": detail,
        "row": detail.row,
        "form": form,
        "days": node_health.NODE_WINDOW_DAYS,
        "quarantined": detail.row.health == NodeHealth.QUARANTINED,
        "events_shown": node_health.EVENTS_SHOWN,
        "checks": node_health_checks(cluster=detail.node.cluster, node=detail.node.name),
    }


@login_required
@require_POST
def node_act(request: HttpRequest, cluster: str, node: str, act: str) -> HttpResponse:
    """Quarantine the node, or return it to service (``act``), with the form's note."""
    or_404(require_platform_admin, request.user)
    found = or_404(
        ClusterNode.objects.select_related("cluster").get, cluster__name=cluster, name=node
    )
    form = NodeActForm(data=request.POST)
    if not form.is_valid():
        detail = node_health.node_detail(cluster=cluster, node=node, now=timezone.now())
        return render(
            request, "telemetry/node_detail.html", _detail_context(detail, form), status=400
        )
    service = node_quarantine if act == "quarantine" else node_release
    try:
        service(
            cluster=found.cluster, node=node, actor=request.user, note=form.cleaned_data["note"]
        )
    except (ValidationError, ValueError) as exc:
        text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        messages.error(request, f"{node} was not changed: {text}")
    else:
        done = "quarantined" if act == "quarantine" else "returned to service"
        messages.success(request, f"{node} {done}.")
    return redirect(reverse("telemetry:node_detail", args=[cluster, node]))


@login_required
@require_POST
def node_health_check(request: HttpRequest, cluster: str, node: str) -> HttpResponse:
    """Ask for an active health check of the node: the next sync submits it."""
    or_404(require_platform_admin, request.user)
    found = or_404(
        ClusterNode.objects.select_related("cluster").get, cluster__name=cluster, name=node
    )
    try:
        node_health_check_request(cluster=found.cluster, node=node, actor=request.user)
    except ValidationError as exc:
        messages.error(request, f"No health check asked for: {'; '.join(exc.messages)}")
    else:
        messages.success(request, f"A health check of {node} was asked for; the next sync runs it.")
    return redirect(reverse("telemetry:node_detail", args=[cluster, node]))
