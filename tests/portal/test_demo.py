"""The demo that `make run` seeds tells its story, part by part (portal/demo.py): tenants with
different quotas, a run that waits and says why, a borrowed run, a run preempted and resumed
from its checkpoint, an input-bound run whose diagnosis says so, and a month of history that
the finance statements of last month and this one are made of."""

import contextlib
import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth.hashers import get_hasher, identify_hasher
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Max, Min, Sum
from django.urls import reverse
from django.utils import timezone

from clusters.models import ClusterNode, NodeHealthEvent
from clusters.sim_faults import fault_settings, faults_between
from finance.models import DailyUsage, RateCard
from finance.selectors.drill_down import attempts_in_month, statement_attempts
from finance.selectors.statements import statement_month, statement_total
from images.models import Image
from jobs.models import Attempt, Run
from jobs.selectors.estimates import run_start_estimate
from jobs.selectors.runs import runs_place_in_line
from portal.demo import DEMO_PASSWORD, LOGINS, STRAGGLER_RUN, demo_seed, previous_month
from portal.demo_history import GPU_MINUTE_COLUMNS, _gpu_minutes_insert
from telemetry import accounting
from telemetry.goodput import DEFAULT_GOODPUT_DAYS, goodput_window
from telemetry.kpis.node_health import node_overview
from telemetry.models import AttemptAccounting, GpuMinute, RankStepWindow
from telemetry.selectors.evidence import attempt_clock_evidence, attempt_link_evidence
from telemetry.selectors.gpu_seconds import GpuSeconds
from telemetry.selectors.rank_windows import attempt_rank_windows
from telemetry.selectors.run_page import run_telemetry
from telemetry.selectors.tenant_goodput import GoodputPeriod, goodput_by_period
from telemetry.services import accounting_compute_pending
from telemetry.simulated import SimulatedMinute
from telemetry.stragglers import Cause, GpuEvidence, Placement, RankWindow, detect
from tenants.models import Quota, Tenant

pytestmark = pytest.mark.django_db


# The story holds whenever it is told: now, in the first hour of a month (and of a year),
# and in the last minute of a month. At a fixed instant the clock stands still.
DEMO_INSTANTS = {
    "now": None,
    "first-hour-of-a-month": datetime(2027, 1, 1, 0, 20, tzinfo=UTC),
    "last-minute-of-a-month": datetime(2027, 2, 28, 23, 59, 30, tzinfo=UTC),
}


@pytest.fixture(scope="module", params=list(DEMO_INSTANTS))
def demo(request, django_db_setup, django_db_blocker):
    """Seeded once per instant for the module, rolled back at its end; each test reads it
    inside its own savepoint (the ``db`` fixture), so what one test might change the next
    does not see."""
    instant = DEMO_INSTANTS[request.param]
    with contextlib.ExitStack() as stack:
        if instant is not None:
            stack.enter_context(time_machine.travel(instant, tick=False))
        with django_db_blocker.unblock(), transaction.atomic():
            demo_seed(speedup=30)
            yield request.param
            transaction.set_rollback(True)


def run_named(name: str) -> Run:
    return Run.objects.select_related("experiment").get(experiment__name=name)


def largest_waste(row: AttemptAccounting) -> str:
    return max(
        ("lost", "startup", "checkpoint", "idle", "input_wait", "comm_wait"),
        key=lambda name: getattr(row, f"{name}_gpu_s"),
    )


def test_tenants_have_different_quotas(demo):
    quotas = Quota.objects.order_by("tenant__slug", "flavor__slug").values_list(
        "tenant__slug",
        "flavor__slug",
        "guaranteed_gpus",
        "borrow_limit_gpus",
        "monthly_gpu_hour_budget",
        "budget_mode",
    )
    assert list(quotas) == [
        ("climate", "a100-80gb", 8, 0, 400, "soft"),
        ("climate", "h100-80gb", 0, 0, None, "hard"),
        ("nlp", "a100-80gb", 8, 16, None, "hard"),
        ("nlp", "h100-80gb", 8, 0, None, "hard"),
        ("vision", "a100-80gb", 16, 8, 5000, "hard"),
        ("vision", "h100-80gb", 8, 0, None, "hard"),
    ]


