"""The demo world that ``make run`` seeds: tenants, people, images, a simulated cluster, runs.

Seeding is idempotent: a second start finds the demo tenant and only prints the logins.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from images.models import Image
from jobs import services as job_services
from jobs.models import Attempt, AttemptState, Cluster, Run, RunEvent, RunState
from jobs.services import ExperimentInput
from tenants import services as tenant_services
from tenants.models import GlobalRole, GpuFlavor, Membership, Project, Quota, Tenant

DEMO_PASSWORD = "gantry-demo"  # noqa: S105 - the documented demo login, printed at start


@dataclass(frozen=True)
class DemoLogin:
    username: str
    persona: str
    where: str


LOGINS = (
    DemoLogin("alice", "researcher", "vision"),
    DemoLogin("bob", "researcher", "nlp"),
    DemoLogin("carol", "researcher", "climate"),
    DemoLogin("tara", "tenant admin", "vision"),
    DemoLogin("admin", "platform admin", "all tenants, /admin/"),
    DemoLogin("fiona", "finance", "all tenants"),
)

PYTORCH_DIGEST = "sha256:6a3d1f0b9c5e2d4a8f7b1c0e9d8a7f6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f"
JAX_DIGEST = "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
MEGATRON_DIGEST = "sha256:9b8a7c6d5e4f30211203f4e5d6c7b8a99b8a7c6d5e4f30211203f4e5d6c7b8a9"
NIGHTLY_DIGEST = "sha256:1111222233334444555566667777888899990000aaaabbbbccccddddeeeeffff"
COMMITS = (
    "3f2c1a9e8d7b6c5a4f3e2d1c0b9a8f7e6d5c4b3a",
    "a1b2c3d4e5f60718293a4b5c6d7e8f9011223344",
    "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00",
)


def demo_seeded() -> bool:
    return Tenant.objects.filter(slug="vision").exists()


@transaction.atomic
def demo_seed(*, speedup: int = 30) -> None:
    a100 = GpuFlavor.objects.create(slug="a100-80gb", name="NVIDIA A100 80GB", memory_gb=80)
    h100 = GpuFlavor.objects.create(slug="h100-80gb", name="NVIDIA H100 80GB", memory_gb=80)
    cluster = Cluster.objects.create(
        name="sim-east",
        backend=Cluster.Backend.SIMULATOR,
        settings={
            "speedup": speedup,
            "pools": [
                {"flavor": "a100-80gb", "nodes": 4, "gpus_per_node": 8},
                {"flavor": "h100-80gb", "nodes": 2, "gpus_per_node": 8},
            ],
        },
    )
    job_services.cluster_refresh_inventory(cluster=cluster)

    admin = User.objects.create_superuser("admin", "admin@gantry.example", DEMO_PASSWORD)
    tenant_services.global_role_grant(user=admin, role=GlobalRole.PLATFORM_ADMIN, actor=admin)
    fiona = User.objects.create_user("fiona", "fiona@gantry.example", DEMO_PASSWORD)
    tenant_services.global_role_grant(user=fiona, role=GlobalRole.FINANCE, actor=admin)

    tenants = {}
    for slug, name, projects, quotas in (
        ("vision", "Vision Lab", ("detection", "segmentation"), (16, 8)),
        ("nlp", "NLP Group", ("llm", "retrieval"), (8, 16)),
        ("climate", "Climate Modeling", ("downscaling", "nowcasting"), (8, 0)),
    ):
        tenant = Tenant.objects.create(slug=slug, name=name, cost_center=f"CC-{slug.upper()}")
        for project in projects:
            Project.objects.create(tenant=tenant, slug=project, name=project.title())
        Quota.objects.create(tenant=tenant, flavor=a100, guaranteed_gpus=quotas[0])
        Quota.objects.create(tenant=tenant, flavor=h100, guaranteed_gpus=quotas[1])
        tenants[slug] = tenant

    people = {}
    for username, tenant, role in (
        ("alice", "vision", Membership.Role.RESEARCHER),
        ("bob", "nlp", Membership.Role.RESEARCHER),
        ("carol", "climate", Membership.Role.RESEARCHER),
        ("tara", "vision", Membership.Role.TENANT_ADMIN),
    ):
        user = User.objects.create_user(username, f"{username}@gantry.example", DEMO_PASSWORD)
        tenant_services.membership_set(user=user, tenant=tenants[tenant], role=role, actor=admin)
        people[username] = user

    pytorch = Image.objects.create(
        repository="registry.gantry.example/ml/pytorch",
        digest=PYTORCH_DIGEST,
        tag="2.4-cuda12.4",
        description="PyTorch 2.4, CUDA 12.4, NCCL 2.21",
        labels={"org.opencontainers.image.version": "2.4.0", "cuda": "12.4", "nccl": "2.21.5"},
        status=Image.Status.APPROVED,
    )
    Image.objects.create(
        repository="registry.gantry.example/ml/jax",
        digest=JAX_DIGEST,
        tag="0.4.30-cuda12",
        description="JAX 0.4.30 with CUDA 12",
        labels={"org.opencontainers.image.version": "0.4.30", "cuda": "12.3"},
        status=Image.Status.APPROVED,
    )
    megatron = Image.objects.create(
        repository="registry.gantry.example/nlp/megatron",
        digest=MEGATRON_DIGEST,
        tag="24.05",
        description="Megatron-LM for the NLP group only",
        status=Image.Status.APPROVED,
        visible_to_all=False,
    )
    megatron.allowed_tenants.add(tenants["nlp"])
    Image.objects.create(
        repository="registry.gantry.example/ml/pytorch-nightly",
        digest=NIGHTLY_DIGEST,
        tag="nightly",
        description="Awaiting review",
        status=Image.Status.PENDING,
    )

    def request(user, tenant, project, name, image, **extra):
        values = {
            "tenant": tenant,
            "project": project,
            "image": image.reference,
            "command": "torchrun --nproc-per-node=$GPUS train.py --config configs/base.yaml",
            "flavor": "a100-80gb",
            "nodes": 1,
            "gpus_per_node": 8,
            "name": name,
            "code_repository": f"https://git.gantry.example/{tenant}/{project}.git",
            "code_commit": COMMITS[len(name) % len(COMMITS)],
            "dataset_uri": f"s3://datasets/{project}",
            "dataset_version": "v3",
            "params": {"lr": 3e-4, "batch_size": 512, "epochs": 90},
        }
        values.update(extra)
        return job_services.run_submit(user=people[user], data=ExperimentInput(**values))

    history = (
        ("alice", "vision", "detection", "yolo-baseline", pytorch, RunState.SUCCEEDED, 0, 26),
        ("alice", "vision", "segmentation", "unet-sweep-1", pytorch, RunState.SUCCEEDED, 0, 20),
        ("bob", "nlp", "llm", "llama-ft-lr3e4", megatron, RunState.FAILED, 1, 12),
        ("bob", "nlp", "retrieval", "dpr-train", pytorch, RunState.SUCCEEDED, 0, 8),
        ("carol", "climate", "downscaling", "cordex-emulator", pytorch, RunState.SUCCEEDED, 0, 3),
    )
    now = timezone.now()
    for user, tenant, project, name, image, state, exit_code, days_ago in history:
        run = request(user, tenant, project, name, image)
        _record_history(
            run=run,
            cluster=cluster,
            state=state,
            exit_code=exit_code,
            submitted=now - timedelta(days=days_ago, hours=3),
        )

    # Live work: long jobs that run while you look around, and one that has to wait.
    long_job = {"GANTRY_SIM_DURATION_S": str(6 * 3600)}
    request("alice", "vision", "detection", "yolo-large", pytorch, env=long_job)
    request("alice", "vision", "segmentation", "unet-sweep-2", pytorch, env=long_job)
    request("alice", "vision", "detection", "yolo-xl", pytorch, env=long_job, nodes=2)
    request(
        "bob", "nlp", "llm", "llama-pretrain", megatron, env=long_job, flavor="h100-80gb", nodes=2
    )
    request("carol", "climate", "nowcasting", "radar-nowcast", pytorch, gpus_per_node=4)


def _record_history(*, run: Run, cluster: Cluster, state: str, exit_code: int, submitted) -> None:
    """Turn a freshly queued run into one that ran in the past (demo history only)."""
    admitted = submitted + timedelta(minutes=4)
    started = admitted + timedelta(minutes=2)
    finished = started + timedelta(hours=5)
    failed = state == RunState.FAILED
    attempt = Attempt.objects.create(
        run=run,
        number=1,
        cluster=cluster,
        state=AttemptState.FAILED if failed else AttemptState.SUCCEEDED,
        backend_job_id=f"history-{run.pk}",
        submitted_at=admitted,
        started_at=started,
        finished_at=finished,
        exit_code=exit_code,
        failure_reason="USER_EXIT" if failed else "",
        failure_message="Traceback: loss became NaN at step 41200" if failed else "",
        node_list=[f"{cluster.name}-a100-80gb-0{run.pk % 4}"],
    )
    Run.objects.filter(pk=run.pk).update(
        state=state,
        cluster=cluster,
        submitted_at=submitted,
        admitted_at=admitted,
        started_at=started,
        finished_at=finished,
        failure_reason="USER_EXIT" if failed else "",
    )
    job_services.usage_record_attempt(attempt=attempt, started=started, finished=finished)
    RunEvent.objects.filter(run=run).update(at=submitted)
    for at, from_state, to_state, reason in (
        (admitted, RunState.QUEUED, RunState.ADMITTED, "ADMITTED"),
        (started, RunState.PENDING, RunState.RUNNING, "STARTED"),
        (finished, RunState.RUNNING, state, "USER_EXIT" if failed else "SUCCEEDED"),
    ):
        event = RunEvent.objects.create(
            run=run, attempt=attempt, from_state=from_state, to_state=to_state, reason=reason
        )
        RunEvent.objects.filter(pk=event.pk).update(at=at)
