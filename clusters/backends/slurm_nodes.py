"""Slurm's nodes: ``scontrol -d show node -o`` / REST ``/nodes``, the GPUs jobs hold per node
(``squeue -o``), and ``node_inventory``: the GPU nodes, their use (by Gantry and by others),
whether they take work and where they sit in the switch tree. Pure: no Django, no processes.
"""

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from clusters.backends.base import Inventory, NodeInventory
from clusters.backends.slurm_fence import node_signals
from clusters.backends.slurm_hostlist import expand_hostlist
from clusters.backends.slurm_jobs import JOB_ID, SlurmJob, base_state, describe_errors
from clusters.backends.slurm_settings import SlurmSettings
from clusters.backends.slurm_topology import (
    UNKNOWN_TOPOLOGY,
    Switch,
    parse_topology,
    topology_levels,
    topology_paths,
)
from clusters.backends.slurm_tres import gpus_of_alloc_tres, gpus_per_node_of, parse_gres

# Gantry's jobs are named after their attempt (``Attempt.name``: gantry-a<id>).
GANTRY_JOB_NAME = re.compile(r"gantry-a[0-9]+")


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    state: str  # lower case, flags joined with "+": "idle", "mixed+drain"
    partitions: tuple[str, ...]
    gpus: Mapping[str, int]  # GPU type ("" when untyped) → count
    gpus_used: Mapping[str, int] = field(default_factory=dict)  # held by any job now
    reason: str = ""  # why an operator or Slurm took it out of service, without who and when
    address: str = ""  # NodeAddr: where other hosts reach it (a workspace's server there)


# Job states in which a job holds its nodes' GPUs (what a node's GresUsed counts).
HOLDING_JOB_STATES = (
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESIZING",
)
# ``squeue -o`` columns of the jobs holding GPUs (CLI): id, state, nodes, GPUs per node
# (TRES per node, ``gres:gpu:a100:8``), then name and comment, which may contain "|".
SQUEUE_GPU_FORMAT = "%i|%T|%N|%b|%j|%k"


def _reason(text: str) -> str:
    """A node's Reason without the ``[user@time]`` that scontrol appends."""
    return re.sub(r"\s*\[[^\[\]@]*@[^\[\]]*\]$", "", (text or "").strip())


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """``scontrol -d show node -o``: one node per line of ``Key=Value`` pairs. ``-d`` adds
    ``GresUsed`` (GPUs held, whatever accounting tracks); without it ``AllocTRES`` counts
    GPUs only where ``AccountingStorageTRES`` lists ``gres/gpu``. ``Reason`` (spaces and all)
    runs to the end of the line, or to a ``Comment=``/``Extra=`` after it."""
    nodes = []
    for line in (text or "").splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        if not name:
            continue

        def value(key: str, line: str = line) -> str:
            found = re.search(rf"(?:^|\s){key}=(\S*)", line)
            return found.group(1) if found else ""

        reason = re.search(r"\sReason=(.*?)(?=\s+(?:Comment|Extra)=|$)", line)
        used = value("GresUsed")
        partitions = value("Partitions")
        nodes.append(
            SlurmNode(
                name=name.group(1),
                state=(value("State") or "unknown").lower(),
                partitions=tuple(partitions.split(",")) if partitions else (),
                gpus=parse_gres(value("Gres")),
                gpus_used=parse_gres(used) if used else gpus_of_alloc_tres(value("AllocTRES")),
                reason=_reason(reason.group(1)) if reason else "",
                address=value("NodeAddr"),
            )
        )
    return nodes


def parse_rest_nodes(payload: Mapping[str, Any]) -> list[SlurmNode]:
    """slurmrestd ``GET /slurm/v0.0.38/nodes``: ``state`` is the base state, ``state_flags``
    the flags (``["DRAIN"]``), ``gres_used`` the GPUs held (``gpu:a100:6(IDX:0-5)``)."""
    errors = payload.get("errors") or []
    if errors and not payload.get("nodes"):
        raise ValueError(describe_errors(errors))
    nodes = []
    for node in payload.get("nodes") or []:
        state = str(node.get("state") or "unknown").lower()
        flags = [str(f).lower() for f in node.get("state_flags") or []]
        used = str(node.get("gres_used") or "")
        nodes.append(
            SlurmNode(
                name=str(node.get("name") or ""),
                state="+".join([state, *flags]),
                partitions=tuple(node.get("partitions") or ()),
                gpus=parse_gres(str(node.get("gres") or "")),
                gpus_used=(
                    parse_gres(used)
                    if used
                    else gpus_of_alloc_tres(str(node.get("tres_used") or ""))
                ),
                reason=_reason(str(node.get("reason") or "")),
                address=str(node.get("address") or ""),
            )
        )
    return nodes


