"""Accounting passes that run at once share the pending attempts
(``telemetry.services.accounting_compute_pending``).

Found by the chaos test (tests/portal/test_chaos.py): the passes of several workers computed
the same attempts, 3,465 computations for 1,000 attempts, on a machine already short of CPU.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs.models import Attempt, AttemptState
from jobs.services.submission import run_submit
from telemetry.models import AttemptAccounting
from telemetry.services import ACCOUNTING_CHUNK, accounting_compute_pending
from tests.conftest import experiment_input


def finished_attempts(world, count: int) -> list[Attempt]:
    ended = timezone.now().replace(microsecond=0) - timedelta(hours=1)
    attempts = []
    for n in range(count):
        run = run_submit(user=world.researcher_a, data=experiment_input(world, name=f"run-{n}"))
        attempts.append(
            Attempt.objects.create(
                run=run,
                number=1,
                cluster=world.cluster,
                state=AttemptState.SUCCEEDED,
                started_at=ended - timedelta(seconds=600 + n),
                finished_at=ended + timedelta(seconds=n),
            )
        )
    return attempts


@pytest.mark.django_db(transaction=True)
def test_a_pass_leaves_the_attempts_another_pass_is_accounting_to_it(world):
    attempts = finished_attempts(world, ACCOUNTING_CHUNK + 10)
    oldest = [a.pk for a in attempts[:ACCOUNTING_CHUNK]]
    holding, done = threading.Event(), threading.Event()

    def other_pass() -> None:
        """A pass in the middle of its first chunk: those attempts' rows locked."""
        try:
            with transaction.atomic():
                list(Attempt.objects.select_for_update().filter(pk__in=oldest))
                holding.set()
                done.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=other_pass)
    thread.start()
    try:
        assert holding.wait(30)
        # The 10 attempts nobody holds, at once: no waiting for the other pass's chunk.
        assert accounting_compute_pending(limit=200) == 10
        accounted = set(AttemptAccounting.objects.values_list("attempt_id", flat=True))
        assert accounted == {a.pk for a in attempts[ACCOUNTING_CHUNK:]}
    finally:
        done.set()
        thread.join()
    assert accounting_compute_pending(limit=200) == ACCOUNTING_CHUNK
    assert accounting_compute_pending(limit=200) == 0
    assert AttemptAccounting.objects.count() == len(attempts)


@pytest.mark.django_db(transaction=True)
def test_a_pass_accounts_at_most_its_limit_oldest_first(world):
    attempts = finished_attempts(world, ACCOUNTING_CHUNK + 5)

    assert accounting_compute_pending(limit=ACCOUNTING_CHUNK + 2) == ACCOUNTING_CHUNK + 2

    accounted = set(AttemptAccounting.objects.values_list("attempt_id", flat=True))
    assert accounted == {a.pk for a in attempts[: ACCOUNTING_CHUNK + 2]}
