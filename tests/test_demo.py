"""The demo that `make run` seeds: its finished runs carry telemetry that accounts like the
simulator profiles they are named after."""

from decimal import Decimal

from django.db.models import Sum

from jobs.models import Run
from portal.demo import demo_seed
from telemetry.models import AttemptAccounting, DailyUsage, RateCard
from telemetry.services import accounting_compute_pending


def largest_waste(row: AttemptAccounting) -> str:
    return max(
        ("lost", "startup", "checkpoint", "idle", "input_wait", "comm_wait"),
        key=lambda name: getattr(row, f"{name}_gpu_s"),
    )


def test_demo_history_accounts_as_its_profiles(db):
    demo_seed(speedup=30)

    assert accounting_compute_pending(limit=100) == 0  # the seed accounted its history

    rows = {
        row.attempt.run.experiment.name: row
        for row in AttemptAccounting.objects.select_related("attempt__run__experiment")
    }
    assert AttemptAccounting.objects.count() == 8  # six runs, and one preempted and resumed
    assert sorted(rows) == [
        "colbert-distill", "cordex-emulator", "dpr-train", "llama-ft-lr3e4", "notebook-debug",
        "unet-sweep-1", "yolo-baseline",
    ]  # fmt: skip
    for row in AttemptAccounting.objects.all():
        assert row.effective_gpu_s + row.waste_gpu_s == row.allocated_gpu_s
    assert largest_waste(rows["unet-sweep-1"]) == "input_wait"
    assert largest_waste(rows["dpr-train"]) == "comm_wait"
    assert largest_waste(rows["llama-ft-lr3e4"]) == "lost"
    assert rows["notebook-debug"].idle_gpu_s == rows["notebook-debug"].allocated_gpu_s
    healthy = rows["yolo-baseline"]
    assert healthy.effective_gpu_s / healthy.allocated_gpu_s > 0.9
    assert Run.objects.filter(experiment__name="notebook-debug").get().submitted_by.username == (
        "tara"
    )


def test_demo_history_is_priced_and_rolled_up_into_daily_usage(db):
    demo_seed(speedup=30)

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
