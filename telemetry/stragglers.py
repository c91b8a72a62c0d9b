"""Which rank of a synchronous gang is slow, and why (issue 36, point 2). Pure: plain data in,
a ``Detection`` out; no Django, no clock, no I/O. docs/stragglers.md has the method, its
reasoning and the literature.

In synchronous data-parallel training every rank's step takes the same wall time: they meet
at the all-reduce. What differs is how long each rank takes to *reach* the collective, its
compute plus its own input wait, ``step − comm_wait``; the rank the others wait for has the
largest such time and the smallest communication wait. A rank is flagged when that time
exceeds the gang's median by a robust margin in ``consecutive`` aligned windows in a row.

Windows are aligned by each rank's own ``seq`` (never by timestamps: hosts' clocks are
skewed), normalised per step (ranks report different step counts), analysed per world size
(a world size that changes mid-run makes separate segments, never mixed). Bad windows are
refused with a reason; a window reported twice counts once; a (rank, seq) reported twice
with different values is dropped. With too few ranks or windows nothing is flagged and the
Detection says why: no verdict is better than a wrong one.

Cost: O(n log r) for n windows of gangs of r ranks (one sort per aligned window for its
median and MAD, a second pass only for windows where some rank exceeds the margin).
"""

import math
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import median
from typing import NamedTuple

from clusters.health import SignalClass

# Windows in a row a rank must exceed the margin in: a stall of one or two windows (garbage
# collection, a checkpoint's I/O, a preempted CPU) is noise, not a straggler worth a restart;
# three windows of 30 s are 90 s, and a clean rank's chance of three exceedances in a row is
# the cube of one's. The issue wants detection within 10 windows: this leaves 7 for noise.
CONSECUTIVE = 3
# The margin above the gang's median: the larger of MAD_K robust standard deviations
# (1.4826 x MAD) and a relative floor. The floor keeps a quiet gang (MAD near 0) from
# flagging a rank 2 % slower; 10 % is where Falcon counts a change of iteration time as a
# real slowdown (docs/stragglers.md). MAD_K = 5 keeps a clean rank's single-window
# exceedance under 1e-6 with normal noise, when noise rather than the floor sets the margin.
MAD_K = 5.0
MAD_SCALE = 1.4826  # MAD times this estimates sigma for normal noise
RELATIVE_FLOOR = 0.10
# A median of fewer ranks says nothing about "the gang": two ranks cannot tell which one is
# slow. A window is analysed only when this many ranks, and at least half the gang, report.
MIN_RANKS = 3
# The data wait explains the excess when it is at least this share of it (else the compute).
INPUT_SHARE = 0.5
# A GPU runs slow when its SM clock is below this share of its maximum (a clock cap, or
# throttling the reasons bitmask missed).
SLOW_CLOCK_SHARE = 0.9
THROTTLE_REASONS = frozenset({SignalClass.THERMAL_THROTTLE.value, SignalClass.POWER_THROTTLE.value})
# Relative tolerance for float rounding when the waits equal the whole step time.
ROUNDING = 1e-9


class Cause(StrEnum):
    SLOW_GPU = "slow_gpu"
    SLOW_INPUT = "slow_input"
    NETWORK = "network"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class RankWindow:
    rank: int  # 0..world_size-1
    world_size: int
    host: str
    gpu: str  # the physical GPU it drives, as the attempt's GPU list names it (index or UUID)
    seq: int  # this rank's window number, from 1
    start: float  # epoch s, the rank's own clock (may be skewed between hosts)
    end: float
    steps: int
    step_time_s: float  # mean per step, including waits
    data_wait_s: float  # total in the window
    comm_wait_s: float  # total in the window


