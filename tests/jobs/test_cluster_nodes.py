"""The node map (issue 18): every enabled cluster's nodes by topology domain, what holds each
GPU, and each flavor's fragmentation, as each persona may see it.

The world: sim-1's four a100 nodes in two leaf switches of one block (00 and 01 in leaf-1.1,
02 and 03 in leaf-1.2); 03 is drained, 02 has 6 GPUs busy with load from outside Gantry; the
two h100 nodes have no topology. Alice (vision) runs 1 × 4 GPUs, placed on node 00 (best fit
among the nodes with 4 free); bob (nlp) runs 1 × 2, placed on node 02 (its last 2 GPUs).
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from jobs.models import Attempt, Run
from jobs.selectors.nodes import GangSize, NodeMap, NodeView, gang_sizes, gangs_text
from jobs.selectors.queue import gpu_occupancy
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.submission import run_submit
from tenants.models import Membership, Quota, Tenant
from tests.conftest import experiment_input, make_user

pytestmark = pytest.mark.django_db

A100 = "sim-1-a100-80gb-"
# Bob's run gets this id: a number nothing else on the page shows, so its absence means
# the run is not named anywhere.
SECRET_RUN_ID = 7_654_321
SECRET_EXPERIMENT = "llm-secret-pretrain"


def sim_pools(*, a100_nodes: int = 4, domains=(1, 2), drained=None, outside=None) -> list:
    return [
        {
            "flavor": "a100-80gb",
            "nodes": a100_nodes,
            "gpus_per_node": 8,
            "domains": list(domains),
            "drained": drained if drained is not None else {f"{A100}03": "bad DIMM"},
            "outside": outside if outside is not None else {f"{A100}02": 6},
        },
        {"flavor": "h100-80gb", "nodes": 2, "gpus_per_node": 8},
    ]


def set_layout(world, pools: list) -> None:
    world.cluster.settings["pools"] = pools
    world.cluster.save(update_fields=["settings"])
    cluster_refresh_inventory(cluster=world.cluster)


def next_run_id(value: int) -> None:
    """The next run gets id ``value`` (a sequence is not rolled back with the test: put it
    back after use)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('jobs_run', 'id'), %s)", [value - 1])


@dataclass
class Placed:
    alice: Run
    bob: Run


@pytest.fixture
def placed(world) -> Placed:
    set_layout(world, sim_pools())
    alice = run_submit(user=world.researcher_a, data=experiment_input(world, gpus_per_node=4))
    next_run_id(SECRET_RUN_ID)
    bob = run_submit(
        user=world.researcher_b,
        data=experiment_input(
            world, tenant="nlp", project="llm", name=SECRET_EXPERIMENT, gpus_per_node=2
        ),
    )
    next_run_id(alice.pk + 1)
    admission_run_cycle()
    assert dict(Attempt.objects.values_list("run_id", "placement")) == {
        alice.pk: [f"{A100}00"],
        bob.pk: [f"{A100}02"],
    }
    return Placed(alice=alice, bob=bob)


def page(client: Client, user) -> tuple[NodeMap, str]:
    client.force_login(user)
    response = client.get(reverse("jobs:cluster_nodes"))
    assert response.status_code == 200
    return response.context["node_map"], response.content.decode()


def nodes_of(node_map: NodeMap) -> dict[str, NodeView]:
    return {
        node.name: node
        for cluster in node_map.clusters
        for flavor in cluster.flavors
        for domain in flavor.domains
        for node in domain.nodes
    }


def cells(node_map: NodeMap) -> dict[str, list[tuple[str, int, int | None]]]:
    """node -> (occupant, GPUs, run id or None) per group of GPUs."""
    return {
        name: [(g.occupant.value, g.gpus, g.run.id if g.run else None) for g in node.groups]
        for name, node in nodes_of(node_map).items()
    }


def node_row(html: str, name: str) -> str:
    start = html.rindex("<li", 0, html.index(f'data-node="{name}"'))
    return html[start : html.index("</li>", start)]


# --- the map -------------------------------------------------------------------------------


