"""Hostile strings in every user-controlled field of the rendered sbatch script and
Kubernetes manifests (issue 10, point 4b).

The values are built from shell and YAML metacharacters (``$(…)``, backticks, ``;``,
quotes, newlines, ``#SBATCH`` lines, document markers), control characters, unicode line
separators, emoji and very long text. For the sbatch script: the ``#SBATCH`` header is
exactly the job's options, one directive per line, whatever the values; no value adds a
line; ``bash -n`` accepts the script; a printable value is one single-quoted token that
``shlex`` splits back to the value; and run by bash with a fake ``srun``, every value
arrives byte for byte while the canary no command may create stays absent. For the
manifests: every object survives YAML and JSON round trips, each value sits exactly in its
own fields and nowhere else, names and labels are valid DNS-1035 labels and label values,
and kubernetes-validate accepts every object. Last, what the submit accepts renders on
every backend, and what it refuses is refused with a message per field.
"""

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest
import yaml
from django.core.exceptions import ValidationError
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from clusters.backends.base import JobSpec, PermanentBackendError
from clusters.backends.k8s_manifest import (
    ATTEMPT_LABEL,
    MAX_OBJECT_NAME,
    PROJECT_LABEL,
    TENANT_LABEL,
    literal,
    render,
    to_yaml,
)
from clusters.backends.k8s_settings import parse_settings
from clusters.backends.slurm_batch import batch_job, enroot_image, step_command
from clusters.backends.slurm_quoting import RenderError
from clusters.backends.slurm_settings import SlurmSettings
from jobs.models import Attempt
from jobs.services.backend_submit import job_spec_for
from jobs.services.submission import ExperimentInput, run_submit
from tests.clusters.backends.kubernetes_expansion import pod_process
from tests.clusters.backends.test_k8s_manifest import (
    BASE_SETTINGS,
    DNS_1035,
    K8S_VERSIONS,
    LABEL_VALUE,
    validate,
)
from tests.conftest import experiment_input

DIGEST = "sha256:" + "a" * 64
TOKEN = "gat_12.c2VjcmV0LXRva2Vu"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
FRAGMENTS = (
    "$(touch {canary})",
    "`touch {canary}`",
    "; touch {canary};",
    "' ; touch {canary} ; '",
    '" ; touch {canary} ; "',
    "&& touch {canary} ||",
    "| tee {canary}",
    "> {canary}",
    "\n#SBATCH --account=other\n",
    "\n#SBATCH --wrap='touch {canary}'",
    "${{IFS}}",
    "$HOME",
    "$'\\x41'",
    "'",
    '"',
    "\\",
    "\\'",
    "\n",
    "\r\n",
    "\r",
    "\t",
    "\x1b[31m",
    "\x7f",
    "\x85",
    "\u2028",
    "\u2029",
    "\ufeff",
    "!!",
    "*",
    "#",
    "%j",
    "--",
    "---\n",
    "...",
    "key: value",
    "- item",
    "&anchor *alias",
    "!!python/object/apply:os.system ['touch {canary}']",
    "{{ .Values }}",
    "ünïcødé 租户",
    "💥",
    "\u202eRTL\u200b",
)
# Plain names: the test is about values (which names are refused is
# tests/clusters/test_env_names.py).
ENV_NAMES = st.from_regex(r"\AU_[A-Z0-9_]{1,8}\Z")
# A failure is reported as drawn, every draw labelled: shrinking examples of many long
# strings, each run through bash or the database, takes minutes.
AS_DRAWN = (Phase.explicit, Phase.generate)


def hostile_text(canary: str, *, long: bool = True) -> st.SearchStrategy[str]:
    piece = st.one_of(
        st.sampled_from([fragment.format(canary=canary) for fragment in FRAGMENTS]),
        # Any character but NUL (PostgreSQL text cannot hold it; the submit refuses it) and
        # unpaired surrogates (not Unicode text; the API refuses them).
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=8),
    )
    short = st.lists(piece, min_size=1, max_size=8).map("".join)
    if not long:
        return short
    very_long = st.tuples(piece, st.integers(2_000, 17_000)).map(lambda p: (p[0] * p[1])[: p[1]])
    return st.one_of(short, short, short, very_long)


