"""Issue 21.1: names an experiment's env may not set are refused with a clear reason,
everywhere a run is described (form, API, spec files, templates), before any backend sees
them; the bash list is measured against the real bash."""

import json
import subprocess

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from rest_framework.test import APIClient

from jobs.backends import PermanentBackendError
from jobs.backends.k8s_manifest import parse_settings, render
from jobs.env_names import BASH_REFUSES, env_name_refusal
from jobs.models import Experiment, ExperimentTemplate, Run
from jobs.services.submission import run_submit
from jobs.services.templates import template_save
from tenants.services import api_token_create
from tests.conftest import experiment_input
from tests.jobs.backends.test_k8s_manifest import BASE_SETTINGS, TOKEN, spec_for
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


def test_gantry_s_own_names_and_bad_names():
    assert env_name_refusal("GANTRY_ATTEMPT_TOKEN") == (
        "GANTRY_ATTEMPT_TOKEN is set by Gantry for every job; leave it out."
    )
    assert env_name_refusal("GANTRY_API_URL", set_by_gantry=frozenset({"GANTRY_API_URL"})) is None
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