def test_nodes_are_grouped_by_topology_domain(client, world, placed):
    node_map, html = page(client, world.platform_admin)

    [cluster] = node_map.clusters
    assert (cluster.name, cluster.backend, cluster.levels) == (
        "sim-1",
        "Simulator",
        ("block", "leaf"),
    )
    assert {
        flavor.flavor: [
            (domain.path, [node.name for node in domain.nodes], domain.free)
            for domain in flavor.domains
        ]
        for flavor in cluster.flavors
    } == {
        "a100-80gb": [
            ((("block", "block-1"), ("leaf", "leaf-1.1")), [f"{A100}00", f"{A100}01"], 12),
            ((("block", "block-1"), ("leaf", "leaf-1.2")), [f"{A100}02", f"{A100}03"], 0),
        ],
        "h100-80gb": [((), ["sim-1-h100-80gb-00", "sim-1-h100-80gb-01"], 16)],
    }
    assert (
        '<h4 class="node-domain"><span class="muted">block</span> block-1 › '
        '<span class="muted">leaf</span> leaf-1.1 <span class="muted">· 2 nodes, 12 GPUs free'
        "</span></h4>"
    ) in html
    assert 'No topology domain <span class="muted">· 2 nodes, 16 GPUs free</span>' in html
    assert (
        html.index(f'data-node="{A100}01"')
        < html.index("leaf-1.2")
        < html.index(f'data-node="{A100}02"')
    )


def test_a_platform_admin_sees_every_run_named_and_linked(client, world, placed):
    node_map, html = page(client, world.platform_admin)

    assert node_map.names_every_run is True
    assert cells(node_map) == {
        f"{A100}00": [("run", 4, placed.alice.pk), ("free", 4, None)],
        f"{A100}01": [("free", 8, None)],
        f"{A100}02": [("run", 2, SECRET_RUN_ID), ("outside", 6, None)],
        f"{A100}03": [("unused", 8, None)],
        "sim-1-h100-80gb-00": [("free", 8, None)],
        "sim-1-h100-80gb-01": [("free", 8, None)],
    }
    assert (
        f'<a class="seg seg-run" href="/runs/{SECRET_RUN_ID}/" title="2 GPUs: run '
        f'{SECRET_RUN_ID} ({SECRET_EXPERIMENT}) of NLP Group, LLM, by bob, admitted">'
        f"<b>#{SECRET_RUN_ID} NLP Group</b><i></i><i></i></a>"
    ) in node_row(html, f"{A100}02")
    assert f'href="/runs/{placed.alice.pk}/"' in node_row(html, f"{A100}00")
    assert "another tenant" not in html


def test_a_researcher_sees_other_tenants_runs_anonymised(client, world, placed):
    node_map, html = page(client, world.researcher_a)

    assert node_map.names_every_run is False
    assert cells(node_map)[f"{A100}00"] == [("run", 4, placed.alice.pk), ("free", 4, None)]
    assert cells(node_map)[f"{A100}02"] == [("other", 2, None), ("outside", 6, None)]
    assert (
        '<span class="gpu-cells"><span class="seg seg-other" title="2 GPUs held by another '
        'tenant"><b>another tenant</b><i></i><i></i></span>'
    ) in node_row(html, f"{A100}02")
    # Nothing of bob's run anywhere: no id, no link, no tenant, project, user or name.
    for secret in (str(SECRET_RUN_ID), "NLP Group", "nlp", "LLM", "bob", SECRET_EXPERIMENT):
        assert secret not in html, secret
    assert f'href="/runs/{placed.alice.pk}/"' in html
    assert "Vision Lab" in node_row(html, f"{A100}00")


def test_the_other_tenant_sees_alices_run_anonymised_and_its_own_named(client, world, placed):
    node_map, html = page(client, world.researcher_b)

    assert cells(node_map)[f"{A100}00"] == [("other", 4, None), ("free", 4, None)]
    assert cells(node_map)[f"{A100}02"] == [("run", 2, SECRET_RUN_ID), ("outside", 6, None)]
    for secret in (f"/runs/{placed.alice.pk}/", "Vision Lab", "Detection", "alice", "resnet"):
        assert secret not in html, secret


