"""The ``gantry`` CLI against a live test server (real HTTP), in process through
``gantry_cli.main.main`` and once through the installed console script.

No Celery worker runs: ``Task.delay`` is a no-op and the tests move runs along themselves
(admission, submit, cluster sync), between polls through ``main``'s ``poll_hook``.
"""

import json
import os
import socket
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.core.cache import cache
from django.core.management import call_command
from django.utils import timezone

from clusters.models import SimulatedJob
from gantry_cli.client import Client
from gantry_cli.main import main
from jobs.models import Attempt, AttemptState, Experiment, Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tenants.models import ApiToken
from tests.conftest import COMMIT, PASSWORD, experiment_input

GANTRY = Path(sys.executable).with_name("gantry")


@pytest.fixture(autouse=True)
def no_celery(monkeypatch):
    """Work is enqueued on commit in the live server; nothing consumes it here."""
    monkeypatch.setattr("celery.app.task.Task.delay", lambda self, *args, **kwargs: None)


@pytest.fixture
def gantry_env(tmp_path, monkeypatch):
    config = tmp_path / "config"
    monkeypatch.setenv("GANTRY_CONFIG_DIR", str(config))
    monkeypatch.delenv("GANTRY_URL", raising=False)
    monkeypatch.delenv("GANTRY_TOKEN", raising=False)
    return config


@pytest.fixture
def server(live_server, world, gantry_env):
    # The token endpoint's throttle counts logins in the (database) cache, whose rows the
    # live server's committed transactions leave behind for the next test.
    cache.clear()
    return live_server.url


class Cli:
    def __init__(self, capsys, monkeypatch):
        self.capsys = capsys
        self.monkeypatch = monkeypatch

    def __call__(self, *argv: str, stdin: str = "", poll_hook=None):
        self.capsys.readouterr()
        self.monkeypatch.setattr("sys.stdin", _Stdin(stdin))
        code = main(list(argv), poll_hook=poll_hook)
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str):
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


class _Stdin:
    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        self.text = text

    def readline(self) -> str:
        return self.lines.pop(0) if self.lines else ""

    def read(self) -> str:
        return self.text


@pytest.fixture
def cli(capsys, monkeypatch):
    return Cli(capsys, monkeypatch)


def login(cli, url: str, username: str = "alice") -> None:
    code, _out, err = cli(
        "--url", url, "login", "--username", username, "--password-stdin", stdin=PASSWORD + "\n"
    )
    assert code == 0, err


