"""The Slurm backend's pure half: settings, the rendered batch job, parsers and the state
mapping. No cluster: the rendered script is checked with ``bash -n`` and run by bash with
a fake ``srun`` that records the argv and environment it receives."""

import base64
import json
import shlex
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters.backends.base import InventoryItem, JobSpec, NodeInventory, inventory_items
from clusters.backends.slurm import _merge
from clusters.backends.slurm_accounts import QuotaLimit, jwt_claims, quota_commands
from clusters.backends.slurm_batch import batch_job, enroot_image, step_command
from clusters.backends.slurm_hostlist import expand_hostlist
from clusters.backends.slurm_jobs import (
    SlurmJob,
    job_status,
    parse_sacct,
    parse_sbatch_job_id,
    parse_slurmdb_jobs,
    parse_squeue_json,
)
from clusters.backends.slurm_nodes import (
    SlurmNode,
    gantry_gpus_by_node,
    node_condition,
    node_inventory,
    parse_rest_nodes,
    parse_scontrol_nodes,
    parse_squeue_gpus,
)
from clusters.backends.slurm_quoting import RenderError, shell_quote
from clusters.backends.slurm_settings import SlurmSettings
from clusters.backends.slurm_topology import (
    UNKNOWN_TOPOLOGY,
    derived_level_names,
    parse_topology,
    topology_paths,
)
from clusters.backends.slurm_tres import gpus_per_node_of, parse_gres
from core.schema import SchemaError
from tests import REPOSITORY

IMAGE = "registry.example.org/ml/pytorch@sha256:" + "a" * 64
TOKEN = "gat_12.c2VjcmV0LXRva2Vu"


def slurm_settings(**overrides) -> SlurmSettings:
    raw = {
        "transport": "cli",
        "job_dir": "/shared/jobs",
        "partition": "gpu",
        "flavors": {
            "a100-80gb": "a100",
            "h100-80gb": {"gres_type": "h100", "partition": "hopper", "qos": "fast"},
        },
        "container_runtime": "pyxis",
    }
    raw.update(overrides)
    return SlurmSettings.parse(raw, cluster="test")


def job_spec(**overrides) -> JobSpec:
    values = {
        "name": "gantry-a12",
        "attempt_id": 12,
        "run_id": 7,
        "tenant": "vision",
        "project": "detection",
        "image": IMAGE,
        "command": "python train.py --epochs 3",
        "env": {"LR": "0.1"},
        "api_url": "https://gantry.example.org/api/v1",
        "flavor": "a100-80gb",
        "nodes": 2,
        "gpus_per_node": 8,
        "max_runtime_s": 3600,
        "attempt_token": TOKEN,
    }
    values.update(overrides)
    return JobSpec(**values)


# --- settings ------------------------------------------------------------------------------


def test_settings_parse_with_defaults():
    s = SlurmSettings.parse(
        {
            "rest_url": "http://slurm-head:6820",
            "rest_user": "gantry",
            "rest_token_env": "SLURM_TOKEN",
            "job_dir": "/shared/jobs",
            "flavors": {"a100-80gb": "a100"},
        }
    )
    assert (s.transport, s.container_runtime, s.tasks_per_node) == ("rest", "pyxis", 1)
    assert (s.signal_before_s, s.qos_prefix, s.logs_at) == (300, "gantry-", "/shared/jobs")
    assert s.flavors["a100-80gb"].gres_type == "a100"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"transport": "ssh"}, "setting 'transport' must be one of rest, cli"),
        ({"job_dir": "relative/dir"}, "setting 'job_dir' = 'relative/dir' has characters"),
        ({"job_dir": "/with space"}, "has characters Slurm options cannot take"),
        ({"flavors": {}}, "setting 'flavors' must map each GPU flavor"),
        ({"flavors": {"a100-80gb": "a100;rm"}}, "gres_type 'a100;rm' is not a plain Slurm name"),
        ({"partition": "gpu\n#SBATCH --x"}, "setting 'partition'"),
        ({"container_runtime": "docker"}, "setting 'container_runtime' must be one of"),
        ({"tasks_per_node": 0}, "setting 'tasks_per_node' must be between 1 and 1024"),
        ({"colour": "blue"}, "unknown Slurm setting(s): colour"),
        (
            {"transport": "rest", "rest_url": "slurm-head:6820"},
            "setting 'rest_url' = 'slurm-head:6820' is not an http(s) URL",
        ),
        (
            {"transport": "rest", "rest_url": "http://h:1", "rest_user": "u"},
            "setting 'rest_token_env' is required with transport 'rest'",
        ),
        ({"topology_levels": "spine,leaf"}, "setting 'topology_levels' must be a list of level"),
        ({"topology_levels": ["spine", "leaf\n#SBATCH"]}, "'topology_levels' must be a list"),
        ({"topology_levels": ["leaf", "leaf"]}, "setting 'topology_levels' names a level twice"),
        ({"topology": ["SwitchName=s Nodes=n1"]}, "setting 'topology' is for transport 'rest'"),
        (
            {
                "transport": "rest",
                "rest_url": "http://h:1",
                "rest_user": "u",
                "rest_token_env": "T",
                "topology": "SwitchName=s Nodes=n1",
            },
            "setting 'topology' must be a list of topology.conf lines",
        ),
    ],
)
def test_settings_errors_name_the_setting(overrides, message):
    with pytest.raises(SchemaError) as error:
        slurm_settings(**overrides)
    assert message in str(error.value)
    assert str(error.value).startswith("cluster test: ")


# --- rendering -----------------------------------------------------------------------------


def test_script_carries_every_option_and_no_token():
    job = batch_job(job_spec(), slurm_settings())
    lines = job.script.splitlines()
    assert lines[:14] == [
        "#!/bin/bash",
        "#SBATCH --job-name=gantry-a12",
        "#SBATCH --comment=gantry-a12",
        "#SBATCH --account=vision",
        "#SBATCH --partition=gpu",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:a100:8",
        "#SBATCH --time=60",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --no-requeue",
        "#SBATCH --chdir=/shared/jobs",
        "#SBATCH --output=/shared/jobs/gantry-a12-%j.out",
        "# Gantry run 7, attempt 12.",
    ]
    assert TOKEN not in job.script
    assert "GANTRY_ATTEMPT_TOKEN=<redacted>" in job.script
    assert job.environment == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "GANTRY_ATTEMPT_TOKEN": TOKEN,
    }
    # The env is exported by the step's shell in the container, never by the batch shell.
    assert [line for line in lines if line.startswith("export ")] == []
    assert (
        '"$gantry_srun" --container-image=\'registry.example.org#ml/pytorch:sha256:'
        + "a" * 64
        + "' /bin/bash -c 'export GANTRY_API_URL=https://gantry.example.org/api/v1; "
        + f"export GANTRY_IMAGE={IMAGE}; export LR=0.1; python train.py --epochs 3' &"
    ) in lines