def test_finance_sees_the_map_with_every_run_anonymised(client, world, placed):
    node_map, html = page(client, world.finance)

    assert cells(node_map)[f"{A100}00"] == [("other", 4, None), ("free", 4, None)]
    assert cells(node_map)[f"{A100}02"] == [("other", 2, None), ("outside", 6, None)]
    assert 'class="seg seg-run"' not in html.split("</section>", 1)[1]  # the key's sample aside


def test_a_drained_node_shows_its_reason_and_has_no_free_gpus(client, world, placed):
    node_map, html = page(client, world.researcher_a)

    drained = nodes_of(node_map)[f"{A100}03"]
    assert (drained.schedulable, drained.reason, drained.free) == (False, "drained: bad DIMM", 0)
    row = node_row(html, f"{A100}03")
    assert 'class="node node-off"' in row
    assert '<span class="node-state">drained: bad DIMM</span>' in row
    assert '<span class="seg seg-unused" title="8 GPUs unused: the node takes no work">' in row
    assert '<span class="node-state">takes work, 8 of 8 free</span>' in node_row(html, f"{A100}01")


def test_load_from_outside_gantry_has_cells_of_its_own(client, world, placed):
    _, html = page(client, world.researcher_a)

    row = node_row(html, f"{A100}02")
    assert (
        '<span class="seg seg-outside" title="6 GPUs used by jobs from outside Gantry">'
        "<b>outside Gantry</b>" + "<i></i>" * 6 + "</span>"
    ) in row
    assert '<span class="node-state">takes work, 0 of 8 free</span>' in row


def test_outside_load_on_gpus_a_run_was_placed_on_shows_as_overbooked(client, world, placed):
    set_layout(world, sim_pools(outside={f"{A100}00": 6, f"{A100}02": 6}))

    node_map, html = page(client, world.researcher_a)

    node = nodes_of(node_map)[f"{A100}00"]
    assert cells(node_map)[f"{A100}00"] == [("run", 4, placed.alice.pk), ("outside", 4, None)]
    assert (node.free, node.overbooked) == (0, 2)
    assert gpu_occupancy(now=datetime.now(UTC)).free["a100-80gb"] == 8  # node 01 only
    assert node_map.clusters[0].flavors[0].free == 8
    assert (
        '<span class="node-state">takes work, 0 of 8 free <span class="tag tag-warning" '
        'title="Load from outside Gantry uses GPUs that Gantry\'s runs were placed on">'
        "2 overbooked</span></span>"
    ) in node_row(html, f"{A100}00")


def test_fragmentation_figures_per_flavor(client, world, placed):
    node_map, html = page(client, world.researcher_a)

    [cluster] = node_map.clusters
    figures = {
        f.flavor: (f.nodes, f.gpus, f.free, [(g.nodes, g.gpus_per_node) for g in f.largest_gangs])
        for f in cluster.flavors
    }
    # a100: 4 free on 00, 8 on 01; 02 is full, 03 drained.
    assert figures == {
        "a100-80gb": (4, 32, 12, [(1, 8), (1, 7), (1, 6), (1, 5), (2, 4), (2, 3), (2, 2), (2, 1)]),
        "h100-80gb": (2, 16, 16, [(2, size) for size in range(8, 0, -1)]),
    }
    assert gpu_occupancy(now=datetime.now(UTC)).free == {"a100-80gb": 12, "h100-80gb": 16}
    assert '<dd data-figure="free">12</dd>' in html
    assert '<dd data-figure="largest-gangs">1 × 5–8, 2 × 1–4</dd>' in html
    assert '<dd data-figure="largest-gangs">2 × 1–8</dd>' in html


def test_gang_sizes_are_every_gpus_per_node_up_to_the_largest_node():
    assert gang_sizes([8, 8, 8]) == [8, 7, 6, 5, 4, 3, 2, 1]
    assert gang_sizes([6, 4]) == [6, 5, 4, 3, 2, 1]
    assert gang_sizes([1]) == [1]
    assert gang_sizes([]) == []


