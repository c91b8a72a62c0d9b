"""The cluster pages that show runs (so they live in jobs, not clusters): the clusters with
the GPUs runs hold on each, the connection test, a simulator's capacity and the node map.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clusters.models import Cluster
from clusters.selectors import cluster_get_manageable, cluster_list_manageable
from clusters.services import cluster_test_connection
from core.http import or_404
from jobs import live
from jobs.forms import (
    ClusterCapacityForm,
)
from jobs.selectors.capacity import flavor_overcommits, held_gpus_by_pool
from jobs.selectors.nodes import cluster_node_map
from jobs.services.capacity import cluster_capacity_set

CLUSTERS_PER_PAGE = 25


@login_required
@require_GET
def cluster_list(request: HttpRequest) -> HttpResponse:
    clusters = or_404(cluster_list_manageable, user=request.user)
    page = Paginator(clusters, CLUSTERS_PER_PAGE).get_page(request.GET.get("page"))
    held = held_gpus_by_pool(clusters=page.object_list)
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
        {
            "page_obj": page,
            "rows": rows,
            "Backend": Cluster.Backend,
            "overcommits": flavor_overcommits(),
            "show_overcommit_figures": True,  # platform admins only
        },
    )


@login_required
@require_POST
def cluster_test(request: HttpRequest, name: str) -> HttpResponse:
    cluster = or_404(cluster_get_manageable, user=request.user, name=name)
    ok, message = cluster_test_connection(cluster=cluster)
    (messages.success if ok else messages.error)(request, message)
    return redirect("jobs:cluster_list")


@login_required
@require_http_methods(["GET", "POST"])
def cluster_capacity(request: HttpRequest, name: str) -> HttpResponse:
    """Edit a simulator cluster's GPUs per flavor; other clusters report theirs."""
    cluster = or_404(cluster_get_manageable, user=request.user, name=name)
    editable = cluster.backend == Cluster.Backend.SIMULATOR
    if request.method == "POST":
        form = ClusterCapacityForm(request.POST)
        if form.is_valid():
            try:
                pool = cluster_capacity_set(
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


@never_cache
@login_required
@require_GET
def cluster_nodes(request: HttpRequest) -> HttpResponse:
    """The node map: every enabled cluster's nodes by topology domain, what holds each GPU
    and each flavor's fragmentation (members of tenants, finance and platform admins)."""
    node_map = or_404(cluster_node_map, user=request.user)
    part = live.live_page(
        request,
        part_id="nodes-live",
        template="jobs/cluster_nodes.html",
        context={"node_map": node_map},
    )
    return live.live_page_poll(request, part) or render(
        request, "jobs/cluster_nodes_page.html", {"node_map": node_map, "live_page": part}
    )