# --- sbatch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    root: Path
    bin: Path
    canary: Path


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    """A PATH of fakes only: ``srun`` records its argv and environment, NUL-separated, and
    ``apptainer`` exists to be found. An injected command finds nothing else to run."""
    root = tmp_path_factory.mktemp("render-injection")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(
        "#!/bin/bash\n"
        'printf \'%s\\0\' "$@" > "$GANTRY_TEST_OUT/argv"\n'
        '/usr/bin/env -0 > "$GANTRY_TEST_OUT/env"\n'
    )
    apptainer = bin_dir / "apptainer"
    apptainer.write_text("#!/bin/sh\nexit 99\n")
    for fake in (srun, apptainer):
        fake.chmod(0o755)
    return Sandbox(root=root, bin=bin_dir, canary=root / "canary")


def slurm_settings(*, transport: str, runtime: str) -> SlurmSettings:
    raw = {
        "transport": transport,
        "job_dir": "/shared/jobs",
        "partition": "gpu",
        "flavors": {"a100-80gb": "a100"},
        "container_runtime": runtime,
    }
    if transport == "rest":
        raw |= {
            "rest_url": "http://slurm-head:6820",
            "rest_user": "gantry",
            "rest_token_env": "SLURM_JWT",
        }
    return SlurmSettings.parse(raw, cluster="fuzz")


