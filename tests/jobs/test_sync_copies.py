"""Copies of beat's sync that waited together in a busy queue sync once (``jobs.tasks.
sync_all_clusters``, ``jobs.services.backend_sync.sync_slot_claim``).

Found by the chaos test (tests/portal/test_chaos.py): a sync slower than its interval, and
the burst of submits the syncs share their queue with, had 46 copies of the sync waiting at
once, each a full sync when a worker reached it.
"""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from clusters.models import Cluster
from jobs import tasks

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

pytestmark = pytest.mark.sync_slot


def synced_at(cluster: Cluster):
    return Cluster.objects.get(pk=cluster.pk).inventory_at


def test_a_sync_within_half_an_interval_of_the_last_start_is_skipped(world, settings):
    settings.GANTRY_SYNC_INTERVAL_S = 4
    with time_machine.travel(T0, tick=False):
        tasks.sync_all_clusters()
    assert synced_at(world.cluster) == T0

    with time_machine.travel(T0 + timedelta(seconds=1.5), tick=False):
        tasks.sync_all_clusters()  # a copy that waited behind the first one: nothing done
    assert synced_at(world.cluster) == T0

    later = T0 + timedelta(seconds=3)  # the database cache keeps whole seconds
    with time_machine.travel(later, tick=False):
        tasks.sync_all_clusters()  # beat's next one, however late: it syncs
    assert synced_at(world.cluster) == later