def test_the_largest_gangs_read_for_every_per_node_size():
    def text(free_per_node: list[int], node_gpus: int = 8) -> str:
        return gangs_text(
            GangSize(sum(1 for free in free_per_node if free >= size), size)
            for size in gang_sizes([node_gpus])
        )

    # The case: 4 nodes with 6 free each start a gang of 4 x 6 (it read "0 x 8, or 4 x 4").
    assert text([6, 6, 6, 6]) == "4 × 1–6; none with 7–8"
    assert text([8, 6, 6, 2]) == "1 × 7–8, 3 × 3–6, 4 × 1–2"
    assert text([8, 8]) == "2 × 1–8"
    assert text([0, 0]) == "none with 1–8"
    assert text([3], node_gpus=4) == "1 × 1–3; none with 4"


def test_a_stale_inventory_takes_no_work_and_says_so(client, world, placed):
    read = datetime(2025, 1, 15, 12, 0, tzinfo=UTC)
    Cluster.objects.filter(pk=world.cluster.pk).update(
        inventory_at=read,
        inventory_valid_until=read + timedelta(seconds=60),
        inventory_error="slurmctld at hpc-1 did not answer within 10 s",
        inventory_problems=["node gpu-17: GPUs of unknown flavor v100, left out"],
    )

    node_map, html = page(client, world.researcher_a)

    [cluster] = node_map.clusters
    assert cluster.stale is True
    assert cluster.problems is None  # for platform admins only
    reason = "not seen by sim-1's inventory since 2025-01-15 12:00:00 UTC"
    assert {name: (n.schedulable, n.reason, n.free) for name, n in nodes_of(node_map).items()} == {
        f"{A100}00": (False, reason, 0),
        f"{A100}01": (False, reason, 0),
        f"{A100}02": (False, reason, 0),
        f"{A100}03": (False, "drained: bad DIMM", 0),
        "sim-1-h100-80gb-00": (False, reason, 0),
        "sim-1-h100-80gb-01": (False, reason, 0),
    }
    # Runs still hold their GPUs; nothing is free.
    assert cells(node_map)[f"{A100}00"] == [("run", 4, placed.alice.pk), ("unused", 4, None)]
    assert [
        (f.free, [(g.nodes, g.gpus_per_node) for g in f.largest_gangs]) for f in cluster.flavors
    ] == [
        (0, [(0, size) for size in range(8, 0, -1)]),
        (0, [(0, size) for size in range(8, 0, -1)]),
    ]
    assert '<span class="tag tag-warning">inventory out of date</span>' in html
    assert (
        'out of date since <time datetime="2025-01-15T12:01:00+00:00">2025-01-15 12:01:00 UTC'
        "</time>: its nodes take no new work until the next refresh"
    ) in html
    assert "<dd>slurmctld at hpc-1 did not answer within 10 s</dd>" in html
    assert f'<span class="node-state">{escape(reason)}</span>' in node_row(html, f"{A100}01")
    assert "gpu-17" not in html

    admin_map, admin_html = page(client, world.platform_admin)
    assert admin_map.clusters[0].problems == ("node gpu-17: GPUs of unknown flavor v100, left out",)
    assert "<li>node gpu-17: GPUs of unknown flavor v100, left out</li>" in admin_html


def test_a_disabled_cluster_is_not_on_the_map(client, world, placed):
    Cluster.objects.create(name="sim-2", backend=Cluster.Backend.SIMULATOR, enabled=False)

    node_map, _ = page(client, world.platform_admin)

    assert [cluster.name for cluster in node_map.clusters] == ["sim-1"]


# --- who may see it --------------------------------------------------------------------------


def test_a_user_without_any_role_gets_404(client, world, placed):
    nobody = make_user("nora")
    client.force_login(nobody)
    assert client.get(reverse("jobs:cluster_nodes")).status_code == 404

    inactive = Tenant.objects.create(slug="gone", name="Gone", active=False)
    Membership.objects.create(user=nobody, tenant=inactive, role="researcher")
    client.force_login(nobody)  # a fresh request: roles are cached per request
    assert client.get(reverse("jobs:cluster_nodes")).status_code == 404


