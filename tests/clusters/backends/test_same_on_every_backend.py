"""Issue 31.3: the same experiment runs byte for byte the same on every backend.

Kubernetes expands ``$(NAME)`` and reads ``$$`` as ``$`` in a container's command, args and
env values; Slurm's batch script is bash; the simulator runs what it records. One hostile
experiment (quotes, ``$`` in every position, backticks, ``$(…)``, newlines, backslashes,
unicode, ``--``, leading dashes, empty strings) is rendered for all three and each rendering
is run under its backend's own rules: the Kubernetes container as the kubelet would start it
(``kubernetes_expansion``), the sbatch script by bash with a ``srun`` (and ``apptainer``) that
only start their command, and the simulator's recorded command and env. The program at the
end of the command records its argv and environment: they are the same bytes everywhere.
"""

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from django.conf import settings
from hypothesis import given
from hypothesis import strategies as st

from clusters.backends.base import COMMAND_SHELL, JobSpec
from clusters.backends.k8s_manifest import literal
from clusters.backends.simulator import SimulatorBackend
from clusters.backends.slurm_batch import batch_job
from clusters.job_env import REDACTED
from jobs.models import Attempt
from jobs.services.backend_submit import job_spec_for
from jobs.services.submission import run_submit
from tests.clusters.backends.kubernetes_expansion import expand, pod_process
from tests.clusters.backends.test_k8s_backend import TOKEN as K8S_TOKEN
from tests.clusters.backends.test_k8s_backend import TOKEN_ENV as K8S_TOKEN_ENV
from tests.clusters.backends.test_k8s_backend import backend as kubernetes
from tests.clusters.backends.test_render_injection import slurm_settings
from tests.conftest import experiment_input
from tests.k8s_fake import FakeKubernetes

TOKEN = "gat_12.c2VjcmV0LXRva2Vu"
DOLLARS = ["$", "$$", "$$$", "$(", "$()", "$(A", "end$", "$(LR)", "$$(LR)", "${LR}", "$LR"]
HOSTILE_ENV = {
    "LR": "3e-4",
    "U_DOLLARS": " ".join(DOLLARS) + " $(GANTRY_ATTEMPT_TOKEN) $(GANTRY_API_URL)",
    "U_QUOTES": "it's \"quoted\" `uname` $(touch /tmp/canary) \\ back\\slash \\'",
    "U_LINES": "two\nlines\r\nand\ttab",
    "U_UNICODE": "ünïcødé 租户 💥 \u2028 \u202eRTL",
    "U_DASHES": "--lr=-1 -- -x",
    "U_EMPTY": "",
}
# Each argument the program gets, in bash's own words: literals in every quoting, and values
# bash computes (the experiment's variables, a substitution, the shell's own pid).
ARGUMENTS = [
    *(f"'{text}'" for text in DOLLARS),
    "'$(GANTRY_ATTEMPT_TOKEN)'",
    '"$U_DOLLARS"',
    '"$U_QUOTES"',
    '"$U_LINES"',
    '"$U_UNICODE"',
    "$U_DASHES",  # unquoted: split into words
    '"$U_EMPTY"',
    "''",
    "--",
    "-x",
    "--lead=-1",
    '"it\'s"',
    "'\"dq\"'",
    "`printf back`",
    "\"$(printf 'sub\\nst')\"",
    "$'tab\\there'",
    "'\\'",
    '"\\\\"',
    "'ünïcødé 租户 💥'",
    '"$pid"',
    '"$LR"',
]
# ``$$`` is the shell's pid: a number, whatever the backend (Kubernetes would make it "$").
COMMAND = (
    'case $$ in (*[!0-9]*|"") pid="not a pid";; (*) pid="a pid";; esac\n'
    "# a comment with $(GANTRY_ATTEMPT_TOKEN)\n"
    "exec {recorder} " + " ".join(ARGUMENTS)
)


@pytest.fixture
def recorder(tmp_path) -> tuple[Path, Path]:
    """A program that writes its argv and environment, NUL-separated, to ``out``; and a
    ``bin`` of launchers that only start their command: ``srun`` drops its options, and
    ``apptainer exec --nv IMAGE`` its first three arguments."""
    out = tmp_path / "out"
    out.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        tmp_path / "record": f"printf '%s\\0' \"$@\" > {out}/argv\n/usr/bin/env -0 > {out}/env\n",
        bin_dir / "srun": 'while [[ $1 == --* ]]; do shift; done\nexec "$@"\n',
        bin_dir / "apptainer": 'shift 3\nexec "$@"\n',
    }
    for path, body in scripts.items():
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)
    return tmp_path / "record", bin_dir


