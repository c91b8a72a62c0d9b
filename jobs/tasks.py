"""Thin Celery tasks: take ids, call a service. Redelivery is harmless by construction."""

import logging

from celery import shared_task
from django.utils import timezone

from clusters.backends import BackendError, TransientBackendError
from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from clusters.services.health import node_fences_push
from clusters.services.health_checks import node_health_checks_follow
from core.log_context import log_context
from jobs.services import attribution, backend_submit, backend_sync, budgets, workspace_storage
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.estimates import estimates_refresh

logger = logging.getLogger(__name__)


@shared_task
def admission_cycle() -> None:
    summary = admission_run_cycle()
    if summary is not None and summary.admitted:
        logger.info("admission: %d admitted, %d waiting", summary.admitted, summary.waiting)


@shared_task
def estimate_starts() -> None:
    summary = estimates_refresh()
    if summary is not None:
        logger.info(
            "estimates: %d queued, %d with a bound, %d changed",
            summary.queued,
            summary.with_bound,
            summary.changed,
        )


@shared_task(
    bind=True,
    autoretry_for=(TransientBackendError,),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=None,
)
def attempt_submit(self, attempt_id: int) -> None:
    # Unbounded retries are safe: the sync cycle re-drives stuck submits too, and a submit
    # that reaches the backend twice adopts the first job.
    backend_submit.attempt_submit(attempt_id=attempt_id)


@shared_task(autoretry_for=(TransientBackendError,), retry_backoff=2, max_retries=8)
def attempt_cancel(attempt_id: int) -> None:
    backend_sync.attempt_cancel(attempt_id=attempt_id)


@shared_task
def sync_all_clusters() -> None:
    if not backend_sync.sync_slot_claim():
        return  # another sync started moments ago: this copy waited in a busy queue
    answered: list[int] = []
    for cluster in Cluster.objects.filter(enabled=True):
        try:
            # The sync first: when the backend is down, it is what records "backend
            # unreachable" on the cluster and on every live attempt, for their runs' pages.
            backend_sync.cluster_sync(cluster=cluster)
            cluster_refresh_inventory(cluster=cluster)
            answered.append(cluster.pk)  # it answered (the sync asks nothing when idle)
            # After the refresh, which may have quarantined nodes: their runs leave as the
            # cluster's policy says (idempotent: an attempt already acted on is skipped).
            attribution.quarantined_attempts_settle(cluster=cluster, now=timezone.now())
            node_fences_push(cluster=cluster)  # quarantines to the backend, after the inventory
            node_health_checks_follow(cluster=cluster)  # checks asked for, and their verdicts
        except BackendError as exc:  # recorded on the cluster; the other clusters go on
            with log_context(cluster=cluster.name):
                logger.warning("cluster %s: %s", cluster.name, exc)
    backend_submit.attempt_redrive_stuck_submits()
    backend_submit.attempt_redrive_deferred_cancels()
    # Ended workspaces' files, on the clusters that answered (the others' wait).
    workspace_storage.workspace_storage_release_ended(reachable=answered)


@shared_task
def budget_alerts() -> None:
    fired = budgets.budget_alerts_check(now=timezone.now())
    if fired:
        logger.info("budget alerts: %d fired", fired)
