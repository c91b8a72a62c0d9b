"""A workspace on the real Slurm test cluster (scripts/slurm-cluster.sh; see
tests/clusters/backends/test_slurm_cluster.py): its batch job runs gantry-workspace on the
allocated node, which starts JupyterLab on a free port and reports the port to the live
portal; Gantry records the node's NodeAddr from Slurm, the server there answers with its
secret only, and cancelling the run stops it. In a browser, the journey of
tests/portal/test_workspace_browser.py: launched from the form, opened through Gantry's
proxy, a cell run over the kernel's WebSocket, refused to others, stopped from its card."""

import time
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from clusters.backends import JobRef
from clusters.models import Cluster
from jobs.models import Attempt, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.workspaces import workspace_server_token
from tests.browser_support import screenshot
from tests.clusters.backends.test_slurm_cluster import (  # noqa: F401 (fixtures)
    accounts,
    backend,
    cancel_leftovers,
    rest_answers,
    slurm,
    slurm_env,
    slurm_state,
    slurm_world,
    unique_attempt_ids,
)
from tests.workspace_browser_support import (
    PRINT_42,
    RUN_A_CELL,
    launch_from_form,
    open_lab,
    outsiders_see,
    server_ready,
    stop_from_card,
)
from tests.workspace_support import (
    launch_workspace,
    node_launcher,
    proxy_serving,
    refuses,
    status_code,
)

pytest_plugins = ["tests.browser_support"]
pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("slurm-cluster")]

READY_WITHIN_S = 120


@pytest.fixture
def launcher_on_the_nodes(tmp_path, slurm_world):  # noqa: F811 (the fixture)
    """gantry-workspace on the jobs' PATH, as an operator installs it on the nodes, and the
    server on the node's loopback address (``node_launcher``). Whatever the test leaves on
    the cluster is cancelled."""
    cluster = slurm_world.slurm
    cluster.settings = cluster.settings | node_launcher(tmp_path)
    Cluster.objects.filter(pk=cluster.pk).update(settings=cluster.settings)
    yield slurm_world
    cancel_leftovers()


def test_a_workspace_on_slurm_reports_its_port_and_answers_at_the_nodes_address(
    launcher_on_the_nodes, live_server, settings
):
    world = launcher_on_the_nodes
    settings.GANTRY_PUBLIC_URL = live_server.url
    run = launch_workspace(world, name="slurm-notebook")
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    assert attempt.cluster_id == world.slurm.pk
    attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    assert "GANTRY_WORKSPACE_TOKEN=<redacted>" in attempt.rendered_spec
    assert workspace_server_token(attempt.pk) not in attempt.rendered_spec

    deadline = time.monotonic() + READY_WITHIN_S
    workspace = Workspace.objects.get(run=run)
    while workspace.port is None and time.monotonic() < deadline:
        cluster_sync(cluster=world.slurm)
        time.sleep(0.5)
        workspace.refresh_from_db()
    assert workspace.port is not None, slurm("squeue", "-h", "-j", attempt.backend_job_id)
    cluster_sync(cluster=world.slurm)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.node_list) == (RunState.RUNNING, [attempt.placement[0]])
    # The host is the node's NodeAddr as slurmctld gives it, never the job's word.
    assert (workspace.attempt_id, workspace.host) == (attempt.pk, "127.0.0.1")
    assert 1024 <= workspace.port <= 65535

    # slurmrestd names the same address.
    ref = JobRef(attempt.name, attempt.backend_job_id)
    assert backend("rest").workspace_address(ref, port=workspace.port) == (
        "127.0.0.1",
        workspace.port,
    )

    status_url = f"http://{workspace.host}:{workspace.port}/w/{run.pk}/api/status"
    assert status_code(status_url, workspace_server_token(attempt.pk)) == 200
    assert status_code(status_url) == 403

    run_cancel(run=run, actor=world.researcher_a)
    attempt_cancel(attempt_id=attempt.pk)
    assert slurm_state(attempt.backend_job_id) == "CANCELLED"
    assert refuses(workspace.port)


@pytest.mark.django_db(transaction=True)
def test_a_workspace_on_slurm_in_a_browser_from_launch_to_stop(
    launcher_on_the_nodes, persona_page, live_server, settings, tmp_path
):
    """The browser journey of tests/portal/test_workspace_browser.py on the real cluster:
    the form's workspace is admitted onto Slurm (the simulator is off), its batch job starts
    gantry-workspace on the node, which starts JupyterLab and reports its port."""
    world = launcher_on_the_nodes
    settings.GANTRY_PUBLIC_URL = live_server.url  # where the launcher reports its port
    with proxy_serving(host=urlsplit(live_server.url).hostname) as proxy:
        settings.GANTRY_WORKSPACE_URL = proxy
        owner = persona_page(world.researcher_a)
        run = launch_from_form(owner, name="slurm-browser", image=world.image.reference)

        admission_run_cycle()
        attempt = Attempt.objects.get(run=run)
        assert attempt.cluster_id == world.slurm.pk
        attempt_submit(attempt_id=attempt.pk)
        workspace = server_ready(world.slurm, run, timeout_s=READY_WITHIN_S)
        attempt.refresh_from_db()
        assert slurm("squeue", "-h", "-j", attempt.backend_job_id, "-o", "%T").strip() == (
            "RUNNING"
        )
        owner.reload()
        expect(owner.locator("#workspace-card")).to_have_attribute("data-phase", "running")
        screenshot(owner, "slurm-workspace-card", tmp_path)
        lab = open_lab(owner, proxy=proxy, run=run)
        assert lab.evaluate(RUN_A_CELL, PRINT_42) == "42\n"

        # Nobody else opens it: the same 404 as for a workspace that does not exist.
        outsiders = (world.researcher_b, world.researcher_a2)
        seen = outsiders_see(persona_page, outsiders, proxy=proxy, run=run)
        assert [answer for answer, _ in seen] == [missing for _, missing in seen]
        assert [missing[0] for _, missing in seen] == [404, 404]

        # Stop: Slurm cancels the job, and the server on the node is gone with it.
        assert stop_from_card(owner, cluster=world.slurm, run=run).state == RunState.CANCELLED
        expect(owner.locator("#workspace-card")).to_have_attribute("data-phase", "ended")
        assert slurm_state(attempt.backend_job_id) == "CANCELLED"
        assert refuses(workspace.port)