@dataclass(frozen=True, slots=True)
class GpuEvidence:
    """One GPU's DCGM signals over the period analysed (minute rollups, summarised by the
    caller; several rows of one GPU are combined: any slow sign counts)."""

    host: str
    gpu: str
    sm_clock_mhz: float | None = None  # DCGM_FI_DEV_SM_CLOCK, mean
    max_sm_clock_mhz: float | None = None  # DCGM_FI_DEV_MAX_SM_CLOCK
    throttle_reasons: frozenset[str] = frozenset()  # SignalClass values (thermal_throttle…)
    pcie_replays: int = 0  # growth of DCGM_FI_DEV_PCIE_REPLAY_COUNTER
    xid: int | None = None  # the latest XID, None without one


@dataclass(frozen=True, slots=True)
class Placement:
    """The gang's nodes and the topology domain path of each (widest first, as
    ``jobs.admission_types.ClusterNode.path``: block, leaf switch)."""

    paths: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    host: str
    gpu: str
    first_window: int  # the seq where its first run of slow windows began
    windows: int  # slow windows in runs of at least ``consecutive``
    slowdown: float  # its time to the collective ÷ the gang's median, median over those windows
    cause: Cause
    evidence: Mapping[str, object]
    world_size: int


@dataclass(frozen=True, slots=True)
class Refusal:
    window: RankWindow
    reason: str


@dataclass(frozen=True, slots=True)
class Detection:
    stragglers: tuple[Straggler, ...]
    refused: tuple[Refusal, ...] = ()
    duplicates: int = 0  # windows reported again with the same values: counted once
    conflicts: int = 0  # (rank, seq) pairs reported with different values: dropped
    notes: tuple[str, ...] = ()  # why nothing could be decided, where it could not


class _Point(NamedTuple):
    """One rank's window, per step (a tuple: made once per window, the hot path)."""

    host: str
    gpu: str
    reach_s: float  # time to the collective: compute + its own data wait
    compute_s: float
    data_s: float
    comm_s: float


@dataclass(slots=True)
class _Slow:
    seq: int
    ratio: float  # reach ÷ the gang's median reach
    data_share: float  # the data wait's share of the excess over the median
    point: _Point
    gang: tuple[float, float, float]  # the gang's median compute, data and comm per step


@dataclass(slots=True)
class _Segment:
    """The usable windows of one world size, by seq then rank."""

    world_size: int
    by_seq: dict[int, dict[int, RankWindow]] = field(default_factory=dict)

    def windows_per_rank(self) -> Counter[int]:
        return Counter(rank for ranks in self.by_seq.values() for rank in ranks)


def _refusal(w: RankWindow, attempt_gpus: Collection[tuple[str, str]] | None) -> str:
    """Why the window cannot be used, or "" when it can."""
    # One sum: any infinity or NaN among them makes it non-finite (so would two huge finite
    # values, which are no sane times either).
    if not math.isfinite(w.start + w.end + w.step_time_s + w.data_wait_s + w.comm_wait_s):
        return "a time that is not a finite number"
    if w.world_size < 1:
        return f"world size {w.world_size} (at least 1)"
    if not 0 <= w.rank < w.world_size:
        return f"rank {w.rank} outside 0..{w.world_size - 1} for world size {w.world_size}"
    if w.seq < 1:
        return f"window number {w.seq} (they start at 1)"
    if w.steps < 1:
        return f"{w.steps} steps (at least 1)"
    if w.end < w.start:
        return "a window that ends before it starts"
    if w.step_time_s <= 0 or w.data_wait_s < 0 or w.comm_wait_s < 0:
        return "a step time that is not positive, or a negative wait"
    if w.data_wait_s + w.comm_wait_s > w.steps * w.step_time_s * (1 + ROUNDING):
        return (
            f"waits of {w.data_wait_s + w.comm_wait_s:g} s longer than its "
            f"{w.steps} steps of {w.step_time_s:g} s"
        )
    if attempt_gpus is not None and (w.host, w.gpu) not in attempt_gpus:
        return f"GPU {w.gpu!r} on {w.host!r}, which the attempt does not hold"
    return ""


