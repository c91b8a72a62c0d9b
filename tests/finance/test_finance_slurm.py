"""Issue 8, acceptance 5 (second half): on the real Slurm test cluster, a month's GPU-hours
in Gantry's statement equal ``sacct``'s for the same jobs.

Jobs run through Gantry's services on the cluster of ``scripts/slurm-cluster.sh`` (the
fixtures and helpers of tests/clusters/backends/test_slurm_cluster.py); then the accounting and the
DailyUsage rollup run as the workers would run them, and the statement's GPU-seconds are
compared with Σ ``gres/gpu`` × ``ElapsedRaw`` from ``sacct``, exactly: Gantry takes an
attempt's start and end from Slurm's own (whole-second) times.

Alone, against a private cluster and database:
``GANTRY_SLURM_DIR=/tmp/gantry-slurm-finance GANTRY_SLURM_PORT_BASE=28400
DATABASE_URL=postgres://…/gantry_fslurm pytest tests/finance/test_finance_slurm.py``.
"""

import time
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.db.models import Sum
from django.utils import timezone

from clusters.backends.slurm_tres import gpus_of_tres
from finance.costing import SECONDS_PER_HOUR
from finance.models import DailyUsage
from finance.selectors.statements import statement_total
from finance.services import daily_usage_update, rate_card_add
from jobs.models import Attempt, CauseClass, RunState
from jobs.services.backend_submit import attempt_submit
from telemetry.models import AttemptAccounting
from telemetry.services import accounting_compute_pending
from tests.clusters.backends import test_slurm_cluster as cluster_tests

pytestmark = cluster_tests.pytestmark  # a database test, in the worker that has the cluster

# The cluster and the Slurm-backed world of tests/clusters/backends/test_slurm_cluster.py:
# pytest finds fixtures by their names in this module.
slurm_env = cluster_tests.slurm_env
accounts = cluster_tests.accounts
unique_attempt_ids = cluster_tests.unique_attempt_ids
slurm_world = cluster_tests.slurm_world

# Per GPU-hour of a100-80gb: high enough that a few GPU-seconds cost more than a few cents.
PRICE = Decimal("1234.5678")
CENT = Decimal("0.01")
JOBS = [  # experiment overrides: one GPU, a failing two-GPU job, two nodes of two GPUs
    {"gpus_per_node": 1, "command": "sleep 2"},
    {"gpus_per_node": 2, "command": "sleep 3; exit 3"},
    {"nodes": 2, "gpus_per_node": 2, "command": "sleep 2"},
]
SACCT_FIELDS = ("JobIDRaw", "JobName", "State", "ElapsedRaw", "AllocTRES")


def sacct_jobs(*, names: list[str], since: str) -> dict[str, dict[str, str]]:
    """Slurm's accounting of the jobs named ``names`` that ran since ``since``, once every
    one of them has its end recorded, by job id."""
    for _ in range(40):
        out = cluster_tests.slurm(
            "sacct", "-X", "-n", "-P", "-a", "-A", "vision", "-S", since, "-E", "now",
            f"--name={','.join(names)}", "-o", ",".join(SACCT_FIELDS),
        )  # fmt: skip
        rows = [dict(zip(SACCT_FIELDS, line.split("|"), strict=True)) for line in out.splitlines()]
        ended = [row for row in rows if row["State"] not in ("PENDING", "RUNNING")]
        if len(ended) == len(names):
            return {row["JobIDRaw"]: row for row in ended}
        time.sleep(0.25)  # slurmdbd records a job's end a moment after slurmctld
    raise AssertionError(f"sacct has no finished record of every job: {out}")


