"""The node-health figures read the rows the clusters services write (one vocabulary,
clusters.health_policy): a signal the policy quarantines on, Gantry's fence that fails and
then takes, a passing health check, a person's release and unfence, a person's quarantine.
Built through the services, not by hand, at fixed times."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from clusters.backends import BackendError
from clusters.backends.simulator import SimulatorBackend
from clusters.health import Signal, SignalClass, Source
from clusters.models import NodeHealthEvent
from clusters.services.health import (
    node_fences_push,
    node_health_check_record,
    node_quarantine,
    node_release,
    node_signals_record,
)
from telemetry.kpis.node_health import node_overview

NOW = datetime(2026, 3, 31, 12, 0, tzinfo=UTC)
T0 = NOW - timedelta(days=5)
DAY = timedelta(days=1)


@pytest.fixture
def history(world, monkeypatch):
    cluster, admin, node = world.cluster, world.platform_admin, "sim-1-a100-80gb-00"
    fence = SimulatorBackend.fence

    def refuse(self, name, reason):
        raise BackendError("simulated: not allowed to drain")

    with time_machine.travel(T0 + timedelta(seconds=30), tick=False):
        xid = Signal(node, SignalClass.GPU_LOST, Source.DCGM, T0.timestamp(), gpu="3",
                     code="79", detail="XID 79 GPU has fallen off the bus")  # fmt: skip
        node_signals_record(cluster=cluster, signals=[xid], now=T0 + timedelta(seconds=30))
    with time_machine.travel(T0 + timedelta(seconds=60), tick=False):
        monkeypatch.setattr(SimulatorBackend, "fence", refuse)
        assert node_fences_push(cluster=cluster) == 0
        monkeypatch.setattr(SimulatorBackend, "fence", fence)
    with time_machine.travel(T0 + timedelta(seconds=120), tick=False):
        assert node_fences_push(cluster=cluster) == 1
    with time_machine.travel(T0 + DAY - timedelta(hours=1), tick=False):
        node_health_check_record(cluster=cluster, node=node, passed=True, at=T0 + DAY / 2)
    with time_machine.travel(T0 + DAY, tick=False):
        node_release(cluster=cluster, node=node, actor=admin, note="GPU 3 replaced")
        assert node_fences_push(cluster=cluster) == 1
    with time_machine.travel(NOW - DAY, tick=False):
        node_quarantine(cluster=cluster, node=node, actor=admin, note="fan noise")
    return node


def test_the_rows_are_h1s_vocabulary(world, history):
    rows = NodeHealthEvent.objects.filter(node=history).order_by("recorded_at", "id")
    assert [(e.source, e.signal, e.action) for e in rows] == [
        ("dcgm", "gpu_lost", "quarantine"),
        ("gantry", "fence", "fence_failed"),
        ("gantry", "fence", "fenced"),
        ("health_check", "health_check_passed", "observe"),
        ("person", "release", "release"),
        ("gantry", "unfence", "unfenced"),
        ("person", "quarantine", "quarantine"),
    ]


def test_the_figures_count_one_fault_two_quarantines_and_their_time(world, history):
    overview = node_overview(now=NOW)
    [row] = [row for row in overview.nodes if row.name == history]
    # One fault (the XID); the fence rows, the check and the acts are none.
    assert row.faults == 1
    # Quarantined from T0 + 30 s to the release a day later, and for the last day.
    assert row.mtbf.in_service_s == 30 * 86400 - (86400 - 30) - 86400
    # Only the policy's quarantine had a fault before it: 30 s; the person's had none.
    assert row.latencies == (30.0,)
    # The last signal is the XID, not the acts after it.
    assert (row.last_signal.signal, row.last_signal.code) == ("gpu_lost", "79")
    assert (row.health, row.health_reason) == ("quarantined", "quarantined by paul: fan noise")
