"""Issue 21.1: names an experiment's env may not set are refused with a clear reason,
everywhere a run is described (form, API, spec files, templates), before any backend sees
them; the bash list is measured against the real bash."""

import json
import re
import subprocess
from dataclasses import replace

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from rest_framework.test import APIClient

from clusters.backends import PermanentBackendError
from clusters.backends.k8s_manifest import render
from clusters.backends.k8s_settings import parse_settings
from clusters.backends.simulator import SimulatorBackend
from clusters.backends.slurm_batch import batch_job
from clusters.backends.slurm_quoting import RenderError
from clusters.env_names import BASH_REFUSES, env_name_refusal
from jobs.models import Attempt, Experiment, ExperimentTemplate, Run
from jobs.services.backend_submit import job_spec_for
from jobs.services.submission import run_rerun, run_submit
from jobs.services.templates import template_save
from tenants.services.tokens import api_token_create
from tests.clusters.backends.test_k8s_manifest import BASE_SETTINGS, TOKEN, spec_for
from tests.clusters.backends.test_render_injection import slurm_settings
from tests.conftest import experiment_input
from tests.jobs.test_spec import FULL_SPEC, SPECS
from tests.jobs.test_web import form_data

LAUNCHER = (
    "{name} is read by the cluster's launcher, the dynamic loader or the shell outside your "
    "container, not only by your program; Gantry does not pass such names. Set it inside "
    "your command instead (e.g. 'export NAME=value; python train.py')."
)
BASH = (
    "{name} is set by bash itself and cannot be passed to a job; use another name, or set it "
    "inside your command."
)


@pytest.mark.parametrize(
    "name",
    [
        "SLURM_JOB_ID", "SLURM_CONF", "SLURM_OVERLAP", "SRUN_CPUS_PER_TASK", "SBATCH_ACCOUNT",
        "SALLOC_PARTITION", "SPANK_PYXIS_X", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT",
        "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PMIX_SERVER_URI", "PMI_FD",
        "PYXIS_CONTAINER_IMAGE", "ENROOT_DATA_PATH", "APPTAINER_BIND", "APPTAINERENV_PATH",
        "SINGULARITY_BIND", "BASH_FUNC_ls%%"[:-2],
    ],
)  # fmt: skip
def test_host_side_names_are_refused_with_the_reason(name):
    assert env_name_refusal(name) == LAUNCHER.format(name=name)


@pytest.mark.parametrize("name", ["UID", "PPID", "RANDOM", "PWD", "SHLVL", "IFS", "_", "EUID"])
def test_names_bash_will_not_pass_are_refused(name):
    assert env_name_refusal(name) == BASH.format(name=name)


@pytest.mark.parametrize(
    "name",
    ["PATH", "HOME", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "OMP_NUM_THREADS", "MY_LD_FLAGS",
     "slurm_job_id", "LR", "GANTRY_SIM_PROFILE", "PYTHONPATH"],
)  # fmt: skip
def test_the_program_s_own_names_pass(name):
    assert env_name_refusal(name) is None


GANTRY_SETS = {
    "GANTRY_ATTEMPT_TOKEN": "the attempt's token, with which the job reports about itself",
    "GANTRY_API_URL": "the address the job reports to",
    "GANTRY_IMAGE": "the image the job runs",
    "GANTRY_CHECKPOINT_DIR": "the experiment's checkpoint directory",
    "GANTRY_RESUME_FROM": "the checkpoint a resumed attempt starts from",
    "GANTRY_RESUME_STEP": "the step of that checkpoint",
}


@pytest.mark.parametrize(("name", "what"), GANTRY_SETS.items())
def test_every_name_gantry_sets_is_refused_with_what_it_carries(name, what):
    assert env_name_refusal(name) == f"{name} is set by Gantry itself ({what}); leave it out."


