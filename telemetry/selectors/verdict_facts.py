"""What the troubleshooting tree (``telemetry.verdicts``) knows about each attempt of a run,
read in a fixed number of queries whatever the number of attempts, nodes or ranks: the
topology and health of its nodes, the image's recorded CUDA and NCCL, the versions its
ranks reported, the ranks the straggler scan flagged, its links' counters."""

from collections.abc import Sequence
from datetime import datetime

from clusters.health import NodeHealth
from clusters.models import ClusterNode
from jobs.models import LIVE_ATTEMPT_STATES, Attempt, CauseClass, Run
from jobs.selectors.runtime import rank_versions
from telemetry.diagnosis import Signals
from telemetry.models import StragglerFlag
from telemetry.selectors.rank_windows import RankCoverage
from telemetry.selectors.run_links import infiniband_by_attempt, nvlink_errors_by_attempt
from telemetry.selectors.run_page_sql import GpuSummary
from telemetry.verdicts import (
    Facts,
    LinkUse,
    NodeTrouble,
    SlowRank,
    Spread,
    Versions,
    oldest,
)


def _attempt_nodes(attempt: Attempt) -> list[str]:
    """Where the attempt ran (the backend's word), else where it was placed."""
    return list(attempt.node_list or attempt.placement or [])


def _weighted_mean(pairs: Sequence[tuple[float | None, int]]) -> float | None:
    """The mean of per-GPU means weighted by their minutes; None without any minute."""
    minutes = sum(n for mean, n in pairs if mean is not None and n)
    if not minutes:
        return None
    return sum(mean * n for mean, n in pairs if mean is not None and n) / minutes


def _spread(
    attempt: Attempt, nodes: list[str], levels: Sequence[str], paths: dict[str, list[str]]
) -> Spread | None:
    """The gang's domains per level (a domain is its path down to that level), and what
    admission recorded a tighter placement would have waited; None when the cluster has no
    topology or a node's path is not known."""
    if not levels or not nodes or any(len(paths.get(node) or ()) < len(levels) for node in nodes):
        return None
    return Spread(
        nodes=len(nodes),
        domains=tuple(
            (level, len({tuple(paths[node][: depth + 1]) for node in nodes}))
            for depth, level in enumerate(levels)
        ),
        tighter_wait_s=attempt.tighter_wait_s,
    )


def _nvlink(gpus: Sequence[GpuSummary], errors: dict[str, int]) -> tuple[LinkUse, ...] | None:
    """Each GPU's mean NVLink traffic and each node's NVLink errors; None when DCGM reported
    neither (the signal is missing)."""
    uses = [
        LinkUse(gpu.host, bytes_s=gpu.mean_nvlink_bytes_s, gpu=gpu.gpu)
        for gpu in gpus
        if gpu.nvlink_minutes
    ]
    uses += [LinkUse(node, errors=count) for node, count in sorted(errors.items())]
    return tuple(uses) or None


def _trouble(attempt: Attempt, health: dict[str, tuple[str, str]]) -> tuple[NodeTrouble, ...]:
    """A live attempt's nodes that are not healthy now; an ended attempt's node when a
    hardware fault there ended it."""
    if attempt.state in LIVE_ATTEMPT_STATES:
        return tuple(
            NodeTrouble(node, *health[node])
            for node in sorted(_attempt_nodes(attempt))
            if node in health and health[node][0] != NodeHealth.HEALTHY
        )
    evidence = attempt.cause_evidence or {}
    if attempt.cause_class == CauseClass.HARDWARE and evidence.get("node"):
        signal = str(evidence.get("signal", "")).replace("_", " ")
        detail = str(evidence.get("detail", ""))
        return (NodeTrouble(str(evidence["node"]), "faulty", detail or signal),)
    return ()


def attempts_facts(
    *,
    run: Run,
    attempts: Sequence[Attempt],
    signals: dict[int, Signals],
    summaries: Sequence[GpuSummary],
    coverage: dict[int, RankCoverage],
    now: datetime,
) -> dict[int, Facts]:
    """Each started attempt's ``Facts``, by attempt id. Six queries: the attempts' nodes
    with their cluster's topology levels, the image's versions, the straggler flags, the
    versions every rank reported, InfiniBand minutes, NVLink error signals."""
    started = [attempt for attempt in attempts if attempt.started_at is not None]
    if not started:
        return {}
    wanted = {node for attempt in started for node in _attempt_nodes(attempt)}
    rows = ClusterNode.objects.filter(
        cluster_id__in={attempt.cluster_id for attempt in started}, name__in=wanted
    ).values_list(
        "cluster_id", "name", "path", "health", "health_reason", "cluster__topology_levels"
    )
    paths: dict[int, dict[str, list[str]]] = {}
    health: dict[int, dict[str, tuple[str, str]]] = {}
    levels: dict[int, list[str]] = {}
    for cluster_id, name, path, node_health, reason, cluster_levels in rows:
        paths.setdefault(cluster_id, {})[name] = path
        health.setdefault(cluster_id, {})[name] = (node_health, reason)
        levels[cluster_id] = cluster_levels or []
    image = (
        type(run.experiment.image)
        .objects.values("cuda_version", "nccl_version")
        .get(pk=run.experiment.image_id)
    )
    slow: dict[int, list[SlowRank]] = {}
    flags = StragglerFlag.objects.filter(attempt__in=started).order_by("attempt_id", "rank")
    for flag in flags:
        slow.setdefault(flag.attempt_id, []).append(
            SlowRank(
                rank=flag.rank,
                host=flag.node,
                gpu=flag.gpu,
                cause=flag.cause,
                slowdown=flag.slowdown,
                windows=flag.windows,
                evidence=flag.evidence,
            )
        )
    versions = rank_versions(attempt_ids=[attempt.pk for attempt in started])
    infiniband = infiniband_by_attempt(attempts=started, now=now)
    nvlink_errors = nvlink_errors_by_attempt(attempts=started, now=now)
    facts = {}
    for attempt in started:
        gpus = [gpu for gpu in summaries if gpu.attempt_id == attempt.pk]
        nodes = _attempt_nodes(attempt)
        ranks = coverage.get(attempt.pk)
        runtime = attempt.runtime_env or {}
        facts[attempt.pk] = Facts(
            signals=signals[attempt.pk],
            gpus=run.gpus,
            nodes=run.experiment.nodes,
            mean_dram_activity=_weighted_mean([(g.mean_dram_active, g.dram_minutes) for g in gpus]),
            ranks_reporting=ranks.ranks if ranks is not None else 0,
            slow_ranks=tuple(slow.get(attempt.pk, ())),
            nvlink=_nvlink(gpus, nvlink_errors.get(attempt.pk, {})),
            infiniband=infiniband.get(attempt.pk),
            spread=_spread(
                attempt,
                nodes,
                levels.get(attempt.cluster_id, []),
                paths.get(attempt.cluster_id, {}),
            ),
            versions=Versions(
                driver=oldest(
                    [
                        str(runtime.get("driver_version", "")),
                        *versions[attempt.pk]["driver_version"],
                    ]
                ),
                image_cuda=image["cuda_version"],
                image_nccl=image["nccl_version"],
                nccl_ranks=versions[attempt.pk]["nccl_version"],
            ),
            node_trouble=_trouble(attempt, health.get(attempt.cluster_id, {})),
        )
    return facts