def recorded(out: Path) -> tuple[list[str], dict[str, str]]:
    argv = (out / "argv").read_bytes().decode().split("\0")[:-1]
    pairs = (out / "env").read_bytes().decode().split("\0")[:-1]
    (out / "argv").unlink()
    (out / "env").unlink()
    return argv, dict(pair.split("=", 1) for pair in pairs)


def run(argv: list[str], env: dict[str, str], **kwargs) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, timeout=30, **kwargs)
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def the_job_s(env: dict[str, str], names: set[str]) -> dict[str, str]:
    """Of a process's environment, what the experiment and Gantry set: not what the
    backend's machinery (the kubelet's service variables, srun, bash) adds on its own."""
    return {name: value for name, value in env.items() if name in names or "GANTRY" in name}


def hostile_spec(world, command: str) -> JobSpec:
    """The experiment as the submit stores it, as its resumed second attempt runs it."""
    run_ = run_submit(
        user=world.researcher_a,
        data=experiment_input(
            world,
            command=command,
            env=HOSTILE_ENV,
            checkpoint_dir="/ckpt/$(LR)/$$/it's",
        ),
    )
    spec = job_spec_for(Attempt.objects.create(run=run_, number=1, cluster=world.cluster))
    return replace(
        spec,
        attempt_token=TOKEN,
        resume_step=1200,
        resume_uri="s3://ckpt/$(GANTRY_ATTEMPT_TOKEN)/$$/step 1200",
    )