def test_one_live_run_waits_and_says_why_and_where_it_stands(demo):
    waiting = Run.objects.filter(state="QUEUED")

    assert [run.experiment.name for run in waiting] == ["yolo-xl"]
    run = waiting.get()
    assert run.get_wait_reason_display() == "Borrow limit reached"
    assert run.wait_message == (
        "tenant vision uses 16 of 16 guaranteed + 8 borrowable a100-80gb GPUs; this run needs 16"
    )
    runs_place_in_line([run])
    assert run.queue_position == 1
    # The seed runs the first start estimate, as the README's tour says: a number, not a
    # reason, and the expected start no later than the one at full time limits.
    estimate = run_start_estimate(run=run)
    assert estimate is not None and estimate.note == ""
    assert estimate.full_limits is not None and estimate.expected is not None
    assert run.submitted_at < estimate.expected <= estimate.full_limits
    assert estimate.summary(now=run.submitted_at).startswith("Should start at about ")


def test_the_other_live_runs_are_placed_one_of_them_on_borrowed_gpus(demo):
    live = Run.objects.exclude(state__in=["SUCCEEDED", "FAILED", "QUEUED"])
    placed = {run.experiment.name: (run.state, run.borrowed) for run in live}

    assert placed == {
        "yolo-large": ("ADMITTED", False),
        "unet-sweep-2": ("ADMITTED", False),
        "llama-pretrain": ("ADMITTED", False),
        "dpr-index": ("ADMITTED", False),
        "dpr-sweep": ("ADMITTED", True),
        "radar-nowcast": ("ADMITTED", False),
    }
    borrowed = run_named("dpr-sweep")
    assert borrowed.events.order_by("at", "id").last().message == (
        "Admitted to sim-east on sim-east-a100-80gb-03: 4 a100-80gb GPUs borrowing idle GPUs "
        "(preemptible)"
    )
    assert borrowed.attempts.get().number == 1  # created by admission, for the worker to submit


def test_a_borrowed_run_was_preempted_and_resumed_from_its_checkpoint(demo):
    run = run_named("colbert-distill")
    first, second = Attempt.objects.filter(run=run).order_by("number")

    assert (run.state, run.borrowed) == ("SUCCEEDED", True)
    assert (first.state, first.failure_reason, first.resumed_from) == (
        "PREEMPTED",
        "PREEMPTED",
        None,
    )
    assert (second.state, second.resumed_from.attempt, second.resumed_from.step) == (
        "SUCCEEDED",
        first,
        7200,
    )
    assert list(run.events.order_by("at", "id").values_list("reason", flat=True)) == [
        "SUBMITTED",
        "ADMITTED",
        "STARTED",
        "PREEMPTED",
        "REQUEUED",
        "ADMITTED",
        "STARTED",
        "SUCCEEDED",
    ]
    assert largest_waste(first.accounting) == "lost"  # its work after the checkpoint


