"""The demo world that ``make run`` seeds: tenants, people, images, a simulated cluster, runs.

It tells a story (tests/portal/test_demo.py holds it to each part):

- three tenants with different quotas: vision (16 guaranteed A100 GPUs, may borrow 8, a hard
  monthly budget), nlp (8 guaranteed, may borrow 16, no budget), climate (8, no borrowing, a
  soft budget);
- a template, ``first-run``, that fills in the submit form for the README's first run: it
  starts at once, on the H100 node that vision is guaranteed and nobody else uses;
- live runs placed by the first admission cycle: ``yolo-xl`` of vision waits, and says why
  (vision's guarantee and borrow limit are used up) and where it stands in the queue;
  ``dpr-sweep`` of nlp runs on borrowed GPUs, preemptible;
- history: ``colbert-distill`` borrowed GPUs, was preempted when their owner reclaimed them,
  and resumed from its checkpoint on a second attempt; ``segformer-b5`` ran on a lemon node
  whose GPU fell off the bus (XID 79): Gantry quarantined and drained the node, and the run
  was retried from its checkpoint on another node, its lost GPU-hours credited;
  ``unet-sweep-1`` was input-bound and its diagnosis says so; ``vit-gang`` ran on 16 GPUs of
  two nodes, one of them clock-capped (1.5x slower), and every rank's step windows and the
  GPUs' clocks name it the straggler; a healthy run, an idle notebook, a crash, a
  communication-bound run;
- a month of it, accounted and rolled up: three runs on fixed days of the last closed month
  (priced at the A100 rate before this month's rise), so finance's landing statement has
  lines whatever today's date is, and the profile runs above a few days to weeks back, so
  the goodput pages have data in their default 30 days.

Dates are consistent on any day: the demo's world (tenants, people, images, the cluster) is
dated before its oldest run, each experiment is created when its first run was submitted,
and each attempt when its run was admitted.

Seeding is idempotent: a second start finds the demo tenant and only prints the logins.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from finance import services as finance_services
from images.demo_registry import DEMO_REGISTRY_URL
from images.models import Image, Registry
from images.services.catalog import image_import, image_set_status, image_set_visibility
from images.services.registries import registry_create
from jobs.models import Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.estimates import estimates_refresh
from jobs.services.submission import ExperimentInput, run_submit
from jobs.services.templates import template_save
from portal.demo_faults import DEMO_FAULTS, history_record_hardware_fault, lemon_fence
from portal.demo_history import (
    history_record,
    history_record_gang,
    history_record_preempted,
    history_telemetry_record,
)
from telemetry import services as telemetry_services
from telemetry.straggler_flags import attempt_stragglers_scan
from tenants.models import GlobalRole, GpuFlavor, Membership, Project, Quota, Tenant
from tenants.services.memberships import global_role_grant, membership_set

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

# What the demo's catalog imports from the demo registry: reference, description, status.
DEMO_CATALOG = (
    ("ml/pytorch:2.4-cuda12.4", "PyTorch 2.4 with CUDA 12.4", Image.Status.APPROVED),
    ("ml/jax:0.4.30-cuda12", "JAX 0.4.30 with CUDA 12", Image.Status.APPROVED),
    ("nlp/megatron:24.05", "Megatron-LM for the NLP group only", Image.Status.APPROVED),
    ("ml/pytorch-nightly:nightly", "Awaiting review", Image.Status.PENDING),
)
# The README's first run: a template of vision that fills in every field the submit form
# needs, for a run that starts at once (see ``_first_run_template``).
FIRST_RUN_TEMPLATE = "first-run"
# The run with a straggler (issue 36): 2 nodes of 8 A100 GPUs under one leaf switch, GPU 3 of
# the second node (rank 11) capped at 1/1.5 of its clock; an hour of work, 60 windows a rank.
STRAGGLER_RUN = "vit-gang"
STRAGGLER_NODES = ["sim-east-a100-80gb-00", "sim-east-a100-80gb-01"]
STRAGGLER_ENV = {
    "GANTRY_SIM_PROFILE": "compute-bound",
    "GANTRY_SIM_DURATION_S": "3600",
    "GANTRY_SIM_STRAGGLER": "slow_gpu",
    "GANTRY_SIM_STRAGGLER_RANK": "11",
    "GANTRY_SIM_STRAGGLER_FACTOR": "1.5",
}
COMMITS = (
    "3f2c1a9e8d7b6c5a4f3e2d1c0b9a8f7e6d5c4b3a",
    "a1b2c3d4e5f60718293a4b5c6d7e8f9011223344",
    "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00",
)


def demo_seeded() -> bool:
    return Tenant.objects.filter(slug="vision").exists()


class DemoRegistryOff(Exception):
    """The demo's images come from its in-process registry, which is switched off."""