def run_script(script: str, sandbox: Sandbox, environment: dict) -> tuple[list[str], dict]:
    """bash -n, then bash with the fake srun: the argv and environment srun received."""
    out = sandbox.root / "out"
    out.mkdir(exist_ok=True)
    for leftover in [*out.iterdir(), sandbox.canary]:
        leftover.unlink(missing_ok=True)
    path = sandbox.root / "job.sh"
    path.write_text(script, encoding="utf-8")
    syntax = subprocess.run(["/bin/bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    env = {**environment, "PATH": str(sandbox.bin), "GANTRY_TEST_OUT": str(out)}
    done = subprocess.run(
        ["/bin/bash", str(path)], env=env, capture_output=True, cwd=sandbox.root, timeout=30
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    argv = (out / "argv").read_bytes().decode().split("\0")[:-1]
    pairs = (out / "env").read_bytes().decode().split("\0")[:-1]
    return argv, dict(pair.split("=", 1) for pair in pairs)


def step_exports(spec: JobSpec) -> dict[str, str]:
    """The variables the step's shell exports: the experiment's env and Gantry's own."""
    return {
        **spec.env,
        "GANTRY_IMAGE": spec.image,
        **({"GANTRY_CHECKPOINT_DIR": spec.checkpoint_dir} if spec.checkpoint_dir else {}),
        **(
            {"GANTRY_RESUME_FROM": spec.resume_uri, "GANTRY_RESUME_STEP": str(spec.resume_step)}
            if spec.resume_step is not None
            else {}
        ),
    }


def step_environment(exports: dict[str, str], sandbox: Sandbox) -> dict[str, str]:
    """What a program started by the step's shell sees of ``exports``: the shell run with the
    exports and a command that dumps its environment instead of the user's command."""
    dump = sandbox.root / "step-env"
    done = subprocess.run(
        ["/bin/bash", "-c", step_command(exports, f"/usr/bin/env -0 > {shlex.quote(str(dump))}")],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    pairs = dump.read_bytes().decode().split("\0")[:-1]
    return dict(pair.split("=", 1) for pair in pairs)


def expected_launch(spec: JobSpec, runtime: str, sandbox: Sandbox) -> list[str]:
    tail = ["/bin/bash", "-c", step_command(step_exports(spec), spec.command)]
    if runtime == "pyxis":
        return [f"--container-image={enroot_image(spec.image)}", *tail]
    if runtime == "apptainer":
        return [str(sandbox.bin / "apptainer"), "exec", "--nv", f"docker://{spec.image}", *tail]
    return tail


def benign(spec: JobSpec) -> JobSpec:
    """The same job with every user value replaced by one plain word."""
    return replace(
        spec,
        command="x",
        env=dict.fromkeys(spec.env, "x"),
        checkpoint_dir="x" if spec.checkpoint_dir else "",
        resume_uri="x",
        image=f"x@{DIGEST}",
        project="x",
    )


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    phases=AS_DRAWN,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_sbatch_script_keeps_hostile_values_inert_and_exact(sandbox, data):
    text = hostile_text(str(sandbox.canary))
    transport = data.draw(st.sampled_from(["cli", "rest"]), label="transport")
    runtime = data.draw(st.sampled_from(["pyxis", "apptainer", "none"]), label="runtime")
    env = data.draw(st.dictionaries(ENV_NAMES, text, max_size=3), label="env")
    repository = data.draw(
        st.one_of(st.just("registry.example.org/ml/pytorch"), text.filter(lambda s: "@" not in s)),
        label="image repository",
    )
    spec = JobSpec(
        name="gantry-a12",
        attempt_id=12,
        run_id=7,
        tenant="vision",
        project=data.draw(text, label="project"),
        image=f"{repository}@{DIGEST}",
        command=data.draw(text.filter(str.strip), label="command"),
        env=env,
        flavor="a100-80gb",
        nodes=data.draw(st.integers(1, 4), label="nodes"),
        gpus_per_node=data.draw(st.integers(1, 8), label="gpus_per_node"),
        max_runtime_s=data.draw(st.integers(60, 30 * 24 * 3600), label="max_runtime_s"),
        checkpoint_dir=data.draw(st.one_of(st.just(""), text), label="checkpoint_dir"),
        resume_step=1200,
        resume_uri=data.draw(text, label="resume uri"),
        attempt_token=TOKEN,
    )
    slurm = slurm_settings(transport=transport, runtime=runtime)

    job = batch_job(spec, slurm)

    lines = job.script.split("\n")
    # The header is the job's options, one directive a line, and nothing else is one.
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives == [f"#SBATCH {option}" for option in job.sbatch_options()]
    assert lines[1 : 1 + len(directives)] == directives
    # Values never add a line: the script has the lines of the same job with plain values.
    assert len(lines) == len(batch_job(benign(spec), slurm).script.split("\n"))
    assert "\r" not in job.script  # sbatch refuses DOS line breaks
    assert TOKEN not in job.script
    exports = step_exports(spec)
    # Nothing of the experiment's env is exported by the batch shell (issue 21.1).
    assert [line for line in lines if line.startswith("export ")] == []
    launch = next(line for line in lines if line.startswith('"$gantry_srun"'))
    if not CONTROL.search(spec.command + spec.image + "".join(exports.values())):
        assert shlex.split(launch)[-2:] == [step_command(exports, spec.command), "&"]

    argv, received = run_script(job.script, sandbox, job.environment)

    assert argv == expected_launch(spec, runtime, sandbox)
    # srun (and the container runtime it starts) receive none of it ...
    assert sorted(set(exports) & set(received)) == []
    assert received["GANTRY_ATTEMPT_TOKEN"] == TOKEN
    # ... the step's shell exports each value exactly, for the program.
    seen = step_environment(exports, sandbox)
    assert {key: seen.get(key) for key in exports} == exports
    assert not sandbox.canary.exists()
    if transport == "rest":
        body = json.loads(json.dumps(job.rest_submission()))
        assert body["script"] == job.script
        assert body["job"]["environment"]["GANTRY_ATTEMPT_TOKEN"] == TOKEN


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"command": "echo \x00"}, "values cannot contain NUL characters"),
        ({"env": {"U_X": "a\x00b"}}, "values cannot contain NUL characters"),
        ({"checkpoint_dir": "/ckpt\x00"}, "values cannot contain NUL characters"),
        ({"env": {"BAD;NAME": "x"}}, "'BAD;NAME' is not a valid variable name"),
        ({"tenant": "vision\n#SBATCH --account=x"}, "is not a plain Slurm name"),
        ({"image": "registry.example.org/ml/pytorch:latest"}, "is not pinned by digest"),
    ],
)
def test_sbatch_render_refuses_what_it_cannot_quote_instead_of_writing_it(overrides, message):
    spec = JobSpec(
        name="gantry-a12",
        attempt_id=12,
        run_id=7,
        tenant="vision",
        project="detection",
        image=f"registry.example.org/ml/pytorch@{DIGEST}",
        command="python train.py",
        env={},
        flavor="a100-80gb",
        nodes=1,
        gpus_per_node=1,
        max_runtime_s=3600,
    )

    with pytest.raises(RenderError) as refused:
        batch_job(replace(spec, **overrides), slurm_settings(transport="cli", runtime="pyxis"))

    assert message in str(refused.value)


