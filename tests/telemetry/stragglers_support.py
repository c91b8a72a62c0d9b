"""Gangs of step windows for the straggler tests: lockstep data-parallel training, where every
rank's step lasts as long as the slowest rank's compute and data wait plus the transfer, and
each rank's communication wait is the rest."""

from collections.abc import Callable

from telemetry.stragglers import RankWindow

COMPUTE_S = 0.3  # per step
DATA_S = 0.02  # per step
TRANSFER_S = 0.05  # per step
STEPS = 100
WINDOW_S = 30.0
GPUS_PER_HOST = 4

# (rank, seq) -> (compute, data wait) per step
Shape = Callable[[int, int], tuple[float, float]]


def uniform(rank: int, seq: int) -> tuple[float, float]:
    return COMPUTE_S, DATA_S


def host_of(rank: int) -> str:
    return f"node-{rank // GPUS_PER_HOST}"


def gpu_of(rank: int) -> str:
    return str(rank % GPUS_PER_HOST)


def gang(
    ranks: int,
    windows: int,
    shape: Shape = uniform,
    *,
    steps: Callable[[int, int], int] = lambda rank, seq: STEPS,
    skew: Callable[[str], float] = lambda host: 0.0,
    world_size: int | None = None,
    first_seq: int = 1,
) -> list[RankWindow]:
    """Windows seq ``first_seq``… of every rank, in rank then seq order."""
    out: list[RankWindow] = []
    for seq in range(first_seq, first_seq + windows):
        per_rank = {rank: shape(rank, seq) for rank in range(ranks)}
        step = max(c + d for c, d in per_rank.values()) + TRANSFER_S
        for rank, (compute, data) in per_rank.items():
            n = steps(rank, seq)
            start = 1_700_000_000.0 + seq * WINDOW_S + skew(host_of(rank))
            out.append(
                RankWindow(
                    rank=rank,
                    world_size=world_size or ranks,
                    host=host_of(rank),
                    gpu=gpu_of(rank),
                    seq=seq,
                    start=start,
                    end=start + WINDOW_S,
                    steps=n,
                    step_time_s=step,
                    data_wait_s=data * n,
                    comm_wait_s=(step - compute - data) * n,
                )
            )
    out.sort(key=lambda w: (w.rank, w.seq))
    return out


def slowed(victim: int, factor: float, *, since: int = 1, on: str = "compute") -> Shape:
    """The victim's compute (or data wait, by the same time) × ``factor`` from ``since``."""

    def shape(rank: int, seq: int) -> tuple[float, float]:
        if rank != victim or seq < since:
            return COMPUTE_S, DATA_S
        if on == "compute":
            return COMPUTE_S * factor, DATA_S
        return COMPUTE_S, DATA_S + (factor - 1) * (COMPUTE_S + DATA_S)

    return shape