@pytest.fixture
def alice(cli, server):
    login(cli, server)
    return server


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def spec_file(tmp_path: Path, world, **overrides) -> Path:
    spec = {
        "version": 1,
        "kind": "experiment",
        "tenant": "vision",
        "project": "detection",
        "name": "resnet-cli",
        "image": world.image.reference,
        "command": "python train.py --epochs 3",
        "resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 2},
        "code": {"repository": "https://git.example.org/vision/detection.git", "commit": COMMIT},
        "dataset": {"uri": "s3://datasets/imagenet", "version": "2024-01"},
        "params": {"lr": 0.1, "batch_size": 256},
        "env": {"GANTRY_SIM_DURATION_S": "600"},
        **overrides,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def simulator_steps(world):
    """One step of a run's life per call: admit, submit to the cluster, place on nodes,
    then let 1000 simulated seconds pass (speedup 1000) so the workload finishes."""

    def age_simulated_jobs() -> None:
        for job in SimulatedJob.objects.exclude(started_at=None):
            job.started_at -= timedelta(seconds=1)
            job.save(update_fields=["started_at"])

    def submit_attempts() -> None:
        for attempt in Attempt.objects.filter(state=AttemptState.CREATED):
            attempt_submit(attempt_id=attempt.pk)

    steps = [
        admission_run_cycle,
        submit_attempts,
        lambda: cluster_sync(cluster=world.cluster),
        age_simulated_jobs,
        lambda: cluster_sync(cluster=world.cluster),
    ]

    def step() -> None:
        if steps:
            steps.pop(0)()

    return step


# --- login and tokens ------------------------------------------------------------------


def test_login_stores_the_token_0600_and_never_prints_it(cli, server, gantry_env):
    code, out, err = cli(
        "--url", server, "login", "--username", "alice", "--password-stdin", stdin=PASSWORD
    )

    assert code == 0, err
    credentials = gantry_env / "credentials.json"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert stat.S_IMODE(gantry_env.stat().st_mode) == 0o700
    stored = json.loads(credentials.read_text())
    assert stored["url"] == server
    token = ApiToken.objects.get(user__username="alice")
    assert token.name == "gantry-cli"
    assert ApiToken.hash_secret(stored["token"]) == token.key_hash
    assert stored["token"] not in out + err
    assert f"Logged in to {server} as alice" in out


def test_wrong_password_is_exit_3_and_stores_nothing(cli, server, gantry_env):
    code, _out, err = cli(
        "--url", server, "login", "--username", "alice", "--password-stdin", stdin="wrong\n"
    )

    assert code == 3
    assert "Wrong username or password." in err
    assert not (gantry_env / "credentials.json").exists()


def test_not_logged_in_is_exit_3(cli, server):
    code, _out, err = cli("--url", server, "ls")

    assert code == 3
    assert "Not logged in" in err


def test_expired_token_is_exit_3_with_the_reason(cli, alice):
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    code, _out, err = cli("ls")

    assert code == 3
    assert "Token expired." in err
    assert "gantry login" in err


def test_revoked_token_is_exit_3(cli, alice):
    ApiToken.objects.update(revoked_at=timezone.now())

    code, _out, err = cli("quota")

    assert code == 3
    assert "Invalid or revoked token." in err


def test_logout_revokes_the_token_and_forgets_it(cli, alice, gantry_env):
    code, _out, err = cli("logout")

    assert code == 0, err
    assert ApiToken.objects.get(user__username="alice").revoked_at is not None
    assert not (gantry_env / "credentials.json").exists()
    assert cli("ls")[0] == 3


def test_stored_token_is_not_sent_to_another_server(cli, alice):
    code, _out, err = cli("--url", "http://127.0.0.1:9", "ls")

    assert code == 3
    assert "Not logged in to http://127.0.0.1:9" in err


def test_gantry_token_and_url_from_the_environment(cli, server, monkeypatch):
    _, secret = services_token(username="bob")
    monkeypatch.setenv("GANTRY_URL", server)
    monkeypatch.setenv("GANTRY_TOKEN", secret)

    images = cli.json("images")

    assert [image["repository"] for image in images] == [
        "registry.example.org/ml/pytorch",
        "registry.example.org/nlp/megatron",
    ]


def services_token(*, username: str):
    from django.contrib.auth.models import User

    from tenants.services.tokens import api_token_create

    return api_token_create(
        user=User.objects.get(username=username),
        name="test",
        expires_at=timezone.now() + timedelta(days=1),
    )


# --- submit ----------------------------------------------------------------------------


def test_submit_a_spec_with_overrides(cli, alice, world, tmp_path):
    path = spec_file(tmp_path, world)

    code, out, err = cli(
        "submit", str(path), "--set", "resources.gpus_per_node=4", "--set", "params.lr=0.001"
    )

    assert code == 0, err
    run = Run.objects.get()
    assert (run.state, run.gpus, run.submitted_by.username) == ("QUEUED", 4, "alice")
    assert run.experiment.params == {"lr": 0.001, "batch_size": 256}
    assert run.experiment.name == "resnet-cli"
    assert out == (
        f"Submitted run {run.pk} of experiment {run.experiment_id} (resnet-cli): QUEUED.\n"
    )


def test_submit_reads_standard_input_and_prints_json(cli, alice, world, tmp_path):
    text = spec_file(tmp_path, world).read_text()

    code, out, err = cli("submit", "-", "--json", stdin=text)

    assert code == 0, err
    body = json.loads(out)
    run = Run.objects.get()
    assert (body["id"], body["experiment"], body["state"]) == (
        run.pk,
        run.experiment_id,
        "QUEUED",
    )


def test_submit_validation_error_names_the_dotted_field(cli, alice, world, tmp_path):
    path = spec_file(tmp_path, world)

    code, out, err = cli("submit", str(path), "--set", "resources.gpus_per_node=0")

    assert code == 4
    assert "  resources.gpus_per_node: Must be at least 1.\n" in err
    assert out == ""
    assert Experiment.objects.count() == 0
    assert Run.objects.count() == 0


def test_submit_of_a_variable_gantry_sets_says_why(cli, alice, world, tmp_path):
    path = spec_file(tmp_path, world, env={"GANTRY_CHECKPOINT_DIR": "/mine"})

    code, out, err = cli("submit", str(path))

    assert code == 4
    assert (
        "  env: GANTRY_CHECKPOINT_DIR is set by Gantry itself (the experiment's checkpoint "
        "directory); leave it out.\n"
    ) in err
    assert out == ""
    assert Experiment.objects.count() == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "Cannot read the spec"),
        ("tenant: [unclosed", "is not valid YAML"),
        ("- a list\n", "is not a YAML mapping"),
    ],
)
def test_bad_local_spec_is_exit_2_without_a_request(cli, alice, tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)

    code, _out, err = cli("submit", str(path))

    assert code == 2
    assert message in err
    assert Run.objects.count() == 0


