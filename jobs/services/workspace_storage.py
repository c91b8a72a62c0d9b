"""A workspace's files once it has ended for good (docs/workspaces.md, "Backends"): every
cluster it ran on lets go of what it kept of them (Kubernetes deletes its volume).

A suspended workspace keeps them: only a run that ended (stopped, finished, failed,
cancelled) with no job of it left is released, whatever ended it, from the sync or from a
stop while it held no job. The sync cycle asks after the clusters answered
(``jobs.tasks.sync_all_clusters``), and asks again every cycle until each of the run's
clusters has done it: a cluster that is down, disabled or refuses keeps its workspaces
waiting, and none is forgotten (``Workspace.storage_released_at`` says when it was done).
"""

import logging
from collections import defaultdict
from collections.abc import Collection

from django.db.models import Exists, OuterRef
from django.utils import timezone

from clusters.backends import BackendError, backend_for
from clusters.backends.calls import backend_call
from clusters.models import Cluster
from core.log_context import log_context
from jobs.models import LIVE_ATTEMPT_STATES, TERMINAL_STATES, Attempt, Workspace

logger = logging.getLogger(__name__)

# Workspaces released at most per call: a backlog is worked off over a few sync cycles, and
# a cycle stays short.
RELEASE_BATCH = 20


def workspace_storage_release_ended(
    *, reachable: Collection[int], limit: int = RELEASE_BATCH
) -> int:
    """Have the clusters let go of the files of ended workspaces that still hold them, those
    whose every cluster is among ``reachable`` (the ids of the clusters that answered this
    sync cycle), oldest run first, at most ``limit``. A cluster that fails is not asked
    again in this call; its workspaces wait for the next. Returns how many were released."""
    on_another_cluster = Attempt.objects.filter(run=OuterRef("run")).exclude(
        cluster_id__in=list(reachable)
    )
    job_left = Attempt.objects.filter(run=OuterRef("run"), state__in=LIVE_ATTEMPT_STATES)
    pending = list(
        Workspace.objects.filter(storage_released_at__isnull=True, run__state__in=TERMINAL_STATES)
        .exclude(Exists(on_another_cluster))
        .exclude(Exists(job_left))
        .select_related("run__tenant")
        .order_by("run_id")[:limit]
    )
    if not pending:
        return 0
    clusters_of: dict[int, set[int]] = defaultdict(set)
    for run_id, cluster_id in Attempt.objects.filter(
        run_id__in=[workspace.run_id for workspace in pending]
    ).values_list("run_id", "cluster_id"):
        clusters_of[run_id].add(cluster_id)
    clusters = Cluster.objects.in_bulk({pk for ids in clusters_of.values() for pk in ids})
    failed: set[int] = set()
    released = 0
    for workspace in pending:
        ids = sorted(clusters_of[workspace.run_id])
        if failed.intersection(ids):
            continue
        failing = _release(workspace, [clusters[pk] for pk in ids])
        if failing is not None:
            failed.add(failing)
            continue
        released += Workspace.objects.filter(
            pk=workspace.pk, storage_released_at__isnull=True
        ).update(storage_released_at=timezone.now())
    return released


def _release(workspace: Workspace, clusters: list[Cluster]) -> int | None:
    """Ask each cluster to let go of the workspace's files; the id of the first that could
    not (None: all did)."""
    run = workspace.run
    for cluster in clusters:
        with log_context(run_id=run.pk, cluster=cluster.name):
            try:
                with backend_call(cluster=cluster.name, operation="workspace_release"):
                    backend_for(cluster).workspace_release(run_id=run.pk, tenant=run.tenant.slug)
            except BackendError as exc:
                logger.warning("workspace %s: its files not released yet: %s", run.pk, exc)
                return cluster.pk
    logger.info("workspace %s: its files released on its clusters", run.pk)
    return None