def test_a_lemon_node_was_quarantined_and_the_run_it_failed_was_retried_elsewhere(demo):
    """The node's GPU fell off the bus at the instant the simulator's lemon settings say;
    Gantry's policy quarantined the node and drained it on the simulator (it takes no work:
    the inventory says why); the attempt it ended is the hardware's, with the evidence, and
    the run resumed from its checkpoint on another node with the lemon excluded."""
    lemon = "sim-east-a100-80gb-04"
    run = run_named("segformer-b5")
    first, second = Attempt.objects.filter(run=run).order_by("number")
    cluster = first.cluster
    nodes = {f"sim-east-a100-80gb-0{i}": 8 for i in range(6)}
    [fault] = faults_between(
        {lemon: 8},
        fault_settings(cluster.settings["faults"], nodes=nodes),
        start=first.started_at.timestamp(),
        end=first.finished_at.timestamp() + 1,
    )
    assert fault.at == first.finished_at.timestamp()
    assert (first.state, first.failure_reason, first.exit_code, first.node_list) == (
        "FAILED", "NODE_FAILURE", 137, [lemon],
    )  # fmt: skip
    assert first.failure_message == (
        f"XID 79 (GPU has fallen off the bus) on GPU 3 of {lemon}: the node went down with it"
    )
    assert (first.cause_class, first.cause_evidence) == (
        "hardware",
        {"node": lemon, "gpu": "3", "signal": "gpu_lost", "code": "79",
         "at": first.finished_at.isoformat(), "detail": "XID 79 GPU has fallen off the bus"},
    )  # fmt: skip
    assert (second.state, second.node_list, second.resumed_from.attempt) == (
        "SUCCEEDED", ["sim-east-a100-80gb-01"], first,
    )  # fmt: skip
    assert (run.state, run.platform_retries, run.excluded_nodes) == ("SUCCEEDED", 1, [lemon])
    assert largest_waste(first.accounting) == "lost"  # its work after the checkpoint
    assert GpuMinute.objects.filter(attempt=first, gpu="3", xid=79).count() == 1

    node = ClusterNode.objects.get(cluster=cluster, name=lemon)
    assert (node.health, node.schedulable, node.reason, node.health_reason) == (
        "quarantined",
        False,
        "gantry: GPU 3: XID 79 GPU has fallen off the bus",
        "GPU 3: XID 79 GPU has fallen off the bus",
    )
    assert node.health_since - first.finished_at == timedelta(seconds=45)
    assert node.fenced_at - first.finished_at == timedelta(seconds=70)
    # The rows node health's services write (clusters.health_policy's vocabulary).
    history = list(
        NodeHealthEvent.objects.filter(node=lemon)
        .order_by("observed_at")
        .values_list("source", "signal", "code", "gpu", "action", "recorded_at")
    )
    assert history == [
        ("dcgm", "gpu_lost", "79", "3", "quarantine", node.health_since),
        ("gantry", "fence", "", "", "fenced", node.fenced_at),
    ]
    # The node health page counts the fault and its 45 s to the quarantine.
    overview = node_overview(now=timezone.now())
    [row] = [row for row in overview.nodes if row.name == lemon]
    assert (row.faults, row.latencies, row.last_signal.signal) == (1, (45.0,), "gpu_lost")
    # The live runs were placed around it: on every other node that takes Gantry's work.
    placed = {
        node
        for placement in Attempt.objects.filter(finished_at=None).values_list(
            "placement", flat=True
        )
        for node in placement
    }
    assert lemon not in placed and {"sim-east-a100-80gb-00", "sim-east-a100-80gb-03"} <= placed


def test_the_input_bound_run_is_diagnosed_as_input_bound(demo):
    run = run_named("unet-sweep-1")
    telemetry = run_telemetry(run=run, attempts=list(run.attempts.all()), now=timezone.now())

    [attempt] = telemetry.attempts
    assert [(finding.code, finding.text) for finding in attempt.findings] == [
        (
            "input_bound",
            "Input-bound: shard the dataset, add DataLoader workers, use local NVMe cache. "
            "The GPUs waited for data 60 % of the step time (24.0 GPU-hours).",
        )
    ]


