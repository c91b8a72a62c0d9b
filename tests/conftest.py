"""Fixed personas and a small world: two tenants, two flavors, a simulated cluster."""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group, User
from hypothesis import settings as hypothesis_settings

from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from images.models import Image
from jobs.services.submission import ExperimentInput
from tenants.models import GlobalRole, GpuFlavor, Membership, Project, Quota, Tenant

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
DIGEST_BLOCKED = "sha256:" + "c" * 64
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PASSWORD = "correct-horse-battery"

# In CI (CI=true, as GitHub Actions and `make mutation` set it) every hypothesis test draws
# the same examples on every run, so a red build is reproducible and a mutant is killed or
# not the same way each time; locally the draws vary and keep finding new cases. A test's
# own @settings still win for what they set.
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI") == "true":
    hypothesis_settings.load_profile("ci")

# Under `make mutation` (GANTRY_MUTATION=1, set by scripts/mutation.py) the property tests run
# once per mutant, hundreds of times: each draws a fifth of its examples (at least 20), the
# same ones every time (derandomised), so the run fits its time (docs/mutation-testing.md).
# The test's own budget is divided, so a test that asks for more still gets more.
MUTATION_EXAMPLES_DIVISOR, MUTATION_EXAMPLES_MINIMUM = 5, 20


def mutation_budget(items: list[pytest.Item]) -> None:
    """The smaller, derandomised example budget of ``make mutation``, once per test function
    (parametrised items share it)."""
    for item in items:
        test = getattr(item, "obj", None)
        if getattr(test, "hypothesis", None) is None or getattr(test, "_mutation_budget", False):
            continue
        own = test._hypothesis_internal_use_settings
        test._hypothesis_internal_use_settings = hypothesis_settings(
            own,
            max_examples=max(
                MUTATION_EXAMPLES_MINIMUM, own.max_examples // MUTATION_EXAMPLES_DIVISOR
            ),
            derandomize=True,
            database=None,
        )
        test._mutation_budget = True


@dataclass
class World:
    vision: Tenant
    nlp: Tenant
    vision_project: Project
    nlp_project: Project
    a100: GpuFlavor
    h100: GpuFlavor
    cluster: Cluster
    image: Image  # approved, visible to all
    nlp_only_image: Image  # approved, allow-listed for nlp only
    blocked_image: Image
    researcher_a: User
    researcher_a2: User
    researcher_b: User
    tenant_admin_a: User
    finance: User
    platform_admin: User


# The suite's longest files (minutes each, from `--durations`), started first: pytest-xdist
# hands out work in collection order, so one of them started last would run alone at the end
# while the other workers idle. The rest keep their order.
START_FIRST = (
    "tests/portal/test_chaos.py",
    "tests/portal/test_redis_outage.py",
    "tests/jobs/test_api_fuzz.py",
    "tests/portal/test_documented_commands.py",
    "tests/clusters/backends/test_slurm_cluster.py",
    "tests/mutation/test_equivalent_mutants.py",
    "tests/portal/test_accessibility.py",
    "tests/jobs/test_unbounded_ids.py",
    "tests/tenants/test_throttling.py",
    "tests/clusters/test_move_migration.py",
    "tests/portal/test_browser_journeys.py",
    "tests/portal/test_demo_clock.py",
)


