"""Node health's services (clusters/services/health.py) on a cluster of 8 a100 nodes whose
backend is a fake the tests drive: signals recorded and acted on, floods, flapping, the
blast radius, a person's quarantine and release, the policy's edit, and the push of
quarantines to the backend (drain refused, crash between write and push)."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError

from clusters.backends import BackendError, register
from clusters.backends.base import Inventory, NodeInventory
from clusters.health import Signal, SignalClass, Source
from clusters.health_policy import HealthPolicy
from clusters.models import Cluster, ClusterNode, NodeHealthEvent
from clusters.selectors import cluster_health_policy, node_health_events
from clusters.services import cluster_refresh_inventory
from clusters.services.health import (
    cluster_health_policy_set,
    node_fences_push,
    node_health_check_record,
    node_quarantine,
    node_release,
    node_signals_record,
)
from tenants.access import NotVisible
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
NODES = [f"gpu-{i}" for i in range(8)]


class FakeBackend:
    """A backend whose inventory the tests set and whose fence/unfence they watch."""

    inventory_max_age_s = 600.0
    honours_placement = True
    reclaim_first = True
    nodes: tuple[NodeInventory, ...] = ()
    calls: list[tuple] = []
    refuse: str = ""

    def __init__(self, cluster) -> None:
        self.cluster = cluster

    def inventory(self) -> Inventory:
        return Inventory(nodes=FakeBackend.nodes)

    def fence(self, node: str, reason: str) -> None:
        FakeBackend.calls.append(("fence", node, reason))
        if FakeBackend.refuse:
            raise BackendError(FakeBackend.refuse)

    def unfence(self, node: str) -> None:
        FakeBackend.calls.append(("unfence", node))
        if FakeBackend.refuse:
            raise BackendError(FakeBackend.refuse)


register("fake-health")(FakeBackend)


@pytest.fixture
def fake(world) -> Cluster:
    FakeBackend.nodes = tuple(NodeInventory(name=n, flavor="a100-80gb", gpus=8) for n in NODES)
    FakeBackend.calls = []
    FakeBackend.refuse = ""
    cluster = Cluster.objects.create(name="fake-1", backend="fake-health")
    cluster_refresh_inventory(cluster=cluster, now=NOW)
    return cluster


def at(seconds: float) -> float:
    return (NOW + timedelta(seconds=seconds)).timestamp()


def xid79(node: str, seconds: float = 0, gpu: str = "3") -> Signal:
    return Signal(
        node=node,
        signal=SignalClass.GPU_LOST,
        source=Source.DCGM,
        at=at(seconds),
        gpu=gpu,
        code="79",
        detail="XID 79 GPU has fallen off the bus",
    )


def health(cluster: Cluster) -> dict[str, str]:
    return dict(ClusterNode.objects.filter(cluster=cluster).values_list("name", "health"))


def node(cluster: Cluster, name: str) -> ClusterNode:
    return ClusterNode.objects.get(cluster=cluster, name=name)


def events(cluster: Cluster) -> list[tuple]:
    return list(
        NodeHealthEvent.objects.filter(cluster=cluster)
        .order_by("id")
        .values_list("node", "gpu", "source", "signal", "code", "count", "action")
    )


def test_a_fault_quarantines_its_node_and_is_recorded(fake):
    [event] = node_signals_record(cluster=fake, signals=[xid79("gpu-5", -10)], now=NOW)

    row = node(fake, "gpu-5")
    assert (row.health, row.health_reason, row.health_since) == (
        "quarantined",
        "GPU 3: XID 79 GPU has fallen off the bus",
        NOW,
    )
    assert (row.fenced_at, row.fence_error) == (None, "")
    assert events(fake) == [("gpu-5", "3", "dcgm", "gpu_lost", "79", 1, "quarantine")]
    assert (event.observed_at, event.last_observed_at, event.recorded_at) == (
        NOW - timedelta(seconds=10),
        NOW - timedelta(seconds=10),
        NOW,
    )
    assert (event.detail, event.actor, event.note) == (
        "XID 79 GPU has fallen off the bus",
        None,
        "",
    )
    assert sorted(h for h in health(fake).values()) == ["healthy"] * 7 + ["quarantined"]


def test_an_unknown_xid_is_recorded_as_unknown_and_does_nothing(fake):
    unknown = Signal("gpu-1", SignalClass.XID_UNKNOWN, Source.DCGM, at(0), gpu="0", code="999")
    bogus = Signal("gpu-2", "fan_fault", "ipmi", float("nan"))  # type: ignore[arg-type]

    node_signals_record(cluster=fake, signals=[unknown, bogus], now=NOW)

    assert events(fake) == [
        ("gpu-1", "0", "dcgm", "xid_unknown", "999", 1, "observe"),
        ("gpu-2", "", "ipmi", "xid_unknown", "fan_fault", 1, "observe"),
    ]
    assert NodeHealthEvent.objects.get(node="gpu-2").observed_at == NOW  # no time: now
    assert set(health(fake).values()) == {"healthy"}


def test_a_flood_from_one_gpu_is_one_row_whose_count_grows(fake):
    thermal = [
        Signal("gpu-1", SignalClass.THERMAL_THROTTLE, Source.DCGM, at(s), gpu="2", code="0x40")
        for s in range(500)
    ]
    node_signals_record(cluster=fake, signals=thermal, now=NOW + timedelta(seconds=500))
    node_signals_record(cluster=fake, signals=thermal[:1] * 2, now=NOW + timedelta(seconds=600))
    later = Signal(
        "gpu-1", SignalClass.THERMAL_THROTTLE, Source.DCGM, at(799), gpu="2", code="0x40"
    )
    node_signals_record(cluster=fake, signals=[later], now=NOW + timedelta(seconds=800))

    [row] = NodeHealthEvent.objects.filter(cluster=fake)
    assert (row.count, row.action) == (503, "warn")
    assert (row.observed_at, row.last_observed_at) == (NOW, NOW + timedelta(seconds=799))
    # Past the window (300 s after the last one): a new event.
    beyond = Signal(
        "gpu-1", SignalClass.THERMAL_THROTTLE, Source.DCGM, at(1100), gpu="2", code="0x40"
    )
    node_signals_record(cluster=fake, signals=[beyond], now=NOW + timedelta(seconds=1100))
    assert [e[5] for e in events(fake)] == [503, 1]
    assert node(fake, "gpu-1").health == "suspect"


def test_a_flapping_node_stays_quarantined_and_is_fenced_once(fake):
    def backend_says(seconds, klass, state):
        signal = Signal("gpu-3", klass, Source.BACKEND, at(seconds), code=state)
        node_signals_record(cluster=fake, signals=[signal], now=NOW + timedelta(seconds=seconds))
        node_fences_push(cluster=fake, now=NOW + timedelta(seconds=seconds))
        return node(fake, "gpu-3").health

    seen = [
        backend_says(0, SignalClass.NODE_DOWN, "DOWN"),
        backend_says(60, SignalClass.NODE_CONDITION, "GpuXidError"),
        backend_says(120, SignalClass.NODE_DOWN, "IDLE"),
        backend_says(180, SignalClass.NODE_CONDITION, "GpuXidError"),
    ]
    node_fences_push(cluster=fake, now=NOW + timedelta(seconds=240))

    assert seen == ["suspect", "quarantined", "quarantined", "quarantined"]
    assert FakeBackend.calls == [
        ("fence", "gpu-3", "gantry: node_condition GpuXidError from backend")
    ]
    assert node(fake, "gpu-3").fenced_at == NOW + timedelta(seconds=60)
    assert events(fake) == [
        ("gpu-3", "", "backend", "node_down", "DOWN", 1, "warn"),
        ("gpu-3", "", "backend", "node_condition", "GpuXidError", 2, "quarantine"),
        ("gpu-3", "", "gantry", "fence", "", 1, "fenced"),
        ("gpu-3", "", "backend", "node_down", "IDLE", 1, "warn"),
    ]


def test_the_blast_radius_quarantines_up_to_its_share_then_waits_for_a_person(fake, world):
    faults = [xid79("gpu-6", 3), xid79("gpu-1", 1), xid79("gpu-4", 2), xid79("gpu-0", 4)]

    node_signals_record(cluster=fake, signals=faults, now=NOW + timedelta(seconds=5))

    assert {n: h for n, h in health(fake).items() if h != "healthy"} == {
        "gpu-1": "quarantined",
        "gpu-4": "quarantined",
        "gpu-6": "suspect",
        "gpu-0": "suspect",
    }
    assert node(fake, "gpu-6").health_reason == (
        "GPU 3: XID 79 GPU has fallen off the bus: not quarantined, 2 of 8 nodes are "
        "quarantined already, the most max_quarantined_share 0.25 allows: waits for a person"
    )
    assert sorted((e[0], e[6]) for e in events(fake)) == [
        ("gpu-0", "quarantine_refused"),
        ("gpu-1", "quarantine"),
        ("gpu-4", "quarantine"),
        ("gpu-6", "quarantine_refused"),
    ]
    # A person may go beyond it.
    node_quarantine(cluster=fake, node="gpu-6", actor=world.platform_admin, note="rack", now=NOW)
    assert node(fake, "gpu-6").health == "quarantined"


def test_a_backend_that_refuses_the_drain_leaves_the_node_quarantined_with_the_error(fake):
    node_signals_record(cluster=fake, signals=[xid79("gpu-2")], now=NOW)
    FakeBackend.refuse = "scontrol: Access/permission denied"

    assert node_fences_push(cluster=fake, now=NOW) == 0
    assert node_fences_push(cluster=fake, now=NOW + timedelta(minutes=1)) == 0

    row = node(fake, "gpu-2")
    assert (row.health, row.fenced_at, row.fence_error) == (
        "quarantined",
        None,
        "scontrol: Access/permission denied",
    )
    assert (
        FakeBackend.calls
        == [("fence", "gpu-2", "gantry: GPU 3: XID 79 GPU has fallen off the bus")] * 2
    )
    # One event for the failure, not one per sync.
    assert events(fake)[1:] == [("gpu-2", "", "gantry", "fence", "", 1, "fence_failed")]
    FakeBackend.refuse = ""
    assert node_fences_push(cluster=fake, now=NOW + timedelta(minutes=2)) == 1
    row = node(fake, "gpu-2")
    assert (row.fenced_at, row.fence_error) == (NOW + timedelta(minutes=2), "")
    assert node_fences_push(cluster=fake, now=NOW + timedelta(minutes=3)) == 0
    assert len(FakeBackend.calls) == 3


class NoFenceBackend(FakeBackend):
    """A backend that cannot fence nodes (yet)."""

    fence = None  # type: ignore[assignment]
    unfence = None  # type: ignore[assignment]


register("fake-nofence")(NoFenceBackend)


def test_a_backend_without_fence_keeps_the_quarantine_in_gantry_and_says_so(fake):
    Cluster.objects.filter(pk=fake.pk).update(backend="fake-nofence")
    fake.refresh_from_db()
    node_signals_record(cluster=fake, signals=[xid79("gpu-0")], now=NOW)

    assert node_fences_push(cluster=fake, now=NOW) == 0

    row = node(fake, "gpu-0")
    assert (row.health, row.fenced_at, row.fence_error) == (
        "quarantined",
        None,
        "the fake-nofence backend cannot fence nodes yet: Gantry only keeps the node out of "
        "its own placement",
    )


def test_with_fence_backend_off_the_backend_is_never_called(fake, world):
    cluster_health_policy_set(
        cluster=fake, actor=world.platform_admin, raw={"fence_backend": False}
    )
    node_signals_record(cluster=fake, signals=[xid79("gpu-2")], now=NOW)

    assert node_fences_push(cluster=fake, now=NOW) == 0
    assert FakeBackend.calls == []
    assert node(fake, "gpu-2").health == "quarantined"


def test_a_crash_between_the_quarantine_and_its_push_is_repaired_by_the_next_push(fake, world):
    # Written, never pushed (the process died): the next push fences it.
    ClusterNode.objects.filter(cluster=fake, name="gpu-1").update(
        health="quarantined", health_reason="GPU 0: DBE", health_since=NOW
    )
    # Fenced on the backend, the process died before recording it, then released: the
    # backend still shows Gantry's drain, so the next push undoes it.
    FakeBackend.nodes = tuple(
        NodeInventory(name=n, flavor="a100-80gb", gpus=8, schedulable=n != "gpu-4",
                      reason="drained: gantry: GPU 1: DBE" if n == "gpu-4" else "")
        for n in NODES
    )  # fmt: skip
    cluster_refresh_inventory(cluster=fake, now=NOW)

    assert node_fences_push(cluster=fake, now=NOW) == 2
    assert FakeBackend.calls == [("fence", "gpu-1", "gantry: GPU 0: DBE"), ("unfence", "gpu-4")]


def test_a_person_quarantines_and_releases_a_node_with_a_note(fake, world):
    admin = world.platform_admin
    event = node_quarantine(cluster=fake, node="gpu-7", actor=admin, note="fan noise", now=NOW)
    assert (event.source, event.signal, event.action, event.actor, event.note) == (
        "person", "quarantine", "quarantine", admin, "fan noise"
    )  # fmt: skip
    assert node(fake, "gpu-7").health_reason == "quarantined by paul: fan noise"
    with pytest.raises(ValidationError) as again:
        node_quarantine(cluster=fake, node="gpu-7", actor=admin, note="", now=NOW)
    assert again.value.messages == [
        "gpu-7 is quarantined already (since 2026-12-06 12:00 UTC): quarantined by paul: fan noise"
    ]
    node_fences_push(cluster=fake, now=NOW)

    for note in ("", "   "):
        with pytest.raises(ValidationError) as refused:
            node_release(cluster=fake, node="gpu-7", actor=admin, note=note, now=NOW)
        assert refused.value.message_dict == {
            "note": ["Say why the node may take work again: a release needs a note."]
        }
    assert node(fake, "gpu-7").health == "quarantined"

    later = NOW + timedelta(hours=1)
    released = node_release(cluster=fake, node="gpu-7", actor=admin, note="fan replaced", now=later)
    row = node(fake, "gpu-7")
    assert (row.health, row.health_reason, row.health_since) == ("healthy", "", later)
    assert (released.signal, released.action, released.note) == (
        "release",
        "release",
        "fan replaced",
    )
    assert node_fences_push(cluster=fake, now=later) == 1
    assert FakeBackend.calls[-1] == ("unfence", "gpu-7")
    assert node(fake, "gpu-7").fenced_at is None
    audits = AuditEvent.objects.filter(action__startswith="node.").order_by("id")
    reason = "quarantined by paul: fan noise"
    assert [(a.action, a.actor, a.target, a.before, a.after) for a in audits] == [
        (
            "node.quarantine",
            admin,
            "fake-1/gpu-7",
            {"health": "healthy", "reason": ""},
            {"health": "quarantined", "reason": reason, "note": "fan noise"},
        ),
        (
            "node.release",
            admin,
            "fake-1/gpu-7",
            {"health": "quarantined", "reason": reason},
            {"health": "healthy", "reason": "", "note": "fan replaced"},
        ),
    ]
    with pytest.raises(ValidationError):
        node_release(cluster=fake, node="gpu-7", actor=admin, note="again", now=later)


def test_only_platform_admins_act_on_nodes(fake, world):
    for person in (world.researcher_a, world.tenant_admin_a, world.finance):
        with pytest.raises(NotVisible):
            node_quarantine(cluster=fake, node="gpu-1", actor=person, note="x", now=NOW)
        with pytest.raises(NotVisible):
            cluster_health_policy_set(cluster=fake, actor=person, raw={})
    with pytest.raises(ClusterNode.DoesNotExist):
        node_quarantine(cluster=fake, node="nope", actor=world.platform_admin, note="x", now=NOW)
    assert set(health(fake).values()) == {"healthy"}
    assert not AuditEvent.objects.filter(action__startswith="node.").exists()


def test_a_release_the_policy_gates_on_a_health_check(fake, world):
    admin = world.platform_admin
    cluster_health_policy_set(cluster=fake, actor=admin, raw={"release_needs_check": True})
    node_quarantine(cluster=fake, node="gpu-2", actor=admin, note="", now=NOW)
    node_health_check_record(
        cluster=fake, node="gpu-2", passed=True, at=NOW - timedelta(minutes=1), detail="old"
    )
    with pytest.raises(ValidationError) as refused:
        node_release(cluster=fake, node="gpu-2", actor=admin, note="ok", now=NOW)
    assert refused.value.messages == [
        "gpu-2 returns to service only after a health check passes on it since its quarantine "
        "(this cluster's policy: release_needs_check); none has yet."
    ]
    node_health_check_record(
        cluster=fake,
        node="gpu-2",
        passed=True,
        at=NOW + timedelta(minutes=5),
        detail="dcgmi diag -r 2: pass",
    )
    node_release(
        cluster=fake, node="gpu-2", actor=admin, note="diag passed", now=NOW + timedelta(minutes=6)
    )
    assert node(fake, "gpu-2").health == "healthy"


def test_a_failed_health_check_is_a_signal(fake):
    node_health_check_record(
        cluster=fake, node="gpu-3", passed=False, at=NOW, detail="dcgmi diag -r 2: FAIL", now=NOW
    )
    assert node(fake, "gpu-3").health == "quarantined"
    assert events(fake) == [
        ("gpu-3", "", "health_check", "health_check_failed", "", 1, "quarantine")
    ]


def test_a_policy_edit_that_would_quarantine_half_the_cluster_is_refused(fake, world):
    admin = world.platform_admin
    hot = [
        Signal(n, SignalClass.THERMAL_THROTTLE, Source.DCGM, at(-60), gpu="0", code="0x40")
        for n in NODES[:4]
    ]
    node_signals_record(cluster=fake, signals=hot, now=NOW)
    strict = {"actions": {"thermal_throttle": "quarantine"}}

    with pytest.raises(ValidationError) as refused:
        cluster_health_policy_set(cluster=fake, actor=admin, raw=strict, now=NOW)

    assert refused.value.message_dict == {
        "health_policy": [
            "Refused: under this policy the signals of the last 3,600 s would quarantine 4 "
            "more nodes (gpu-0, gpu-1, gpu-2, gpu-3), 4 of 8 in all, more than "
            "max_quarantined_share 0.25 allows (2). Quarantine nodes by hand if you mean it, "
            "or raise max_quarantined_share."
        ]
    }
    fake.refresh_from_db()
    assert fake.health_policy == {}
    assert not AuditEvent.objects.filter(action="cluster.health_policy").exists()
    # Two hours later those signals are out of its window: allowed, stored as overrides only.
    policy = cluster_health_policy_set(
        cluster=fake,
        actor=admin,
        raw={**strict, "suspect_tenants": 2},
        now=NOW + timedelta(hours=2),
    )
    fake.refresh_from_db()
    assert fake.health_policy == strict
    assert cluster_health_policy(cluster=fake) == policy
    audit = AuditEvent.objects.get(action="cluster.health_policy")
    assert (audit.actor, audit.target, audit.before, audit.after) == (admin, "fake-1", {}, strict)


def test_a_bad_policy_is_refused_by_name_and_changes_nothing(fake, world):
    with pytest.raises(ValidationError) as refused:
        cluster_health_policy_set(cluster=fake, actor=world.platform_admin, raw={"drain": True})
    assert refused.value.message_dict["health_policy"][0].startswith(
        "unknown health policy key: drain (allowed: actions, "
    )
    fake.refresh_from_db()
    assert fake.health_policy == {}


def test_a_stored_policy_that_is_not_one_counts_as_the_defaults(fake):
    Cluster.objects.filter(pk=fake.pk).update(health_policy={"max_quarantined_share": 7})
    fake.refresh_from_db()
    assert cluster_health_policy(cluster=fake) == HealthPolicy()


def test_the_inventory_turns_lost_gpus_and_backend_signals_into_health(fake):
    down = Signal("gpu-6", SignalClass.NODE_DOWN, Source.BACKEND, at(120), code="DOWN",
                  detail="Slurm: DOWN (Not responding)")  # fmt: skip
    bad = Signal("gpu-7", "weird", Source.BACKEND, at(120))  # type: ignore[arg-type]
    FakeBackend.nodes = tuple(
        NodeInventory(
            name=n,
            flavor="a100-80gb",
            gpus={"gpu-2": 7, "gpu-3": 0}.get(n, 8),
            signals={"gpu-6": (down,), "gpu-7": (bad,)}.get(n, ()),
        )
        for n in NODES
    )
    cluster_refresh_inventory(cluster=fake, now=NOW + timedelta(seconds=120))

    assert events(fake) == [
        ("gpu-2", "", "inventory", "gpu_lost", "7", 1, "quarantine"),
        ("gpu-3", "", "inventory", "gpu_lost", "0", 1, "observe"),  # left the inventory
        ("gpu-6", "", "backend", "node_down", "DOWN", 1, "warn"),
        ("gpu-7", "", "backend", "xid_unknown", "weird", 1, "observe"),
    ]
    assert node(fake, "gpu-2").health_reason == "reports 7 GPUs, had 8"
    assert node(fake, "gpu-2").gpus == 7
    assert {n: h for n, h in health(fake).items() if h != "healthy"} == {
        "gpu-2": "quarantined",
        "gpu-6": "suspect",
    }
    # The same counts again: nothing new is lost.
    cluster_refresh_inventory(cluster=fake, now=NOW + timedelta(seconds=180))
    assert [e[5] for e in events(fake)] == [1, 1, 2, 2]


def test_nothing_in_the_signals_stops_the_inventory_refresh(fake, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr("clusters.services.inventory.node_signals_record", broken)
    FakeBackend.nodes = (NodeInventory(name="gpu-0", flavor="a100-80gb", gpus=4),)

    cluster_refresh_inventory(cluster=fake, now=NOW + timedelta(minutes=1))

    fake.refresh_from_db()
    assert (fake.inventory_at, fake.inventory_error) == (NOW + timedelta(minutes=1), "")
    assert list(ClusterNode.objects.filter(cluster=fake).values_list("name", "gpus")) == [
        ("gpu-0", 4)
    ]


def test_node_events_are_read_per_node_and_since(fake, world):
    node_signals_record(cluster=fake, signals=[xid79("gpu-1", -7200)], now=NOW - timedelta(hours=2))
    node_signals_record(cluster=fake, signals=[xid79("gpu-2", -60)], now=NOW)
    node_quarantine(cluster=fake, node="gpu-3", actor=world.platform_admin, note="x", now=NOW)

    assert [e.node for e in node_health_events(cluster=fake)] == ["gpu-3", "gpu-2", "gpu-1"]
    assert [e.node for e in node_health_events(cluster=fake, node="gpu-2")] == ["gpu-2"]
    since = node_health_events(cluster=fake, since=NOW - timedelta(hours=1))
    assert [(e.node, e.signal) for e in since] == [("gpu-3", "quarantine"), ("gpu-2", "gpu_lost")]
    assert list(node_health_events(cluster=world.cluster)) == []


def test_platform_admins_edit_the_policy_in_the_django_admin(world):
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    from tests.tenants.test_audit_log import admin_form_data

    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@gantry.example", "pw-42-pw"))
    sim = world.cluster
    url = reverse("admin:clusters_cluster_change", args=[sim.pk])
    data = admin_form_data(client.get(url))

    refused = client.post(url, data | {"health_policy": '{"max_quarantined_share": 2}'})
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors["health_policy"] == [
        "max_quarantined_share must be a number from 0 to 1 (a share of the cluster's nodes), not 2"
    ]
    saved = client.post(url, data | {"health_policy": '{"max_quarantined_share": 0.5}'})
    assert saved.status_code == 302
    sim.refresh_from_db()
    assert sim.health_policy == {"max_quarantined_share": 0.5}
    audit = AuditEvent.objects.get(action="cluster.health_policy")
    assert (audit.target, audit.before, audit.after) == (
        "sim-1",
        {},
        {"max_quarantined_share": 0.5},
    )
    # Nothing else changed: no "cluster.update" (the policy's own event says it all).
    assert not AuditEvent.objects.filter(action="cluster.update").exists()


def test_the_periodic_sync_pushes_quarantines_after_the_inventory(fake, world, monkeypatch):
    from jobs import tasks

    synced = []
    monkeypatch.setattr(
        tasks.backend_sync, "cluster_sync", lambda cluster: synced.append(cluster.name)
    )
    node_quarantine(cluster=fake, node="gpu-4", actor=world.platform_admin, note="PSU", now=NOW)

    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
        tasks.sync_all_clusters()

    assert sorted(synced) == ["fake-1", "sim-1"]
    assert FakeBackend.calls == [("fence", "gpu-4", "gantry: quarantined by paul: PSU")]
    assert node(fake, "gpu-4").fenced_at == NOW + timedelta(minutes=1)