def test_a_gang_with_a_clock_capped_gpu_has_what_names_its_straggler(demo, client):
    """vit-gang: 2 x 8 A100 GPUs, GPU 3 of the second node (rank 11) capped at 1,410 / 1.5
    MHz; every rank's windows, every GPU's clock and both nodes' links are stored, and the
    straggler detector names rank 11, its node, its GPU and the cause from them."""
    run = run_named(STRAGGLER_RUN)
    [attempt] = run.attempts.all()
    nodes = ["sim-east-a100-80gb-00", "sim-east-a100-80gb-01"]
    step = 0.97 * 1.5 + 0.01 + 0.02  # the gang's step: the capped GPU's, plus the transfer
    assert (run.gpus, run.state, attempt.node_list) == (16, "SUCCEEDED", nodes)
    assert run.experiment.env["GANTRY_SIM_STRAGGLER"] == "slow_gpu"
    # An hour of work and 30 s of start-up, at the gang's pace.
    assert (attempt.finished_at - attempt.started_at).total_seconds() == pytest.approx(
        3630 * step, abs=1e-5
    )
    per_rank = Counter(
        RankStepWindow.objects.filter(attempt=attempt).values_list("rank", "world_size")
    )
    assert per_rank == {(rank, 16): 60 for rank in range(16)}
    slow = RankStepWindow.objects.filter(attempt=attempt, rank=11).first()
    assert (slow.host, slow.gpu, slow.steps, round(slow.comm_wait_s, 6)) == (nodes[1], "3", 60, 1.2)
    clocks = {
        (c.host, c.gpu): c.sm_clock_mhz for c in attempt_clock_evidence(attempt_id=attempt.pk)
    }
    assert clocks.pop((nodes[1], "3")) == 940.0
    assert (len(clocks), set(clocks.values())) == (15, {1410.0})
    links = attempt_link_evidence(attempt_id=attempt.pk)
    assert [(host.host, host.ib_errors, host.minutes > 80) for host in links.hosts] == [
        (nodes[0], 0, True),
        (nodes[1], 0, True),
    ]
    assert links.low_infiniband() == links.low_nvlink() == []
    paths = dict(ClusterNode.objects.filter(name__in=nodes).values_list("name", "path"))
    found = detect(
        [RankWindow(**row) for row in attempt_rank_windows(attempt_id=attempt.pk)],
        evidence=[
            GpuEvidence(c.host, c.gpu, c.sm_clock_mhz, c.max_sm_clock_mhz)
            for c in attempt_clock_evidence(attempt_id=attempt.pk)
        ],
        placement=Placement({node: tuple(path) for node, path in paths.items()}),
    )
    assert [(s.rank, s.host, s.gpu, s.cause, s.first_window) for s in found.stragglers] == [
        (11, nodes[1], "3", Cause.SLOW_GPU, 1)
    ]
    # The seed scanned it as the scan task would have: its run page names the straggler.
    flags = list(attempt.straggler_flags.values_list("rank", "node", "gpu", "cause"))
    assert flags == [(11, nodes[1], "3", "slow_gpu")]
    client.force_login(User.objects.get(username="alice"))
    content = client.get(reverse("telemetry:run_telemetry", args=[run.pk])).content.decode()
    assert (
        f'data-finding="slow_rank">A slow rank: rank 11 on {nodes[1]}, GPU 3, reached each '
        "all-reduce 1.49× later than the gang&#x27;s median for 21 windows, and every other "
        "rank waited for it; its GPU is slow (SM clock at 67% of its maximum)."
    ) in content


def test_the_history_spans_a_month_and_accounts_as_its_profiles(demo):
    assert accounting_compute_pending(limit=100) == 0  # the seed accounted its history

    rows = {
        row.attempt.run.experiment.name: row
        for row in AttemptAccounting.objects.select_related("attempt__run__experiment")
    }
    # Twelve runs, one preempted and resumed, and one retried after a hardware fault.
    assert AttemptAccounting.objects.count() == 14
    assert sorted(rows) == [
        "colbert-distill", "cordex-emulator", "cordex-v0", "dpr-train", "llama-ft-lr1e4",
        "llama-ft-lr3e4", "notebook-debug", "segformer-b5", "unet-sweep-1", "vit-gang",
        "yolo-baseline", "yolo-v0",
    ]  # fmt: skip
    for row in AttemptAccounting.objects.all():
        assert row.effective_gpu_s + row.waste_gpu_s == row.allocated_gpu_s
    assert largest_waste(rows["unet-sweep-1"]) == "input_wait"
    assert largest_waste(rows["cordex-v0"]) == "input_wait"
    assert largest_waste(rows["dpr-train"]) == "comm_wait"
    assert largest_waste(rows["llama-ft-lr3e4"]) == "lost"
    assert rows["notebook-debug"].idle_gpu_s == rows["notebook-debug"].allocated_gpu_s
    healthy = rows["yolo-baseline"]
    assert healthy.effective_gpu_s / healthy.allocated_gpu_s > 0.9
    assert run_named("notebook-debug").submitted_by.username == "tara"
    span = Attempt.objects.filter(accounting__isnull=False).aggregate(
        first=Min("started_at"), last=Max("finished_at")
    )
    assert span["last"] - span["first"] >= timedelta(days=22)


