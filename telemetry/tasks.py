"""Thin Celery tasks: call a service. Redelivery is harmless: the writes are idempotent."""

import logging

from celery import shared_task

from jobs.models import Cluster
from telemetry import services

logger = logging.getLogger(__name__)


@shared_task
def accounting_compute_pending(limit: int = 200) -> None:
    computed = services.accounting_compute_pending(limit=limit)
    if computed:
        logger.info("accounting: %d attempts computed", computed)


@shared_task
def simulator_telemetry_collect_all() -> None:
    for cluster_id in Cluster.objects.filter(
        enabled=True, backend=Cluster.Backend.SIMULATOR
    ).values_list("pk", flat=True):
        cluster = Cluster.objects.get(pk=cluster_id)
        services.simulator_telemetry_collect(cluster=cluster)
