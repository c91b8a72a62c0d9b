"""The troubleshooting tree's verdicts (telemetry/verdicts.py): each branch with its evidence,
its figures and its next step; none without evidence, and the missing signal named."""

from fractions import Fraction

from telemetry.accounting import Accounting
from telemetry.diagnosis import Code, Signals
from telemetry.verdicts import (
    Facts,
    LinkUse,
    NodeTrouble,
    SlowRank,
    Spread,
    Versions,
    min_driver,
    oldest,
    tree,
)

BUSY = Signals(mean_activity=0.9, mean_tensor_activity=0.6)
ALL_MEASURED = {
    "nvlink": (LinkUse("gpu-1", bytes_s=20e9, gpu="0"),),
    "infiniband": (LinkUse("gpu-1", bytes_s=10e9), LinkUse("gpu-2", bytes_s=10e9)),
    "versions": Versions(driver="535.104.05", image_cuda="12.2", nccl_ranks={"2.18.3": 16}),
    "ranks_reporting": 16,
    "spread": Spread(nodes=2, domains=(("block", 1), ("leaf", 1))),
    "mean_dram_activity": 0.2,
}


def accounting(**seconds: int) -> Accounting:
    values = {
        "allocated": 36_000,
        "effective": 36_000,
        "lost": 0,
        "startup": 0,
        "checkpoint": 0,
        "interactive_idle": 0,
        "idle": 0,
        "input_wait": 0,
        "comm_wait": 0,
    } | seconds
    return Accounting(
        **{name: Fraction(value) for name, value in values.items()},
        active_gpu_hours=9.0,
        queue_s=None,
    )


def facts(signals: Signals = BUSY, **changes: object) -> Facts:
    return Facts(**({"signals": signals, "gpus": 16, "nodes": 2} | ALL_MEASURED | changes))  # type: ignore[arg-type]


def codes(result) -> list[str]:
    return [finding.code.value for finding in result.findings]


def test_a_healthy_well_measured_run_has_no_verdict_and_nothing_missing():
    result = tree(accounting(), facts())
    assert result.findings == ()
    assert result.missing == ()


def test_a_slow_rank_names_its_node_gpu_slowdown_and_next_step():
    slow = SlowRank(
        rank=5,
        host="gpu-2",
        gpu="1",
        cause="slow_gpu",
        slowdown=1.5,
        windows=4,
        evidence={"gpu_signs": ["SM clock at 66% of its maximum"]},
    )
    result = tree(None, facts(slow_ranks=(slow,)))
    (finding,) = result.findings
    assert finding.code == Code.SLOW_RANK
    assert finding.node == "gpu-2"
    assert finding.numbers == {
        "rank": 5,
        "node": "gpu-2",
        "gpu": "1",
        "slowdown": 1.5,
        "windows": 4,
        "cause": "slow_gpu",
    }
    assert finding.text == (
        "A slow rank: rank 5 on gpu-2, GPU 1, reached each all-reduce 1.50× later than the "
        "gang's median for 4 windows, and every other rank waited for it; its GPU is slow "
        "(SM clock at 66% of its maximum). Next: restart the run excluding that node (it "
        "resumes from its latest checkpoint); platform admins are told when a node is slow "
        "for several runs."
    )


def test_slow_ranks_come_slowest_first():
    ranks = tuple(
        SlowRank(rank=r, host=f"gpu-{r}", gpu="0", cause="slow_input", slowdown=s, windows=3)
        for r, s in ((1, 1.2), (2, 1.8), (3, 1.8))
    )
    result = tree(None, facts(slow_ranks=ranks))
    assert [f.numbers["rank"] for f in result.findings] == [2, 3, 1]


def test_without_rank_windows_the_slow_rank_branch_says_what_is_missing():
    result = tree(None, facts(ranks_reporting=0))
    assert result.findings == ()
    assert result.missing == ("per-rank step windows (the Gantry SDK sends them from every rank)",)


def test_two_gpus_cannot_tell_a_slow_rank_and_nothing_is_missing_for_it():
    result = tree(None, facts(gpus=2, nodes=1, ranks_reporting=0, infiniband=None))
    assert result.missing == ()


