"""Whether GPUs a preemption frees reach the run that reclaims them. Pure: no ORM, no I/O.

A cluster shared with work from outside Gantry starts the jobs waiting in its own queue as
GPUs come free. A preemption that frees GPUs such a job fits on hands them to that job
unless the backend starts Gantry's reclaiming job there first (``reclaim_first``: Slurm
submits it with top priority before the cancel). Where it cannot, admission does not
preempt for such GPUs: the borrowed run would lose its work for nothing and the reclaiming
run would still wait (docs/admission.md, "Reclaiming on a shared cluster").
"""

from collections.abc import Mapping

from clusters.outside_claims import OutsideClaim, OutsideQueue


def _fits(claim: OutsideClaim, free: Mapping[str, int]) -> bool:
    names = claim.eligible or tuple(free)
    return sum(1 for name in names if free.get(name, 0) >= claim.gpus_per_node) >= claim.nodes


def outside_taker(
    queue: OutsideQueue,
    *,
    flavor: str,
    free: Mapping[str, int],
    freed: Mapping[str, int],
) -> OutsideClaim | str | None:
    """What would take the GPUs a preemption frees before the reclaiming run: the first
    outside claim (in the backend's order) that does not fit on the ``free`` GPUs of the
    schedulable nodes now but does once ``freed`` are added; the queue's error when it could
    not be read; None when nothing would, or the backend starts the reclaiming run first."""
    if queue.reclaim_first:
        return None
    if queue.error:
        return queue.error
    after = {name: gpus + freed.get(name, 0) for name, gpus in free.items()}
    for claim in queue.claims:
        if claim.flavor == flavor and not _fits(claim, free) and _fits(claim, after):
            return claim
    return None


def stolen_reason(
    taker: OutsideClaim | str, *, cluster: str, flavor: str, gpus: int, victims: int
) -> str:
    """Why a run within its guarantee does not reclaim ``gpus`` borrowed GPUs on
    ``cluster`` (held by ``victims`` runs): who would take them first, with its size."""
    runs = "run" if victims == 1 else "runs"
    if isinstance(taker, str):
        return (
            f"preempting {victims} borrowed {runs} on {cluster} would free {gpus} {flavor} GPUs, "
            f"but {cluster}'s queue could not be read ({taker}), so whether they would reach "
            "this run is not known: no preemption on a guess"
        )
    return (
        f"preempting {victims} borrowed {runs} on {cluster} would free {gpus} {flavor} GPUs, "
        f"but {taker.job} from outside Gantry ({taker.nodes} × {taker.gpus_per_node} {flavor} "
        f"GPUs) waits for them and {cluster} would start it first; this run waits until that "
        "job has started elsewhere or GPUs free up without a preemption"
    )