def test_bad_set_is_exit_2(cli, alice, world, tmp_path):
    code, _out, err = cli("submit", str(spec_file(tmp_path, world)), "--set", "no-equals-sign")

    assert code == 2
    assert "--set takes key=value" in err


def test_submit_wait_shows_progress_and_exits_0_on_success(cli, alice, world, tmp_path):
    path = spec_file(tmp_path, world)

    code, out, err = cli(
        "submit", str(path), "--wait", "--poll-interval", "0", poll_hook=simulator_steps(world)
    )

    assert code == 0, err
    run = Run.objects.get()
    assert run.state == RunState.SUCCEEDED
    assert out.splitlines()[-1] == f"Run {run.pk} SUCCEEDED."
    states = [line.split()[2] for line in err.splitlines()]
    assert states[0] == "QUEUED"
    assert "RUNNING" in states
    assert states[-1] == "SUCCEEDED"


def test_wait_on_a_failed_run_exits_1_with_the_reason(cli, alice, world, tmp_path):
    path = spec_file(tmp_path, world)

    code, out, err = cli(
        "submit",
        str(path),
        "--set",
        "env.GANTRY_SIM_PROFILE=crash",
        "--wait",
        "--json",
        "--poll-interval",
        "0",
        poll_hook=simulator_steps(world),
    )

    assert code == 1, err
    run = Run.objects.get()
    final = json.loads(out)
    assert (final["id"], final["state"], final["failure_reason"]) == (run.pk, "FAILED", "USER_EXIT")


# --- reading ----------------------------------------------------------------------------


def test_ls_and_show_json_give_exact_ids_and_states(cli, alice, world):
    first = submit(world)
    second = submit(world, name="second")
    run_cancel(run=first, actor=world.researcher_a)
    submit(world, user=world.researcher_b, tenant="nlp", project="llm")  # another tenant

    runs = cli.json("ls")
    queued = cli.json("ls", "--state", "queued")
    shown = cli.json("show", str(second.pk))

    assert [(r["id"], r["state"]) for r in runs] == [
        (second.pk, "QUEUED"),
        (first.pk, "CANCELLED"),
    ]
    assert [r["id"] for r in queued] == [second.pk]
    assert (shown["id"], shown["state"], shown["experiment_name"]) == (
        second.pk,
        "QUEUED",
        "second",
    )
    assert shown["image"] == world.image.reference


def test_ls_prints_an_aligned_table(cli, alice, world):
    run = submit(world)

    code, out, err = cli("ls")

    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == [
        "ID",
        "NAME",
        "TENANT/PROJECT",
        "FLAVOR",
        "GPUS",
        "STATE",
        "REASON",
        "SUBMITTED",
    ]
    assert row.split()[:6] == [
        str(run.pk),
        "resnet-baseline",
        "vision/detection",
        "a100-80gb",
        "2",
        "QUEUED",
    ]
    assert header.index("STATE") == row.index("QUEUED")


