"""A workspace on the real Slurm test cluster (scripts/slurm-cluster.sh; see
tests/clusters/backends/test_slurm_cluster.py): its batch job runs gantry-workspace on the
allocated node, which starts JupyterLab on a free port and reports the port to the live
portal; Gantry records the node's NodeAddr from Slurm, the server there answers with its
secret only, and cancelling the run stops it."""

import socket
import sys
import time
import urllib.error
import urllib.request

import pytest

from clusters.backends import JobRef
from clusters.models import Cluster
from jobs.models import Attempt, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.workspaces import WorkspaceInput, workspace_launch, workspace_server_token
from tests import REPOSITORY
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

pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("slurm-cluster")]

READY_WITHIN_S = 120


@pytest.fixture
def launcher_on_the_nodes(tmp_path, slurm_world):  # noqa: F811 (the fixture)
    """gantry-workspace on the job's PATH, as an operator installs it on the nodes (the test
    cluster's jobs are processes of this machine), and the server on the node's loopback
    address (NodeAddr 127.0.0.1). Whatever the test leaves on the cluster is cancelled."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "gantry-workspace"
    launcher.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={REPOSITORY / 'sdk'}\n"
        f'exec {sys.executable} -m gantry_sdk.workspace "$@"\n'
    )
    launcher.chmod(0o755)
    tmp_path.chmod(0o755)
    cluster = slurm_world.slurm
    cluster.settings = cluster.settings | {
        "job_path": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "workspace_bind": "127.0.0.1",
    }
    Cluster.objects.filter(pk=cluster.pk).update(settings=cluster.settings)
    yield slurm_world
    cancel_leftovers()


def status_code(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def refuses(port: int, *, within: float = 30) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except OSError:
            return True
        time.sleep(0.5)
    return False


def test_a_workspace_on_slurm_reports_its_port_and_answers_at_the_nodes_address(
    launcher_on_the_nodes, live_server, settings
):
    world = launcher_on_the_nodes
    settings.GANTRY_PUBLIC_URL = live_server.url
    run = workspace_launch(
        user=world.researcher_a,
        data=WorkspaceInput(
            tenant="vision",
            project="detection",
            image=world.image.reference,
            flavor="a100-80gb",
            gpus=1,
            name="slurm-notebook",
        ),
    )
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
