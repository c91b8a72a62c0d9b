"""``gantry workspace start | ls | open | stop`` against a live test server (real HTTP), in
process through ``gantry_cli.main.main`` as tests/gantry_cli/test_cli.py runs the others,
with its fixtures."""

# ruff: noqa: F811 (the fixtures imported from test_cli are parameters of the tests)

import re
import stat
import webbrowser

import pytest

from jobs.models import Attempt, AttemptState, Run, RunEvent, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from tests.gantry_cli.test_cli import (  # noqa: F401
    alice,
    cli,
    gantry_env,
    login,
    no_celery,
    server,
)
from tests.workspace_support import launch_workspace, workspace_running

PROXY = "https://ws.gantry.example.org"


@pytest.fixture(autouse=True)
def proxy_url(settings):
    settings.GANTRY_WORKSPACE_URL = PROXY


def start_args(world, *extra: str) -> list[str]:
    return [
        "workspace",
        "start",
        "--tenant",
        "vision",
        "--project",
        "detection",
        "--image",
        world.image.reference,
        "--flavor",
        "a100-80gb",
        "--gpus",
        "2",
        "--hours",
        "3",
        "--name",
        "cli-notebook",
        *extra,
    ]


def launch(world, user=None) -> Run:
    return launch_workspace(world, user=user, name="debug-loader", hours=4)


def server_answers(run: Run) -> None:
    """What the launcher reports once the workspace's server answers."""
    run.refresh_from_db()
    attempt = Attempt.objects.get(run=run)
    Workspace.objects.filter(run=run).update(
        attempt=attempt, host="127.0.0.1", port=8888, ready_at=attempt.started_at
    )


def starting_steps(world):
    """One step of a workspace's start per poll: admit, submit, place, its server answers."""

    def submit_attempts() -> None:
        for attempt in Attempt.objects.filter(state=AttemptState.CREATED):
            attempt_submit(attempt_id=attempt.pk)

    steps = [
        admission_run_cycle,
        submit_attempts,
        lambda: cluster_sync(cluster=world.cluster),
        lambda: server_answers(Run.objects.get(experiment__name="cli-notebook")),
    ]

    def step() -> None:
        if steps:
            steps.pop(0)()

    return step


def test_start_queues_a_workspace_and_says_so(cli, alice, world):
    code, out, err = cli("--url", alice, *start_args(world))

    run = Run.objects.get(experiment__name="cli-notebook")
    assert (code, err) == (0, "")
    assert out == f"Launched workspace {run.pk} (cli-notebook): queued.\n"
    assert (run.gpus, run.experiment.max_runtime_minutes, run.workspace.server) == (
        2,
        180,
        "jupyter",
    )


def test_start_wait_prints_each_step_and_the_url(cli, alice, world):
    code, out, err = cli(
        "--url",
        alice,
        *start_args(world, "--wait", "--poll-interval", "0"),
        poll_hook=starting_steps(world),
    )

    run = Run.objects.get(experiment__name="cli-notebook")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"Launched workspace {run.pk} (cli-notebook): queued."
    assert [line.strip().split("  ")[0] for line in lines[1:-1]] == [
        "Queued",
        "Admitted",
        "Submitted to the cluster",
        "Job running",
        "Server ready",
    ]
    assert all(re.search(r"  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$", line) for line in lines[1:-1])
    assert lines[-1] == f"Workspace {run.pk} is ready: {PROXY}/w/{run.pk}/lab"


def test_start_wait_gives_up_after_its_timeout_with_exit_1(cli, alice, world):
    code, _out, err = cli("--url", alice, *start_args(world, "--wait", "--timeout", "0"))
    run = Run.objects.get(experiment__name="cli-notebook")
    assert code == 1
    assert err == (
        f"gantry: error: Workspace {run.pk} is not ready after 0 s: it is queued. "
        "`gantry workspace ls` shows it; it keeps starting.\n"
    )


def test_start_past_the_tenants_hours_is_exit_4_naming_the_field(cli, alice, world):
    args = start_args(world)
    args[args.index("--hours") + 1] = "13"
    code, _out, err = cli("--url", alice, *args)
    assert code == 4
    assert err.splitlines() == [
        "gantry: error: the server rejected the request:",
        "  hours: Tenant vision allows a workspace at most 12 hours (extensions included).",
    ]
    assert not Run.objects.exists()


