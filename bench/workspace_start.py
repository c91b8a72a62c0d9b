"""From *Launch* to a usable notebook on the simulator (issue 37, point 7): a workspace
launched through the service, admitted, submitted; the simulator starts Gantry's launcher
as a real process, which starts JupyterLab and reports its port to the portal (a gunicorn
serving this benchmark's database); usable is its first answer to ``api/status`` with its
secret. Each step's time is what the workspace's card shows its owner.

The admission cycle, the submit and the sync are called here one after the other, the sync
every ``SYNC_EVERY_S`` (a deployment runs the admission cycle and the submit on commit and
the sync every ``GANTRY_SYNC_INTERVAL_S``, 3 s by default: up to that much more before the
simulator lets the job start).

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

from bench.report import Section, quick
from bench.workspace_proxy import seed
from clusters.backends import sim_workspace
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
from tests.workspace_support import free_port

LAUNCHES = 5
QUICK_LAUNCHES = 1
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


def launch_once(world, user, number: int) -> dict[str, float]:
    """One launch: seconds from *Launch* to each step."""
    started = time.perf_counter()
    run = workspace_launch(
        user=user,
        data=WorkspaceInput(
            tenant="vision", project="detection", image=world.image.reference,
            flavor="a100-80gb", gpus=1, name=f"bench-{number}", hours=1,
        ),
    )  # fmt: skip
    steps = {"launched": time.perf_counter() - started}
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    steps["admitted"] = time.perf_counter() - started
    attempt_submit(attempt_id=attempt.pk)
    steps["submitted"] = time.perf_counter() - started
    deadline = time.monotonic() + 120
    while "ready" not in steps:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workspace {run.pk} did not report its server in 120 s")
        cluster_sync(cluster=world.cluster)
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
        cluster_sync(cluster=world.cluster)
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


def run() -> list[Section]:
    world, user = seed()
    count = QUICK_LAUNCHES if quick() else LAUNCHES
    web_port = free_port()
    web = Web(web_port)
    settings.GANTRY_PUBLIC_URL = f"http://127.0.0.1:{web_port}"
    try:
        launches = [launch_once(world, user, number) for number in range(count)]
    finally:
        web.stop()
        sim_workspace.stop_all()  # whatever a failed launch left running
    bare = [bare_start() for _ in range(count)]
    section = Section(
        title="Workspaces: from Launch to a usable notebook on the simulator (issue 37, point 7)",
        intro=(
            f"{count} workspaces launched one after the other on an idle simulator (1 GPU "
            "each); seconds from *Launch* to each step the card shows, median and worst. "
            "Baseline: the launcher's own `jupyter lab` command started by hand, to its "
            f"first answer. Goal: usable within {GOAL_S:g} s when GPUs are free."
        ),
        columns=["step", "median", "worst"],
    )
    for step in ("launched", "admitted", "submitted", "running", "ready", "usable"):
        values = [launch[step] for launch in launches]
        section.rows.append([step, f"{statistics.median(values):.2f} s", f"{max(values):.2f} s"])
    usable = statistics.median(launch["usable"] for launch in launches)
    floor = statistics.median(bare)
    section.rows.append(["bare `jupyter lab` (baseline)", f"{floor:.2f} s", f"{max(bare):.2f} s"])
    section.notes.append(
        f"Launch to usable: {usable:.2f} s, {usable / floor:.2f}× a bare start of JupyterLab "
        f"(goal ≤ {GOAL_S:g} s: {'met' if usable <= GOAL_S else 'missed'})."
    )
    return [section]