def test_flavor_mapping_picks_partition_qos_and_gres_type():
    spec = job_spec(flavor="h100-80gb", nodes=1, gpus_per_node=4, max_runtime_s=61)
    job = batch_job(spec, slurm_settings(qos="normal", tasks_per_node="gpus"))
    assert job.sbatch_options() == [
        "--job-name=gantry-a12",
        "--comment=gantry-a12",
        "--account=vision",
        "--partition=hopper",
        "--qos=fast",
        "--nodes=1",
        "--ntasks-per-node=4",
        "--gres=gpu:h100:4",
        "--time=2",  # 61 s rounds up to whole minutes
        "--signal=B:USR1@30",  # never more than half the runtime
        "--no-requeue",
        "--chdir=/shared/jobs",
        "--output=/shared/jobs/gantry-a12-%j.out",
    ]


def test_rest_submission_has_the_same_options_as_job_properties():
    spec = job_spec(checkpoint_dir="/ckpt/run7")
    rest = slurm_settings(
        transport="rest", rest_url="http://h:6820", rest_user="gantry", rest_token_env="T"
    )
    body = batch_job(spec, rest).rest_submission()
    assert body["script"].startswith("#!/bin/bash\n#SBATCH --job-name=gantry-a12\n")
    assert TOKEN not in body["script"]
    assert body["job"] == {
        "name": "gantry-a12",
        "comment": "gantry-a12",
        "account": "vision",
        "partition": "gpu",
        "nodes": "2",
        "tasks_per_node": 1,
        "gres": "gpu:a100:8",
        "time_limit": 60,
        "requeue": False,
        "signal": "USR1@300",  # slurmrestd 22.05 rejects B:
        "current_working_directory": "/shared/jobs",
        "standard_output": "/shared/jobs/gantry-a12-%j.out",
        "environment": {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "GANTRY_ATTEMPT_TOKEN": TOKEN,
        },
    }


def test_rest_job_without_checkpoint_dir_is_not_signalled():
    rest = slurm_settings(
        transport="rest", rest_url="http://h:6820", rest_user="gantry", rest_token_env="T"
    )
    job = batch_job(job_spec(), rest)
    assert job.signal == ""
    assert "signal" not in job.rest_submission()["job"]
    assert "--signal" not in job.script


def test_placement_pins_the_nodes_and_a_required_leaf_asks_for_one_switch():
    spec = job_spec(
        placement=("gpu-node1", "gpu-node2"), topology_level="leaf", topology_required=True
    )
    job = batch_job(spec, slurm_settings())
    assert job.sbatch_options()[4:8] == [
        "--nodes=2",
        "--nodelist=gpu-node1,gpu-node2",
        "--switches=1",
        "--ntasks-per-node=1",
    ]
    assert "#SBATCH --nodelist=gpu-node1,gpu-node2" in job.script.splitlines()
    assert "# Required in one" not in job.script
    # Only preferred, or one node: the node list alone.
    for relaxed in (
        job_spec(placement=("gpu-node1", "gpu-node2"), topology_level="leaf"),
        job_spec(nodes=1, placement=("gpu-node2",), topology_level="leaf", topology_required=True),
    ):
        options = batch_job(relaxed, slurm_settings()).sbatch_options()
        assert [o for o in options if o.startswith(("--nodelist", "--switches"))] == [
            f"--nodelist={','.join(relaxed.placement)}"
        ]
    # No placement: Slurm places the job, and no #SBATCH line says otherwise.
    assert "--nodelist" not in batch_job(job_spec(), slurm_settings()).script


def test_a_wider_required_level_is_held_by_the_node_list_alone():
    spec = job_spec(
        placement=("gpu-node1", "gpu-node2"), topology_level="spine", topology_required=True
    )
    job = batch_job(spec, slurm_settings(topology_levels=["spine", "leaf"]))
    assert job.switches == 0
    assert "--switches" not in job.script
    assert (
        "# Required in one spine: the node list holds the gang there "
        "(a switch count cannot say it)."
    ) in job.script.splitlines()
    # The settings name the levels: their deepest is what --switches counts.
    named = job_spec(
        placement=("gpu-node1", "gpu-node2"), topology_level="tor", topology_required=True
    )
    assert batch_job(named, slurm_settings(topology_levels=["pod", "tor"])).switches == 1
    assert batch_job(named, slurm_settings()).switches == 0


def test_rest_submission_carries_the_node_list_but_no_switch_count():
    rest = slurm_settings(
        transport="rest", rest_url="http://h:6820", rest_user="gantry", rest_token_env="T"
    )
    spec = job_spec(
        placement=("gpu-node1", "gpu-node2"), topology_level="leaf", topology_required=True
    )
    job = batch_job(spec, rest)
    assert job.rest_submission()["job"]["nodelist"] == "gpu-node1,gpu-node2"
    assert "required_switches" not in job.rest_submission()["job"]
    assert job.switches == 0
    assert (
        "# Required in one leaf: the node list holds the gang there "
        "(slurmrestd 22.05 takes no switch count)."
    ) in job.script.splitlines()
    assert "nodelist" not in batch_job(job_spec(), rest).rest_submission()["job"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"placement": ("gpu-node1",)}, "the placement names 1 nodes for a job of 2 nodes"),
        ({"placement": ("gpu-node1", "gpu-node1")}, "the placement names a node twice"),
        ({"placement": ("gpu-node1", "n2,n3")}, "node name 'n2,n3' is not a plain Slurm name"),
        (
            {"placement": ("gpu-node1", "n2\n#SBATCH --account=nlp")},
            "node name 'n2\\n#SBATCH --account=nlp' is not a plain Slurm name",
        ),
        (
            {"topology_level": "leaf\n#SBATCH --account=nlp", "topology_required": True},
            "topology level 'leaf\\n#SBATCH --account=nlp' is not a level name",
        ),
    ],
)
def test_render_refuses_a_placement_it_cannot_express(overrides, message):
    with pytest.raises(RenderError) as error:
        batch_job(job_spec(**overrides), slurm_settings())
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("runtime", "launch"),
    [
        (
            "pyxis",
            "\"$gantry_srun\" --container-image='registry.example.org#ml/pytorch:sha256:{d}' "
            "/bin/bash -c nvidia-smi &",
        ),
        (
            "apptainer",
            '"$gantry_srun" "$gantry_apptainer" exec --nv '
            "docker://registry.example.org/ml/pytorch@sha256:{d} /bin/bash -c nvidia-smi &",
        ),
        ("none", '"$gantry_srun" /bin/bash -c nvidia-smi &'),
    ],
)
def test_container_runtime_syntax(runtime, launch):
    job = batch_job(
        job_spec(command="nvidia-smi", env={}, api_url=""),
        slurm_settings(container_runtime=runtime),
    )
    step = shlex.quote(f"export GANTRY_IMAGE={IMAGE}; nvidia-smi")
    assert launch.format(d="a" * 64).replace("nvidia-smi", step) in job.script.splitlines()


