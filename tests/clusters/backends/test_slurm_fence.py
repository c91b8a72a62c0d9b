"""The Slurm backend's drain and resume, what a node's state says about its health, and
``--exclude``, without a cluster: the commands Gantry would run are recorded and answered
as scontrol answers (the real cluster: test_slurm_cluster.py)."""

import subprocess
from types import SimpleNamespace

import pytest

from clusters.backends import JobSpec, PermanentBackendError
from clusters.backends.slurm import SlurmBackend
from clusters.backends.slurm_batch import batch_job
from clusters.backends.slurm_cli import CliTransport
from clusters.backends.slurm_fence import (
    MAX_REASON,
    fence_argv,
    fence_reason,
    is_gantry_reason,
    node_signals,
    unfence_argv,
)
from clusters.backends.slurm_nodes import node_inventory, parse_scontrol_nodes
from clusters.backends.slurm_quoting import RenderError
from clusters.backends.slurm_settings import SlurmSettings
from clusters.health import Signal, SignalClass, Source

SETTINGS = {
    "job_dir": "/shared/jobs",
    "transport": "cli",
    "partition": "gpu",
    "flavors": {"a100-80gb": "a100"},
}
HOSTILE_NODES = ["gpu-node2; rm -rf /", "gpu-node[1-2]", "$(id)", "gpu node2", "", "-x", "a\nb"]


def show_node(name: str, state: str, reason: str = "") -> str:
    line = (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1 Gres=gpu:a100:8 State={state} "
        "Partitions=gpu,parked"
    )
    return line + (f" Reason={reason} [root@2026-12-06T11:00:00]" if reason else "")


class Scontrol:
    """Stands in for ``CliTransport.run``: answers ``scontrol -o show node`` from ``nodes``
    (name → (state, reason)), a drain or resume with ``update`` (stderr, returncode)."""

    def __init__(self, nodes: dict[str, tuple[str, str]], update=("", 0)):
        self.nodes, self.update, self.calls = nodes, update, []

    def __call__(self, transport, argv, **kwargs):
        self.calls.append(list(argv))
        if argv[:4] == ["scontrol", "-o", "show", "node"]:
            if argv[4] not in self.nodes:
                return subprocess.CompletedProcess(argv, 1, "", f"Node {argv[4]} not found\n")
            state, reason = self.nodes[argv[4]]
            return subprocess.CompletedProcess(argv, 0, show_node(argv[4], state, reason), "")
        stderr, code = self.update
        return subprocess.CompletedProcess(argv, code, "", stderr)


@pytest.fixture
def scontrol(monkeypatch):
    def install(nodes, update=("", 0)):
        fake = Scontrol(nodes, update)
        monkeypatch.setattr(CliTransport, "run", lambda self, argv, **kw: fake(self, argv, **kw))
        return fake

    return install


def backend(**overrides) -> SlurmBackend:
    return SlurmBackend(SimpleNamespace(name="hpc", settings={**SETTINGS, **overrides}))


# --- the commands ---------------------------------------------------------------------------


def test_the_drain_is_one_argument_per_key_with_gantrys_reason():
    assert fence_argv("gpu-node2", "XID 79 on GPU 1") == [
        "scontrol",
        "update",
        "NodeName=gpu-node2",
        "State=DRAIN",
        "Reason=gantry: XID 79 on GPU 1",
    ]
    assert unfence_argv("gpu-node2") == [
        "scontrol",
        "update",
        "NodeName=gpu-node2",
        "State=RESUME",
    ]


def test_a_reason_is_one_line_without_quotes_and_bounded():
    assert fence_reason('XID 79\non GPU 1\r\n"bad"\x1b[31m') == "gantry: XID 79 on GPU 1 bad [31m"
    assert fence_reason("") == "gantry: node health"
    # Node health's push gives every backend the prefixed reason: Slurm shows it once.
    assert fence_reason("gantry: GPU 1: XID 79") == "gantry: GPU 1: XID 79"
    assert fence_reason(" gantry:  GPU 1 ") == "gantry: GPU 1"
    assert fence_reason("gantry:") == "gantry: node health"
    long = fence_reason("x" * 1000)
    assert long == "gantry: " + "x" * (MAX_REASON - 1) + "…"
    assert is_gantry_reason("gantry: XID 79 on GPU 1")
    assert not is_gantry_reason("bad DIMM (ticket 42)")
    assert not is_gantry_reason("Gantry said so")