def test_last_months_statement_has_the_runs_of_last_month_at_last_months_price(demo):
    vision = Tenant.objects.get(slug="vision")
    month = previous_month(timezone.now().date())

    statement = statement_month(tenant=vision, month=month)
    attempts = statement_attempts(tenant=vision, month=month, filters={})
    shares = {
        share.attempt.run.experiment.name: share
        for share in attempts_in_month(attempts=list(attempts), month=month)
    }

    assert statement.total.allocated_gpu_s >= 8 * 5 * 3600
    yolo = shares["yolo-v0"]  # 8 A100 GPUs for 5 hours at 2.10 EUR
    assert (yolo.month_allocated_gpu_s, yolo.month_cost) == (144_000, Decimal("84.00"))


def test_the_history_is_priced_and_rolled_up_into_daily_usage(demo):
    assert list(RateCard.objects.values_list("flavor__slug", "price_per_gpu_hour", "currency")) == [
        ("a100-80gb", Decimal("2.1000"), "EUR"),
        ("a100-80gb", Decimal("2.4000"), "EUR"),
        ("h100-80gb", Decimal("3.9000"), "EUR"),
    ]
    usage = DailyUsage.objects.aggregate(
        gpu_s=Sum("allocated_gpu_s"), unpriced=Sum("unpriced_gpu_s")
    )
    assert usage == {
        "gpu_s": AttemptAccounting.objects.aggregate(gpu_s=Sum("allocated_gpu_s"))["gpu_s"],
        "unpriced": 0,
    }


def test_every_record_is_dated_in_the_order_things_happened(demo):
    """Nothing is created after what follows from it, and nothing lies in the future."""
    now = timezone.now()
    founded = Tenant.objects.aggregate(last=Max("created_at"))["last"]
    joined = User.objects.aggregate(last=Max("date_joined"))["last"]
    published = Image.objects.aggregate(last=Max("created_at"))["last"]
    for run in Run.objects.select_related("experiment", "submitted_by"):
        created = run.experiment.created_at
        assert max(founded, joined, published) <= created <= run.submitted_at <= now, run
        # admitted_at is the latest admission, started_at the first start: a resumed run
        # was admitted again after it first started.
        for moments in (
            [run.submitted_at, run.admitted_at, run.finished_at],
            [run.submitted_at, run.started_at, run.finished_at],
        ):
            known = [moment for moment in moments if moment is not None]
            assert known == sorted(known), run
        for attempt in run.attempts.all():
            assert run.submitted_at <= attempt.created_at <= now, attempt
            if attempt.started_at is not None:
                assert attempt.created_at <= attempt.started_at <= now, attempt
            if attempt.finished_at is not None:
                assert attempt.started_at <= attempt.finished_at <= now, attempt
        events = list(run.events.order_by("id").values_list("at", flat=True))
        assert events == sorted(events), run  # recorded in the order they happened
        assert run.submitted_at <= events[0] and events[-1] <= now, run


def test_the_last_closed_month_has_a_run_of_every_tenant_whatever_the_day(demo):
    """What finance reviews first is never empty: each tenant ran in the last closed month."""
    month = previous_month(timezone.now().date())
    # Each with its own size and length: 8 GPUs for 5 hours, 8 for 7, 4 for 9.
    fixed = {
        "vision": ("yolo-v0", 8 * 5),
        "nlp": ("llama-ft-lr1e4", 8 * 7),
        "climate": ("cordex-v0", 4 * 9),
    }

    for slug, (name, gpu_hours) in fixed.items():
        statement = statement_month(tenant=Tenant.objects.get(slug=slug), month=month)
        attempts = statement_attempts(tenant=statement.tenant, month=month, filters={})
        names = {attempt.run.experiment.name for attempt in attempts}
        assert name in names, (slug, names)
        assert statement.total.allocated_gpu_s >= gpu_hours * 3600
        assert statement.total.unpriced_gpu_s == 0