def _point(w: RankWindow) -> _Point:
    data, comm = w.data_wait_s / w.steps, w.comm_wait_s / w.steps
    reach = w.step_time_s - comm
    # ≥ 0 up to rounding: waits longer than the steps are refused.
    return _Point(w.host, w.gpu, reach, max(0.0, reach - data), data, comm)


def _segments(
    windows: Iterable[RankWindow], attempt_gpus: Collection[tuple[str, str]] | None
) -> tuple[dict[int, _Segment], list[Refusal], int, int]:
    """The usable windows by world size and rank; the refused; duplicates and conflicts."""
    refused: list[Refusal] = []
    segments: dict[int, _Segment] = {}
    # (world size, seq, rank) reported again, and those reported with different values (all
    # their windows are dropped: which one is true cannot be told).
    again: Counter[tuple[int, int, int]] = Counter()
    conflicted: set[tuple[int, int, int]] = set()
    for w in windows:
        reason = _refusal(w, attempt_gpus)
        if reason:
            refused.append(Refusal(w, reason))
            continue
        segment = segments.get(w.world_size)
        if segment is None:
            segment = segments[w.world_size] = _Segment(w.world_size)
        ranks = segment.by_seq.get(w.seq)
        if ranks is None:
            ranks = segment.by_seq[w.seq] = {}
        earlier = ranks.get(w.rank)
        if earlier is None:
            ranks[w.rank] = w
            continue
        key = (w.world_size, w.seq, w.rank)
        again[key] += 1
        if earlier != w:
            conflicted.add(key)
    for world_size, seq, rank in conflicted:
        del segments[world_size].by_seq[seq][rank]
    for world_size in list(segments):
        by_seq = segments[world_size].by_seq
        for seq in [seq for seq, ranks in by_seq.items() if not ranks]:
            del by_seq[seq]
        if not by_seq:
            del segments[world_size]
    duplicates = sum(n for key, n in again.items() if key not in conflicted)
    refused.sort(
        key=lambda r: (r.window.world_size, r.window.rank, r.window.seq, r.reason, repr(r))
    )
    return segments, refused, duplicates, len(conflicted)


def _mad(values: Iterable[float], centre: float) -> float:
    return median([abs(v - centre) for v in values])


def _slow_windows(
    segment: _Segment, *, mad_k: float, floor: float, min_ranks: int, notes: list[str]
) -> dict[int, list[_Slow]]:
    """Per rank, its windows above the margin, in seq order."""
    by_seq = segment.by_seq
    quorum = max(min_ranks, math.ceil(segment.world_size / 2))
    slow: dict[int, list[_Slow]] = defaultdict(list)
    thin = 0
    for seq in sorted(by_seq):
        ranks = by_seq[seq]
        if len(ranks) < quorum:
            thin += 1
            continue
        reach = {r: w.step_time_s - w.comm_wait_s / w.steps for r, w in ranks.items()}
        centre = median(reach.values())
        if centre <= 0:
            thin += 1
            continue
        limit = centre + max(mad_k * MAD_SCALE * _mad(reach.values(), centre), floor * centre)
        above = {r: _point(ranks[r]) for r, t in reach.items() if t > limit}
        if not above:
            continue
        data = {r: w.data_wait_s / w.steps for r, w in ranks.items()}
        gang = (
            median(max(0.0, t - data[r]) for r, t in reach.items()),
            median(data.values()),
            median(w.comm_wait_s / w.steps for w in ranks.values()),
        )
        for rank, p in above.items():
            share = (p.data_s - gang[1]) / (p.reach_s - centre)
            slow[rank].append(_Slow(seq, p.reach_s / centre, share, p, gang))
    if thin:
        notes.append(
            f"world size {segment.world_size}: {thin} of {len(by_seq)} windows not analysed "
            f"(fewer than {quorum} ranks reported them, or no rank computed)"
        )
    return slow