@pytest.mark.parametrize("node", HOSTILE_NODES)
def test_a_node_name_with_shell_or_hostlist_characters_runs_nothing(scontrol, node):
    fake = scontrol({"gpu-node2": ("IDLE", "")})
    for call in (lambda: backend().fence(node, "XID 79"), lambda: backend().unfence(node)):
        with pytest.raises(PermanentBackendError, match="is not a Slurm node name"):
            call()
    assert fake.calls == []


# --- fence and unfence ----------------------------------------------------------------------


def test_fence_drains_an_idle_node(scontrol):
    fake = scontrol({"gpu-node2": ("IDLE", "")})
    backend().fence("gpu-node2", "XID 79 on GPU 1")
    assert fake.calls == [
        ["scontrol", "-o", "show", "node", "gpu-node2"],
        fence_argv("gpu-node2", "XID 79 on GPU 1"),
    ]


@pytest.mark.parametrize(
    "state, reason",
    [("IDLE+DRAIN", "gantry: XID 79 on GPU 1"), ("MIXED+DRAIN", "bad DIMM (ticket 42)")],
)
def test_fence_leaves_a_drained_node_and_its_reason_alone(scontrol, state, reason):
    fake = scontrol({"gpu-node2": (state, reason)})
    backend().fence("gpu-node2", "XID 48 on GPU 3")
    assert fake.calls == [["scontrol", "-o", "show", "node", "gpu-node2"]]


def test_a_node_that_is_only_down_is_drained_so_it_stays_out(scontrol):
    fake = scontrol({"gpu-node2": ("DOWN+NOT_RESPONDING", "Not responding")})
    backend().fence("gpu-node2", "XID 79 on GPU 1")
    assert fake.calls[-1] == fence_argv("gpu-node2", "XID 79 on GPU 1")


def test_a_refused_drain_says_the_user_needs_slurm_admin_rights(scontrol):
    scontrol({"gpu-node2": ("IDLE", "")}, update=("slurm_update error: Invalid user id\n", 1))
    with pytest.raises(PermanentBackendError) as refused:
        backend().fence("gpu-node2", "XID 79")
    assert str(refused.value) == (
        "Slurm refused to drain node gpu-node2 (Invalid user id): only Slurm administrators "
        "may drain or resume nodes; give Gantry's Slurm user AdminLevel=Admin "
        "(sacctmgr modify user <user> set AdminLevel=Admin)"
    )


def test_an_unknown_node_is_refused_with_slurms_words(scontrol):
    scontrol({})
    with pytest.raises(
        PermanentBackendError, match=r"^Slurm has no node gpu-node9: Node gpu-node9"
    ):
        backend().fence("gpu-node9", "XID 79")


def test_unfence_resumes_only_gantrys_drain(scontrol):
    fake = scontrol({"gpu-node2": ("IDLE+DRAIN", "gantry: XID 79 on GPU 1")})
    backend().unfence("gpu-node2")
    assert fake.calls[-1] == unfence_argv("gpu-node2")

    fake = scontrol({"gpu-node2": ("IDLE+DRAIN", "bad DIMM (ticket 42)")})
    with pytest.raises(PermanentBackendError) as refused:
        backend().unfence("gpu-node2")
    assert str(refused.value) == (
        "Slurm node gpu-node2 is IDLE+DRAIN for 'bad DIMM (ticket 42)', not by Gantry: Gantry "
        "resumes only the nodes it drained itself; a Slurm administrator resumes it "
        "(scontrol update NodeName=gpu-node2 State=RESUME) once it is fit"
    )
    assert fake.calls == [["scontrol", "-o", "show", "node", "gpu-node2"]]


def test_unfence_of_a_node_that_takes_work_does_nothing(scontrol):
    fake = scontrol({"gpu-node2": ("MIXED", "")})
    backend().unfence("gpu-node2")
    assert fake.calls == [["scontrol", "-o", "show", "node", "gpu-node2"]]