def test_a_spread_placement_with_communication_wait_says_what_a_tighter_one_would_wait():
    signals = Signals(mean_activity=0.6, mean_tensor_activity=0.5, comm_wait_share=0.15)
    spread = Spread(nodes=4, domains=(("block", 1), ("leaf", 2)), tighter_wait_s=5_400)
    result = tree(None, facts(signals, nodes=4, spread=spread))
    (finding,) = result.findings
    assert finding.code == Code.PLACEMENT_SPREAD
    assert finding.text == (
        "A spread placement: this run's 4 nodes sit in 2 leafs; every all-reduce crosses the "
        "link above them, and the run waited on communication 15 % of its step time. A "
        "placement inside one leaf would have waited about 1 h 30 min more. Next: ask for "
        "topology level 'leaf' (required) if the wait is worth it."
    )
    assert finding.numbers == {
        "nodes": 4,
        "level": "leaf",
        "domains": 2,
        "comm_wait_share": 0.15,
        "tighter_wait_s": 5_400,
    }


def test_a_spread_placement_names_the_widest_level_it_crosses():
    signals = Signals(mean_activity=0.6, comm_wait_share=0.3, mean_tensor_activity=0.5)
    spread = Spread(nodes=4, domains=(("block", 2), ("leaf", 3)), tighter_wait_s=0)
    (finding, _comm) = tree(
        accounting(comm_wait=10_800), facts(signals, nodes=4, spread=spread)
    ).findings
    assert finding.numbers["level"] == "block"
    assert finding.numbers["domains"] == 2
    assert "One leaf had room when it started" in finding.text


def test_a_spread_placement_without_communication_wait_is_no_verdict():
    signals = Signals(mean_activity=0.9, mean_tensor_activity=0.5, comm_wait_share=0.09)
    spread = Spread(nodes=4, domains=(("leaf", 2),))
    assert tree(None, facts(signals, nodes=4, spread=spread)).findings == ()


def test_a_multi_node_run_without_topology_misses_it():
    result = tree(None, facts(spread=None))
    assert result.missing == ("the topology of the run's nodes (the cluster reports none)",)


def test_link_errors_name_the_nodes_and_the_node_to_exclude():
    ib = (LinkUse("gpu-2", errors=7, bytes_s=9e9), LinkUse("gpu-1", errors=2, bytes_s=9e9))
    (finding,) = tree(None, facts(infiniband=ib)).findings
    assert finding.code == Code.INFINIBAND
    assert finding.node == "gpu-1"
    assert finding.numbers == {"errors": 9, "nodes": ["gpu-1", "gpu-2"]}


def test_low_nvlink_traffic_matters_only_when_waiting_on_communication():
    nvlink = (LinkUse("gpu-1", bytes_s=0.4e9, gpu="0"), LinkUse("gpu-1", bytes_s=0.2e9, gpu="1"))
    quiet = tree(None, facts(nvlink=nvlink))
    assert quiet.findings == ()
    waiting = Signals(mean_activity=0.4, mean_tensor_activity=0.5, comm_wait_share=0.3)
    (finding,) = tree(None, facts(waiting, nvlink=nvlink)).findings
    assert finding.code == Code.NVLINK
    assert finding.numbers == {"max_bytes_s": 0.4e9, "comm_wait_share": 0.3}
    assert finding.text.startswith("Low NVLink traffic: at most 0.40 GB/s while the run waited")


def test_missing_link_counters_are_named():
    result = tree(None, facts(nvlink=None, infiniband=None))
    assert result.missing == ("DCGM NVLink counters", "InfiniBand port counters (node exporter)")


def test_a_driver_too_old_for_the_images_cuda():
    versions = Versions(driver="470.82.01", image_cuda="12.1.1", nccl_ranks={"2.18.1": 16})
    (finding,) = tree(None, facts(versions=versions)).findings
    assert finding.code == Code.DRIVER_TOO_OLD
    assert finding.text.startswith(
        "Driver too old: the node's driver 470.82.01 is older than 525.60.13, the oldest that "
        "runs the image's CUDA 12.1.1"
    )