def _runs(slow: list[_Slow], consecutive: int) -> list[_Slow]:
    """The slow windows in runs of ``consecutive`` or more: consecutive seq numbers on the
    same GPU (a gap, an unanalysed window or a move to another GPU breaks a run)."""
    kept: list[_Slow] = []
    run: list[_Slow] = []
    for s in slow:
        if run and (
            s.seq != run[-1].seq + 1
            or (s.point.host, s.point.gpu) != (run[-1].point.host, run[-1].point.gpu)
        ):
            if len(run) >= consecutive:
                kept += run
            run = []
        run.append(s)
    if len(run) >= consecutive:
        kept += run
    return kept


def _gpu_signs(rows: list[GpuEvidence]) -> tuple[list[str], dict[str, object]]:
    """What makes the GPU slow (empty when nothing) and the figures, from all its rows."""
    signs: list[str] = []
    figures: dict[str, object] = {}
    shares = [
        r.sm_clock_mhz / r.max_sm_clock_mhz
        for r in rows
        if r.sm_clock_mhz is not None and r.max_sm_clock_mhz
    ]
    if shares:
        lowest = min(shares)
        figures["sm_clock_share"] = round(lowest, 4)
        if lowest < SLOW_CLOCK_SHARE:
            signs.append(f"SM clock at {lowest:.0%} of its maximum")
    reasons = sorted(set().union(*(r.throttle_reasons for r in rows)) & THROTTLE_REASONS)
    figures["throttle_reasons"] = reasons
    signs += [reason.replace("_", " ") for reason in reasons]
    replays = sum(r.pcie_replays for r in rows)
    figures["pcie_replays"] = replays
    if replays > 0:
        signs.append(f"{replays} PCIe replays")
    xids = sorted({r.xid for r in rows if r.xid is not None})
    figures["xids"] = xids
    signs += [f"XID {x}" for x in xids]
    if not shares and not signs:
        figures["missing"] = "the GPU's SM clock"
    return signs, figures


def _apart(host: str, placement: Placement) -> bool | None:
    """Whether the host's topology domain holds fewer of the gang's nodes than its largest
    domain does, so that the host's traffic crosses the spine where most of the gang's does
    not (None when the placement does not name the host)."""
    path = placement.paths.get(host)
    if path is None:
        return None
    per_domain = Counter(placement.paths.values())
    return per_domain[path] < max(per_domain.values())


def _cause(
    slow: list[_Slow],
    evidence: Mapping[tuple[str, str], list[GpuEvidence]],
    placement: Placement | None,
) -> tuple[Cause, dict[str, object]]:
    """The cause named from the evidence, and the evidence it was named from."""
    point = slow[0].point
    share = median(s.data_share for s in slow)
    found: dict[str, object] = {"data_wait_share_of_excess": round(share, 4)}
    if share >= INPUT_SHARE:
        return Cause.SLOW_INPUT, found
    rows = evidence.get((point.host, point.gpu))
    if not rows:
        found["missing"] = f"DCGM evidence for GPU {point.gpu} on {point.host}"
        return Cause.UNKNOWN, found
    signs, figures = _gpu_signs(rows)
    found.update(figures)
    if signs:
        found["gpu_signs"] = signs
        return Cause.SLOW_GPU, found
    if "missing" in found:
        return Cause.UNKNOWN, found
    if placement is None:
        found["missing"] = "the gang's placement"
        return Cause.UNKNOWN, found
    apart = _apart(point.host, placement)
    if apart is None:
        found["missing"] = f"the topology path of {point.host}"
        return Cause.UNKNOWN, found
    found["placement_domains"] = len(set(placement.paths.values()))
    found["node_apart"] = apart
    return (Cause.NETWORK if apart else Cause.UNKNOWN), found