def test_slurmrestd_cannot_drain_without_a_cli(scontrol):
    fake = scontrol({"gpu-node2": ("IDLE", "")})
    rest = {
        "transport": "rest",
        "rest_url": "http://slurm-head:6820",
        "rest_user": "gantry",
        "rest_token_env": "SLURM_JWT_TEST",
    }
    with pytest.raises(PermanentBackendError) as refused:
        backend(**rest).fence("gpu-node2", "XID 79")
    assert str(refused.value) == (
        "cluster hpc: slurmrestd's API v0.0.38 cannot drain nodes (it has no endpoint that "
        "changes a node): give the setting slurm_conf, so that Gantry runs scontrol on its "
        "workers as a Slurm administrator, or turn the health policy's fence_backend off "
        "(Gantry then only keeps the node out of its own placement)"
    )
    assert fake.calls == []
    # With a slurm.conf on the worker, the drain goes through scontrol.
    backend(**rest, slurm_conf="/etc/slurm/slurm.conf").fence("gpu-node2", "XID 79")
    assert fake.calls[-1] == fence_argv("gpu-node2", "XID 79")


# --- signals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state, reason, code, detail",
    [
        ("down+not_responding", "Not responding", "DOWN+NOT_RESPONDING", "Not responding"),
        ("idle*", "", "IDLE+NOT_RESPONDING", "Slurm reports the node IDLE+NOT_RESPONDING"),
        ("idle+fail", "GPU hang", "IDLE+FAIL", "GPU hang"),
        ("down", "power supply", "DOWN", "power supply"),
    ],
)
def test_down_failing_and_unresponsive_nodes_are_node_down(state, reason, code, detail):
    assert node_signals("gpu-node2", state, reason, at=1_700_000_000.0) == (
        Signal(
            node="gpu-node2",
            signal=SignalClass.NODE_DOWN,
            source=Source.BACKEND,
            at=1_700_000_000.0,
            code=code,
            detail=detail,
        ),
    )


@pytest.mark.parametrize(
    "state, reason",
    [
        ("idle", ""),
        ("mixed", ""),
        ("allocated+completing", ""),
        ("idle+drain", "bad DIMM"),  # a person's drain: unschedulable already, no signal
        ("mixed+drain", "gantry: XID 79 on GPU 1"),  # Gantry's own
    ],
)
def test_working_and_drained_nodes_send_no_signal(state, reason):
    assert node_signals("gpu-node1", state, reason, at=1.0) == ()


def test_the_inventory_carries_each_nodes_signals():
    text = "\n".join(
        [
            show_node("gpu-node1", "IDLE"),
            show_node("gpu-node2", "DOWN+DRAIN+NOT_RESPONDING", "gantry: XID 79 on GPU 1"),
        ]
    )
    found = node_inventory(
        parse_scontrol_nodes(text), SlurmSettings.parse(SETTINGS), now=1_700_000_000.0
    )
    by_name = {node.name: node for node in found.nodes}
    assert by_name["gpu-node1"].signals == ()
    assert (by_name["gpu-node2"].schedulable, by_name["gpu-node2"].reason) == (
        False,
        "drained: gantry: XID 79 on GPU 1",
    )
    assert [(s.signal, s.code, s.detail) for s in by_name["gpu-node2"].signals] == [
        (SignalClass.NODE_DOWN, "DOWN+DRAIN+NOT_RESPONDING", "gantry: XID 79 on GPU 1")
    ]


# --- exclusion ------------------------------------------------------------------------------


def spec(**overrides) -> JobSpec:
    values = {
        "name": "gantry-a7",
        "attempt_id": 7,
        "run_id": 3,
        "tenant": "vision",
        "project": "detection",
        "image": "registry.example.org/ml/pytorch@sha256:" + "a" * 64,
        "command": "python train.py",
        "env": {},
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 2,
        "max_runtime_s": 600,
    }
    return JobSpec(**{**values, **overrides})