def test_minor_version_compatibility_table():
    assert min_driver("12.4") == (525, 60, 13)
    assert min_driver("11.8.0") == (450, 80, 2)
    assert min_driver("13.0") == (580,)
    assert min_driver("10.2") == (440, 33)
    assert min_driver("10.3") is None
    assert min_driver("12") is None
    assert min_driver("cuda") is None
    # exactly the minimum runs
    same = Versions(driver="525.60.13", image_cuda="12.8", nccl_ranks={"2.21.5": 16})
    assert tree(None, facts(versions=same)).findings == ()


def test_nccl_versions_differing_between_ranks():
    versions = Versions(
        driver="550.54.15",
        image_cuda="12.4",
        image_nccl="2.20.5",
        nccl_ranks={"2.20.5": 15, "2.18.1": 1},
    )
    (finding,) = tree(None, facts(versions=versions)).findings
    assert finding.code == Code.NCCL_MISMATCH
    assert finding.text.startswith(
        "NCCL versions differ between ranks: 2.20.5 on 15 ranks, 2.18.1 on 1 rank (the image "
        "records 2.20.5)."
    )


def test_missing_versions_are_named_one_by_one():
    assert tree(None, facts(versions=Versions())).missing == (
        "the driver version (the job's runtime report)",
        "the NCCL version of each rank",
    )
    assert tree(None, facts(versions=Versions(driver="550.1"))).missing == (
        "the image's CUDA version",
        "the NCCL version of each rank",
    )


def test_memory_bandwidth_bound_needs_dram_activity():
    (finding,) = tree(None, facts(mean_dram_activity=0.72)).findings
    assert finding.code == Code.MEMORY_BOUND
    assert finding.numbers == {"dram_activity": 0.72, "activity": 0.9}
    result = tree(None, facts(mean_dram_activity=None))
    assert result.findings == ()
    assert result.missing == ("DRAM activity (DCGM_FI_PROF_DRAM_ACTIVE)",)


def test_unhealthy_nodes_come_after_a_failure_and_before_the_rest():
    signals = Signals(
        mean_activity=0.3, mean_tensor_activity=0.5, data_wait_share=0.5, failure_reason="NCCL"
    )
    trouble = (NodeTrouble("gpu-2", "suspect", "thermal throttle on GPU 3"),)
    result = tree(accounting(input_wait=18_000), facts(signals, node_trouble=trouble))
    assert codes(result) == ["failure", "node_health", "input_bound"]
    assert result.findings[1].text == (
        "Node gpu-2 is suspect: thermal throttle on GPU 3. Next: restart the run excluding "
        "it; platform admins see its signals."
    )


def test_without_gpu_activity_it_says_so():
    result = tree(None, facts(Signals()))
    assert result.missing == ("GPU activity (DCGM)",)


def test_full_texts_of_the_version_link_and_memory_verdicts():
    versions = Versions(
        driver="470.82.01", image_cuda="12.1", image_nccl="", nccl_ranks={"2.18.1": 15, "2.20.5": 1}
    )
    ib = (LinkUse("gpu-1", bytes_s=0.2e9), LinkUse("gpu-2", bytes_s=0.3e9))
    waiting = Signals(mean_activity=0.9, mean_tensor_activity=0.5, comm_wait_share=0.3)
    result = tree(None, facts(waiting, versions=versions, infiniband=ib, mean_dram_activity=0.9))
    assert [f.text for f in result.findings] == [
        "Driver too old: the node's driver 470.82.01 is older than 525.60.13, the oldest that "
        "runs the image's CUDA 12.1 (https://docs.nvidia.com/deploy/cuda-compatibility/). "
        "Next: use an image built for an older CUDA, or ask platform admins for nodes with a "
        "newer driver.",
        "NCCL versions differ between ranks: 2.18.1 on 15 ranks, 2.20.5 on 1 rank. Ranks must "
        "run the same NCCL or collectives hang or fail. Next: run every rank from the image "
        "pinned by digest, without a host NCCL mounted over it (LD_LIBRARY_PATH).",
        "Low InfiniBand traffic: at most 0.30 GB/s while the run waited on communication 30 % "
        "of its step time; NCCL may use TCP sockets instead of InfiniBand (NCCL_IB_DISABLE, "
        "NCCL_SOCKET_IFNAME, missing RDMA devices in the container). Next: rerun with "
        "NCCL_DEBUG=INFO and read which transport NCCL chose.",
        "Memory-bandwidth bound: the GPU memory was busy 90 % of cycles at 90 % GPU activity. "
        "Fuse element-wise kernels (torch.compile), use bf16 to halve the bytes moved, and "
        "raise arithmetic intensity (larger batches or matrix sizes).",
    ]
    assert [f.code for f in result.findings] == [
        Code.DRIVER_TOO_OLD,
        Code.NCCL_MISMATCH,
        Code.INFINIBAND,
        Code.MEMORY_BOUND,
    ]