@transaction.atomic
def demo_seed(*, speedup: int = 30) -> None:
    """Seed the demo's world, its history and its live runs, in the order the story (and
    the run numbers the docs show) needs; then do what beat and the worker would do first."""
    if not settings.GANTRY_DEMO_REGISTRY:
        raise DemoRegistryOff(
            "The demo imports its images from the demo registry: set GANTRY_DEMO_REGISTRY=1 "
            "(the default in embedded mode) for the seed and for the processes that serve it."
        )
    a100 = GpuFlavor.objects.create(slug="a100-80gb", name="NVIDIA A100 80GB", memory_gb=80)
    h100 = GpuFlavor.objects.create(slug="h100-80gb", name="NVIDIA H100 80GB", memory_gb=80)
    cluster = _seed_cluster(speedup=speedup)

    # The one published demo password, hashed once for every login: a hash costs PBKDF2's
    # 1,000,000 iterations (~0.4 s of CPU), a sixth of the seed's time when done per login.
    # The logins share its salt, which tells no more than the README does.
    password = make_password(DEMO_PASSWORD)
    admin = _demo_user("admin", password, superuser=True)
    global_role_grant(user=admin, role=GlobalRole.PLATFORM_ADMIN, actor=admin)
    fiona = _demo_user("fiona", password)
    global_role_grant(user=fiona, role=GlobalRole.FINANCE, actor=admin)
    _seed_rate_cards(a100=a100, h100=h100, actor=fiona)
    tenants = _seed_tenants(a100=a100, h100=h100)
    people = _seed_people(tenants=tenants, password=password, actor=admin)
    pytorch, megatron = _seed_catalog(tenants=tenants, actor=admin)
    _first_run_template(tenant=tenants["vision"], image=pytorch, actor=people["tara"])

    submit = partial(_demo_submit, people)
    now = timezone.now()
    _seed_history(submit, cluster=cluster, pytorch=pytorch, megatron=megatron, now=now)
    _seed_live_runs(submit, pytorch=pytorch, megatron=megatron)
    _seed_last_month(submit, cluster=cluster, pytorch=pytorch, megatron=megatron, now=now)
    # Last, so the run numbers above stay as the docs show them.
    hardware = submit("alice", "vision", "segmentation", "segformer-b5", pytorch)
    history_record_hardware_fault(
        run=hardware, cluster=cluster, submitted=now - timedelta(days=2, hours=8)
    )
    # A gang with a straggler: its run page names the slow rank, its node and GPU.
    gang = submit(
        "alice", "vision", "detection", STRAGGLER_RUN, pytorch, nodes=2, env=STRAGGLER_ENV
    )
    history_record_gang(
        run=gang, cluster=cluster, submitted=now - timedelta(days=4, hours=6), nodes=STRAGGLER_NODES
    )
    # What the straggler scan did while it ran: flag the slow rank (its verdict).
    attempt_stragglers_scan(attempt=gang.attempts.get(), now=timezone.now())
    _date_the_world_before(_oldest_submit() - timedelta(days=1))

    # What beat would do within two minutes: account the history and roll it up into daily
    # usage, so the goodput and finance pages have data from the first page view.
    telemetry_services.accounting_compute_pending(limit=100)
    finance_services.daily_usage_update()
    # And what the worker does first: place the live runs, so the first page view already
    # shows who runs, who borrows and who waits, and why. (Their backend submits are queued
    # for the worker when the seed commits.)
    admission_run_cycle(now=timezone.now())  # after the live runs' submits
    # And the first start estimates, so waiting runs say when they should start at once.
    estimates_refresh(now=timezone.now())