def test_ls_prints_a_table_of_mine(cli, alice, world):
    mine = launch(world)
    launch(world, user=world.researcher_a2)  # another member's: not listed

    code, out, err = cli("--url", alice, "workspace", "ls")

    assert code == 0, err
    width = max(len("ID"), len(str(mine.pk)))  # ids right-aligned, as wide as the widest
    assert out.splitlines() == [
        f"{'ID':>{width}}  NAME          TENANT/PROJECT    OWNER  SERVER   GPUS           PHASE"
        "   TIME LEFT",
        f"{mine.pk:>{width}}  debug-loader  vision/detection  alice  jupyter  1 x a100-80gb"
        "  queued  -",
    ]
    assert [card["id"] for card in cli.json("--url", alice, "workspace", "ls")] == [mine.pk]


def test_open_prints_the_url_once_ready_and_opens_a_browser_only_if_asked(
    cli, alice, world, tmp_path, monkeypatch
):
    run = launch(world)
    assert cli("--url", alice, "workspace", "open", str(run.pk))[1:] == (
        "",
        f"gantry: error: Workspace {run.pk} does not open: it is queued.\n",
    )
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=run).pk)
    cluster_sync(cluster=world.cluster)
    server_answers(run)
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {opened}\n')
    browser.chmod(browser.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("BROWSER", str(browser))
    monkeypatch.setattr(webbrowser, "_tryorder", None)  # read $BROWSER again

    printed = cli("--url", alice, "workspace", "open", str(run.pk))
    assert not opened.exists()
    browsed = cli("--url", alice, "workspace", "open", str(run.pk), "--browser")

    url = f"{PROXY}/w/{run.pk}/lab"
    assert printed == (0, url + "\n", "")
    assert browsed == (0, url + "\n", "")
    assert opened.read_text() == url


def test_a_tenant_admin_sees_but_does_not_open_anothers_workspace(cli, server, world):
    run = launch(world)
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=run).pk)
    cluster_sync(cluster=world.cluster)
    server_answers(run)
    login(cli, server, "tara")

    code, out, err = cli("--url", server, "workspace", "open", str(run.pk))

    assert (code, out) == (1, "")
    assert err == f"gantry: error: Workspace {run.pk} does not open: only its owner opens it.\n"


def test_stop_ends_a_queued_workspace(cli, alice, world):
    run = launch(world)
    code, out, err = cli("--url", alice, "workspace", "stop", str(run.pk))
    assert (code, out, err) == (0, f"Workspace {run.pk} is stopped.\n", "")
    assert Run.objects.get(pk=run.pk).state == RunState.CANCELLED


def test_another_members_workspace_is_exit_5_and_not_stopped(cli, alice, world):
    theirs = launch(world, user=world.researcher_a2)
    for verb in ("open", "stop"):
        code, out, err = cli("--url", alice, "workspace", verb, str(theirs.pk))
        assert (code, out, err) == (5, "", "gantry: error: No such run.\n")
    assert Run.objects.get(pk=theirs.pk).state == RunState.QUEUED


def test_usage_errors_are_exit_2(cli, gantry_env):
    assert cli("workspace")[0] == 2
    assert cli("workspace", "open", "not-a-number")[0] == 2
    assert cli("workspace", "start", "--tenant", "vision")[0] == 2


def test_suspend_and_resume_say_what_they_did_or_why_not(cli, alice, world):
    run = launch(world)
    code, out, err = cli("--url", alice, "workspace", "resume", str(run.pk))
    assert (code, out) == (1, "")
    assert (
        err == "gantry: error: The server answered 409: The workspace is queued, not suspended.\n"
    )
    Run.objects.filter(pk=run.pk).update(state=RunState.SUSPENDED)
    code, out, err = cli("--url", alice, "workspace", "resume", str(run.pk))
    assert (code, err) == (0, "")
    assert out == f"Workspace {run.pk} is back in the queue (queued).\n"
    code, out, err = cli("--url", alice, "workspace", "suspend", str(run.pk))
    assert (code, out) == (1, "")
    assert err == (
        "gantry: error: The server answered 409: The workspace is queued: nothing to suspend.\n"
    )
    assert Run.objects.get(pk=run.pk).state == RunState.QUEUED


def test_ls_prints_an_idle_warning_below_the_table(cli, alice, world):
    run = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=8888)
    message = f"Workspace {run.pk} has been idle since 10:05 UTC; it will be suspended."
    RunEvent.objects.create(run=run, reason="IDLE_WARNING", message=message)
    Workspace.objects.filter(run=run).update(warned_at=run.started_at)

    code, out, err = cli("--url", alice, "workspace", "ls")

    assert code == 0, err
    lines = out.splitlines()
    assert (len(lines), "  idle warning  " in lines[1], lines[-2:]) == (4, True, ["", message])