def test_nvlink_errors_text_and_low_nvlink_hint():
    nvlink = (LinkUse("gpu-1", errors=3, gpu="2"),)
    (errors,) = tree(None, facts(nvlink=nvlink)).findings
    assert errors.code == Code.NVLINK
    assert errors.text == (
        "NVLink errors: 3 on gpu-1 during the attempt (the link retried and recovered, slower "
        "each time). Next: restart excluding gpu-1 if the run is slow; platform admins see "
        "the node's signals."
    )
    waiting = Signals(mean_activity=0.4, mean_tensor_activity=0.5, comm_wait_share=0.25)
    quiet = (LinkUse("gpu-1", bytes_s=0.1e9, gpu="0"),)
    (low,) = tree(None, facts(waiting, nvlink=quiet)).findings
    assert (
        "NCCL may not use NVLink (peer-to-peer disabled: NCCL_P2P_DISABLE, or a container "
        "without a shared IPC namespace)." in low.text
    )


def test_the_smallest_gangs_each_branch_applies_to():
    # two GPUs on one node: NVLink counters matter, a slow rank cannot be told
    two = tree(None, facts(gpus=2, nodes=1, nvlink=None, ranks_reporting=0))
    assert two.missing == ("DCGM NVLink counters",)
    # three GPUs: a slow rank can be told
    three = tree(None, facts(gpus=3, nodes=1, ranks_reporting=0))
    assert three.missing == ("per-rank step windows (the Gantry SDK sends them from every rank)",)
    # one GPU: no NCCL between ranks, no link
    one = tree(None, facts(gpus=1, nodes=1, nvlink=None, versions=Versions("550.1", "12.4")))
    assert one.missing == ()


def test_a_slow_rank_lists_every_gpu_sign():
    slow = SlowRank(
        rank=1,
        host="gpu-1",
        gpu="0",
        cause="slow_gpu",
        slowdown=1.25,
        windows=3,
        evidence={"gpu_signs": ["thermal throttle", "2 PCIe replays"]},
    )
    (finding,) = tree(None, facts(slow_ranks=(slow,))).findings
    assert "; its GPU is slow (thermal throttle, 2 PCIe replays). Next:" in finding.text


def test_the_oldest_driver_is_the_one_checked():
    assert oldest(["535.104.05", "470.82.01", "", "n/a", "535.54.03"]) == "470.82.01"
    assert oldest(["", "unknown"]) == ""


def test_one_node_low_against_the_gang_names_the_node():
    ib = (
        LinkUse("gpu-1", bytes_s=10e9),
        LinkUse("gpu-2", bytes_s=3e9),
        LinkUse("gpu-3", bytes_s=12e9),
        LinkUse("gpu-4", bytes_s=11e9),
    )
    (finding,) = tree(None, facts(nodes=4, infiniband=ib)).findings
    assert finding.code == Code.INFINIBAND
    assert finding.node == "gpu-2"
    assert finding.numbers == {"low": ["gpu-2"], "median_bytes_s": 11e9}
    assert finding.text == (
        "Low InfiniBand traffic on gpu-2: at most 3.00 GB/s, under 50% of the others' median, "
        "11.00 GB/s (in data-parallel training every node moves the same gradients). A link "
        "that trained at a lower width or speed, or ranks there that reach the collective "
        "late. Next: check the link (ibstat, nvidia-smi nvlink -s); restart excluding gpu-2 if "
        "the run is slow."
    )
    # errors come first and say enough
    erring = (*ib[:3], LinkUse("gpu-4", errors=1, bytes_s=11e9))
    (first,) = tree(None, facts(nodes=4, infiniband=erring)).findings
    assert first.text.startswith("InfiniBand errors: 1 on gpu-4")


