"""Diagnosis in plain words, following the troubleshooting tree (exact texts)."""

from fractions import Fraction

import pytest

from telemetry.accounting import WASTE, Accounting
from telemetry.diagnosis import NEXT_STEP, Code, FailureReason, Finding, Signals, diagnose


def accounting(**gpu_seconds: int) -> Accounting:
    """A 10 GPU-hour attempt; the categories not given are effective."""
    allocated = 36_000
    waste = {name: Fraction(gpu_seconds.get(name, 0)) for name in WASTE}
    return Accounting(
        allocated=Fraction(allocated),
        effective=allocated - sum(waste.values()),
        active_gpu_hours=5.0,
        queue_s=None,
        **waste,
    )


def test_healthy_job_has_nothing_to_fix():
    assert diagnose(accounting(), Signals(mean_activity=0.9, mean_tensor_activity=0.4)) == []


def test_low_activity_and_high_data_wait_is_input_bound():
    findings = diagnose(
        accounting(input_wait=14_400),
        Signals(mean_activity=0.3, mean_tensor_activity=0.2, data_wait_share=0.4),
    )

    assert findings == [
        Finding(
            Code.INPUT_BOUND,
            "Input-bound: shard the dataset, add DataLoader workers, use local NVMe cache. "
            "The GPUs waited for data 40 % of the step time (4.0 GPU-hours).",
        )
    ]


def test_high_communication_wait_gets_topology_and_nccl_advice():
    findings = diagnose(
        accounting(comm_wait=9_000), Signals(mean_activity=0.45, comm_wait_share=0.25)
    )

    assert findings == [
        Finding(
            Code.COMM_BOUND,
            "Communication-bound: keep the run inside one topology domain (one NVLink island "
            "or leaf switch), check with NCCL_DEBUG=INFO that NCCL uses InfiniBand/RoCE and "
            "not TCP sockets, and communicate less often (larger per-GPU batch, gradient "
            "accumulation). The GPUs waited on communication 25 % of the step time "
            "(2.5 GPU-hours).",
        )
    ]


def test_high_activity_without_tensor_activity_means_tensor_cores_unused():
    findings = diagnose(accounting(), Signals(mean_activity=0.92, mean_tensor_activity=0.01))

    assert findings == [
        Finding(
            Code.TENSOR_CORES_UNUSED,
            "Tensor Cores unused: use mixed precision (bf16/fp16 with torch.autocast) or "
            "enable TF32 for fp32 matmuls, and keep matrix dimensions multiples of 8. "
            "Tensor activity 1 % at 92 % GPU activity.",
        )
    ]


def test_idle_gpus_get_idle_advice():
    findings = diagnose(accounting(idle=21_600), Signals(mean_activity=0.1))

    assert findings == [
        Finding(
            Code.IDLE,
            "Idle: the GPUs were below 5 % activity for 60 % of the allocation "
            "(6.0 GPU-hours). Stop interactive sessions when you are not using them, "
            "request fewer GPUs, or move preprocessing off the GPU job.",
        )
    ]


def test_low_activity_without_waits_or_idleness_suggests_profiling():
    findings = diagnose(accounting(), Signals(mean_activity=0.3, data_wait_share=0.05))

    assert findings == [
        Finding(
            Code.LOW_ACTIVITY,
            "Low GPU activity (30 %) without input or communication waits: profile a few "
            "steps (torch.profiler) for CPU-side work, small batches or host-device "
            "synchronisation.",
        )
    ]


def test_lost_work_startup_and_checkpoint_stalls_are_reported():
    findings = diagnose(
        accounting(lost=7_200, startup=3_600, checkpoint=5_400),
        Signals(mean_activity=0.8, failure_reason="NODE_FAILURE"),
    )

    assert findings == [
        Finding(
            Code.FAILURE,
            "The node failed (not your code): the run is requeued from its latest checkpoint "
            "while it has restarts left; checkpoint more often to lose less work.",
        ),
        Finding(
            Code.LOST_WORK,
            "Lost work: 2.0 GPU-hours (20 %) of progress after the last usable checkpoint "
            "was thrown away; checkpoint more often.",
        ),
        Finding(
            Code.SLOW_STARTUP,
            "Slow startup: 10 % of the allocation passed before the first training step; "
            "use a smaller image, stage data on local disk, and load the checkpoint in "
            "parallel.",
        ),
        Finding(
            Code.CHECKPOINT_STALLS,
            "Checkpoint stalls: training was blocked saving or restoring checkpoints 15 % "
            "of the allocation; save asynchronously or less often.",
        ),
    ]