def _straggler(
    rank: int,
    world_size: int,
    kept: list[_Slow],
    evidence: Mapping[tuple[str, str], list[GpuEvidence]],
    placement: Placement | None,
) -> Straggler:
    # Its latest GPU: a rank that moved is named where it is slow now.
    host, gpu = kept[-1].point.host, kept[-1].point.gpu
    on_gpu = [s for s in kept if (s.point.host, s.point.gpu) == (host, gpu)]
    cause, found = _cause(on_gpu, evidence, placement)

    def per_step(values: Iterable[float]) -> float:
        return round(median(values), 6)

    found.update(
        {
            "reach_s": per_step(s.point.reach_s for s in on_gpu),
            "compute_s": per_step(s.point.compute_s for s in on_gpu),
            "gang_compute_s": per_step(s.gang[0] for s in on_gpu),
            "data_wait_s": per_step(s.point.data_s for s in on_gpu),
            "gang_data_wait_s": per_step(s.gang[1] for s in on_gpu),
            "comm_wait_s": per_step(s.point.comm_s for s in on_gpu),
            "gang_comm_wait_s": per_step(s.gang[2] for s in on_gpu),
        }
    )
    return Straggler(
        rank=rank,
        host=host,
        gpu=gpu,
        first_window=kept[0].seq,
        windows=len(kept),
        slowdown=round(median(s.ratio for s in kept), 4),
        cause=cause,
        evidence=found,
        world_size=world_size,
    )


def detect(
    windows: Iterable[RankWindow],
    *,
    evidence: Iterable[GpuEvidence] = (),
    placement: Placement | None = None,
    attempt_gpus: Collection[tuple[str, str]] | None = None,
    consecutive: int = CONSECUTIVE,
    mad_k: float = MAD_K,
    floor: float = RELATIVE_FLOOR,
    min_ranks: int = MIN_RANKS,
) -> Detection:
    """The stragglers among one attempt's step windows, in any order.

    ``attempt_gpus``: the (host, GPU) pairs the attempt holds; a window for another GPU is
    refused. ``evidence`` and ``placement`` only name causes; without them a straggler is
    still flagged, its cause ``unknown`` with the missing signal in its evidence.
    """
    if consecutive < 1 or min_ranks < 2 or floor < 0 or mad_k < 0:
        raise ValueError("consecutive ≥ 1, min_ranks ≥ 2, floor ≥ 0 and mad_k ≥ 0")
    segments, refused, duplicates, conflicts = _segments(windows, attempt_gpus)
    by_gpu: dict[tuple[str, str], list[GpuEvidence]] = defaultdict(list)
    for row in evidence:
        by_gpu[(row.host, row.gpu)].append(row)
    notes: list[str] = []
    if len(segments) > 1:
        notes.append(
            f"the world size changed ({', '.join(map(str, sorted(segments)))}): "
            "each is analysed apart"
        )
    stragglers: list[Straggler] = []
    for world_size in sorted(segments):
        segment = segments[world_size]
        per_rank = segment.windows_per_rank()
        reporting = len(per_rank)
        if reporting < min_ranks:
            notes.append(
                f"world size {world_size}: {reporting} ranks reported; at least {min_ranks} "
                "are needed to tell a slow rank from the gang"
            )
            continue
        if reporting < world_size:
            notes.append(
                f"world size {world_size}: ranks that never reported: {world_size - reporting}"
            )
        longest = max(per_rank.values())
        if longest < consecutive:
            notes.append(
                f"world size {world_size}: {longest} windows per rank at most; "
                f"{consecutive} in a row are needed"
            )
            continue
        slow = _slow_windows(segment, mad_k=mad_k, floor=floor, min_ranks=min_ranks, notes=notes)
        for rank in sorted(slow):
            kept = _runs(slow[rank], consecutive)
            if kept:
                stragglers.append(_straggler(rank, world_size, kept, by_gpu, placement))
    return Detection(tuple(stragglers), tuple(refused), duplicates, conflicts, tuple(notes))
