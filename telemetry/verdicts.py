"""The whole troubleshooting tree of design §7 as verdicts on one attempt (issue 36, point 3).
Pure: plain facts in, ``Verdicts`` out; no Django, no clock, no I/O.

``telemetry.diagnosis`` answers the first branches from the accounting (a failure, waiting
for input or on communication, idle or low activity, Tensor Cores unused, time lost). This
module adds the branches that need more than one number per attempt:

* memory-bandwidth bound: busy GPUs whose DRAM interface is busy most cycles;
* a slow rank: a straggler the detector flagged (``telemetry.stragglers``), with its node,
  GPU, slowdown and cause;
* a placement that spans topology domains, from Gantry's own placement, with the wait a
  tighter one would have had;
* NVLink or InfiniBand errors, or low traffic while the run waits on communication;
* a driver too old for the image's CUDA, NCCL versions differing between ranks;
* the health of the attempt's nodes.

A verdict is given only with its evidence, and each carries its figures (``numbers``) and
a next step in its text. Where the evidence for a branch is missing, no verdict is guessed:
``Verdicts.missing`` names the signal, so the page can say what it could not check.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median

from telemetry.accounting import Accounting
from telemetry.diagnosis import (
    HIGH_ACTIVITY,
    HIGH_COMM_WAIT,
    Code,
    Finding,
    Signals,
    diagnose,
)
from telemetry.links import LOW_TRAFFIC_SHARE, low_traffic

# DRAM_ACTIVE is the share of cycles the device memory interface sends or receives: above
# this on a busy GPU the kernels are bandwidth-bound (NVIDIA's DCGM profiling guide calls a
# DRAM activity near 1 "saturated"; half of every cycle is where fusing and recompute pay).
HIGH_DRAM_ACTIVITY = 0.5
# A spread placement is worth a verdict when the run waits on communication at least this
# share of its step time (below it, the spine costs the run little).
SPREAD_COMM_WAIT = 0.1
# Mean link traffic under which a communication-bound gang is not using the link at all: a
# data-parallel all-reduce over NVLink or InfiniBand moves gigabytes per second; NCCL on
# TCP sockets or with peer-to-peer disabled leaves every link near idle. (One node's link
# low against the others is ``telemetry.links``' rule.)
LOW_LINK_BYTES_S = 1e9

# The oldest Linux driver that runs each CUDA release: NVIDIA, "CUDA Compatibility", table
# "CUDA Toolkit 11.x, 12.x, and 13.x Driver Version Ranges" (minor version compatibility:
# any release of a major family runs on the family's minimum driver), and the CUDA Toolkit
# Release Notes' table of toolkit drivers for releases before 11
# (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html,
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/). Keys: (major, minor); a
# major listed with minor None covers its whole family.
MIN_DRIVER: Mapping[tuple[int, int | None], tuple[int, ...]] = {
    (13, None): (580,),
    (12, None): (525, 60, 13),
    (11, None): (450, 80, 2),
    (10, 2): (440, 33),
    (10, 1): (418, 39),
    (10, 0): (410, 48),
    (9, 2): (396, 26),
    (9, 1): (390, 46),
    (9, 0): (384, 81),
}
COMPATIBILITY_SOURCE = "https://docs.nvidia.com/deploy/cuda-compatibility/"


@dataclass(frozen=True, slots=True)
class SlowRank:
    """A rank the straggler detector flagged (``telemetry.stragglers.Straggler``)."""

    rank: int
    host: str
    gpu: str
    cause: str  # a ``telemetry.stragglers.Cause`` value
    slowdown: float
    windows: int
    evidence: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Spread:
    """Where Gantry placed the gang: per topology level (widest first), how many domains
    its nodes sit in; and how long a placement inside one domain of the narrowest level
    would have waited (None: not known)."""

    nodes: int
    domains: tuple[tuple[str, int], ...]
    tighter_wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class LinkUse:
    """One NVLink GPU or one InfiniBand node over the attempt: error counts that grew,
    mean traffic in bytes per second (None: not collected)."""

    host: str
    errors: int = 0
    bytes_s: float | None = None
    gpu: str = ""


@dataclass(frozen=True, slots=True)
class Versions:
    """The runtime report against the image: the driver the job saw, the CUDA and NCCL the
    image was recorded with, and how many ranks reported each NCCL version."""

    driver: str = ""
    image_cuda: str = ""
    image_nccl: str = ""
    nccl_ranks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeTrouble:
    node: str
    health: str  # ``clusters.health.NodeHealth`` value: suspect, quarantined…
    reason: str


@dataclass(frozen=True, slots=True)
class Facts:
    """What is known about one attempt. ``None`` and empty mean "not collected"."""

    signals: Signals
    gpus: int
    nodes: int
    mean_dram_activity: float | None = None
    ranks_reporting: int = 0  # ranks with step windows
    slow_ranks: tuple[SlowRank, ...] = ()
    spread: Spread | None = None
    nvlink: tuple[LinkUse, ...] | None = None
    infiniband: tuple[LinkUse, ...] | None = None
    versions: Versions = field(default_factory=Versions)
    node_trouble: tuple[NodeTrouble, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdicts:
    findings: tuple[Finding, ...]
    missing: tuple[str, ...]  # the signals a branch needed and did not have


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %"


def _version(text: str) -> tuple[int, ...] | None:
    """``"535.104.05"`` → (535, 104, 5); None for what is not dotted numbers."""
    parts = text.strip().split(".")
    if not parts or not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def oldest(versions: Iterable[str]) -> str:
    """The oldest of dotted versions ("535.104.05"), "" when none parses: the driver to check
    when ranks on several nodes report theirs."""
    parsed = [(v, t) for v in versions if (t := _version(v)) is not None]
    return min(parsed, key=lambda pair: pair[1])[0] if parsed else ""


def min_driver(cuda: str) -> tuple[int, ...] | None:
    """The oldest driver that runs CUDA ``cuda`` ("12.4", "12.4.1"), None when unknown."""
    version = _version(cuda)
    if version is None or len(version) < 2:
        return None
    major, minor = version[0], version[1]
    return MIN_DRIVER.get((major, None), MIN_DRIVER.get((major, minor)))


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(f"{part:02d}" if i else str(part) for i, part in enumerate(version))


def _memory_bound(facts: Facts, missing: list[str]) -> list[Finding]:
    activity, dram = facts.signals.mean_activity, facts.mean_dram_activity
    if activity is None or activity < HIGH_ACTIVITY:
        return []
    if dram is None:
        missing.append("DRAM activity (DCGM_FI_PROF_DRAM_ACTIVE)")
        return []
    if dram < HIGH_DRAM_ACTIVITY:
        return []
    return [
        Finding(
            Code.MEMORY_BOUND,
            f"Memory-bandwidth bound: the GPU memory was busy {_percent(dram)} of cycles at "
            f"{_percent(activity)} GPU activity. Fuse element-wise kernels (torch.compile), "
            "use bf16 to halve the bytes moved, and raise arithmetic intensity (larger "
            "batches or matrix sizes).",
            {"dram_activity": round(dram, 4), "activity": round(activity, 4)},
        )
    ]


_CAUSE_WORDS = {
    "slow_gpu": "its GPU is slow",
    "slow_input": "its input is slow",
    "network": "its node's network is slow",
    "unknown": "the cause is not known",
}
_CAUSE_STEP = {
    "slow_gpu": "restart the run excluding that node (it resumes from its latest "
    "checkpoint); platform admins are told when a node is slow for several runs.",
    "slow_input": "check that node's local disk or cache and its share of the dataset "
    "(a larger shard, a cold cache), and add DataLoader workers.",
    "network": "restart the run excluding that node, or ask for a placement inside one "
    "leaf switch; report the node's link to platform admins if it repeats.",
    "unknown": "restart the run excluding that node if it stays slow.",
}


def _slow_ranks(facts: Facts, missing: list[str]) -> list[Finding]:
    if facts.gpus < 3:  # two ranks cannot tell which one is slow
        return []
    if facts.ranks_reporting == 0 and not facts.slow_ranks:
        missing.append("per-rank step windows (the Gantry SDK sends them from every rank)")
        return []
    findings = []
    for slow in sorted(facts.slow_ranks, key=lambda s: (-s.slowdown, s.rank)):
        if slow.cause == "unknown" and slow.evidence.get("missing"):
            missing.append(f"to name rank {slow.rank}'s cause: {slow.evidence['missing']}")
        gpu_signs = slow.evidence.get("gpu_signs")
        signs = f" ({', '.join(map(str, gpu_signs))})" if isinstance(gpu_signs, list) else ""
        findings.append(
            Finding(
                Code.SLOW_RANK,
                f"A slow rank: rank {slow.rank} on {slow.host}, GPU {slow.gpu}, reached each "
                f"all-reduce {slow.slowdown:.2f}× later than the gang's median for "
                f"{slow.windows} windows, and every other rank waited for it; "
                f"{_CAUSE_WORDS.get(slow.cause, _CAUSE_WORDS['unknown'])}{signs}. Next: "
                f"{_CAUSE_STEP.get(slow.cause, _CAUSE_STEP['unknown'])}",
                {
                    "rank": slow.rank,
                    "node": slow.host,
                    "gpu": slow.gpu,
                    "slowdown": slow.slowdown,
                    "windows": slow.windows,
                    "cause": slow.cause,
                },
                node=slow.host,
            )
        )
    return findings


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _spread(facts: Facts, missing: list[str]) -> list[Finding]:
    if facts.nodes < 2:
        return []
    spread = facts.spread
    if spread is None or not spread.domains:
        missing.append("the topology of the run's nodes (the cluster reports none)")
        return []
    split = [(level, count) for level, count in spread.domains if count > 1]
    if not split:
        return []
    comm = facts.signals.comm_wait_share
    if comm < SPREAD_COMM_WAIT:
        return []
    level, count = split[0]  # the widest level it is split at: the costliest crossing
    if spread.tighter_wait_s is None:
        tighter = "How long a placement inside one would have waited is not known."
    elif spread.tighter_wait_s <= 0:
        tighter = f"One {split[-1][0]} had room when it started: resubmit with that level."
    else:
        tighter = (
            f"A placement inside one {split[-1][0]} would have waited about "
            f"{_duration(spread.tighter_wait_s)} more."
        )
    return [
        Finding(
            Code.PLACEMENT_SPREAD,
            f"A spread placement: this run's {spread.nodes} nodes sit in {count} {level}s; "
            f"every all-reduce crosses the link above them, and the run waited on "
            f"communication {_percent(comm)} of its step time. {tighter} Next: ask for "
            f"topology level {split[-1][0]!r} (required) if the wait is worth it.",
            {
                "nodes": spread.nodes,
                "level": level,
                "domains": count,
                "comm_wait_share": round(comm, 4),
                "tighter_wait_s": spread.tighter_wait_s,
            },
        )
    ]


_LOW_TRANSPORT_HINT = {
    "NVLink": "NCCL may not use NVLink (peer-to-peer disabled: NCCL_P2P_DISABLE, or a "
    "container without a shared IPC namespace)",
    "InfiniBand": "NCCL may use TCP sockets instead of InfiniBand (NCCL_IB_DISABLE, "
    "NCCL_SOCKET_IFNAME, missing RDMA devices in the container)",
}


def _link_errors(name: str, code: Code, uses: tuple[LinkUse, ...]) -> list[Finding]:
    erring = sorted({use.host for use in uses if use.errors > 0})
    if not erring:
        return []
    errors = sum(use.errors for use in uses)
    return [
        Finding(
            code,
            f"{name} errors: {errors} on {', '.join(erring)} during the attempt (the link "
            "retried and recovered, slower each time). Next: restart excluding "
            f"{erring[0]} if the run is slow; platform admins see the node's signals.",
            {"errors": errors, "nodes": erring},
            node=erring[0],
        )
    ]


def _link_apart(name: str, code: Code, uses: tuple[LinkUse, ...]) -> list[Finding]:
    """Nodes (GPUs) whose traffic is low against the gang's others (``telemetry.links``)."""
    low = low_traffic(uses, lambda use: use.bytes_s)
    if not low:
        return []
    where = [f"{use.host}{f' GPU {use.gpu}' if use.gpu else ''}" for use in low]
    rates = [use.bytes_s for use in uses if use.bytes_s is not None and use not in low]
    return [
        Finding(
            code,
            f"Low {name} traffic on {', '.join(where)}: at most "
            f"{max(use.bytes_s or 0.0 for use in low) / 1e9:.2f} GB/s, under "
            f"{LOW_TRAFFIC_SHARE:.0%} of the others' median, {median(rates) / 1e9:.2f} GB/s "
            "(in data-parallel training every node moves the same gradients). A link that "
            "trained at a lower width or speed, or ranks there that reach the collective late. "
            f"Next: check the link (ibstat, nvidia-smi nvlink -s); restart excluding "
            f"{low[0].host} if the run is slow.",
            {"low": where, "median_bytes_s": median(rates)},
            node=low[0].host,
        )
    ]


