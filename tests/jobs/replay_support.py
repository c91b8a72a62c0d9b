"""Recording a history through the product for the what-if replay's tests: runs submitted
through the service, the worker's loop driven by hand (hand placed runs to the simulated
cluster, take preempted ones off it, sync it, decide admission) on a clock the test moves."""

from collections.abc import Callable
from datetime import datetime, timedelta

import time_machine
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import LIVE_ATTEMPT_STATES, Attempt, AttemptState, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync


def hand_over_attempts() -> None:
    """What the worker's tasks do after a cycle, in line: take the preempted runs' jobs off
    their cluster, then submit the admitted runs' attempts."""
    for attempt in Attempt.objects.filter(
        state__in=LIVE_ATTEMPT_STATES, run__state=RunState.PREEMPTED
    ):
        attempt_cancel(attempt_id=attempt.pk)
    for attempt in Attempt.objects.filter(
        state__in=[AttemptState.CREATED, AttemptState.SUBMITTING]
    ):
        attempt_submit(attempt_id=attempt.pk)


def worker_tick(cluster: Cluster) -> None:
    hand_over_attempts()
    cluster_sync(cluster=cluster)
    admission_run_cycle(now=timezone.now())


def record(
    cluster: Cluster,
    *,
    start: datetime,
    seconds: int,
    tick_s: int,
    at_tick: Callable[[int], None] = lambda second: None,
) -> None:
    """``seconds`` of the platform from ``start``, one worker tick every ``tick_s``;
    ``at_tick(second)`` first, each tick (submit, cancel: what people do then)."""
    with time_machine.travel(start, tick=False) as clock:
        for second in range(0, seconds, tick_s):
            clock.move_to(start + timedelta(seconds=second))
            at_tick(second)
            worker_tick(cluster)