def test_the_refused_gantry_names_are_exactly_those_every_backend_sets(world):
    """One list: what each backend puts in a job's env itself (for a resumed attempt of an
    experiment with a checkpoint directory: all of it) is what the submit refuses."""
    run = run_submit(
        user=world.researcher_a, data=experiment_input(world, checkpoint_dir="/ckpt", env={})
    )
    attempt = Attempt.objects.create(run=run, number=1, cluster=world.cluster)
    spec = replace(
        job_spec_for(attempt), resume_step=5, resume_uri="s3://ckpt/5", attempt_token=TOKEN
    )

    pod = render(spec, parse_settings(BASE_SETTINGS), token=TOKEN)[-1]["spec"]["template"]
    kubernetes = {item["name"] for item in pod["spec"]["containers"][0]["env"]}
    job = batch_job(spec, slurm_settings(transport="cli", runtime="pyxis"))
    slurm = set(re.findall(r"export (\w+)=", job.script)) | set(job.environment) - {"PATH"}
    simulator = set(json.loads(SimulatorBackend(world.cluster).render(spec))["env"])

    assert kubernetes == slurm == simulator == set(GANTRY_SETS)
    assert all(env_name_refusal(name) for name in GANTRY_SETS)
    # Other GANTRY_* names are the program's: these steer the simulated workload.
    assert env_name_refusal("GANTRY_SIM_PROFILE") is None


def test_bad_names():
    assert env_name_refusal("1X") == (
        "'1X' is not a valid variable name: letters, digits and _, not starting with a digit, "
        "at most 128 characters."
    )


