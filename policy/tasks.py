"""Thin Celery tasks: take ids, call a service. Redelivery is harmless by construction."""

import logging

from celery import shared_task

from policy.services import replaying

logger = logging.getLogger(__name__)

# A report whose turn has not come (another is being replayed) asks again this much later.
WAIT_RETRY_S = 10


@shared_task(bind=True, max_retries=None)
def replay_report_run(self, report_id: int) -> None:
    outcome = replaying.replay_report_run(report_id=report_id)
    logger.info("what-if report %s: %s", report_id, outcome)
    if outcome == replaying.Replayed.WAITING:
        raise self.retry(countdown=WAIT_RETRY_S)