def _link_transport(name: str, code: Code, uses: tuple[LinkUse, ...], comm: float) -> list[Finding]:
    """The whole gang's links near idle while it waits on communication."""
    traffic = [use.bytes_s for use in uses if use.bytes_s is not None]
    if comm < HIGH_COMM_WAIT or not traffic or max(traffic) >= LOW_LINK_BYTES_S:
        return []
    return [
        Finding(
            code,
            f"Low {name} traffic: at most {max(traffic) / 1e9:.2f} GB/s while the run "
            f"waited on communication {_percent(comm)} of its step time; "
            f"{_LOW_TRANSPORT_HINT[name]}. Next: rerun with NCCL_DEBUG=INFO and read which "
            "transport NCCL chose.",
            {"max_bytes_s": max(traffic), "comm_wait_share": comm},
        )
    ]


def _links(facts: Facts, missing: list[str]) -> list[Finding]:
    """Per link kind: errors, else a node (GPU) apart from the gang, else the whole gang's
    links idle while it waits on communication."""
    findings: list[Finding] = []
    comm = facts.signals.comm_wait_share
    for uses, name, code, needed, counters in (
        (facts.nvlink, "NVLink", Code.NVLINK, facts.gpus > 1, "DCGM NVLink counters"),
        (
            facts.infiniband,
            "InfiniBand",
            Code.INFINIBAND,
            facts.nodes > 1,
            "InfiniBand port counters (node exporter)",
        ),
    ):
        if not needed:
            continue
        if uses is None:
            missing.append(counters)
            continue
        findings += (
            _link_errors(name, code, uses)
            or _link_apart(name, code, uses)
            or _link_transport(name, code, uses, comm)
        )
    return findings