@pytest.mark.parametrize(
    ("reference", "enroot"),
    [
        (
            "registry.example.org/ml/pytorch@sha256:abc",
            "registry.example.org#ml/pytorch:sha256:abc",
        ),
        ("localhost:5000/team/img@sha256:abc", "localhost:5000#team/img:sha256:abc"),
        ("localhost/img@sha256:abc", "localhost#img:sha256:abc"),
        ("nvidia/cuda@sha256:abc", "nvidia/cuda:sha256:abc"),
        ("ubuntu@sha256:abc", "ubuntu:sha256:abc"),
    ],
)
def test_enroot_image_reference(reference, enroot):
    assert enroot_image(reference) == enroot


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"flavor": "mi300x"}, "maps no Slurm GPU type for flavor mi300x"),
        ({"tenant": "vision;rm"}, "tenant (the Slurm account) 'vision;rm' is not a plain"),
        ({"env": {"BAD-NAME": "x"}}, "'BAD-NAME' is not a valid variable name"),
        ({"env": {"SLURM_JOB_ID": "424242"}}, "SLURM_JOB_ID is read by the cluster's launcher"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "LD_PRELOAD is read by the cluster's launcher"),
        ({"env": {"UID": "0"}}, "UID is set by bash itself"),
        ({"command": "echo \x00"}, "values cannot contain NUL characters"),
        ({"image": "registry.example.org/ml/pytorch:latest"}, "is not pinned by digest"),
    ],
)
def test_render_refuses_what_it_cannot_express(overrides, message):
    with pytest.raises(RenderError) as error:
        batch_job(job_spec(**overrides), slurm_settings())
    assert message in str(error.value)


# --- hostile strings: the script parses and values arrive verbatim -------------------------

FRAGMENTS = [
    "'",
    '"',
    "\\",
    "$(touch {canary})",
    "`touch {canary}`",
    "${{IFS}}",
    "$HOME",
    "; touch {canary};",
    "' ; touch {canary} ; '",
    '" ; touch {canary} ; "',
    "\n",
    "\r\n",
    "\n#SBATCH --account=other\n",
    "\t",
    "\x1b[31m",
    "&& touch {canary} ||",
    "| tee {canary}",
    "> {canary}",
    "\\'",
    "$'\\x41'",
    "!!",
    "*",
    "ünïcødé",
    "💥",
    "\u2028",
    "-",
]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """A fake srun that records its argv and environment, NUL-separated."""
    root = tmp_path_factory.mktemp("slurm-render")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(
        "#!/bin/bash\n"
        'printf \'%s\\0\' "$@" > "$GANTRY_TEST_OUT/argv"\n'
        '/usr/bin/env -0 > "$GANTRY_TEST_OUT/env"\n'
    )
    srun.chmod(0o755)
    return root


def hostile_text(canary: str):
    pieces = st.one_of(
        st.sampled_from([f.format(canary=canary) for f in FRAGMENTS]),
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8
        ),
    )
    return st.lists(pieces, max_size=8).map("".join)


def step_sees(exports: dict[str, str], sandbox: Path) -> dict[str, str]:
    """The environment a program started by the step's shell gets: the shell run with the
    exports and a command that dumps the environment in place of the user's."""
    dump = sandbox / "step-env"
    done = subprocess.run(
        ["bash", "-c", step_command(exports, f"/usr/bin/env -0 > '{dump}'")],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr
    return dict(pair.split("=", 1) for pair in dump.read_bytes().decode().split("\0")[:-1])


def run_rendered(script: str, sandbox: Path, *, environment: dict) -> tuple[list[str], dict]:
    out = sandbox / "out"
    out.mkdir(exist_ok=True)
    for leftover in out.iterdir():
        leftover.unlink()
    path = sandbox / "job.sh"
    path.write_text(script, encoding="utf-8")
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    env = {
        **environment,
        "PATH": f"{sandbox / 'bin'}:/usr/bin:/bin",
        "GANTRY_TEST_OUT": str(out),
    }
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, cwd=sandbox)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    argv = (out / "argv").read_bytes().decode().split("\0")[:-1]
    pairs = (out / "env").read_bytes().decode().split("\0")[:-1]
    return argv, dict(pair.split("=", 1) for pair in pairs)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_hostile_command_and_env_reach_the_job_verbatim(sandbox, data):
    canary = str(sandbox / "canary")
    text = hostile_text(canary)
    command = data.draw(text.filter(lambda s: s.strip() != ""), label="command")
    env = data.draw(
        st.dictionaries(st.from_regex(r"\AHOSTILE_[A-Z0-9_]{1,6}\Z"), text, max_size=4),
        label="env",
    )
    spec = job_spec(command=command, env=env, nodes=1, gpus_per_node=1)
    job = batch_job(spec, slurm_settings(container_runtime="none"))
    assert TOKEN not in job.script
    assert "\r" not in job.script  # sbatch refuses DOS line breaks

    argv, received = run_rendered(job.script, sandbox, environment=job.environment)

    exports = {**env, "GANTRY_API_URL": "https://gantry.example.org/api/v1", "GANTRY_IMAGE": IMAGE}
    assert argv == ["/bin/bash", "-c", step_command(exports, command)]
    # srun gets none of the experiment's env, only Gantry's token; the step's shell exports
    # every value exactly before the command.
    assert sorted(set(exports) & set(received)) == []
    assert received["GANTRY_ATTEMPT_TOKEN"] == TOKEN
    seen = step_sees(exports, sandbox)
    assert {key: seen.get(key) for key in exports} == exports
    assert not Path(canary).exists()


def test_pyxis_image_and_command_arrive_as_separate_arguments(sandbox):
    command = 'echo "$(hostname)"; exit 3 # it\'s'
    job = batch_job(job_spec(command=command, env={}, api_url=""), slurm_settings())
    argv, received = run_rendered(job.script, sandbox, environment=job.environment)
    assert argv == [
        "--container-image=registry.example.org#ml/pytorch:sha256:" + "a" * 64,
        "/bin/bash",
        "-c",
        step_command({"GANTRY_IMAGE": IMAGE}, command),
    ]
    assert received["GANTRY_ATTEMPT_TOKEN"] == TOKEN