def test_show_explains_why_a_run_waits(cli, alice, world):
    submit(world, nodes=2, gpus_per_node=8, name="big")
    waiting = submit(world, nodes=1, gpus_per_node=8, name="small")
    admission_run_cycle()
    waiting.refresh_from_db()

    code, out, err = cli("show", str(waiting.pk))

    assert code == 0, err
    fields = dict(line.split(None, 1) for line in out.split("\n\n")[0].splitlines()[3:5])
    assert fields == {
        "State": "QUEUED",
        "Waiting": "queue position 1; quota; tenant vision uses 16 of 16 guaranteed a100-80gb "
        "GPUs and may not borrow; this run needs 8",
    }
    assert out.split("\n\n")[1].splitlines()[1].split()[2:5] == ["-", "QUEUED", "SUBMITTED"]


def test_show_of_another_tenants_run_is_exit_5(cli, alice, world):
    run = submit(world, user=world.researcher_b, tenant="nlp", project="llm")

    code, _out, err = cli("show", str(run.pk))

    # The same words as for a run that does not exist: nothing tells the two apart.
    assert (code, err) == (5, "gantry: error: No such run.\n")


def test_missing_run_is_exit_5(cli, alice):
    code, out, err = cli("cancel", "999999")

    # In words, once: not the ORM's "Run matching query does not exist." nor a doubled stop.
    assert (code, out, err) == (5, "", "gantry: error: No such run.\n")


def test_logs_print_the_latest_attempt_and_follow_until_the_end(cli, alice, world):
    run = submit(world)

    code, out, err = cli("logs", str(run.pk))
    assert (code, out, err) == (0, "", f"Run {run.pk} has no logs yet: it is QUEUED.\n")

    code, out, err = cli(
        "logs", str(run.pk), "-f", "--poll-interval", "0", poll_hook=simulator_steps(world)
    )

    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("[simulator] ")
    assert "[simulator] started on sim-1-a100-80gb-00" in lines
    assert lines[-1].startswith("[simulator] finished SUCCEEDED exit=0")
    assert len(lines) == len(set(lines)) == 4  # each line once
    assert f"Run {run.pk} SUCCEEDED." in err


def test_logs_endpoint_names_the_run_and_its_latest_attempt(alice, world):
    run = submit(world)
    step = simulator_steps(world)
    for _ in range(3):  # admitted, submitted, placed on a node
        step()
    _, secret = services_token(username="alice")

    body = Client(url=alice, token=secret).get(f"runs/{run.pk}/logs/", {"tail": 1})

    assert body == {
        "run": run.pk,
        "attempt": 1,
        "logs": "[simulator] workload compute-bound",
    }


def test_cancel_a_queued_run(cli, alice, world):
    run = submit(world)

    code, out, err = cli("cancel", str(run.pk))

    assert code == 0, err
    assert out == f"Cancel requested for run {run.pk}: CANCELLED.\n"
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED


def test_cancel_of_a_finished_run_is_exit_1(cli, alice, world):
    run = submit(world)
    run_cancel(run=run, actor=world.researcher_a)

    code, _out, err = cli("cancel", str(run.pk))

    assert code == 1
    assert "409" in err or "ended" in err


def running_run(world) -> tuple[Run, str]:
    """A run of alice's running on the simulator, and its node."""
    run = submit(world, env={"GANTRY_SIM_DURATION_S": "86400"})
    admission_run_cycle()
    attempt = run.attempts.get()
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING
    return run, attempt.node_list[0]


def test_restart_without_a_node(cli, alice, world):
    run, node = running_run(world)

    code, out, err = cli("restart", str(run.pk), "--exclude", node)

    assert code == 0, err
    assert out == (
        f"Run {run.pk} restarts without {node}: PREEMPTED; it resumes from its latest "
        "checkpoint on other nodes.\n"
    )
    run.refresh_from_db()
    assert (run.state, run.excluded_nodes) == (RunState.PREEMPTED, [node])


def test_restart_refused_is_exit_1_with_the_reason_and_needs_a_node(cli, alice, world):
    run, node = running_run(world)

    code, _out, err = cli("restart", str(run.pk), "--exclude", "sim-1-a100-80gb-03")
    usage, _out, _err = cli("restart", str(run.pk))

    assert code == 1
    assert f"sim-1-a100-80gb-03 is not one of the nodes run {run.pk} runs on ({node})." in err
    assert usage == 2
    run.refresh_from_db()
    assert (run.state, run.excluded_nodes) == (RunState.RUNNING, [])


