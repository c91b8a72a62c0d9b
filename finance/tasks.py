"""Thin Celery tasks: call a service. Redelivery is harmless: the rollup is idempotent."""

import logging

from celery import shared_task

from finance import services

logger = logging.getLogger(__name__)


@shared_task
def daily_usage_update() -> None:
    summary = services.daily_usage_update()
    if summary.days:
        logger.info("daily usage: %d days rebuilt, %d rows", summary.days, summary.rows)