DEMO_PYTORCH = (
    "registry.gantry.example/ml/pytorch@"
    "sha256:3c7c01d2195c3005ac24b2ccec80f994e8e2a850f7978a15be8b0e21bac9d87f"
)


def test_the_images_carry_what_the_demo_registry_says_of_them(demo):
    """Imported from the demo registry as an admin imports from a real one: each image has
    its CUDA, frameworks, NCCL, platform, size and build time."""
    images = {
        image.tag: (
            image.repository,
            image.status,
            image.cuda_version,
            image.frameworks,
            image.nccl_version,
            f"{image.os}/{image.architecture}",
            image.size_bytes,
            image.created,
            image.registry.name,
        )
        for image in Image.objects.select_related("registry")
    }
    assert images == {
        "2.4-cuda12.4": (
            "registry.gantry.example/ml/pytorch", "approved", "12.4.1", {"pytorch": "2.4.0"},
            "2.21.5", "linux/amd64", 7_421_821_642,
            datetime(2024, 7, 25, 9, 14, 3, 512345, tzinfo=UTC), "demo",
        ),
        "0.4.30-cuda12": (
            "registry.gantry.example/ml/jax", "approved", "12.3.2", {"jax": "0.4.30"},
            "2.19.3", "linux/amd64", 4_522_508_798,
            datetime(2024, 6, 19, 16, 40, 51, tzinfo=UTC), "demo",
        ),
        "24.05": (
            "registry.gantry.example/nlp/megatron", "approved", "12.4.1.003",
            {"pytorch": "2.4.0a0"}, "2.21.5", "linux/amd64", 11_144_266_354,
            datetime(2024, 5, 28, 22, 3, 17, tzinfo=UTC), "demo",
        ),
        "nightly": (
            "registry.gantry.example/ml/pytorch-nightly", "pending", "12.4.1",
            {"pytorch": "2.5.0.dev20240801"}, "2.22.3", "linux/amd64", 6_145_704_429,
            datetime(2024, 8, 1, 3, 2, 44, tzinfo=UTC), "demo",
        ),
    }  # fmt: skip
    assert Image.objects.get(tag="2.4-cuda12.4").reference == DEMO_PYTORCH


def test_a_tag_of_the_images_page_resolves_to_its_digest_at_submit(demo, client):
    """What a researcher copies from the Images page (repository:tag) submits; the run
    records the digest the demo registry resolves the tag to."""
    client.force_login(User.objects.get(username="alice"))

    response = client.post(
        "/api/v1/runs/",
        {
            "tenant": "vision",
            "project": "detection",
            "flavor": "a100-80gb",
            "nodes": 1,
            "gpus_per_node": 1,
            "command": "python train.py",
            "image": "registry.gantry.example/ml/pytorch:2.4-cuda12.4",
        },
        content_type="application/json",
    )

    assert response.status_code == 201, response.content
    run = Run.objects.select_related("experiment").get(pk=response.json()["id"])
    assert run.experiment.image_reference == DEMO_PYTORCH
    refused = client.post(
        "/api/v1/runs/",
        {
            "tenant": "vision",
            "project": "detection",
            "flavor": "a100-80gb",
            "nodes": 1,
            "gpus_per_node": 1,
            "command": "python train.py",
            "image": "registry.gantry.example/ml/pytorch:2.5",
        },
        content_type="application/json",
    )
    assert refused.status_code == 400
    assert refused.json()["image"] == ["registry.gantry.example/ml/pytorch:2.5 does not exist."]


