"""Reads of per-rank step windows (issue 36): the GPUs an attempt holds (what a rank may
claim to drive), an attempt's windows as the straggler detector takes them, and how many
ranks of each attempt report, for the run page. Each is one or two queries, whatever the
number of ranks."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max, OuterRef, Q, Subquery

from clusters.models import Cluster, ClusterFlavor, SimulatedJob
from jobs.models import Attempt
from telemetry.models import RankStepWindow
from telemetry.rank_windows import HeldGpus, short_host

# The fields of ``telemetry.stragglers.RankWindow``, in its order: a row of
# ``attempt_rank_windows`` builds one with ``RankWindow(**row)``.
RANK_WINDOW_FIELDS = (
    "rank", "world_size", "host", "gpu", "seq", "start", "end", "steps", "step_time_s",
    "data_wait_s", "comm_wait_s",
)  # fmt: skip


def _held_pairs(attempt: Attempt, *, backend: str, experiment_per_node: int, per_node: int | None):
    """(host, GPU index) of every GPU the attempt holds, by the rules that map DCGM samples
    to attempts (``telemetry.collection.attempt_allocations``, ``simulated_allocations``):
    the simulator's job allocation; on Slurm and Kubernetes every GPU of its nodes when it
    holds whole nodes. None when not known (not started, or part of a node)."""
    if backend == Cluster.Backend.SIMULATOR:
        if not attempt.backend_job_id.isdigit():
            return None
        job = SimulatedJob.objects.filter(pk=int(attempt.backend_job_id)).first()
        if job is None or not job.allocation:
            return None
        return frozenset(
            (short_host(node), str(gpu)) for node, gpus in job.allocation.items() for gpu in gpus
        )
    if not attempt.node_list or per_node is None or experiment_per_node != per_node:
        return None
    hosts = {short_host(host) for host in attempt.node_list}
    gpus = [str(gpu) for gpu in range(per_node)]
    return frozenset((host, gpu) for host in hosts for gpu in gpus)


def held_gpus(
    attempt: Attempt, *, gpus: int, backend: str, experiment_per_node: int, per_node: int | None
) -> HeldGpus:
    """What ``attempt`` holds, from the facts read with it: its run's GPU count (``gpus``),
    its cluster's ``backend``, its experiment's GPUs per node and its cluster's GPUs per node
    of the run's flavor (``per_node``, None when the cluster does not offer it). No query,
    but one on the simulator (its job's allocation)."""
    pairs = _held_pairs(
        attempt, backend=backend, experiment_per_node=experiment_per_node, per_node=per_node
    )
    uuids = frozenset(uuid for uuid in attempt.gpu_uuids or () if isinstance(uuid, str))
    return HeldGpus(count=gpus, pairs=pairs, uuids=uuids)


def attempt_held_gpus(*, attempt: Attempt) -> HeldGpus:
    """What ``attempt`` holds, for checking its ranks' claims: its run's GPU count, its
    (host, GPU) pairs when known, the GPU UUIDs its runtime report listed. One query (two
    on the simulator)."""
    per_node = ClusterFlavor.objects.filter(
        cluster_id=OuterRef("cluster_id"), flavor_id=OuterRef("run__flavor_id")
    ).values("gpus_per_node")[:1]
    facts = (
        Attempt.objects.filter(pk=attempt.pk)
        .values("run__gpus", "cluster__backend", "run__experiment__gpus_per_node")
        .annotate(per_node=Subquery(per_node))
        .get()
    )
    return held_gpus(
        attempt,
        gpus=facts["run__gpus"],
        backend=facts["cluster__backend"],
        experiment_per_node=facts["run__experiment__gpus_per_node"],
        per_node=facts["per_node"],
    )


def attempt_rank_windows(*, attempt_id: int, since: datetime | None = None) -> list[dict[str, Any]]:
    """The attempt's rank windows ending at or after ``since`` (all without it), by rank
    and window number, each a dict of ``RANK_WINDOW_FIELDS`` with unix seconds for
    ``start`` and ``end``: the straggler detector's input. One query."""
    rows = RankStepWindow.objects.filter(attempt_id=attempt_id)
    if since is not None:
        rows = rows.filter(end__gte=since)
    values = rows.order_by("rank", "seq").values_list(*RANK_WINDOW_FIELDS)
    result = []
    for row in values:
        window = dict(zip(RANK_WINDOW_FIELDS, row, strict=True))
        window["start"] = window["start"].timestamp()
        window["end"] = window["end"].timestamp()
        result.append(window)
    return result


@dataclass(frozen=True, slots=True)
class RankCoverage:
    """How many ranks of an attempt reported windows, of the world size they named, and
    when the latest window ended."""

    ranks: int
    world_size: int
    last_end: datetime

    @property
    def complete(self) -> bool:
        return self.ranks == self.world_size


# How far back from an attempt's latest window a rank counts as reporting: ten minutes
# holds any rank's latest window (the SDK flushes every 120 s at most; a window is 30 s by
# default), and keeps the read to the ranks' last windows, however long the run.
COVERAGE_SPAN = timedelta(minutes=10)


def rank_coverage(*, attempt_ids: list[int]) -> dict[int, RankCoverage]:
    """Each attempt's ``RankCoverage`` from the windows ending in the ``COVERAGE_SPAN``
    before its latest one, for attempts with rank windows. Two queries, each read from the
    (attempt, end) index: the latest window's end per attempt, then the ranks of that span,
    grouped in SQL. The run page reads it whatever the number of ranks or the run's length."""
    latest = RankStepWindow.objects.filter(attempt_id=OuterRef("pk")).order_by("-end")
    ends = dict(
        Attempt.objects.filter(pk__among=attempt_ids)
        .annotate(last=Subquery(latest.values("end")[:1]))
        .filter(last__isnull=False)
        .values_list("pk", "last")
    )
    if not ends:
        return {}
    span = Q()
    for attempt_id, last in ends.items():
        span |= Q(attempt_id=attempt_id, end__gte=last - COVERAGE_SPAN)
    rows = (
        RankStepWindow.objects.filter(span)
        .values("attempt_id")
        .annotate(ranks=Count("rank", distinct=True), world=Max("world_size"))
        .order_by()
    )
    return {
        row["attempt_id"]: RankCoverage(
            ranks=row["ranks"], world_size=row["world"], last_end=ends[row["attempt_id"]]
        )
        for row in rows
    }