def test_nvlink_gpus_apart_are_named_with_their_gpu():
    nvlink = (
        LinkUse("gpu-1", bytes_s=40e9, gpu="0"),
        LinkUse("gpu-1", bytes_s=41e9, gpu="1"),
        LinkUse("gpu-1", bytes_s=5e9, gpu="2"),
    )
    (finding,) = tree(None, facts(nvlink=nvlink)).findings
    assert finding.numbers == {"low": ["gpu-1 GPU 2"], "median_bytes_s": 40.5e9}


def test_oldest_compares_versions_not_text():
    assert oldest(["1000.1", "535.104.05"]) == "535.104.05"


def test_a_node_without_a_reason_and_its_figures():
    (finding,) = tree(None, facts(node_trouble=(NodeTrouble("gpu-3", "quarantined", ""),))).findings
    assert finding.text == (
        "Node gpu-3 is quarantined: no reason given. Next: restart the run excluding it; "
        "platform admins see its signals."
    )
    assert finding.numbers == {"node": "gpu-3", "health": "quarantined"}


def test_an_unknown_cause_names_what_it_lacked_and_a_strange_cause_reads_as_unknown():
    lacking = SlowRank(
        rank=4, host="gpu-1", gpu="0", cause="unknown", slowdown=1.3, windows=3,
        evidence={"missing": "the GPU's SM clock"},
    )  # fmt: skip
    result = tree(None, facts(slow_ranks=(lacking,)))
    assert result.missing == ("to name rank 4's cause: the GPU's SM clock",)
    strange = SlowRank(rank=2, host="gpu-1", gpu="1", cause="cosmic_rays", slowdown=1.3, windows=3)
    (finding,) = tree(None, facts(slow_ranks=(strange,))).findings
    assert finding.text.endswith(
        "the cause is not known. Next: restart the run excluding that node if it stays slow."
    )


def test_the_nccl_mismatch_figures():
    versions = Versions(
        driver="550.54.15",
        image_cuda="12.4",
        image_nccl="2.20.5",
        nccl_ranks={"2.20.5": 7, "2.19.3": 1},
    )
    (finding,) = tree(None, facts(versions=versions)).findings
    assert finding.numbers == {"nccl": {"2.20.5": 7, "2.19.3": 1}, "image_nccl": "2.20.5"}


def test_with_a_slow_rank_the_communication_wait_is_the_gang_waiting_for_it():
    signals = Signals(mean_activity=0.6, mean_tensor_activity=0.5, comm_wait_share=0.34)
    slow = SlowRank(rank=11, host="gpu-2", gpu="3", cause="slow_gpu", slowdown=1.49, windows=21)
    result = tree(accounting(comm_wait=12_240), facts(signals, slow_ranks=(slow,)))
    assert codes(result) == ["slow_rank", "comm_bound"]
    assert result.findings[1].text == (
        "Waiting on communication 34 % of the step time (3.4 GPU-hours), mostly the other "
        "ranks waiting for the slow rank above (11) at every collective: fix that first."
    )
    assert result.findings[1].numbers == {"comm_wait_share": 0.34, "comm_wait_gpu_s": 12240.0}
    two = (slow, SlowRank(rank=2, host="gpu-1", gpu="2", cause="unknown", slowdown=1.2, windows=3))
    text = tree(accounting(comm_wait=12_240), facts(signals, slow_ranks=two)).findings[2].text
    assert text.endswith("for the slow ranks above (11, 2) at every collective: fix those first.")