def test_each_tenant_has_a_history_of_its_own(demo):
    """No two demo tenants show the same figures: over the goodput page's default 30 days
    (attempts, allocated and effective GPU-seconds and every waste category) nor in last
    month's statement."""
    today = timezone.localdate()
    since, until = goodput_window(days=DEFAULT_GOODPUT_DAYS, today=today)
    last_month = previous_month(today)
    figures = {}
    for tenant in Tenant.objects.order_by("slug"):
        days = goodput_by_period(tenant=tenant, since=since, until=until, period=GoodputPeriod.DAY)
        total = sum((seconds for _, seconds in days), GpuSeconds())
        month = statement_total(tenant=tenant, month=last_month)
        assert total.attempts > 0 and month.allocated_gpu_s > 0, tenant.slug
        categories = ("allocated", "effective", *accounting.CATEGORIES)
        figures[tenant.slug] = (
            (total.attempts, *(getattr(total, name) for name in categories)),
            (*(getattr(month, f"{name}_gpu_s") for name in categories), month.cost),
        )
    for first, second in itertools.combinations(figures, 2):
        for window in (0, 1):
            assert figures[first][window] != figures[second][window], (first, second, window)


def test_the_demo_logins_share_the_published_password_hashed_once(demo):
    """One hash of the demo password for all six logins (PBKDF2's costs ~0.4 s of CPU each),
    and the accounts ``create_user``/``create_superuser`` would make: active, only the admin
    staff and superuser."""
    users = User.objects.filter(username__in=[login.username for login in LOGINS])
    accounts = sorted(
        (user.username, user.email, user.is_active, user.is_staff, user.is_superuser)
        for user in users
    )
    assert accounts == [
        ("admin", "admin@gantry.example", True, True, True),
        ("alice", "alice@gantry.example", True, False, False),
        ("bob", "bob@gantry.example", True, False, False),
        ("carol", "carol@gantry.example", True, False, False),
        ("fiona", "fiona@gantry.example", True, False, False),
        ("tara", "tara@gantry.example", True, False, False),
    ]
    hashes = {user.password for user in users}
    assert len(hashes) == 1
    # The configured hasher (PBKDF2 in Gantry; MD5 in tests/settings.py, for fast logins).
    assert identify_hasher(hashes.pop()).algorithm == get_hasher().algorithm
    assert [user.check_password(DEMO_PASSWORD) for user in users] == [True] * 6
    assert [user.check_password("gantry-dem0") for user in users] == [False] * 6


def test_the_history_gpu_minutes_are_the_rows_the_orm_would_write(demo):
    """The seed inserts its GPU minutes in one executemany (portal/demo.py): every column of
    GpuMinute gets the value bulk_create would give it, the field defaults included."""
    assert {field.name for field in GpuMinute._meta.concrete_fields} == {
        "id",
        *GPU_MINUTE_COLUMNS,
    }
    attempt = Attempt.objects.get(run=run_named("unet-sweep-1"))
    GpuMinute.objects.filter(attempt=attempt).delete()
    minute = datetime(2026, 11, 3, 9, 41, tzinfo=UTC)
    with time_machine.travel(datetime(2026, 11, 3, 10, 0, 5, tzinfo=UTC), tick=False):
        _gpu_minutes_insert(
            attempt=attempt,
            minutes=[
                SimulatedMinute(
                    "sim-east-a100-80gb-02", "0", minute, 0.91, 0.625, 0.5, 12, 940.0, 1410.0, 8e10
                ),
                SimulatedMinute("sim-east-a100-80gb-02", "7", minute, 0.25, 0.125, 0.0, 11),
            ],
        )
    rows = GpuMinute.objects.filter(attempt=attempt).order_by("gpu")
    assert [
        (
            row.host, row.gpu, row.minute, row.activity, row.sm_active, row.tensor_active,
            row.dram_active, row.fb_used, row.power, row.xid, row.samples, row.sm_clock_mhz,
            row.max_sm_clock_mhz, row.nvlink_bytes_s, row.updated_at,
        )
        for row in rows
    ] == [
        ("sim-east-a100-80gb-02", "0", minute, 0.91, 0.625, 0.5, None, None, None, 0, 84, 940.0,
         1410.0, 8e10, datetime(2026, 11, 3, 10, 0, 5, tzinfo=UTC)),
        ("sim-east-a100-80gb-02", "7", minute, 0.25, 0.125, 0.0, None, None, None, 0, 77, None,
         None, None, datetime(2026, 11, 3, 10, 0, 5, tzinfo=UTC)),
    ]  # fmt: skip