# --- Kubernetes ----------------------------------------------------------------------------


QUEUEING = {
    "none": {},
    "kueue": {"queueing": "kueue", "kueue_queue": "gpu-queue", "kueue_topology_level": "rack"},
    "volcano": {"queueing": "volcano", "volcano_queue": "research"},
}


def string_leaves(value, path=()):
    """(path, string) for every string in a manifest, keys included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*path, "<key>"), key
            yield from string_leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from string_leaves(item, (*path, index))
    elif isinstance(value, str):
        yield path, value


def paths_holding(objects: list[dict], value: str) -> set[tuple]:
    return {
        (obj["kind"], *path)
        for obj in objects
        for path, leaf in string_leaves(obj)
        if value in leaf
    }


def metadata_paths(objects: list[dict], key: str) -> set[tuple]:
    """Where the annotation ``key`` is: every object's metadata and the pod template's."""
    paths = {(obj["kind"], "metadata", "annotations", key) for obj in objects}
    return paths | {("Job", "spec", "template", "metadata", "annotations", key)}


@settings(max_examples=150, deadline=None, derandomize=True, database=None, phases=AS_DRAWN)
@given(data=st.data())
def test_manifests_keep_hostile_values_in_their_own_fields_and_stay_valid(data):
    # Each value starts with its own marker, so finding it anywhere else means it leaked.
    text = hostile_text("/tmp/canary")

    def marked(marker: str, label: str) -> str:
        return f"⟦{marker}⟧" + data.draw(text, label=label)

    tenant, project = marked("t", "tenant"), marked("p", "project")
    command = marked("c", "command")
    env = {
        name: marked(f"e{i}", name)
        for i, name in enumerate(data.draw(st.sets(ENV_NAMES, max_size=3)))
    }
    resume = data.draw(st.booleans(), label="resume")
    nodes = data.draw(st.integers(1, 4), label="nodes")
    queueing = data.draw(st.sampled_from(sorted(QUEUEING)), label="queueing")
    spec = JobSpec(
        name=data.draw(st.one_of(st.just("gantry-a41"), text), label="name"),
        attempt_id=41,
        run_id=17,
        tenant=tenant,
        project=project,
        image=f"registry.example.org/ml/pytorch@{DIGEST}",
        command=command,
        env=env,
        flavor="a100-80gb",
        nodes=nodes,
        gpus_per_node=data.draw(st.integers(1, 8), label="gpus_per_node"),
        max_runtime_s=7200,
        resume_step=1200 if resume else None,
        resume_uri=marked("r", "resume uri") if resume else "",
        attempt_token=TOKEN,
    )

    objects = render(spec, parse_settings({**BASE_SETTINGS, **QUEUEING[queueing]}))

    assert list(yaml.safe_load_all(to_yaml(objects))) == objects
    assert json.loads(json.dumps(objects)) == objects
    for obj in objects:
        validate(obj, K8S_VERSIONS[-1])
        metadata = obj["metadata"]
        assert len(metadata["name"]) <= MAX_OBJECT_NAME + len("-token")
        assert DNS_1035.match(metadata["name"])
        assert len(metadata["namespace"]) <= 63 and DNS_1035.match(metadata["namespace"])
        assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in metadata["labels"].values())
        assert metadata["annotations"][TENANT_LABEL] == tenant
        assert metadata["annotations"][PROJECT_LABEL] == project
    job = objects[-1]
    pod = job["spec"]["template"]
    container = pod["spec"]["containers"][0]
    # What the container gets, after Kubernetes' own $(NAME) expansion, is what was typed.
    argv, received = pod_process(objects)
    assert argv == ["/bin/bash", "-c", command]
    assert {name: received[name] for name in env} == env
    assert pod["metadata"]["labels"][ATTEMPT_LABEL] == "41"
    assert TOKEN not in json.dumps(objects)
    # Each value is where it belongs and nowhere else (there with every "$" doubled, which
    # Kubernetes reads back as one).
    command_path = ("Job", "spec", "template", "spec", "containers", 0, "command", 2)
    assert paths_holding(objects, literal(command)) == {command_path}
    assert paths_holding(objects, "⟦t⟧") == metadata_paths(objects, TENANT_LABEL)
    assert paths_holding(objects, "⟦p⟧") == metadata_paths(objects, PROJECT_LABEL)
    env_index = {item["name"]: i for i, item in enumerate(container["env"])}
    for name, value in env.items():
        where = ("Job", "spec", "template", "spec", "containers", 0, "env", env_index[name])
        assert paths_holding(objects, literal(value)) == {(*where, "value")}
    if resume:
        where = ("Job", "spec", "template", "spec", "containers", 0, "env")
        assert paths_holding(objects, "⟦r⟧") == {(*where, env_index["GANTRY_RESUME_FROM"], "value")}


# --- the submit refuses what no backend could render ----------------------------------------


def requests(canary: str) -> st.SearchStrategy[dict]:
    """Submit requests whose fields are mostly hostile but storable, sometimes refusable."""
    text = hostile_text(canary, long=False)
    env_names = st.one_of(
        ENV_NAMES,
        st.sampled_from(["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GANTRY_IMAGE"]),
        st.sampled_from(["GANTRY_ATTEMPT_TOKEN", "GANTRY_API_URL", "BAD-NAME", "1ST", "X\x00"]),
    )
    return st.fixed_dictionaries(
        {
            "command": st.one_of(
                text, text, hostile_text(canary), st.sampled_from(["", "   ", "echo \x00"])
            ),
            "env": st.dictionaries(
                env_names, st.one_of(text, text, text, st.just("a\x00b")), max_size=2
            ),
            "name": text,
            "checkpoint_dir": st.one_of(st.just(""), text),
            "dataset_uri": text,
            "nodes": st.integers(1, 2),
            "gpus_per_node": st.integers(1, 8),
        }
    )


INPUT_FIELDS = {f.name for f in fields(ExperimentInput)}
K8S_SETTINGS = parse_settings(BASE_SETTINGS)


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    phases=AS_DRAWN,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_what_the_submit_accepts_renders_everywhere_and_what_it_refuses_names_the_field(
    world, sandbox, data
):
    values = data.draw(requests(str(sandbox.canary)), label="request")

    try:
        run = run_submit(user=world.researcher_a, data=experiment_input(world, **values))
    except ValidationError as refused:
        event("refused")
        assert set(refused.message_dict) <= INPUT_FIELDS
        assert all(refused.message_dict.values())
        return
    event("accepted")
    attempt = Attempt.objects.create(run=run, number=1, cluster=world.cluster)
    spec = job_spec_for(attempt)

    for transport, runtime in (("cli", "pyxis"), ("rest", "apptainer"), ("cli", "none")):
        job = batch_job(spec, slurm_settings(transport=transport, runtime=runtime))
        launch = next(line for line in job.script.split("\n") if line.startswith('"$gantry_srun"'))
        assert f"export GANTRY_IMAGE={world.image.reference}; " in launch
    try:
        render(spec, K8S_SETTINGS, token=TOKEN)
    except PermanentBackendError as unrenderable:
        pytest.fail(f"accepted at submit, refused by Kubernetes: {unrenderable}")


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_rendezvous_variables_of_a_multi_node_job_are_refused_at_submit(world, name):
    """Kubernetes sets them in every pod of a multi-node job and refuses a job that sets
    them too: found by the property above, the submit used to accept such a job, whose
    attempt then failed at the backend."""
    request = experiment_input(world, nodes=2, gpus_per_node=8, env={name: "0"})

    with pytest.raises(ValidationError) as refused:
        run_submit(user=world.researcher_a, data=request)

    assert refused.value.message_dict == {
        "env": [f"{name} is set by Gantry in every task of a multi-node job; leave it out."]
    }
    assert Attempt.objects.count() == 0


def test_a_single_node_job_may_set_its_own_rank(world):
    run = run_submit(user=world.researcher_a, data=experiment_input(world, env={"RANK": "0"}))
    spec = job_spec_for(Attempt.objects.create(run=run, number=1, cluster=world.cluster))

    job = render(spec, K8S_SETTINGS)[-1]

    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "RANK", "value": "0"} in env