def test_a_months_gpu_hours_equal_sacct(slurm_world, monkeypatch):
    world = slurm_world
    monkeypatch.setenv("TZ", "UTC")  # sacct reads -S in local time; months are UTC
    started = timezone.now()
    rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour=PRICE,
        currency="EUR",
        valid_from=started.date() - timedelta(days=1),
        actor=world.finance,
    )
    runs, attempts = [], []
    for overrides in JOBS:
        run, attempt = cluster_tests.submit_and_admit(world, **overrides)
        attempt_submit(attempt_id=attempt.pk)
        runs.append(run)
        attempts.append(attempt)
    cluster_tests.sync_until(world, runs, {RunState.SUCCEEDED, RunState.FAILED}, timeout=120)
    attempts = list(
        Attempt.objects.filter(pk__in=[a.pk for a in attempts]).select_related("run__experiment")
    )
    assert sorted(a.state for a in attempts) == ["FAILED", "SUCCEEDED", "SUCCEEDED"]
    # Issue 34: the failed job's end is put down to the hardware (as attribution would for a
    # fault on its node), so its lost and startup GPU-seconds are credited, not charged.
    crashed = next(a for a in attempts if a.state == "FAILED")
    Attempt.objects.filter(pk=crashed.pk).update(cause_class=CauseClass.HARDWARE)

    assert accounting_compute_pending() == len(JOBS)
    daily_usage_update(now=timezone.now())

    month_start = started.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    jobs = sacct_jobs(names=[a.name for a in attempts], since=f"{month_start:%Y-%m-%dT%H:%M:%S}")
    assert sorted(jobs) == sorted(a.backend_job_id for a in attempts)
    slurm_gpu_s = {
        job_id: gpus_of_tres(row["AllocTRES"]) * int(row["ElapsedRaw"])
        for job_id, row in jobs.items()
    }
    # Each attempt: Gantry's allocated GPU-seconds are Slurm's, to the second.
    accounted = dict(
        AttemptAccounting.objects.filter(attempt__in=attempts).values_list(
            "attempt__backend_job_id", "allocated_gpu_s"
        )
    )
    assert accounted == slurm_gpu_s
    assert all(gpu_s > 0 for gpu_s in slurm_gpu_s.values())

    # The statement of the month (of both months, should the jobs have run across the end
    # of one): the same GPU-seconds, and their cost at the card's price.
    months = sorted({a.started_at.date().replace(day=1) for a in attempts} | {
        a.finished_at.date().replace(day=1) for a in attempts
    })  # fmt: skip
    totals = [statement_total(tenant=world.vision, month=month) for month in months]
    total_gpu_s = sum(slurm_gpu_s.values())
    assert sum(t.allocated_gpu_s for t in totals) == total_gpu_s
    rolled_up = DailyUsage.objects.filter(tenant=world.vision).aggregate(Sum("allocated_gpu_s"))
    assert rolled_up == {"allocated_gpu_s__sum": total_gpu_s}
    # The cost: per statement line (project, user, flavor, cluster; one card), Slurm's
    # GPU-seconds * the price, rounded once, half to even; the total is the sum of the lines.
    line_gpu_s: dict[tuple, int] = {}
    for attempt in attempts:
        key = (
            attempt.run.experiment.project_id,
            attempt.run.submitted_by_id,
            attempt.run.flavor_id,
            attempt.cluster_id,
        )
        line_gpu_s[key] = line_gpu_s.get(key, 0) + slurm_gpu_s[attempt.backend_job_id]
    expected_cost = sum(
        (
            (Decimal(gpu_s) * PRICE / SECONDS_PER_HOUR).quantize(CENT, ROUND_HALF_EVEN)
            for gpu_s in line_gpu_s.values()
        ),
        Decimal("0.00"),
    )
    assert sum((t.cost for t in totals), Decimal("0.00")) == expected_cost
    assert sum(t.unpriced_gpu_s for t in totals) == 0
    # With the credit: charged + credited is still Slurm's, to the second and the cent, and
    # the credit is the crashed attempt's lost and startup GPU-seconds.
    credited = AttemptAccounting.objects.get(attempt=crashed)
    assert credited.credited_gpu_s == credited.lost_gpu_s + credited.startup_gpu_s > 0
    assert sum(t.credited_gpu_s for t in totals) == credited.credited_gpu_s
    assert sum(t.charged_gpu_s + t.credited_gpu_s for t in totals) == total_gpu_s
    assert sum((t.charged_cost + t.credited_cost for t in totals), Decimal("0.00")) == expected_cost
