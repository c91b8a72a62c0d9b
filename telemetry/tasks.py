"""Thin Celery tasks: call a service. Redelivery is harmless: the writes are idempotent."""

import logging

from celery import shared_task

from clusters.models import Cluster
from core.log_context import log_context
from telemetry import collection, policy, services, straggler_flags, workspace_policy

logger = logging.getLogger(__name__)


@shared_task
def accounting_compute_pending(limit: int = 200) -> None:
    computed = services.accounting_compute_pending(limit=limit)
    if computed:
        logger.info("accounting: %d attempts computed", computed)


@shared_task
def telemetry_collect_all() -> None:
    """Fan out: one task per enabled cluster, so a slow source delays only its cluster."""
    for cluster_id in Cluster.objects.filter(enabled=True).values_list("pk", flat=True):
        telemetry_collect.delay(cluster_id)


@shared_task
def telemetry_collect(cluster_id: int) -> None:
    cluster = Cluster.objects.filter(pk=cluster_id, enabled=True).first()
    if cluster is None:
        return
    with log_context(cluster=cluster.name):
        collection.telemetry_collect(cluster=cluster)


@shared_task
def idle_policy_enforce() -> None:
    summary = policy.idle_policy_enforce()
    if summary.warned or summary.cleared or summary.cancelled:
        logger.info(
            "idle-GPU policy: %d running attempts checked, %d warned, %d cleared, %d cancelled",
            summary.checked,
            summary.warned,
            summary.cleared,
            summary.cancelled,
        )


@shared_task
def straggler_scan() -> None:
    summary = straggler_flags.straggler_flags_scan()
    if summary.created or summary.updated or summary.signalled:
        logger.info(
            "stragglers: %d attempts scanned, %d ranks flagged, %d flags updated, "
            "slow-ranks signal for %s",
            summary.scanned,
            summary.created,
            summary.updated,
            ", ".join(summary.signalled) or "no node",
        )


@shared_task
def workspace_idle_scan() -> None:
    summary = workspace_policy.workspace_idle_scan()
    if summary.warned or summary.suspended or summary.unanswered:
        logger.info(
            "workspaces: %d checked, %d warned, %d suspended, %d servers did not answer",
            summary.checked,
            summary.warned,
            summary.suspended,
            summary.unanswered,
        )