def test_a_user_path_does_not_hide_srun(sandbox):
    spec = job_spec(env={"PATH": "/opt/conda/bin:$PATH"}, nodes=1, gpus_per_node=1)
    job = batch_job(spec, slurm_settings(container_runtime="none"))
    argv, received = run_rendered(job.script, sandbox, environment=job.environment)
    assert argv[:2] == ["/bin/bash", "-c"]
    # srun ran with the cluster's PATH; the program gets the user's, exactly.
    assert received["PATH"] != "/opt/conda/bin:$PATH"
    assert step_sees({"PATH": "/opt/conda/bin:$PATH"}, sandbox)["PATH"] == "/opt/conda/bin:$PATH"


@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
@settings(max_examples=200, deadline=None)
def test_shell_quote_is_one_line_and_evaluates_to_the_value(value):
    quoted = shell_quote(value)
    assert "\n" not in quoted and "\r" not in quoted
    done = subprocess.run(
        ["bash", "-c", f"printf %s {quoted}"], capture_output=True, env={"LC_ALL": "C.UTF-8"}
    )
    assert done.stdout.decode() == value


# --- what Slurm prints ---------------------------------------------------------------------

# Real output of the test cluster (Slurm 22.05.8), SLURM_TIME_FORMAT=%s.
SACCT = (
    "1|t1|t1|FAILED|NonZeroExitCode|3:0|1795994551|1795994553|2|"
    "billing=1,cpu=1,gres/gpu:a100=2,gres/gpu=2,node=1|gpu-node1|root\n"
    "2|gantry-a9|gantry-a9|COMPLETED|None|0:0|1795994551|1795994567|16|"
    "billing=2,cpu=2,gres/gpu:a100=16,gres/gpu=16,node=2|gpu-node[1-2]|root\n"
    "3|wrap||FAILED|BadConstraints|1:0|1795994550|1795994550|0||None assigned|root\n"
    "4|gantry-a10|gantry-a10|CANCELLED by 0|None|0:15|Unknown|1795994600|0||None assigned|root\n"
    "5|x|a|b|TIMEOUT|TimeLimit|0:15|1795994000|1795994090|90|gres/gpu=1|gpu-node2|slurmrest\n"
)


def test_parse_sacct_rows():
    jobs = parse_sacct(SACCT)
    assert [(j.job_id, j.state, j.exit_code, j.signal, j.gpus) for j in jobs] == [
        ("1", "FAILED", 3, 0, 2),
        ("2", "COMPLETED", 0, 0, 16),
        ("3", "FAILED", 1, 0, None),
        ("4", "CANCELLED", 0, 15, None),
        ("5", "TIMEOUT", 0, 15, 1),
    ]
    assert jobs[1].nodes == ("gpu-node1", "gpu-node2")
    assert jobs[1].start == datetime.fromtimestamp(1795994551, UTC)
    assert (jobs[1].end - jobs[1].start).total_seconds() == jobs[1].elapsed_s == 16
    assert jobs[2].refused and not jobs[0].refused
    assert jobs[3].start is None and jobs[3].nodes == ()
    assert jobs[4].comment == "a|b"  # a "|" in the comment is kept in the comment


SQUEUE = {
    "meta": {},
    "messages": [],
    "jobs": [
        {
            "job_id": 1,
            "name": "t1",
            "job_state": "FAILED",
            "state_reason": "NonZeroExitCode",
            "exit_code": 768,
            "start_time": 1795994551,
            "end_time": 1795994551,
            "nodes": "gpu-node1",
            "tres_alloc_str": "cpu=1,node=1,billing=1,gres/gpu=2,gres/gpu:a100=2",
            "comment": "t1",
            "user_name": "root",
        },
        {
            "job_id": 7,
            "name": "gantry-a7",
            "job_state": "PENDING",
            "state_reason": "QOSGrpGRES",
            "exit_code": 0,
            "start_time": 1895994551,  # an estimate, not a start
            "end_time": 1895998151,
            "nodes": "",
            "tres_alloc_str": "",
            "comment": "gantry-a7",
        },
        {
            "job_id": 8,
            "name": "gantry-a8",
            "job_state": "CANCELLED",
            "exit_code": 15,
            "start_time": 1795994551,
            "end_time": 1795994599,
            "nodes": "gpu-node[1-2]",
            "tres_alloc_str": "gres/gpu=16",
            "comment": "gantry-a8",
        },
    ],
}


def test_parse_squeue_json():
    failed, pending, cancelled = parse_squeue_json(SQUEUE)
    assert (failed.exit_code, failed.signal, failed.gpus) == (3, 0, 2)  # 768 = exit 3
    assert (pending.start, pending.end, pending.reason) == (None, None, "QOSGrpGRES")
    assert (cancelled.exit_code, cancelled.signal, cancelled.nodes) == (
        None,
        15,
        ("gpu-node1", "gpu-node2"),
    )


def test_squeue_json_errors_without_jobs_are_an_error():
    payload = {
        "errors": [
            {
                "description": "Failed while looking for jobs",
                "error_number": -1,
                "error": "Unspecified error",
                "source": "slurm_load_jobs",
            }
        ],
        "jobs": [],
    }
    with pytest.raises(
        ValueError, match=r"Unspecified error: Failed while looking for jobs \(-1\)"
    ):
        parse_squeue_json(payload)