def test_rerun_queues_a_new_run_of_the_same_experiment(cli, alice, world):
    run = submit(world)

    body = cli.json("rerun", str(run.pk))

    new = Run.objects.exclude(pk=run.pk).get()
    assert (body["id"], body["experiment"], body["state"]) == (new.pk, run.experiment_id, "QUEUED")
    assert new.experiment_id == run.experiment_id


def test_spec_prints_yaml_that_submits_again(cli, alice, world, tmp_path):
    run = submit(world)

    code, out, err = cli("spec", str(run.pk))

    assert code == 0, err
    spec = yaml.safe_load(out)
    assert (spec["tenant"], spec["project"], spec["name"]) == (
        "vision",
        "detection",
        "resnet-baseline",
    )
    path = tmp_path / "again.yaml"
    path.write_text(out)
    code, out, err = cli("submit", str(path))
    assert code == 0, err
    assert Run.objects.count() == 2


def test_quota_json_lists_the_users_tenants_quotas(cli, alice, world):
    submit(world)
    admission_run_cycle()  # the run now holds 2 A100 GPUs

    quotas = cli.json("quota")

    assert [(q["tenant"], q["flavor"], q["guaranteed_gpus"], q["in_use"]) for q in quotas] == [
        ("vision", "a100-80gb", 16, 2),
        ("vision", "h100-80gb", 8, 0),
    ]


def test_quota_table(cli, alice):
    code, out, err = cli("quota")

    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TENANT", "FLAVOR", "GUARANTEED"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["vision", "a100-80gb", "16"],
        ["vision", "h100-80gb", "8"],
    ]


def test_images_lists_only_approved_images_the_user_may_run(cli, alice, world):
    images = cli.json("images")
    code, out, _err = cli("images")

    assert [(i["id"], i["reference"]) for i in images] == [(world.image.pk, world.image.reference)]
    assert code == 0
    assert "registry.example.org/ml/pytorch:2.4-cuda12" in out
    assert out.splitlines()[1].split()[2] == world.image.digest  # whole, to copy
    assert "megatron" not in out
    assert "old" not in out


# --- transport failures ----------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_server_down_is_exit_6(cli, gantry_env, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("GANTRY_TOKEN", "gty_whatever")

    code, _out, err = cli("--url", url, "ls")

    assert code == 6
    assert f"Cannot reach the Gantry server at {url}" in err


def test_login_to_a_server_that_is_down_is_exit_6(cli, gantry_env):
    url = f"http://127.0.0.1:{closed_port()}"

    code, _out, _err = cli("--url", url, "login", "--username", "a", "--password-stdin", stdin="p")

    assert code == 6
    assert not (gantry_env / "credentials.json").exists()


def test_usage_errors_are_exit_2(cli, gantry_env):
    assert cli("show", "not-a-number")[0] == 2
    assert cli("frobnicate")[0] == 2
    assert cli("ls", "--state", "SLEEPING")[0] == 2
    assert cli("--url", "ftp://example.org", "ls")[0] == 2


# --- the installed console script ------------------------------------------------------


def test_installed_console_script(server, gantry_env):
    env = {**os.environ, "GANTRY_CONFIG_DIR": str(gantry_env)}
    login = subprocess.run(
        [str(GANTRY), "--url", server, "login", "--username", "bob", "--password-stdin"],
        input=PASSWORD + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert login.returncode == 0, login.stderr

    images = subprocess.run(
        [str(GANTRY), "images", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    missing = subprocess.run(
        [str(GANTRY), "show", "424242"], capture_output=True, text=True, env=env, timeout=60
    )

    assert images.returncode == 0, images.stderr
    assert len(json.loads(images.stdout)) == 2
    assert stat.S_IMODE((gantry_env / "credentials.json").stat().st_mode) == 0o600
    assert missing.returncode == 5


def test_the_cli_endpoints_are_in_the_openapi_schema_without_warnings(tmp_path):
    path = tmp_path / "schema.yaml"

    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(path))

    paths = yaml.safe_load(path.read_text())["paths"]
    for endpoint in ("/api/v1/runs/{id}/logs/", "/api/v1/quotas/", "/api/v1/images/"):
        assert "get" in paths[endpoint]