def parse_squeue_gpus(text: str) -> list[SlurmJob]:
    """Rows of ``squeue -h -o SQUEUE_GPU_FORMAT``: the jobs holding GPUs, with their nodes
    and GPUs per node."""
    jobs = []
    for line in (text or "").splitlines():
        cells = line.split("|", 4)
        if len(cells) != 5 or not JOB_ID.match(cells[0].strip()):
            continue
        job_id, state, nodes, tres, rest = cells
        name, _, comment = rest.partition("|")
        jobs.append(
            SlurmJob(
                job_id=job_id.strip(),
                name=name,
                state=base_state(state),
                comment="" if comment == "(null)" else comment,
                nodes=tuple(expand_hostlist(nodes)),
                gpus_per_node=gpus_per_node_of(tres),
                source="squeue",
            )
        )
    return jobs


def is_gantry_job(job: SlurmJob) -> bool:
    """Submitted by Gantry: named after an attempt, with the name as its comment (or none:
    squeue shows no comment for some jobs)."""
    return bool(GANTRY_JOB_NAME.fullmatch(job.name)) and job.comment in (job.name, "")


def node_condition(state: str) -> str:
    """Why a node in ``state`` (``idle+drain``, ``down*``) takes no new work, in Slurm's
    words, most telling first; "" when it takes work. Planned, powered-down (Slurm powers
    it up on demand), cloud and completing nodes take work."""
    base, *rest = state.lower().split("+")
    flags = set(rest)
    if base.endswith("*"):  # sinfo's and older scontrol's mark of a node not responding
        base = base.rstrip("*")
        flags.add("not_responding")
    if "invalid_reg" in flags or base == "inval":
        return "invalid"  # it registered with less than slurm.conf says it has
    if "drain" in flags:
        busy = base in ("allocated", "mixed") or "completing" in flags
        return "draining" if busy else "drained"
    if "fail" in flags:
        return "failing"
    if base == "down":
        return "down"
    if "not_responding" in flags:
        return "not responding"
    if "maintenance" in flags:
        return "in maintenance"
    if flags & {"reboot_requested", "reboot_issued"}:
        return "rebooting"
    if "reserved" in flags:
        return "reserved"
    if flags & {"power_down", "powering_down"}:
        return "powering down"
    if base not in ("idle", "mixed", "allocated"):
        return base or "unknown"  # future, unknown, error
    return ""


def _of_type(counts: Mapping[str, int], gres_type: str, node_gpus: Mapping[str, int]) -> int:
    """The count of ``gres_type`` GPUs; an untyped count where the node has one type."""
    if gres_type in counts:
        return counts[gres_type]
    return counts.get("", 0) if len(node_gpus) == 1 else 0


def gantry_gpus_by_node(jobs: Iterable[SlurmJob]) -> dict[str, dict[str, int]]:
    """node → GPU type → GPUs held by Gantry's jobs there now."""
    held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job in jobs:
        if job.state not in HOLDING_JOB_STATES or not is_gantry_job(job):
            continue
        for node in job.nodes:
            for gres_type, count in job.gpus_per_node.items():
                held[node][gres_type] += count
    return {node: dict(counts) for node, counts in held.items()}


def node_inventory(
    nodes: Iterable[SlurmNode],
    settings: SlurmSettings,
    *,
    jobs: Iterable[SlurmJob] = (),
    topology: str | None = "",
    now: float = 0.0,
) -> Inventory:
    """The GPU nodes of the cluster's flavors: a node with the flavor's GPU type (in its
    partition, if it names one), the GPUs jobs hold on it and those of them Gantry's jobs
    hold (from ``jobs``), whether it takes work (with Slurm's state and the operator's
    reason, "drained: bad DIMM"), what its state says about its health (``signals``, stamped
    ``now``, Unix seconds) and its path in the switch tree ``topology`` (text of
    ``scontrol show topology``; "" for none, None when it cannot be known)."""
    gantry = gantry_gpus_by_node(jobs)
    found = []
    for node in nodes:
        for flavor, mapping in sorted(settings.flavors.items()):
            partition = mapping.partition or settings.partition
            gpus = node.gpus.get(mapping.gres_type, 0)
            if gpus <= 0 or (partition and partition not in node.partitions):
                continue
            condition = node_condition(node.state)
            reason = f"{condition}: {node.reason}" if condition and node.reason else condition
            found.append(
                NodeInventory(
                    name=node.name,
                    flavor=flavor,
                    gpus=gpus,
                    gpus_used=_of_type(node.gpus_used, mapping.gres_type, node.gpus),
                    gpus_used_by_gantry=_of_type(
                        gantry.get(node.name, {}), mapping.gres_type, node.gpus
                    ),
                    schedulable=not condition,
                    reason=reason,
                    signals=node_signals(node.name, node.state, node.reason, at=now),
                )
            )
            break  # a node serves one flavor
    switches: dict[str, Switch]
    if topology is None:
        switches, problems = {}, [UNKNOWN_TOPOLOGY]
    else:
        switches, problems = parse_topology(topology)
    paths, depth, path_problems = topology_paths(switches, [node.name for node in found])
    levels, level_problems = topology_levels(depth, settings.topology_levels)
    if topology is None:
        level_problems = []  # the tree is unknown, not absent
    return Inventory(
        nodes=tuple(replace(node, path=paths.get(node.name, ())) for node in found),
        levels=levels,
        problems=tuple(problems + path_problems + level_problems),
    )