@pytest.mark.parametrize(
    ("reason", "text"),
    [
        (
            "OOM_GPU",
            "Out of GPU memory: lower the per-GPU batch size (keep the global batch with "
            "gradient accumulation), enable activation checkpointing or bf16, or choose a "
            "flavor with more GPU memory.",
        ),
        (
            "OOM_HOST",
            "Out of host memory: use fewer DataLoader workers or a smaller prefetch_factor, "
            "memory-map the dataset instead of loading it into RAM, or request more memory.",
        ),
        (
            "GPU_XID",
            "GPU hardware error (XID): platform admins are told about the node; resubmit "
            "and the run is placed on other GPUs.",
        ),
        (
            "NCCL",
            "NCCL error (a peer died or the network timed out): read the log of the first "
            "rank that failed, rerun with NCCL_DEBUG=INFO, and report the nodes if it "
            "repeats on the same ones.",
        ),
        (
            "IMAGE_PULL",
            "The image could not be pulled: check that the digest still exists in the "
            "registry and that the tenant's pull secret is valid.",
        ),
        (
            "TIMEOUT",
            "Timed out at the run's time limit: raise the maximum runtime, or checkpoint "
            "regularly so the run resumes where it stopped.",
        ),
        (
            "PREEMPTED",
            "Preempted to give GPUs back to a guaranteed quota: the run resumes from its "
            "latest checkpoint; stay within your guaranteed quota to avoid preemption, and "
            "checkpoint often when borrowing.",
        ),
        ("CANCELLED", "Cancelled: the run events say by whom (a user or the idle-GPU policy)."),
        (
            "USER_EXIT",
            "The training script exited with an error: read the traceback at the end of "
            "the log, fix it and resubmit.",
        ),
        (
            "LOST",
            "The cluster lost track of the job: the run is requeued from its latest "
            "checkpoint while it has restarts left; report it to platform admins if it "
            "repeats.",
        ),
        (
            "UNKNOWN",
            "Failed for a reason Gantry could not classify: read the end of the log and the "
            "run events, and report it to platform admins if they show nothing.",
        ),
        (
            "SOMETHING_NEW",
            "Failed for a reason Gantry could not classify: read the end of the log and the "
            "run events, and report it to platform admins if they show nothing.",
        ),
    ],
)
def test_each_failure_reason_gets_a_concrete_next_step(reason, text):
    assert diagnose(accounting(), Signals(mean_activity=0.9, failure_reason=reason)) == [
        Finding(Code.FAILURE, text)
    ]


def test_every_reason_of_the_taxonomy_has_a_next_step():
    assert set(NEXT_STEP) == set(FailureReason)


def test_an_empty_allocation_only_reports_the_failure():
    empty = Accounting(*(Fraction(0),) * 9, active_gpu_hours=0.0, queue_s=None)

    assert diagnose(empty, Signals(failure_reason="IMAGE_PULL")) == [
        Finding(Code.FAILURE, NEXT_STEP[FailureReason.IMAGE_PULL])
    ]


def test_every_finding_carries_its_figures_for_the_api():
    findings = diagnose(
        accounting(
            input_wait=7_200,
            comm_wait=9_000,
            idle=3_600,
            lost=3_600,
            startup=3_600,
            checkpoint=3_600,
        ),
        Signals(
            mean_activity=0.3,
            mean_tensor_activity=0.2,
            data_wait_share=0.25,
            comm_wait_share=0.3,
            failure_reason="OOM_GPU",
        ),
    )
    assert {f.code.value: dict(f.numbers) for f in findings} == {
        "failure": {"reason": "OOM_GPU"},
        "input_bound": {"data_wait_share": 0.25, "input_wait_gpu_s": 7200.0},
        "comm_bound": {"comm_wait_share": 0.3, "comm_wait_gpu_s": 9000.0},
        "idle": {"idle_share": 0.1, "idle_gpu_s": 3600.0},
        "lost_work": {"lost_share": 0.1},
        "slow_startup": {"startup_share": 0.1},
        "checkpoint_stalls": {"checkpoint_share": 0.1},
    }
    busy = diagnose(accounting(), Signals(mean_activity=0.9, mean_tensor_activity=0.01))
    assert [dict(f.numbers) for f in busy] == [{"tensor_activity": 0.01, "activity": 0.9}]
    low = diagnose(accounting(), Signals(mean_activity=0.3, mean_tensor_activity=0.2))
    assert [dict(f.numbers) for f in low] == [{"activity": 0.3}]


def test_a_workspace_nobody_used_is_reported_before_idle_gpus():
    findings = diagnose(accounting(interactive_idle=7_200, idle=3_600), Signals(mean_activity=0.05))
    assert [(f.code, dict(f.numbers)) for f in findings] == [
        (
            Code.INTERACTIVE_IDLE,
            {"interactive_idle_share": 0.2, "interactive_idle_gpu_s": 7200.0},
        ),
        (Code.IDLE, {"idle_share": 0.1, "idle_gpu_s": 3600.0}),
    ]
    assert findings[0].text.startswith(
        "Interactive idle: nobody used the workspace (no kernel or terminal ran, nothing was "
        "done through Gantry, the GPUs were idle) for 20 % of the allocation (2.0 GPU-hours)."
    )
    assert diagnose(accounting(interactive_idle=3_599), Signals(mean_activity=0.9)) == []