def test_slurmdb_json_exit_code_of_failed_jobs_is_unknown():
    payload = {
        "messages": [],
        "jobs": [
            {
                "job_id": 1,
                "name": "t1",
                "state": {"current": "FAILED", "reason": "None"},
                "exit_code": {"status": "SUCCESS", "return_code": 0},
                "time": {"start": 1795994551, "end": 1795994553, "elapsed": 2},
                "tres": {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": 2}]},
                "comment": {"job": "t1"},
                "nodes": "gpu-node1",
            }
        ],
    }
    (job,) = parse_slurmdb_jobs(payload)
    assert (job.state, job.exit_code, job.gpus, job.elapsed_s) == ("FAILED", None, 2, 2)
    nothing = {"errors": [{"error_number": 9003, "error": "Nothing found"}], "jobs": []}
    assert parse_slurmdb_jobs(nothing) == []


def test_parse_sbatch_job_id():
    assert parse_sbatch_job_id("123\n") == "123"
    assert parse_sbatch_job_id("123;gantrytest\n") == "123"
    with pytest.raises(ValueError):
        parse_sbatch_job_id("Submitted batch job\n")


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("gpu-node[1-2]", ["gpu-node1", "gpu-node2"]),
        ("gpu-node1", ["gpu-node1"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("a[1,3-4],b7", ["a1", "a3", "a4", "b7"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("", []),
        ("None assigned", []),
        ("(null)", []),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["n[1-2", "n]1[", "n[a-b]", "n[3-1]"])
def test_expand_hostlist_refuses_malformed_lists(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


# --- the lifecycle -------------------------------------------------------------------------

START = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
END = datetime(2026, 1, 5, 11, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("state", "exit_code", "signal", "expected"),
    [
        ("PENDING", None, None, ("PENDING", "", None)),
        ("CONFIGURING", None, None, ("PENDING", "", None)),
        ("REQUEUE_HOLD", None, None, ("PENDING", "", None)),
        ("RUNNING", None, None, ("RUNNING", "", None)),
        ("COMPLETING", None, None, ("RUNNING", "", None)),
        ("COMPLETED", 0, 0, ("SUCCEEDED", "", 0)),
        ("FAILED", 3, 0, ("FAILED", "USER_EXIT", 3)),
        ("FAILED", 0, 9, ("FAILED", "USER_EXIT", 137)),
        ("FAILED", 0, 0, ("FAILED", "UNKNOWN", 0)),
        ("FAILED", None, None, ("FAILED", "USER_EXIT", None)),
        ("OUT_OF_MEMORY", 0, 0, ("FAILED", "OOM_HOST", 0)),
        ("NODE_FAIL", 0, 0, ("FAILED", "NODE_FAILURE", 0)),
        ("BOOT_FAIL", 0, 0, ("FAILED", "NODE_FAILURE", 0)),
        ("TIMEOUT", 0, 15, ("FAILED", "TIMEOUT", 143)),
        ("DEADLINE", 0, 0, ("FAILED", "TIMEOUT", 0)),
        ("PREEMPTED", 0, 15, ("PREEMPTED", "PREEMPTED", 143)),
        ("CANCELLED", 0, 15, ("CANCELLED", "CANCELLED", 143)),
        ("SOMETHING_NEW", 0, 0, ("FAILED", "UNKNOWN", 0)),
    ],
)
def test_job_status_maps_states_and_failures(state, exit_code, signal, expected):
    job = SlurmJob(
        job_id="5",
        name="gantry-a5",
        state=state,
        exit_code=exit_code,
        signal=signal,
        start=START,
        end=END,
        nodes=("gpu-node1",),
        gpus=2,
    )
    status = job_status(job)
    assert (status.state, status.failure_reason, status.exit_code) == expected
    if status.state in ("RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED"):
        assert status.started_at == START
        assert status.node_list == ["gpu-node1"]
    if status.state not in ("PENDING", "RUNNING"):
        assert status.finished_at == END


def test_job_status_messages():
    pending = SlurmJob(job_id="5", name="n", state="PENDING", reason="QOSGrpGRES")
    assert job_status(pending).message == "QOSGrpGRES"
    failed = SlurmJob(
        job_id="6",
        name="n",
        state="FAILED",
        reason="NonZeroExitCode",
        exit_code=3,
        signal=0,
        start=START,
        end=END,
        nodes=("gpu-node1",),
        gpus=2,
    )
    assert job_status(failed).message == "Slurm job 6 FAILED, exit code 3:0 on gpu-node1, 2 GPUs"


# --- nodes, inventory, quotas --------------------------------------------------------------

SCONTROL = (
    "NodeName=gpu-node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=16 CPULoad=0.36 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8 NodeAddr=127.0.0.1 "
    "NodeHostName=gpu-node1 Version=22.05.8 OS=Linux 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016 "
    "RealMemory=64000 State=IDLE ThreadsPerCore=1 Partitions=gpu,parked "
    "BootTime=2026-11-29T21:54:26 CfgTRES=cpu=16,mem=62.50G,billing=16,gres/gpu=8\n"
    "NodeName=gpu-node2 Arch=x86_64 Gres=gpu:a100:8(S:0) State=MIXED+DRAIN "
    "Partitions=gpu Reason=maintenance [root@2026-11-29T22:00:00]\n"
    "NodeName=gpu-node3 Gres=gpu:a100:4,gpu:h100:4 State=ALLOCATED Partitions=gpu\n"
    "NodeName=cpu1 Gres=(null) State=IDLE Partitions=cpu\n"
)


def test_parse_scontrol_nodes_and_gres():
    nodes = parse_scontrol_nodes(SCONTROL)
    assert [(n.name, n.state, n.partitions, dict(n.gpus), n.reason) for n in nodes] == [
        ("gpu-node1", "idle", ("gpu", "parked"), {"a100": 8}, ""),
        ("gpu-node2", "mixed+drain", ("gpu",), {"a100": 8}, "maintenance"),
        ("gpu-node3", "allocated", ("gpu",), {"a100": 4, "h100": 4}, ""),
        ("cpu1", "idle", ("cpu",), {}, ""),
    ]
    assert parse_gres("gpu:8") == {"": 8}


def test_inventory_has_every_gpu_node_of_a_flavor_and_says_which_take_no_work():
    nodes = [
        SlurmNode("n1", "idle", ("gpu",), {"a100": 8}),
        SlurmNode("n2", "mixed", ("gpu",), {"a100": 8}),
        SlurmNode("n3", "allocated", ("gpu",), {"a100": 4}),
        SlurmNode("n4", "idle+drain", ("gpu",), {"a100": 8}),
        SlurmNode("n5", "down*", ("gpu",), {"a100": 8}),
        SlurmNode("n6", "idle", ("hopper",), {"h100": 8}),
        SlurmNode("n7", "idle", ("gpu",), {"h100": 8}),  # not in h100's partition
    ]
    inventory = node_inventory(nodes, slurm_settings())
    assert [(n.name, n.flavor, n.gpus, n.schedulable, n.reason) for n in inventory.nodes] == [
        ("n1", "a100-80gb", 8, True, ""),
        ("n2", "a100-80gb", 8, True, ""),
        ("n3", "a100-80gb", 4, True, ""),
        ("n4", "a100-80gb", 8, False, "drained"),
        ("n5", "a100-80gb", 8, False, "down"),
        ("n6", "h100-80gb", 8, True, ""),
    ]
    assert (inventory.levels, inventory.problems) == ((), ())
    assert inventory_items(inventory) == [
        InventoryItem(flavor="a100-80gb", nodes=5, gpus_per_node=8),
        InventoryItem(flavor="h100-80gb", nodes=1, gpus_per_node=8),
    ]


# Captured from the test cluster (scripts/slurm-cluster.sh, Slurm 22.05.8) with gpu-node2
# drained (`scontrol update nodename=gpu-node2 state=drain reason="bad DIMM"`) while two jobs
# ran: `sbatch -J outside --gres=gpu:a100:6` on gpu-node1, and `sbatch -J gantry-a99
# --comment=gantry-a99 -N2 --gres=gpu:a100:1` on both nodes.
# `scontrol -d -o show node`:
SCONTROL_22_05 = (
    "NodeName=gpu-node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=2 CPUEfctv=16 CPUTot=16 "
    "CPULoad=3.02 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8 "
    "GresDrain=N/A GresUsed=gpu:a100:7(IDX:0-6) NodeAddr=127.0.0.1 NodeHostName=gpu-node1 "
    "Port=29421 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=64000 AllocMem=0 FreeMem=21880 Sockets=16 Boards=1 State=MIXED "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,parked  "
    "BootTime=2026-12-02T04:10:43 SlurmdStartTime=2026-12-02T05:49:28 "
    "LastBusyTime=2026-12-02T05:49:47 "
    "CfgTRES=cpu=16,mem=62.50G,billing=16,gres/gpu=8,gres/gpu:a100=8 "
    "AllocTRES=cpu=2,gres/gpu=7,gres/gpu:a100=7 CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
    "NodeName=gpu-node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 CPUEfctv=16 CPUTot=16 "
    "CPULoad=3.02 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:a100:8 "
    "GresDrain=N/A GresUsed=gpu:a100:1(IDX:0) NodeAddr=127.0.0.1 NodeHostName=gpu-node2 "
    "Port=29422 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  "
    "RealMemory=64000 AllocMem=0 FreeMem=21880 Sockets=16 Boards=1 State=MIXED+DRAIN "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu,parked  "
    "BootTime=2026-12-02T04:10:43 SlurmdStartTime=2026-12-02T05:49:28 "
    "LastBusyTime=2026-12-02T05:49:42 "
    "CfgTRES=cpu=16,mem=62.50G,billing=16,gres/gpu=8,gres/gpu:a100=8 "
    "AllocTRES=cpu=1,gres/gpu=1,gres/gpu:a100=1 CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=bad DIMM "
    "[root@2026-12-02T05:52:41]\n"
)
# `squeue -a -h -t CONFIGURING,RUNNING,… -o '%i|%T|%N|%b|%j|%k'` (SQUEUE_GPU_FORMAT):
SQUEUE_GPUS_22_05 = (
    "8|RUNNING|gpu-node1|gres:gpu:a100:6|outside|(null)\n"
    "9|RUNNING|gpu-node[1-2]|gres:gpu:a100:1|gantry-a99|gantry-a99\n"
)
# `scontrol show topology`:
TOPOLOGY_22_05 = (
    "SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu-node1\n"
    "SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=gpu-node2\n"
    "SwitchName=spine Level=1 LinkSpeed=1 Nodes=gpu-node[1-2] Switches=leaf[1-2]\n"
)
# The same moment through slurmrestd v0.0.38: GET /nodes and GET /jobs (the fields read, and
# those next to them; a third job, pending, asked for the drained node with -w gpu-node2).
REST_NODES_22_05 = {
    "meta": {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}},
    "messages": [],
    "nodes": [
        {
            "name": "gpu-node1",
            "state": "mixed",
            "state_flags": [],
            "partitions": ["gpu", "parked"],
            "gres": "gpu:a100:8",
            "gres_drained": "N/A",
            "gres_used": "gpu:a100:7(IDX:0-6)",
            "tres": "cpu=16,mem=62.50G,billing=16,gres/gpu=8,gres/gpu:a100=8",
            "tres_used": "cpu=2,gres/gpu=7,gres/gpu:a100=7",
            "reason": "",
            "reason_changed_at": 0,
            "reason_set_by_user": None,
        },
        {
            "name": "gpu-node2",
            "state": "mixed",
            "state_flags": ["DRAIN"],
            "partitions": ["gpu", "parked"],
            "gres": "gpu:a100:8",
            "gres_drained": "N/A",
            "gres_used": "gpu:a100:1(IDX:0)",
            "tres": "cpu=16,mem=62.50G,billing=16,gres/gpu=8,gres/gpu:a100=8",
            "tres_used": "cpu=1,gres/gpu=1,gres/gpu:a100=1",
            "reason": "bad DIMM",
            "reason_changed_at": 1796190761,
            "reason_set_by_user": "root",
        },
    ],
}
REST_JOBS_22_05 = {
    "messages": [],
    "jobs": [
        {
            "job_id": 8,
            "name": "outside",
            "comment": "",
            "job_state": "RUNNING",
            "state_reason": "None",
            "state_description": "",
            "nodes": "gpu-node1",
            "tres_per_node": "gres:gpu:a100:6",
            "tres_alloc_str": "cpu=1,node=1,billing=1,gres/gpu=6,gres/gpu:a100=6",
        },
        {
            "job_id": 9,
            "name": "gantry-a99",
            "comment": "gantry-a99",
            "job_state": "RUNNING",
            "state_reason": "None",
            "state_description": "",
            "nodes": "gpu-node[1-2]",
            "tres_per_node": "gres:gpu:a100:1",
            "tres_alloc_str": "cpu=2,node=2,billing=2,gres/gpu=2,gres/gpu:a100=2",
        },
        {
            "job_id": 10,
            "name": "gantry-a100",
            "comment": "gantry-a100",
            "job_state": "PENDING",
            "state_reason": "ReqNodeNotAvail",
            "state_description": "ReqNodeNotAvail, UnavailableNodes:gpu-node2",
            "nodes": "",
            "tres_per_node": "gres:gpu:a100:8",
            "tres_alloc_str": "",
        },
    ],
}
# What both transports make of that moment.
NODES_22_05 = (
    NodeInventory(
        name="gpu-node1",
        flavor="a100-80gb",
        gpus=8,
        gpus_used=7,
        gpus_used_by_gantry=1,
        path=("spine", "leaf1"),
    ),
    NodeInventory(
        name="gpu-node2",
        flavor="a100-80gb",
        gpus=8,
        gpus_used=1,
        gpus_used_by_gantry=1,
        schedulable=False,
        reason="draining: bad DIMM",
        path=("spine", "leaf2"),
    ),
)


def test_parse_scontrol_nodes_of_22_05_with_gpus_in_use_and_a_drain_reason():
    node1, node2 = parse_scontrol_nodes(SCONTROL_22_05)
    assert (node1.name, node1.state, node1.partitions, node1.reason) == (
        "gpu-node1",
        "mixed",
        ("gpu", "parked"),
        "",
    )
    assert (dict(node1.gpus), dict(node1.gpus_used)) == ({"a100": 8}, {"a100": 7})
    assert (node2.state, dict(node2.gpus_used), node2.reason) == (
        "mixed+drain",
        {"a100": 1},
        "bad DIMM",
    )
    # Without -d there is no GresUsed: AllocTRES counts the GPUs instead.
    plain = SCONTROL_22_05.replace("GresUsed=gpu:a100:7(IDX:0-6) ", "")
    assert dict(parse_scontrol_nodes(plain)[0].gpus_used) == {"a100": 7}
    idle = "NodeName=n1 Gres=gpu:a100:8 State=IDLE AllocTRES= Reason=x y [slurm@now] Extra=z"
    (node,) = parse_scontrol_nodes(idle)
    assert (dict(node.gpus_used), node.reason) == ({}, "x y")


def test_parse_rest_nodes_of_22_05():
    node1, node2 = parse_rest_nodes(REST_NODES_22_05)
    assert (node1.state, dict(node1.gpus_used), node1.reason) == ("mixed", {"a100": 7}, "")
    assert (node2.state, dict(node2.gpus_used), node2.reason) == (
        "mixed+drain",
        {"a100": 1},
        "bad DIMM",
    )
    idle = {"nodes": [{"name": "n", "state": "idle", "gres": "gpu:a100:8", "tres_used": None}]}
    assert dict(parse_rest_nodes(idle)[0].gpus_used) == {}


def test_gpus_jobs_hold_per_node_and_which_jobs_are_gantrys():
    outside, gantry = parse_squeue_gpus(SQUEUE_GPUS_22_05)
    assert (outside.job_id, outside.name, outside.comment, outside.state) == (
        "8",
        "outside",
        "",
        "RUNNING",
    )
    assert (outside.nodes, dict(outside.gpus_per_node)) == (("gpu-node1",), {"a100": 6})
    assert gantry.nodes == ("gpu-node1", "gpu-node2")
    assert gantry_gpus_by_node([outside, gantry]) == {
        "gpu-node1": {"a100": 1},
        "gpu-node2": {"a100": 1},
    }
    assert gantry_gpus_by_node(parse_squeue_json(REST_JOBS_22_05)) == {
        "gpu-node1": {"a100": 1},
        "gpu-node2": {"a100": 1},
    }
    # A job named like an attempt but carrying another comment is not Gantry's; nor is a
    # pending one (it holds nothing yet).
    posing = SQUEUE_GPUS_22_05.replace("gantry-a99|gantry-a99", "gantry-a99|mine")
    assert gantry_gpus_by_node(parse_squeue_gpus(posing)) == {}
    assert gpus_per_node_of("gres/gpu:h100=4") == {"h100": 4}  # 23.02's spelling
    assert gpus_per_node_of("gres:gpu:2") == {"": 2}


@pytest.mark.parametrize(
    ("state", "condition"),
    [
        ("idle", ""),
        ("mixed", ""),
        ("allocated", ""),
        ("idle+planned", ""),
        ("idle+powered_down", ""),
        ("mixed+completing", ""),
        ("idle+cloud", ""),
        ("idle+drain", "drained"),
        ("down+drain", "drained"),
        ("mixed+drain", "draining"),
        ("idle+drain+completing", "draining"),
        ("down", "down"),
        ("down+not_responding", "down"),
        ("down*", "down"),
        ("idle+not_responding", "not responding"),
        ("idle*", "not responding"),
        ("allocated+fail", "failing"),
        ("idle+maintenance", "in maintenance"),
        ("idle+reserved", "reserved"),
        ("idle+reboot_requested", "rebooting"),
        ("idle+powering_down", "powering down"),
        ("idle+invalid_reg", "invalid"),
        ("future", "future"),
        ("unknown", "unknown"),
        ("error", "error"),
    ],
)
def test_node_condition_in_slurms_words(state, condition):
    assert node_condition(state) == condition


def test_inventory_of_22_05_through_cli_and_rest():
    cli = node_inventory(
        parse_scontrol_nodes(SCONTROL_22_05),
        slurm_settings(),
        jobs=parse_squeue_gpus(SQUEUE_GPUS_22_05),
        topology=TOPOLOGY_22_05,
    )
    assert cli.nodes == NODES_22_05
    assert (cli.levels, cli.problems) == (("spine", "leaf"), ())
    rest_settings = {
        "transport": "rest",
        "rest_url": "http://h:6820",
        "rest_user": "gantry",
        "rest_token_env": "T",
    }
    rest = node_inventory(
        parse_rest_nodes(REST_NODES_22_05),
        slurm_settings(**rest_settings),
        jobs=parse_squeue_json(REST_JOBS_22_05),
        topology=None,  # slurmrestd v0.0.38 cannot tell
    )
    assert rest.nodes == tuple(replace(node, path=()) for node in NODES_22_05)
    assert (rest.levels, rest.problems) == ((), (UNKNOWN_TOPOLOGY,))
    # The operator's copy of topology.conf gives REST the same paths and levels.
    conf = [
        "# topology.conf",
        "SwitchName=leaf1 Nodes=gpu-node1",
        "SwitchName=leaf2 Nodes=gpu-node2",
        "SwitchName=spine Switches=leaf[1-2]",
    ]
    settings = slurm_settings(**rest_settings, topology=conf)
    assert settings.topology is not None
    copied = node_inventory(
        parse_rest_nodes(REST_NODES_22_05),
        settings,
        jobs=parse_squeue_json(REST_JOBS_22_05),
        topology="\n".join(settings.topology),
    )
    assert (copied.nodes, copied.levels, copied.problems) == (NODES_22_05, ("spine", "leaf"), ())


def test_topology_level_names_from_settings_or_the_trees_depth():
    nodes = parse_scontrol_nodes(SCONTROL_22_05)
    named = node_inventory(
        nodes, slurm_settings(topology_levels=["pod", "tor"]), topology=TOPOLOGY_22_05
    )
    assert (named.levels, named.problems) == (("pod", "tor"), ())
    wrong = node_inventory(nodes, slurm_settings(topology_levels=["leaf"]), topology=TOPOLOGY_22_05)
    assert wrong.levels == ("spine", "leaf")
    assert wrong.problems == (
        "setting 'topology_levels' names 1 level (leaf), but the switch tree has 2 "
        "(spine, leaf): using spine, leaf",
    )
    none = node_inventory(nodes, slurm_settings(topology_levels=["spine", "leaf"]), topology="")
    assert (none.levels, [n.path for n in none.nodes]) == ((), [(), ()])
    assert none.problems == (
        "setting 'topology_levels' names 2 levels, but Slurm reports no switch tree "
        "(TopologyPlugin=topology/tree with a topology.conf)",
    )
    assert derived_level_names(5) == ("level-4", "level-3", "core", "spine", "leaf")
    assert derived_level_names(0) == ()


def test_topology_of_uneven_depth_keeps_every_path_one_switch_per_level():
    switches, problems = parse_topology(
        "SwitchName=core Switches=spineA,spineB\n"
        "SwitchName=spineA Switches=leafA1,leafA2\n"
        "SwitchName=spineB Switches=leafB1 Nodes=n5\n"  # n5 hangs off the spine itself
        "SwitchName=leafA1 Nodes=n[1-2]\n"
        "SwitchName=leafA2 Nodes=n[3-4]\n"
        "SwitchName=leafB1 Nodes=n8\n"
        "SwitchName=lone Nodes=n6\n"  # under no core: its own top
    )
    assert problems == []
    assert {name: switch.level for name, switch in switches.items()} == {
        "core": 2,
        "spineA": 1,
        "spineB": 1,
        "leafA1": 0,
        "leafA2": 0,
        "leafB1": 0,
        "lone": 0,
    }
    assert switches["core"].nodes == frozenset({"n1", "n2", "n3", "n4", "n5", "n8"})
    paths, depth, problems = topology_paths(switches, ["n1", "n3", "n5", "n6", "n7"])
    assert depth == 3
    assert paths == {
        "n1": ("core", "spineA", "leafA1"),
        "n3": ("core", "spineA", "leafA2"),
        "n5": ("core", "spineB", "spineB"),
        "n6": ("lone", "lone", "lone"),
        "n7": (),
    }
    assert problems == [
        "topology: node n7 is under no switch (topology.conf)",
        "topology: no switch joins the top switches core, lone: Slurm's topology/tree runs "
        "no job across them",
    ]


def test_a_broken_topology_is_a_problem_not_an_error():
    switches, problems = parse_topology(
        "SwitchName=a Switches=b,ghost\nSwitchName=b Switches=a Nodes=n1\nNodes=n2\n"
    )
    assert switches == {}
    assert problems == [
        "topology: 'Nodes=n2' names no switch (SwitchName=)",
        "topology: switch a names unknown switches ghost",
        "topology: switches form a loop (a → b → a): topology ignored",
    ]
    inventory = node_inventory(
        parse_scontrol_nodes(SCONTROL_22_05),
        slurm_settings(),
        topology="SwitchName=s Nodes=gpu-node[2-1]",
    )
    assert [node.path for node in inventory.nodes] == [(), ()]
    assert inventory.problems == (
        "topology: switch s: bad range '2-1' in host list 'gpu-node[2-1]'",
    )


def test_pending_status_is_slurms_reason_and_has_no_nodes():
    pending = parse_squeue_json(REST_JOBS_22_05)[2]
    status = job_status(pending)
    assert (status.state, status.message, status.node_list) == (
        "PENDING",
        "ReqNodeNotAvail, UnavailableNodes:gpu-node2",
        [],
    )
    fresh = SlurmJob(job_id="5", name="gantry-a5", state="PENDING", reason="None")
    assert job_status(fresh).message == "PENDING"  # not yet looked at by the scheduler
    booting = SlurmJob(
        job_id="6", name="gantry-a6", state="CONFIGURING", reason="None", nodes=("gpu-node1",)
    )
    assert (job_status(booting).message, job_status(booting).node_list) == (
        "CONFIGURING",
        ["gpu-node1"],
    )


def test_quota_commands():
    commands = quota_commands(
        [QuotaLimit("vision", "a100-80gb", 16), QuotaLimit("vision", "h100-80gb", 4)],
        slurm_settings(),
        users=["gantry"],
    )
    assert commands == [
        ["sacctmgr", "-i", "add", "qos", "gantry-vision"],
        [
            "sacctmgr",
            "-i",
            "modify",
            "qos",
            "where",
            "name=gantry-vision",
            "set",
            "GrpTRES=gres/gpu=20,gres/gpu:a100=16,gres/gpu:h100=4",
        ],
        ["sacctmgr", "-i", "add", "account", "vision", "Description=gantry tenant"],
        ["sacctmgr", "-i", "add", "user", "gantry", "account=vision"],
        [
            "sacctmgr",
            "-i",
            "modify",
            "account",
            "where",
            "name=vision",
            "set",
            "QOS+=gantry-vision",
            "DefaultQOS=gantry-vision",
        ],
        [
            "sacctmgr",
            "-i",
            "modify",
            "user",
            "where",
            "name=gantry",
            "account=vision",
            "set",
            "QOS+=gantry-vision",
            "DefaultQOS=gantry-vision",
        ],
    ]


def test_jwt_claims():
    def b64(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    token = f"{b64({'alg': 'HS256'})}.{b64({'exp': 5, 'sun': 'slurmrest'})}.sig"
    assert jwt_claims(token) == {"exp": 5, "sun": "slurmrest"}
    with pytest.raises(ValueError, match="not a JWT"):
        jwt_claims("garbage")
    with pytest.raises(ValueError, match="not a JWT"):
        jwt_claims("a.!!!.c")


def test_pure_module_imports_no_django():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, clusters.backends.slurm_accounts, clusters.backends.slurm_batch, "
            "clusters.backends.slurm_nodes; "
            "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        # squeue's wait status is exact; sacct folds 226 into 98 (observed on 22.05).
        ({"exit_code": 226, "signal": 0}, (226, 0)),
        ({"exit_code": None, "signal": 9}, (None, 9)),
        # slurmctld had no exit status for it: the accounting record's.
        ({"exit_code": None, "signal": 0}, (98, 0)),
        ({"exit_code": None, "signal": None}, (98, 0)),
    ],
)
def test_a_finished_job_keeps_slurmctlds_exact_exit_code_over_saccts(live, expected):
    record = SlurmJob(job_id="7", name="gantry-hc7", state="FAILED", exit_code=98, signal=0)
    held = SlurmJob(job_id="7", name="gantry-hc7", state="FAILED", nodes=("gpu-node2",), **live)
    merged = _merge(record, held)
    assert (merged.exit_code, merged.signal, merged.nodes) == (*expected, ("gpu-node2",))
    assert _merge(record, None) is record