def _versions(facts: Facts, missing: list[str]) -> list[Finding]:
    findings: list[Finding] = []
    versions = facts.versions
    if not versions.driver:
        missing.append("the driver version (the job's runtime report)")
    elif not versions.image_cuda:
        missing.append("the image's CUDA version")
    else:
        need, have = min_driver(versions.image_cuda), _version(versions.driver)
        if need is not None and have is not None and have < need:
            findings.append(
                Finding(
                    Code.DRIVER_TOO_OLD,
                    f"Driver too old: the node's driver {versions.driver} is older than "
                    f"{_dotted(need)}, the oldest that runs the image's CUDA "
                    f"{versions.image_cuda} ({COMPATIBILITY_SOURCE}). Next: use an image "
                    "built for an older CUDA, or ask platform admins for nodes with a newer "
                    "driver.",
                    {"driver": versions.driver, "image_cuda": versions.image_cuda},
                )
            )
    if facts.gpus < 2:
        return findings
    if not versions.nccl_ranks:
        missing.append("the NCCL version of each rank")
        return findings
    if len(versions.nccl_ranks) > 1:
        counts = ", ".join(
            f"{version} on {n} rank{'s' if n != 1 else ''}"
            for version, n in sorted(versions.nccl_ranks.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        image = f" (the image records {versions.image_nccl})" if versions.image_nccl else ""
        findings.append(
            Finding(
                Code.NCCL_MISMATCH,
                f"NCCL versions differ between ranks: {counts}{image}. Ranks must run the "
                "same NCCL or collectives hang or fail. Next: run every rank from the image "
                "pinned by digest, without a host NCCL mounted over it (LD_LIBRARY_PATH).",
                {"nccl": dict(versions.nccl_ranks), "image_nccl": versions.image_nccl},
            )
        )
    return findings


def _node_health(facts: Facts) -> list[Finding]:
    return [
        Finding(
            Code.NODE_HEALTH,
            f"Node {trouble.node} is {trouble.health}: {trouble.reason or 'no reason given'}. "
            "Next: restart the run excluding it; platform admins see its signals.",
            {"node": trouble.node, "health": trouble.health},
            node=trouble.node,
        )
        for trouble in facts.node_trouble
    ]


def tree(accounting: Accounting | None, facts: Facts) -> Verdicts:
    """Every verdict on the attempt, most urgent first: a failure, unhealthy nodes, versions
    that cannot work, a slow rank, the placement, the links, then where the GPU time went
    (from ``accounting``, None while the attempt runs)."""
    missing: list[str] = []
    if facts.signals.mean_activity is None:
        missing.append("GPU activity (DCGM)")
    accounted = diagnose(accounting, facts.signals) if accounting is not None else []
    first = [finding for finding in accounted if finding.code == Code.FAILURE]
    rest = [finding for finding in accounted if finding.code != Code.FAILURE]
    versions = _versions(facts, missing)
    slow = _slow_ranks(facts, missing)
    if slow:
        rest = [_waiting_for(finding, slow) for finding in rest]
    findings = [
        *first,
        *_node_health(facts),
        *versions,
        *slow,
        *_spread(facts, missing),
        *_links(facts, missing),
        *rest,
        *_memory_bound(facts, missing),
    ]
    return Verdicts(tuple(findings), tuple(missing))


def _number(finding: Finding, name: str) -> float:
    value = finding.numbers.get(name)
    return float(value) if isinstance(value, int | float) else 0.0


def _waiting_for(finding: Finding, slow: list[Finding]) -> Finding:
    """With a slow rank, the gang's communication wait is mostly its ranks waiting for it at
    every collective: the advice of a communication-bound run (topology, transport, fewer
    collectives) would miss it."""
    if finding.code != Code.COMM_BOUND:
        return finding
    ranks = ", ".join(str(f.numbers["rank"]) for f in slow)
    share, hours = _number(finding, "comm_wait_share"), _number(finding, "comm_wait_gpu_s") / 3600
    return Finding(
        Code.COMM_BOUND,
        f"Waiting on communication {_percent(share)} of the step time "
        f"({hours:,.1f} GPU-hours), mostly the other ranks waiting for the slow "
        f"rank{'s' if len(slow) > 1 else ''} above ({ranks}) at every collective: fix "
        f"{'those' if len(slow) > 1 else 'that'} first.",
        finding.numbers,
    )