def _seed_cluster(*, speedup: int) -> Cluster:
    """The simulated cluster, its inventory read as the worker would."""
    cluster = Cluster.objects.create(
        name="sim-east",
        backend=Cluster.Backend.SIMULATOR,
        settings={
            "speedup": speedup,
            "topology": ["block", "leaf"],
            "pools": [
                # Two blocks of leaf switches, two nodes per leaf: one node is a lemon that
                # Gantry quarantined (portal/demo_faults.py) and one is busy with jobs from
                # outside Gantry, so 4 whole nodes (32 GPUs) and 2 stray GPUs take Gantry's
                # work.
                {
                    "flavor": "a100-80gb",
                    "nodes": 6,
                    "gpus_per_node": 8,
                    "domains": [2, 2],
                    "outside": {"sim-east-a100-80gb-05": 6},
                },
                {"flavor": "h100-80gb", "nodes": 2, "gpus_per_node": 8},
            ],
            "faults": DEMO_FAULTS,
        },
    )
    lemon_fence(cluster)
    cluster_refresh_inventory(cluster=cluster)
    return cluster


def _seed_rate_cards(*, a100: GpuFlavor, h100: GpuFlavor, actor: User) -> None:
    """Prices per GPU-hour: a year back, and an A100 price rise on the 1st of this month."""
    today = timezone.now().date()
    for flavor, price, since in (
        (a100, "2.10", today - timedelta(days=365)),
        (h100, "3.90", today - timedelta(days=365)),
        (a100, "2.40", today.replace(day=1)),
    ):
        finance_services.rate_card_add(
            flavor=flavor, price_per_gpu_hour=price, currency="EUR", valid_from=since, actor=actor
        )


def _seed_tenants(*, a100: GpuFlavor, h100: GpuFlavor) -> dict[str, Tenant]:
    """The three tenants, their projects and quotas, by slug."""
    tenants = {}
    # (a100 guaranteed, a100 borrow limit, h100 guaranteed, monthly a100 budget, budget mode)
    for slug, name, projects, (a100_g, a100_b, h100_g, budget, mode) in (
        ("vision", "Vision Lab", ("detection", "segmentation"), (16, 8, 8, 5000, "hard")),
        ("nlp", "NLP Group", ("llm", "retrieval"), (8, 16, 8, None, "hard")),
        ("climate", "Climate Modeling", ("downscaling", "nowcasting"), (8, 0, 0, 400, "soft")),
    ):
        tenant = Tenant.objects.create(slug=slug, name=name, cost_center=f"CC-{slug.upper()}")
        for project in projects:
            Project.objects.create(tenant=tenant, slug=project, name=project.title())
        Quota.objects.create(
            tenant=tenant,
            flavor=a100,
            guaranteed_gpus=a100_g,
            borrow_limit_gpus=a100_b,
            max_gpus_per_run=16,
            monthly_gpu_hour_budget=budget,
            budget_mode=mode,
        )
        Quota.objects.create(tenant=tenant, flavor=h100, guaranteed_gpus=h100_g)
        tenants[slug] = tenant
    return tenants


def _seed_people(*, tenants: dict[str, Tenant], password: str, actor: User) -> dict[str, User]:
    """The researchers and the tenant admin, members of their tenants, by username."""
    people = {}
    for username, tenant_slug, role in (
        ("alice", "vision", Membership.Role.RESEARCHER),
        ("bob", "nlp", Membership.Role.RESEARCHER),
        ("carol", "climate", Membership.Role.RESEARCHER),
        ("tara", "vision", Membership.Role.TENANT_ADMIN),
    ):
        user = _demo_user(username, password)
        membership_set(user=user, tenant=tenants[tenant_slug], role=role, actor=actor)
        people[username] = user
    return people


