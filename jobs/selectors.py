from django.db.models import QuerySet
from django.http import Http404

from jobs.models import Attempt, ClusterFlavor, Experiment, Run, RunEvent
from tenants.selectors import tenant_list_viewable


def run_list_viewable(*, user) -> QuerySet[Run]:
    """Runs of every tenant the user may read; the start of every run list."""
    return Run.objects.filter(tenant__in=tenant_list_viewable(user=user)).select_related(
        "tenant", "flavor", "cluster", "submitted_by", "experiment__project"
    )


def run_get_viewable(*, user, run_id: int) -> Run:
    """The run, or 404 alike for a missing run and another tenant's run."""
    run = run_list_viewable(user=user).select_related("experiment__image").filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run")
    return run


def experiment_list_viewable(*, user) -> QuerySet[Experiment]:
    return Experiment.objects.filter(tenant__in=tenant_list_viewable(user=user)).select_related(
        "tenant", "project", "owner", "flavor", "image"
    )


def experiment_get_viewable(*, user, experiment_id: int) -> Experiment:
    experiment = experiment_list_viewable(user=user).filter(pk=experiment_id).first()
    if experiment is None:
        raise Http404("No such experiment")
    return experiment


def run_events(*, run: Run) -> QuerySet[RunEvent]:
    return run.events.select_related("actor", "attempt").order_by("at", "id")


def run_attempts(*, run: Run) -> QuerySet[Attempt]:
    return run.attempts.select_related("cluster").order_by("number")


def flavor_node_limits() -> dict[str, tuple[int, int]]:
    """flavor slug -> (largest node count, largest GPUs per node) over enabled clusters."""
    limits: dict[str, tuple[int, int]] = {}
    rows = ClusterFlavor.objects.filter(cluster__enabled=True).values_list(
        "flavor__slug", "nodes", "gpus_per_node"
    )
    for slug, nodes, gpus_per_node in rows:
        max_nodes, max_gpus = limits.get(slug, (0, 0))
        limits[slug] = (max(max_nodes, nodes), max(max_gpus, gpus_per_node))
    return limits