def test_anonymous_users_are_sent_to_the_login_page(client, world):
    response = client.get(reverse("jobs:cluster_nodes"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_the_page_is_read_only(client, world):
    client.force_login(world.platform_admin)
    assert client.post(reverse("jobs:cluster_nodes")).status_code == 405


# --- cost ------------------------------------------------------------------------------------


def test_the_map_uses_a_fixed_number_of_queries(
    client, world, placed, django_assert_max_num_queries
):
    client.force_login(world.researcher_a)
    with CaptureQueriesContext(connection) as few:
        assert client.get(reverse("jobs:cluster_nodes")).status_code == 200
    # Ten times the nodes, and many more runs of both tenants on them.
    set_layout(world, sim_pools(a100_nodes=40, domains=(2, 4)))
    Quota.objects.filter(flavor=world.a100).update(guaranteed_gpus=100)
    for index in range(12):
        user, tenant, project = (
            (world.researcher_a2, "vision", "detection")
            if index % 2
            else (world.researcher_b, "nlp", "llm")
        )
        run_submit(
            user=user,
            data=experiment_input(
                world, tenant=tenant, project=project, nodes=1 + index % 2, gpus_per_node=2
            ),
        )
    admission_run_cycle()
    assert Run.objects.filter(state="ADMITTED").count() == 14

    with django_assert_max_num_queries(10), CaptureQueriesContext(connection) as many:
        response = client.get(reverse("jobs:cluster_nodes"))

    assert len(nodes_of(response.context["node_map"])) == 42
    assert len(many) == len(few)


# 1,000 nodes of 8 GPUs in 100 leaf switches, ten drained, outside load on every tenth node,
# 300 runs of both tenants (1 to 3 nodes of 1 to 4 GPUs). Each node is one compact row of
# cells: the page measured about 470 kB for the platform admin (under 500 bytes a node). The
# bound, 1.5 MB, leaves room for about three times as many groups of GPUs per node (runs of
# one GPU each) and is still a page a browser lays out in well under a second; a table per
# node, or a link per GPU, would break it.
LARGE_NODES = 1000
LARGE_RUNS = 300
LARGE_PAGE_MAX_BYTES = 1_500_000


def test_a_cluster_of_1000_nodes_renders_in_bounded_size(client, world):
    set_layout(
        world,
        sim_pools(
            a100_nodes=LARGE_NODES,
            domains=(4, 25),
            drained={f"{A100}{i:02d}": "bad DIMM" for i in range(5, LARGE_NODES, 100)},
            outside={f"{A100}{i:02d}": 3 for i in range(0, LARGE_NODES, 10)},
        ),
    )
    Quota.objects.filter(flavor=world.a100).update(guaranteed_gpus=LARGE_NODES * 8)
    for index in range(LARGE_RUNS):
        user, tenant, project = (
            (world.researcher_a, "vision", "detection")
            if index % 2
            else (world.researcher_b, "nlp", "llm")
        )
        run_submit(
            user=user,
            data=experiment_input(
                world,
                tenant=tenant,
                project=project,
                nodes=1 + index % 3,
                gpus_per_node=1 + index % 4,
            ),
        )
    admission_run_cycle()
    assert Run.objects.filter(state="ADMITTED").count() == LARGE_RUNS

    sizes = {}
    for persona in ("platform_admin", "researcher_a"):
        node_map, html = page(client, getattr(world, persona))
        sizes[persona] = len(html.encode())
        assert len(nodes_of(node_map)) == LARGE_NODES + 2
        assert html.count('<li class="node') == LARGE_NODES + 2
        assert html.count("<table") == 0
    print(f"node map of {LARGE_NODES} nodes and {LARGE_RUNS} runs: {sizes} bytes")
    assert max(sizes.values()) < LARGE_PAGE_MAX_BYTES