def _seed_catalog(*, tenants: dict[str, Tenant], actor: User) -> tuple[Image, Image]:
    """The demo registry and its images, reviewed; PyTorch, and Megatron (nlp's only)."""
    # The images come from the demo's registry (images/demo_registry.py, answered in process)
    # through the same import a platform admin does, so the catalog holds what the registry
    # says about each: CUDA, frameworks, NCCL, architecture, size, build time.
    registry = registry_create(name="demo", url=DEMO_REGISTRY_URL, timeout_s=5, actor=actor)
    images = {}
    for reference, description, status in DEMO_CATALOG:
        image, _ = image_import(
            registry=registry, reference=reference, description=description, actor=actor
        )
        if status != Image.Status.PENDING:
            image = image_set_status(image=image, status=status, actor=actor)
        images[reference] = image
    megatron = image_set_visibility(
        image=images["nlp/megatron:24.05"],
        visible_to_all=False,
        allowed_tenants=[tenants["nlp"]],
        actor=actor,
    )
    return images["ml/pytorch:2.4-cuda12.4"], megatron


def _demo_submit(
    people: dict[str, User],
    username: str,
    tenant: str,
    project: str,
    name: str,
    image: Image,
    **extra: Any,
) -> Run:
    """A run submitted as ``username`` through the submit service, as the form would."""
    values: dict[str, Any] = {
        "tenant": tenant,
        "project": project,
        # By tag, as a researcher writes it: resolved to its digest by the demo registry.
        "image": f"{image.repository}:{image.tag}",
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
    return run_submit(user=people[username], data=ExperimentInput(**values))


def _seed_history(
    submit: Callable[..., Run], *, cluster: Cluster, pytorch: Image, megatron: Image, now: datetime
) -> None:
    """Finished runs, each with the telemetry of a simulator profile, and the preempted run
    that resumed from its checkpoint."""
    # The goodput pages have something to show: a healthy run, an input-bound one, a crash,
    # and so on. Each tenant has its own history (sizes and lengths too), so no two show the
    # same figures.
    # yolo-baseline (run 1) is the README's CLI example: `gantry spec 1`, submitted again on
    # two nodes, is 2 x 4 H100 GPUs of vision's guarantee, free at once (llama-pretrain
    # below leaves 4 on its node), so `--wait` returns within a minute or two.
    history = (
        ("alice", "vision", "detection", "yolo-baseline", pytorch, RunState.SUCCEEDED, 0, 26,
         "compute-bound", "h100-80gb", 4, 5),
        ("alice", "vision", "segmentation", "unet-sweep-1", pytorch, RunState.SUCCEEDED, 0, 20,
         "input-bound", "a100-80gb", 8, 5),
        ("tara", "vision", "detection", "notebook-debug", pytorch, RunState.SUCCEEDED, 0, 15,
         "idle", "a100-80gb", 8, 5),
        ("bob", "nlp", "llm", "llama-ft-lr3e4", megatron, RunState.FAILED, 1, 12, "crash",
         "a100-80gb", 8, 5),
        ("bob", "nlp", "retrieval", "dpr-train", pytorch, RunState.SUCCEEDED, 0, 8,
         "comm-bound", "a100-80gb", 8, 5),
        ("carol", "climate", "downscaling", "cordex-emulator", pytorch, RunState.SUCCEEDED, 0, 3,
         "compute-bound", "a100-80gb", 4, 11),
    )  # fmt: skip
    for (
        username, tenant_slug, project, name, image, state, exit_code, days_ago, profile,
        flavor_slug, gpus, hours,
    ) in history:  # fmt: skip
        run = submit(
            username,
            tenant_slug,
            project,
            name,
            image,
            env={"GANTRY_SIM_PROFILE": profile},
            flavor=flavor_slug,
            gpus_per_node=gpus,
        )
        attempt = history_record(
            run=run,
            cluster=cluster,
            state=state,
            exit_code=exit_code,
            submitted=now - timedelta(days=days_ago, hours=3),
            hours=hours,
        )
        history_telemetry_record(attempt=attempt, profile=profile)

    preempted = submit("bob", "nlp", "retrieval", "colbert-distill", pytorch, gpus_per_node=8)
    history_record_preempted(run=preempted, cluster=cluster, submitted=now - timedelta(days=5))


def _seed_live_runs(submit: Callable[..., Run], *, pytorch: Image, megatron: Image) -> None:
    """Live work: long jobs that run while you look around, a borrowed (preemptible) run,
    and one that has to wait. Log in as carol and submit 4 A100 GPUs to watch her guarantee
    reclaim bob's borrowed run, which later resumes from its checkpoint."""
    long_job = {"GANTRY_SIM_DURATION_S": str(6 * 3600)}
    submit("alice", "vision", "detection", "yolo-large", pytorch, env=long_job)
    submit("alice", "vision", "segmentation", "unet-sweep-2", pytorch, env=long_job)
    submit("alice", "vision", "detection", "yolo-xl", pytorch, env=long_job, nodes=2)
    # Half an H100 node: the other node is vision's guarantee, free for the README's first
    # run, and four GPUs on each node take the README's CLI example.
    submit(
        "bob", "nlp", "llm", "llama-pretrain", megatron, env=long_job, flavor="h100-80gb",
        gpus_per_node=4,
    )  # fmt: skip
    submit("bob", "nlp", "retrieval", "dpr-index", pytorch, env=long_job)
    submit("bob", "nlp", "retrieval", "dpr-sweep", pytorch, env=long_job, gpus_per_node=4)
    submit("carol", "climate", "nowcasting", "radar-nowcast", pytorch, gpus_per_node=4,
           env={"GANTRY_SIM_DURATION_S": "1200"})  # fmt: skip


def _seed_last_month(
    submit: Callable[..., Run], *, cluster: Cluster, pytorch: Image, megatron: Image, now: datetime
) -> None:
    """Last month, priced at the A100 rate before this month's rise. Submitted after the
    live runs so that run and experiment numbers of the story above stay as the docs show
    them."""
    last_month = previous_month(now.date())
    for username, tenant_slug, project, name, image, day, profile, gpus, hours in (
        ("alice", "vision", "detection", "yolo-v0", pytorch, 6, "compute-bound", 8, 5),
        ("bob", "nlp", "llm", "llama-ft-lr1e4", megatron, 11, "compute-bound", 8, 7),
        ("carol", "climate", "downscaling", "cordex-v0", pytorch, 19, "input-bound", 4, 9),
    ):
        run = submit(
            username,
            tenant_slug,
            project,
            name,
            image,
            env={"GANTRY_SIM_PROFILE": profile},
            gpus_per_node=gpus,
        )
        attempt = history_record(
            run=run,
            cluster=cluster,
            state=RunState.SUCCEEDED,
            exit_code=0,
            submitted=datetime.combine(last_month.replace(day=day), time(9), tzinfo=UTC),
            hours=hours,
        )
        history_telemetry_record(attempt=attempt, profile=profile)


def _demo_user(username: str, password: str, *, superuser: bool = False) -> User:
    """What ``create_user`` (``create_superuser``) makes, with the password already hashed."""
    return User.objects.create(
        username=username,
        email=f"{username}@gantry.example",
        password=password,
        is_staff=superuser,
        is_superuser=superuser,
    )


def _first_run_template(*, tenant: Tenant, image: Image, actor: User) -> None:
    """One node of 8 H100 GPUs: vision's guarantee of the flavor, which no other vision run
    uses and no other tenant may borrow (the H100 guarantees add up to the two nodes), so
    its first run is admitted at once whatever else the demo runs. An A100 run would wait:
    vision's guarantee of those is in use and ``yolo-xl`` heads its queue."""
    template_save(
        actor=actor,
        tenant=tenant,
        name=FIRST_RUN_TEMPLATE,
        description="A first run: one node of 8 H100 GPUs, which vision is guaranteed.",
        values={
            "project": "detection",
            "image": image.reference,
            "command": "python train.py --epochs 3",
            "resources": {"flavor": "h100-80gb", "nodes": 1, "gpus_per_node": 8},
        },
        locked=[],
        ranges={},
    )


def _oldest_submit() -> datetime:
    return Run.objects.order_by("submitted_at").values_list("submitted_at", flat=True)[0]


def _date_the_world_before(moment: datetime) -> None:
    """The demo's world existed before its history: tenants, people, the registry, its
    images (imported and checked) and the cluster are dated ``moment``. (Audit rows are
    append-only: they keep the seed's time.)"""
    Tenant.objects.update(created_at=moment)
    User.objects.update(date_joined=moment)
    Image.objects.update(created_at=moment, last_checked_at=moment)
    Registry.objects.update(created_at=moment)


def previous_month(day: date) -> date:
    """The first day of the month before ``day``'s."""
    return (day.replace(day=1) - timedelta(days=1)).replace(day=1)