def bash_passes(name: str) -> bool:
    """Whether a program started by bash sees NAME=gantry-v, exported by the shell or given
    in its environment."""
    probe = f"printenv {name}"
    exported = subprocess.run(
        ["/bin/bash", "-c", f"export {name}=gantry-v; /usr/bin/{probe}"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    inherited = subprocess.run(
        ["/bin/bash", "-c", f"/usr/bin/{probe}"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", name: "gantry-v"},
    )  # fmt: skip
    return exported.stdout == inherited.stdout == "gantry-v\n"


def test_every_name_on_the_bash_list_is_one_bash_does_not_pass():
    assert sorted(name for name in BASH_REFUSES if bash_passes(name)) == []
    assert all(bash_passes(name) for name in ("LR", "NCCL_DEBUG", "HOME", "TMOUT"))


# --- refused everywhere, changing nothing ----------------------------------------------------

HIJACK = {"SLURM_JOB_ID": "424242"}
HIJACK_MESSAGE = LAUNCHER.format(name="SLURM_JOB_ID")


def nothing_created() -> tuple[int, int]:
    return Experiment.objects.count(), Run.objects.count()


def test_the_service_refuses_it(world):
    with pytest.raises(ValidationError) as refused:
        run_submit(user=world.researcher_a, data=experiment_input(world, env=HIJACK))
    assert refused.value.message_dict == {"env": [HIJACK_MESSAGE]}
    assert nothing_created() == (0, 0)


def test_the_form_refuses_it(client, world):
    client.force_login(world.researcher_a)
    response = client.post(reverse("jobs:run_submit"), form_data(world, env=json.dumps(HIJACK)))
    assert response.status_code == 400
    assert response.context["form"].errors["env"] == [HIJACK_MESSAGE]
    assert nothing_created() == (0, 0)


def _api(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer " + secret)
    return client


def test_the_api_refuses_it(world):
    body = {
        "tenant": "vision", "project": "detection", "image": world.image.reference,
        "command": "python train.py", "flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 1,
        "env": {"LD_PRELOAD": "/tmp/x.so"},
    }  # fmt: skip
    response = _api(world.researcher_a).post(reverse("api:run-list"), body, format="json")
    assert (response.status_code, response.json()) == (
        400,
        {"env": [LAUNCHER.format(name="LD_PRELOAD")]},
    )
    assert nothing_created() == (0, 0)


def test_a_spec_file_is_refused(world):
    document = FULL_SPEC | {"env": {"BASH_ENV": "/tmp/evil"}}
    response = _api(world.researcher_a).post(SPECS, document, format="json")
    assert response.status_code == 400
    assert response.json()["env"] == [LAUNCHER.format(name="BASH_ENV")]
    assert nothing_created() == (0, 0)


def test_a_template_is_refused(world):
    with pytest.raises(ValidationError) as refused:
        template_save(
            actor=world.tenant_admin_a,
            tenant=world.vision,
            name="hijack",
            description="",
            values={"env": HIJACK},
            locked=[],
            ranges={},
        )
    assert refused.value.message_dict == {"values": [f"env: {HIJACK_MESSAGE}"]}
    assert ExperimentTemplate.objects.count() == 0


def test_kubernetes_refuses_a_stored_experiment_that_predates_the_rule():
    with pytest.raises(PermanentBackendError) as refused:
        render(spec_for(env={"LD_PRELOAD": "/x.so"}), parse_settings(BASE_SETTINGS), token=TOKEN)
    assert str(refused.value) == LAUNCHER.format(name="LD_PRELOAD")


GANTRY_IMAGE_MESSAGE = (
    "GANTRY_IMAGE is set by Gantry itself (the image the job runs); leave it out."
)


def test_a_name_gantry_sets_is_refused_by_the_form_the_api_and_spec_files(client, world):
    env = {"GANTRY_IMAGE": "registry.example.org/other@sha256:" + "b" * 64}
    client.force_login(world.researcher_a)
    form = client.post(reverse("jobs:run_submit"), form_data(world, env=json.dumps(env)))
    api = _api(world.researcher_a)
    body = {
        "tenant": "vision", "project": "detection", "image": world.image.reference,
        "command": "python train.py", "flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 1,
        "env": env,
    }  # fmt: skip
    runs = api.post(reverse("api:run-list"), body, format="json")
    spec_file = api.post(SPECS, FULL_SPEC | {"env": env}, format="json")  # what the CLI sends

    assert form.status_code == 400
    assert form.context["form"].errors["env"] == [GANTRY_IMAGE_MESSAGE]
    assert (runs.status_code, runs.json()) == (400, {"env": [GANTRY_IMAGE_MESSAGE]})
    assert spec_file.status_code == 400
    assert spec_file.json()["env"] == [GANTRY_IMAGE_MESSAGE]
    assert nothing_created() == (0, 0)


def test_a_stored_experiment_that_sets_a_gantry_name_shows_and_is_refused_with_the_reason(
    client, world
):
    """Records older than the rule: the page shows them as stored; a re-run is refused with
    the reason (clone, edit the env, submit); an attempt already queued fails at render, the
    same on every backend, before anything reaches a cluster."""
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    Experiment.objects.filter(pk=run.experiment_id).update(env={"GANTRY_IMAGE": "mine"})
    experiment = Experiment.objects.get(pk=run.experiment_id)
    attempt = Attempt.objects.create(run=run, number=1, cluster=world.cluster)
    spec = job_spec_for(Attempt.objects.get(pk=attempt.pk))
    client.force_login(world.researcher_a)

    page = client.get(reverse("jobs:experiment_detail", args=[experiment.pk]))
    with pytest.raises(ValidationError) as rerun:
        run_rerun(experiment=experiment, user=world.researcher_a)
    with pytest.raises(PermanentBackendError) as simulator:
        SimulatorBackend(world.cluster).render(spec)
    with pytest.raises(PermanentBackendError) as kubernetes:
        render(spec, parse_settings(BASE_SETTINGS), token=TOKEN)
    with pytest.raises(RenderError) as slurm:
        batch_job(spec, slurm_settings(transport="cli", runtime="pyxis"))

    assert page.status_code == 200
    assert "GANTRY_IMAGE" in page.content.decode()
    assert rerun.value.message_dict == {"env": [GANTRY_IMAGE_MESSAGE]}
    assert Run.objects.count() == 1
    assert str(simulator.value) == str(kubernetes.value) == str(slurm.value)
    assert str(slurm.value) == GANTRY_IMAGE_MESSAGE