def _start_order(item: pytest.Item) -> int:
    path = item.nodeid.partition("::")[0]
    return START_FIRST.index(path) if path in START_FIRST else len(START_FIRST)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` pytest-xdist marks each test of a group by suffixing its
    id with ``@group`` and sends a group to one worker. Where that silently stops working
    (pytest 9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386), tests that share one
    machine-wide server (the Slurm cluster) would run at once in several workers: stop.
    Under ``make mutation``, the property tests' smaller budget (``mutation_budget``)."""
    if os.environ.get("GANTRY_MUTATION") == "1":
        mutation_budget(items)
    items.sort(key=_start_order)
    if getattr(config.option, "loadgroup", False):
        for item in items:
            group = item.get_closest_marker("xdist_group")
            if group is not None and not item.nodeid.endswith(f"@{group.args[0]}"):
                raise pytest.UsageError(
                    f"pytest-xdist does not group {item.nodeid} (xdist_group "
                    f"{group.args[0]!r}): pytest-dev/pytest-xdist#1386; see the pytest pin "
                    "in pyproject.toml"
                )


@pytest.fixture(autouse=True)
def _every_sync_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that calls ``sync_all_clusters`` several times (the clock frozen or moved by
    less than half a sync interval) means each call to sync: production skips a copy of the
    sync that starts within half an interval of the last one (``sync_slot_claim``, for the
    copies beat's schedule piles up in a busy queue), which tests/jobs/test_sync_copies.py
    proves with the ``sync_slot`` mark. Processes a test starts keep the real claim."""
    if request.node.get_closest_marker("sync_slot") is None:
        from jobs.services import backend_sync

        monkeypatch.setattr(backend_sync, "sync_slot_claim", lambda: True)


@pytest.fixture(autouse=True)
def _no_admission_kick_left(request: pytest.FixtureRequest) -> None:
    """Each test starts with no admission cycle marked as waiting (jobs.enqueue) and no sync
    just started (``sync_slot_claim``): a mark left by an earlier test would hold back this
    test's kicks, or skip its sync, until it expires; and a test that moves the clock to the
    past sees a mark stamped in real time as unexpired. The cache outlives tests (Redis, or
    a table tests don't flush). Tests that reach the database through a fixture (``world``)
    are cleared too."""
    fixture = next((f for f in ("transactional_db", "db") if f in request.fixturenames), None)
    if fixture is not None:
        request.getfixturevalue(fixture)
    elif request.node.get_closest_marker("django_db") is None:
        return
    from django.core.cache import cache

    from jobs.enqueue import admission_kick_clear
    from jobs.services.backend_sync import SYNC_SLOT_KEY

    admission_kick_clear()
    cache.delete(SYNC_SLOT_KEY)


@pytest.fixture(autouse=True)
def _no_workspace_process_left():
    """A workspace on the simulator is a real process (clusters.backends.sim_workspace): none
    outlives the test that started it, pass or fail."""
    yield
    from clusters.backends import sim_workspace

    sim_workspace.stop_all()


def make_user(username: str) -> User:
    return User.objects.create_user(username=username, password=PASSWORD)


@pytest.fixture
def world(db) -> World:
    a100 = GpuFlavor.objects.create(slug="a100-80gb", name="NVIDIA A100 80GB", memory_gb=80)
    h100 = GpuFlavor.objects.create(slug="h100-80gb", name="NVIDIA H100 80GB", memory_gb=80)
    cluster = Cluster.objects.create(
        name="sim-1",
        backend=Cluster.Backend.SIMULATOR,
        settings={
            "speedup": 1000,
            "pools": [
                {"flavor": "a100-80gb", "nodes": 4, "gpus_per_node": 8},
                {"flavor": "h100-80gb", "nodes": 2, "gpus_per_node": 8},
            ],
        },
    )
    cluster_refresh_inventory(cluster=cluster)
    vision = Tenant.objects.create(slug="vision", name="Vision Lab")
    nlp = Tenant.objects.create(slug="nlp", name="NLP Group")
    vision_project = Project.objects.create(tenant=vision, slug="detection", name="Detection")
    nlp_project = Project.objects.create(tenant=nlp, slug="llm", name="LLM")
    for tenant in (vision, nlp):
        Quota.objects.create(tenant=tenant, flavor=a100, guaranteed_gpus=16)
        Quota.objects.create(tenant=tenant, flavor=h100, guaranteed_gpus=8)
    image = Image.objects.create(
        repository="registry.example.org/ml/pytorch",
        digest=DIGEST_A,
        tag="2.4-cuda12",
        status=Image.Status.APPROVED,
    )
    nlp_only = Image.objects.create(
        repository="registry.example.org/nlp/megatron",
        digest=DIGEST_B,
        tag="24.05",
        status=Image.Status.APPROVED,
        visible_to_all=False,
    )
    nlp_only.allowed_tenants.add(nlp)
    blocked = Image.objects.create(
        repository="registry.example.org/ml/old",
        digest=DIGEST_BLOCKED,
        tag="1.0",
        status=Image.Status.BLOCKED,
    )
    researcher_a = make_user("alice")
    researcher_a2 = make_user("arthur")
    researcher_b = make_user("bob")
    tenant_admin_a = make_user("tara")
    finance = make_user("fiona")
    platform_admin = make_user("paul")
    Membership.objects.create(user=researcher_a, tenant=vision, role="researcher")
    Membership.objects.create(user=researcher_a2, tenant=vision, role="researcher")
    Membership.objects.create(user=researcher_b, tenant=nlp, role="researcher")
    Membership.objects.create(user=tenant_admin_a, tenant=vision, role="tenant_admin")
    finance.groups.add(Group.objects.create(name=GlobalRole.FINANCE))
    platform_admin.groups.add(Group.objects.create(name=GlobalRole.PLATFORM_ADMIN))
    platform_admin.is_staff = True
    platform_admin.save(update_fields=["is_staff"])
    return World(
        vision=vision,
        nlp=nlp,
        vision_project=vision_project,
        nlp_project=nlp_project,
        a100=a100,
        h100=h100,
        cluster=cluster,
        image=image,
        nlp_only_image=nlp_only,
        blocked_image=blocked,
        researcher_a=researcher_a,
        researcher_a2=researcher_a2,
        researcher_b=researcher_b,
        tenant_admin_a=tenant_admin_a,
        finance=finance,
        platform_admin=platform_admin,
    )


def experiment_input(world: World, **overrides) -> ExperimentInput:
    """A valid request for tenant vision; override any field to make it invalid."""
    values = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "command": "python train.py --epochs 3",
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 2,
        "name": "resnet-baseline",
        "code_repository": "https://git.example.org/vision/detection.git",
        "code_commit": COMMIT,
        "dataset_uri": "s3://datasets/imagenet",
        "dataset_version": "2024-01",
        "params": {"lr": 0.1, "batch_size": 256},
        "env": {"GANTRY_SIM_DURATION_S": "600"},
    }
    values.update(overrides)
    return ExperimentInput(**values)


def reserved_ending(holders, nodes: list[str], *, cluster: str = "sim-1") -> str:
    """How a waiting head's message ends under backfill (docs/admission.md, "Backfill") when
    it is reserved ``nodes`` from when the last of ``holders``, the runs there, end at the
    latest (``HeldRun.latest_end``, as admission reads it)."""
    from django.utils import timezone

    from jobs import backfill
    from jobs.selectors.queue import held_runs

    ids = {run.pk for run in holders}
    ends = [run.latest_end for run in held_runs(now=timezone.now()) if run.id in ids]
    assert len(ends) == len(ids) and None not in ends, ends
    return f"; reserved: {', '.join(nodes)} on {cluster} from {backfill.clock(max(ends))}"


@contextmanager
def machine_time_zone(name: str) -> Iterator[None]:
    """The machine's local time zone set to ``name`` (the TZ variable), then as it was: code
    that must count in UTC shows whether it does."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()