@pytest.mark.parametrize("transport", ["cli", "rest"])
def test_excluded_nodes_become_exclude_in_the_script_and_the_rest_body(transport):
    settings = dict(SETTINGS, transport=transport)
    if transport == "rest":
        settings |= {"rest_url": "http://h:6820", "rest_user": "g", "rest_token_env": "T"}
    job = batch_job(
        spec(excluded_nodes=("gpu-node3", "gpu-node2", "gpu-node3")),
        SlurmSettings.parse(settings),
    )
    assert job.exclude == "gpu-node2,gpu-node3"
    assert "#SBATCH --exclude=gpu-node2,gpu-node3" in job.script.splitlines()
    assert (
        "# Not on gpu-node2,gpu-node3: a node Gantry found faulty while this run used it."
        in job.script.splitlines()
    )
    assert job.rest_submission()["job"]["exclude_nodes"] == "gpu-node2,gpu-node3"


def test_without_exclusions_there_is_no_exclude():
    job = batch_job(spec(), SlurmSettings.parse(SETTINGS))
    assert not any("exclude" in line for line in job.script.splitlines())
    assert "exclude_nodes" not in job.rest_submission()["job"]


@pytest.mark.parametrize("node", HOSTILE_NODES)
def test_an_excluded_node_that_is_not_a_node_name_is_refused(node):
    with pytest.raises(RenderError, match=r"^excluded node: .* is not a Slurm node name"):
        batch_job(spec(excluded_nodes=(node,)), SlurmSettings.parse(SETTINGS))


def test_a_node_both_placed_on_and_excluded_is_refused():
    with pytest.raises(
        RenderError, match=r"^node gpu-node2 is both in the placement and excluded$"
    ):
        batch_job(
            spec(placement=("gpu-node2",), excluded_nodes=("gpu-node2",)),
            SlurmSettings.parse(SETTINGS),
        )


# --- the health check -----------------------------------------------------------------------


def test_a_health_check_needs_the_setting_and_a_node_not_drained_by_someone_else(scontrol):
    fake = scontrol({"gpu-node2": ("IDLE+DRAIN", "bad DIMM (ticket 42)")})
    with pytest.raises(PermanentBackendError) as refused:
        backend().health_check("gpu-node2", check_id=1, flavor="a100-80gb", gpus=8)
    assert str(refused.value) == "cluster hpc has no health_check setting (its command)"
    checks = {"command": "dcgmi diag -r 1"}
    with pytest.raises(PermanentBackendError) as refused:
        backend(health_check=checks).health_check(
            "gpu-node2", check_id=1, flavor="a100-80gb", gpus=8
        )
    assert str(refused.value) == (
        "Slurm node gpu-node2 is drained for 'bad DIMM (ticket 42)', not by Gantry: Gantry "
        "checks only nodes that take work or that it drained itself"
    )
    assert fake.calls == [["scontrol", "-o", "show", "node", "gpu-node2"]]
    with pytest.raises(PermanentBackendError) as refused:
        backend(health_check={"command": "x", "image": "y"}).health_check(
            "gpu-node2", check_id=1, flavor="a100-80gb", gpus=8
        )
    assert str(refused.value) == (
        "cluster hpc: health_check: unknown setting(s) image (it takes account, command, "
        "max_runtime_s)"
    )


def test_a_health_check_script_runs_its_command_on_the_node():
    spec_ = spec(name="gantry-hc4", tenant="", command="dcgmi diag -r 1", placement=("gpu-node2",))
    job = batch_job(spec_, SlurmSettings.parse(SETTINGS), reservation="gantry-hc4")
    lines = job.script.splitlines()
    assert lines[1:3] == ["#SBATCH --job-name=gantry-hc4", "#SBATCH --comment=gantry-hc4"]
    assert "#SBATCH --reservation=gantry-hc4" in lines
    assert not any(line.startswith("#SBATCH --account") for line in lines)
    assert "# Gantry health check of gpu-node2." in lines
    assert job.rest_submission()["job"]["reservation"] == "gantry-hc4"
    assert "account" not in job.rest_submission()["job"]
    # An attempt without a tenant is refused as before: only a check may go without one.
    with pytest.raises(RenderError, match="is not a plain Slurm name"):
        batch_job(spec(tenant=""), SlurmSettings.parse(SETTINGS))
