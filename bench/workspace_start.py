"""From *Launch* to a usable notebook (issue 37, point 7), on the simulator and on the real
Slurm test cluster (``scripts/slurm-cluster.sh``, brought up here unless it is, stopped
again if this run started it): a workspace launched through the service, admitted,
submitted; its job starts Gantry's launcher (the simulator as a process of its own, Slurm
as its batch job on the node, with ``gantry-workspace`` installed on the jobs' PATH as an
operator installs it), which starts JupyterLab and reports its port to the portal (a
gunicorn serving this benchmark's database); usable is the server's first answer to
``api/status`` with its secret. Each step's time is what the workspace's card shows its
owner. Admission picks the cluster: the other one is disabled meanwhile.

The admission cycle, the submit and the sync are called here one after the other, the sync
every ``SYNC_EVERY_S`` (a deployment runs the admission cycle and the submit on commit and
the sync every ``GANTRY_SYNC_INTERVAL_S``, 3 s by default: up to that much more before the
simulator lets the job start; Slurm starts it on its own, and the launcher's report makes
the workspace ready without a sync).

Baseline, measured in the same run: the same ``jupyter lab`` command started by hand on
this machine, to its first answer, the floor any portal adds to.
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.db import connection

from bench.report import Section, quick
from bench.slurm import cancel, cluster_settings, running_test_cluster
from bench.workspace_proxy import seed
from clusters.backends import sim_workspace
from clusters.backends.slurm import QuotaLimit, mirror_quotas
from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from jobs.models import Attempt, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.workspaces import (
    WorkspaceInput,
    workspace_base_path,
    workspace_launch,
    workspace_server_token,
)
from tests.workspace_support import free_port, node_launcher

LAUNCHES = 5  # on the simulator
SLURM_LAUNCHES = 3
QUICK_LAUNCHES = 1
STEPS = ("launched", "admitted", "submitted", "running", "ready", "usable")
SYNC_EVERY_S = 0.25
GOAL_S = 15.0
SDK = Path(__file__).resolve().parent.parent / "sdk"


def answers(url: str, token: str) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:  # noqa: S310 (our URL)
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Web:
    """gunicorn on this benchmark's database: where the launcher reports its port."""

    def __init__(self, port: int) -> None:
        self.process = subprocess.Popen(  # noqa: S603 (our own fixed command)
            [
                sys.executable, "-m", "gunicorn", "portal.wsgi:application",
                "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4",
            ],
            env=os.environ | {"DJANGO_SETTINGS_MODULE": "tests.settings"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("gunicorn did not start")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def launch_once(world, user, cluster: Cluster, number: int) -> dict[str, float]:
    """One launch onto ``cluster``: seconds from *Launch* to each step."""
    started = time.perf_counter()
    run = workspace_launch(
        user=user,
        data=WorkspaceInput(
            tenant="vision", project="detection", image=world.image.reference,
            flavor="a100-80gb", gpus=1, name=f"bench-{cluster.name}-{number}", hours=1,
        ),
    )  # fmt: skip
    steps = {"launched": time.perf_counter() - started}
    admission_run_cycle()
    attempt = Attempt.objects.filter(run=run).first()
    if attempt is None or attempt.cluster_id != cluster.pk:
        run.refresh_from_db()
        raise RuntimeError(
            f"workspace {run.pk} was not placed on {cluster.name}: {run.wait_message}"
        )
    steps["admitted"] = time.perf_counter() - started
    attempt_submit(attempt_id=attempt.pk)
    steps["submitted"] = time.perf_counter() - started
    deadline = time.monotonic() + 120
    while "ready" not in steps:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workspace {run.pk} did not report its server in 120 s")
        cluster_sync(cluster=cluster)
        attempt.refresh_from_db(fields=["started_at"])
        if attempt.started_at is not None and "running" not in steps:
            steps["running"] = time.perf_counter() - started
        workspace = Workspace.objects.get(run=run)
        if workspace.ready_at is not None:
            steps["ready"] = time.perf_counter() - started
        else:
            time.sleep(SYNC_EVERY_S)
    url = f"http://{workspace.host}:{workspace.port}{workspace_base_path(run.pk)}api/status"
    while not answers(url, workspace_server_token(attempt.pk)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"workspace {run.pk}'s server did not answer at {url}")
        time.sleep(0.05)
    steps["usable"] = time.perf_counter() - started
    # The cancel's task is dropped (the benchmarks' broker is in memory): the service here.
    run_cancel(run=run, actor=None, system_reason="the benchmark is done with it")
    attempt_cancel(attempt_id=attempt.pk)
    while time.monotonic() < deadline + 60:
        cluster_sync(cluster=cluster)
        attempt.refresh_from_db()
        if attempt.state in ("CANCELLED", "FAILED", "SUCCEEDED"):
            return steps
        time.sleep(SYNC_EVERY_S)
    raise RuntimeError(f"workspace {run.pk} did not stop")


def bare_start() -> float:
    """Seconds from starting the launcher's ``jupyter lab`` command to its first answer."""
    sys.path.insert(0, str(SDK))
    from gantry_sdk.workspace import server_command

    token = "b" * 48
    with tempfile.TemporaryDirectory(prefix="bench-lab-") as root:
        port = free_port()
        command = server_command(
            "jupyter", bind="127.0.0.1", port=port, base_url="/w/0/", root=root
        )
        started = time.perf_counter()
        process = subprocess.Popen(  # noqa: S603 (the launcher's own command)
            command,
            env=os.environ | {"JUPYTER_TOKEN": token, "JUPYTER_RUNTIME_DIR": root},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            while not answers(f"http://127.0.0.1:{port}/w/0/api/status", token):
                if process.poll() is not None:
                    raise RuntimeError("jupyter lab exited")
                time.sleep(0.05)
            return time.perf_counter() - started
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)


def slurm_cluster(env: dict[str, str], nodes: Path) -> Cluster:
    """The test cluster as a cluster of Gantry's (its ``gpu`` partition, the CLI transport,
    the launcher installed under ``nodes``), tenant vision's account mirrored as the tests
    mirror it."""
    cluster = Cluster.objects.create(
        name="slurm-test",
        backend=Cluster.Backend.SLURM,
        settings=cluster_settings(env, "cli", partition="gpu") | node_launcher(nodes),
    )
    mirror_quotas(cluster, [QuotaLimit("vision", "a100-80gb", 16)])
    # Jobs are named after attempt ids (gantry-a<id>), which start at 1 in this flushed
    # database: past those of earlier runs and test sessions, which Slurm still holds.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('jobs_attempt', 'id'), %s)",
            [int(time.time() * 1000)],
        )
    return cluster


def launches_on(world, user, cluster: Cluster, count: int) -> list[dict[str, float]]:
    """``count`` launches one after the other, admission offered ``cluster`` only."""
    Cluster.objects.exclude(pk=cluster.pk).update(enabled=False)
    Cluster.objects.filter(pk=cluster.pk).update(enabled=True)
    launches = []
    for number in range(count):
        # A deployment's sync keeps the inventory fresh; admission places nothing on nodes
        # it has not seen for a while.
        cluster_refresh_inventory(cluster=cluster)
        launches.append(launch_once(world, user, cluster, number))
    return launches


def run() -> list[Section]:
    world, user = seed()
    count = QUICK_LAUNCHES if quick() else LAUNCHES
    slurm_count = QUICK_LAUNCHES if quick() else SLURM_LAUNCHES
    with (
        running_test_cluster() as env,  # before gunicorn: its environment has the cluster's
        tempfile.TemporaryDirectory(prefix="bench-nodes-") as nodes,
    ):
        slurm = slurm_cluster(env, Path(nodes))
        web_port = free_port()
        web = Web(web_port)
        settings.GANTRY_PUBLIC_URL = f"http://127.0.0.1:{web_port}"
        try:
            on_simulator = launches_on(world, user, world.cluster, count)
            on_slurm = launches_on(world, user, slurm, slurm_count)
        finally:
            web.stop()
            sim_workspace.stop_all()  # whatever a failed launch left running
            # Whatever a failed launch left on the cluster (a cancelled job's id is ignored).
            jobs = Attempt.objects.filter(cluster=slurm).exclude(backend_job_id="")
            cancel(list(jobs.values_list("backend_job_id", flat=True)))
    bare = [bare_start() for _ in range(count)]
    return [launch_section(on_simulator, on_slurm, bare)]


def launch_section(
    on_simulator: list[dict[str, float]], on_slurm: list[dict[str, float]], bare: list[float]
) -> Section:
    """The table: each step's median and worst on each cluster, and the baseline."""
    section = Section(
        title="Workspaces: from Launch to a usable notebook (issue 37, point 7)",
        intro=(
            f"{len(on_simulator)} workspaces launched one after the other on an idle "
            f"simulator, then {len(on_slurm)} on the idle Slurm test cluster (Slurm 22.05, "
            "`scripts/slurm-cluster.sh`: the batch job runs `gantry-workspace` on the node), "
            "1 GPU each; seconds from *Launch* to each step the card shows, median and worst. "
            "Baseline: the launcher's own `jupyter lab` command started by hand, to its "
            f"first answer. Goal: usable within {GOAL_S:g} s when GPUs are free."
        ),
        columns=["step", "simulator: median", "worst", "Slurm: median", "worst"],
    )
    for step in STEPS:
        section.rows.append(
            [step, *_median_and_worst(on_simulator, step), *_median_and_worst(on_slurm, step)]
        )
    floor = statistics.median(bare)
    baseline = [f"{floor:.2f} s", f"{max(bare):.2f} s"]
    section.rows.append(["bare `jupyter lab` (baseline)", *baseline, *baseline])
    for where, launches in (("simulator", on_simulator), ("Slurm", on_slurm)):
        usable = statistics.median(launch["usable"] for launch in launches)
        section.notes.append(
            f"Launch to usable on {where}: {usable:.2f} s, {usable / floor:.2f}× a bare start "
            f"of JupyterLab (goal ≤ {GOAL_S:g} s: {'met' if usable <= GOAL_S else 'missed'})."
        )
    return section


def _median_and_worst(launches: list[dict[str, float]], step: str) -> list[str]:
    values = [launch[step] for launch in launches]
    return [f"{statistics.median(values):.2f} s", f"{max(values):.2f} s"]