def test_a_hostile_experiment_gets_the_same_argv_and_env_bytes_on_every_backend(
    world, recorder, tmp_path, monkeypatch
):
    record, bin_dir = recorder
    out = record.parent / "out"
    spec = hostile_spec(world, COMMAND.replace("{recorder}", str(record)))
    expected_env = {
        **HOSTILE_ENV,
        "GANTRY_API_URL": f"{settings.GANTRY_PUBLIC_URL}/api/v1",
        "GANTRY_ATTEMPT_TOKEN": TOKEN,
        "GANTRY_CHECKPOINT_DIR": "/ckpt/$(LR)/$$/it's",
        "GANTRY_IMAGE": world.image.reference,
        "GANTRY_RESUME_FROM": "s3://ckpt/$(GANTRY_ATTEMPT_TOKEN)/$$/step 1200",
        "GANTRY_RESUME_STEP": "1200",
    }
    names = set(expected_env)
    seen: dict[str, tuple[list[str], dict[str, str]]] = {}

    # Kubernetes: the objects as the (fake) API server keeps them after the backend's
    # submit, and the container as the kubelet starts it from them.
    monkeypatch.setenv(K8S_TOKEN_ENV, K8S_TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeKubernetes(token=K8S_TOKEN) as fake:
        kubernetes(fake).submit(spec)
        objects = [
            fake.store.get("secrets", "gantry-vision", f"{spec.name}-token"),
            fake.store.get("jobs", "gantry-vision", spec.name),
        ]
    argv, env = pod_process(objects)
    run(argv, {**env, "PATH": "/usr/bin:/bin"})
    seen["kubernetes"] = recorded(out)

    # Slurm: the batch script run by bash, through srun and each container runtime.
    for transport, runtime in (("cli", "pyxis"), ("rest", "apptainer"), ("cli", "none")):
        job = batch_job(spec, slurm_settings(transport=transport, runtime=runtime))
        script = tmp_path / "job.sh"
        script.write_text(job.script, encoding="utf-8")
        run(["/bin/bash", str(script)], {**job.environment, "PATH": str(bin_dir)}, cwd=tmp_path)
        seen[f"slurm {transport} {runtime}"] = recorded(out)

    # The simulator: what it records it runs (with the token it never shows).
    rendered = json.loads(SimulatorBackend(world.cluster).render(spec))
    assert rendered["env"] == {**expected_env, "GANTRY_ATTEMPT_TOKEN": REDACTED}
    env = {**rendered["env"], "GANTRY_ATTEMPT_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"}
    run([*COMMAND_SHELL, rendered["command"]], env)
    seen["simulator"] = recorded(out)

    expected_argv = [
        *DOLLARS,
        "$(GANTRY_ATTEMPT_TOKEN)",
        HOSTILE_ENV["U_DOLLARS"],
        HOSTILE_ENV["U_QUOTES"],
        HOSTILE_ENV["U_LINES"],
        HOSTILE_ENV["U_UNICODE"],
        "--lr=-1",
        "--",
        "-x",
        "",
        "",
        "--",
        "-x",
        "--lead=-1",
        "it's",
        '"dq"',
        "back",
        "sub\nst",
        "tab\there",
        "\\",
        "\\",
        "ünïcødé 租户 💥",
        "a pid",
        "3e-4",
    ]
    assert len(seen) == 5
    for backend, (argv, env) in seen.items():
        assert (backend, argv) == (backend, expected_argv)
        assert (backend, the_job_s(env, names)) == (backend, expected_env)
    # The token is in its Secret only, never in the Job that runs the command.
    assert TOKEN not in json.dumps(objects[1])


@pytest.mark.parametrize(
    ("text", "variables", "expanded"),
    [
        # Kubernetes' own cases (third_party/forked/golang/expansion/expand_test.go).
        ("$(VAR_A)-$(VAR_A)", {"VAR_A": "A"}, "A-A"),
        ("$$(VAR_B)_$(VAR_A)", {"VAR_A": "A", "VAR_B": "B"}, "$(VAR_B)_A"),
        ("f000-$$VAR_A", {"VAR_A": "A"}, "f000-$VAR_A"),
        ("foo\\$(VAR_C)bar", {"VAR_C": "C"}, "foo\\Cbar"),
        ("$(VAR_A$(VAR_B))", {"VAR_A": "A", "VAR_B": "B"}, "$(VAR_A$(VAR_B))"),
        ("foo$(VAR_EMPTY)bar", {"VAR_EMPTY": ""}, "foobar"),
        ("foo$(VAR_Awhoops!", {"VAR_A": "A"}, "foo$(VAR_Awhoops!"),
        ("$?_boo_$!", {}, "$?_boo_$!"),
        ("$(VAR_DNE)", {}, "$(VAR_DNE)"),
        ("$$$$$$(BIG_MONEY)", {}, "$$$(BIG_MONEY)"),
        ("$$$$$$$(VAR_A)", {"VAR_A": "A"}, "$$$A"),
        ("${VAR_A}", {"VAR_A": "A"}, "${VAR_A}"),
        ("$(VAR_C)_______$(", {"VAR_C": "C"}, "C_______$("),
        ("$(VAR_A)foobarzab$", {"VAR_A": "A"}, "Afoobarzab$"),
        ("--$($($($($--", {}, "--$($($($($--"),
        ("$(foo$$var)", {}, "$(foo$$var)"),
        # What the issue saw: a shell's "$$" arrives as "$", and a reference to the token
        # puts the token on the command line.
        ("echo $$", {}, "echo $"),
        ("echo $(GANTRY_ATTEMPT_TOKEN)", {"GANTRY_ATTEMPT_TOKEN": TOKEN}, f"echo {TOKEN}"),
        ("$()", {}, "$()"),
        ("$(", {}, "$("),
        ("a\n$(X)\n", {"X": "ünï"}, "a\nünï\n"),
    ],
)
def test_the_expansion_is_kubernetes_own(text, variables, expanded):
    assert expand(text, variables) == expanded


EDGES = ["$", "$$", "$$$", "$(", "$()", "$(A", "$(A)", "a$", "$(GANTRY_ATTEMPT_TOKEN)", "ü$(💥)\n$"]


@pytest.mark.parametrize("text", EDGES)
def test_a_literal_comes_back_as_written(text):
    variables = {"A": "x", "GANTRY_ATTEMPT_TOKEN": TOKEN, "💥": "boom", "": "empty"}
    assert expand(literal(text), variables) == text


@given(
    text=st.text(st.sampled_from(["$", "(", ")", "A", "ü", "\n", "\\", "{"]) | st.characters()),
    names=st.lists(st.text(st.sampled_from("A(ü$"), max_size=3), max_size=4),
)
def test_any_literal_comes_back_as_written_whatever_is_defined(text, names):
    assert expand(literal(text), dict.fromkeys(names, "!")) == text
