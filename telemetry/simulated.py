"""What the simulator's workload profiles look like to telemetry. Pure: plain data in and out.

A simulated job reports what a real job with the SDK, a DCGM exporter and a node exporter
would:

- contiguous step windows of ``WINDOW_S`` simulated seconds (what the SDK's rank 0 posts)
  with the profile's data and communication wait;
- for a job of several GPUs, every rank's windows (``SimulatedRankWindow``), each at least
  ``RANK_WINDOW_WALL_S`` of wall time (the SDK's default window), with each rank's waits
  from the gang's lockstep (``clusters.sim_stragglers``: a straggler, a slow node, a
  degraded link, a gang across leaf switches);
- per-GPU minutes: activity (a little during the ``STARTUP_S`` of setup, the profile's while
  working), the SM clock (at the GPU's maximum, a capped GPU's at its maximum ÷ its factor)
  and NVLink traffic (``NVLINK_BYTES_S`` per GPU while working, when the job holds
  another GPU of its node);
- for every node of a multi-node job, the node exporter's InfiniBand counters
  (``node_link_samples``): ``IB_BYTES_S`` while working, a degraded link's less and with
  growing symbol errors.

Traffic is what a real job would move per second at the gang's pace (it is not sped up).
The simulator runs ``speedup`` times faster than the wall clock, so simulated seconds are
divided by it; the output is in wall time.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from clusters.sim_stragglers import Lockstep, StragglerKind, lockstep
from clusters.simulation import SIGNALS, STARTUP_S, ProfileSignals, Workload
from telemetry.exposition.node_links import (
    ERROR_COUNTERS,
    IB_RECEIVED,
    IB_SYMBOL_ERRORS,
    IB_TRANSMITTED,
    LinkSample,
)
from telemetry.exposition.parsing import (
    GR_ENGINE_ACTIVE,
    MAX_SM_CLOCK,
    NVLINK_RX,
    NVLINK_TX,
    SM_ACTIVE,
    SM_CLOCK,
    TENSOR_ACTIVE,
    GpuSample,
)

WINDOW_S = 60  # simulated seconds per step window
RANK_WINDOW_WALL_S = 30  # the SDK's default window: a rank's windows are at least this long
SCRAPE_INTERVAL_S = 15  # how often the pretend exporters are scraped
# Loading the model and the data keeps a GPU a little busy: above the idle threshold, so a
# minute that mixes setup and work never turns the work in it into idle time.
STARTUP_ACTIVITY = 0.10
MINUTE = 60
# Each GPU's maximum SM clock by flavor family (NVIDIA's data sheets: A100 SXM boosts to
# 1,410 MHz, H100 SXM to 1,980 MHz); other flavors take the A100's.
MAX_SM_CLOCK_MHZ = {"a100": 1410.0, "h100": 1980.0}
DEFAULT_MAX_SM_CLOCK_MHZ = 1410.0
# Traffic of a busy data-parallel job at its normal pace: per GPU over NVLink, per node over
# InfiniBand (transmitted + received). Round figures of the right order (NVLink 3 moves up to
# 600 GB/s per A100, 8 HDR ports 400 GB/s per node), so tests can say them exactly.
NVLINK_BYTES_S = 100e9
IB_BYTES_S = 40e9
# A degraded link's symbol errors per minute for each 1.0 of slowdown (60 a minute at 2x).
DEGRADED_ERRORS_PER_MIN = 60.0
IB_DEVICE, IB_PORT = "mlx5_0", "1"  # one port per simulated node
# dcgm-exporter's gauges a simulated GPU reports at each scrape (minute_samples).
GAUGES_PER_SCRAPE = 7


def max_sm_clock_mhz(flavor: str) -> float:
    """The maximum SM clock of a GPU of ``flavor`` (a slug like ``a100-80gb``)."""
    return MAX_SM_CLOCK_MHZ.get(flavor.split("-", 1)[0], DEFAULT_MAX_SM_CLOCK_MHZ)


@dataclass(frozen=True, slots=True)
class SimulatedWindow:
    seq: int  # 1-based window index: stable across collections, the de-duplication key
    start: datetime
    end: datetime
    steps: int
    step_time_s: float
    data_wait_s: float
    comm_wait_s: float
    step: int  # the global step reached at ``end``


@dataclass(frozen=True, slots=True)
class SimulatedRankWindow:
    """One rank's window, as the SDK's ``rank_window`` event says it."""

    rank: int
    world_size: int
    local_rank: int
    host: str
    gpu: str
    seq: int  # the rank's window number, from 1
    start: datetime
    end: datetime
    steps: int
    step_time_s: float  # mean wall seconds per step, the same on every rank (lockstep)
    data_wait_s: float  # total in the window
    comm_wait_s: float  # total in the window


@dataclass(frozen=True, slots=True)
class SimulatedMinute:
    host: str
    gpu: str
    minute: datetime
    activity: float
    sm_active: float
    tensor_active: float
    samples: int  # scrapes in the minute
    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    nvlink_bytes_s: float | None = None


@dataclass(frozen=True, slots=True)
class SimulatedLink:
    """One node's InfiniBand ports while one job runs there: reported from the job's start
    to its end, moving ``bytes_s`` and erring ``errors_per_s`` while it works."""

    node: str
    reported_from: datetime
    work_from: datetime
    work_until: datetime
    bytes_s: float
    errors_per_s: float


@dataclass(frozen=True, slots=True)
class SimulatedTelemetry:
    windows: list[SimulatedWindow]
    minutes: list[SimulatedMinute]
    rank_windows: list[SimulatedRankWindow]
    links: list[SimulatedLink]
    lockstep: Lockstep


def _whole(simulated_s: float) -> int:
    """The steps done in ``simulated_s`` (one a simulated second): whole ones only, but a
    second short by a float's rounding (a gang's pace divides the clock) is a whole one."""
    return int(round(simulated_s, 6))


def _window_bounds(
    length: float, work_end: float, finished: bool
) -> Iterator[tuple[int, float, float]]:
    """(seq, begin, end) in simulated seconds of the windows of ``length`` from the end of
    start-up: only complete ones while the job runs, so a stored window never changes."""
    begin, seq = float(STARTUP_S), 1
    while begin < work_end:
        end = min(begin + length, work_end)
        if end - begin < length and not finished:
            return  # still running: the window is not over yet
        yield seq, begin, end
        begin, seq = end, seq + 1


def simulated_telemetry(
    workload: Workload,
    *,
    started_at: datetime,
    until: datetime,
    finished: bool,
    speedup: float,
    gpus: Sequence[tuple[str, str]],
    paths: Mapping[str, tuple[str, ...]] | None = None,
    max_clock_mhz: float = DEFAULT_MAX_SM_CLOCK_MHZ,
) -> SimulatedTelemetry:
    """Telemetry of a job that started at ``started_at``, up to ``until`` (its end when
    ``finished``, else now), on ``gpus`` (host, GPU index) by rank, its nodes placed on
    ``paths`` (node → topology path). Only complete windows are returned while the job
    runs, so a window's row never changes once written; the last minute may still grow."""
    signals = SIGNALS[workload.profile]
    elapsed = max(0.0, (until - started_at).total_seconds()) * speedup  # simulated seconds
    work_total = max(0, workload.end_step - workload.resume_step)
    work_end = min(elapsed, STARTUP_S + work_total)
    gang = lockstep(
        data_share=signals.data_share,
        comm_share=signals.comm_share,
        nodes=[host for host, _ in gpus],
        paths=paths or {},
        straggler=workload.straggling,
    )

    def wall(simulated_s: float) -> datetime:
        return started_at + timedelta(seconds=simulated_s / speedup)

    windows: list[SimulatedWindow] = []
    rank_windows: list[SimulatedRankWindow] = []
    if signals.reports_steps:
        rank_zero = gang.ranks[0] if gang.ranks else None
        for seq, begin, end in _window_bounds(WINDOW_S, work_end, finished):
            wall_s, steps = (end - begin) / speedup, _whole(end - begin)
            windows.append(
                SimulatedWindow(
                    seq=seq,
                    start=wall(begin),
                    end=wall(end),
                    steps=steps,
                    step_time_s=wall_s / steps if steps else 0.0,
                    data_wait_s=wall_s * (rank_zero.data if rank_zero else signals.data_share),
                    comm_wait_s=wall_s * (rank_zero.comm if rank_zero else signals.comm_share),
                    step=workload.resume_step + _whole(end - STARTUP_S),
                )
            )
        if len(gpus) > 1:
            rank_windows = _rank_windows(gang, gpus, wall, speedup, work_end, finished)
    clocks = dict.fromkeys(gpus, max_clock_mhz)
    capped = _capped_gpu(workload, gpus)
    if capped is not None:
        clocks[capped] = max_clock_mhz / workload.straggler_factor
    minutes = _minutes(
        signals, gang, clocks, max_clock_mhz, started_at=started_at, elapsed=elapsed, wall=wall
    )
    links = _links(workload, gang, gpus, started_at, wall(STARTUP_S), wall(work_end))
    return SimulatedTelemetry(windows, minutes, rank_windows, links, gang)


def _capped_gpu(workload: Workload, gpus: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    straggler = workload.straggling
    if straggler is None or straggler.kind is not StragglerKind.SLOW_GPU:
        return None
    return gpus[straggler.rank]


Wall = Callable[[float], datetime]  # simulated seconds since the start → wall time


def _rank_windows(
    gang: Lockstep,
    gpus: Sequence[tuple[str, str]],
    wall: Wall,
    speedup: float,
    work_end: float,
    finished: bool,
) -> list[SimulatedRankWindow]:
    """Every rank's windows: ``WINDOW_S`` simulated seconds, or as many of them as make
    ``RANK_WINDOW_WALL_S`` of wall time at this speed-up (the SDK's pace and the server's cap
    on windows per rank and hour, telemetry.rank_windows)."""
    length = WINDOW_S * max(1, math.ceil(RANK_WINDOW_WALL_S * speedup / WINDOW_S))
    local: dict[str, int] = defaultdict(int)
    local_ranks = []
    for host, _ in gpus:
        local_ranks.append(local[host])
        local[host] += 1
    found = []
    for seq, begin, end in _window_bounds(length, work_end, finished):
        wall_s, steps = (end - begin) / speedup, _whole(end - begin)
        if steps < 1:
            continue
        found += [
            SimulatedRankWindow(
                rank=rank,
                world_size=len(gpus),
                local_rank=local_ranks[rank],
                host=host,
                gpu=gpu,
                seq=seq,
                start=wall(begin),
                end=wall(end),
                steps=steps,
                step_time_s=wall_s / steps,
                data_wait_s=wall_s * share.data,
                comm_wait_s=wall_s * share.comm,
            )
            for rank, ((host, gpu), share) in enumerate(zip(gpus, gang.ranks, strict=True))
        ]
    return found


def _minutes(
    signals: ProfileSignals,
    gang: Lockstep,
    clocks: Mapping[tuple[str, str], float],
    max_clock_mhz: float,
    *,
    started_at: datetime,
    elapsed: float,
    wall: Wall,
) -> list[SimulatedMinute]:
    """Each GPU's minutes up to ``elapsed`` simulated seconds (``clocks``: GPU → its SM
    clock, by rank)."""
    startup_activity = STARTUP_ACTIVITY if signals.reports_steps else signals.activity
    work_from, end_of_data = wall(STARTUP_S), wall(elapsed)
    phases = [  # (wall start, wall end, activity)
        (started_at, wall(min(elapsed, STARTUP_S)), startup_activity),
        (work_from, wall(max(STARTUP_S, elapsed)), signals.activity),
    ]
    # NVLink joins the GPUs of one node: a GPU moves traffic over it when the job holds
    # another GPU of its node.
    per_node = Counter(host for host, _ in clocks)
    minutes: list[SimulatedMinute] = []
    minute = _minute_floor(started_at)
    while minute < end_of_data:
        lo, hi = max(minute, started_at), min(minute + timedelta(seconds=MINUTE), end_of_data)
        covered = (hi - lo).total_seconds()
        busy = sum(
            activity * max(0.0, (min(hi, p_end) - max(lo, p_start)).total_seconds())
            for p_start, p_end, activity in phases
        )
        working = max(0.0, (hi - max(lo, work_from)).total_seconds())
        activity = busy / covered if covered else 0.0
        nvlink = NVLINK_BYTES_S * gang.pace * working / covered if covered else 0.0
        samples = max(1, round(covered / SCRAPE_INTERVAL_S))
        minutes.extend(
            SimulatedMinute(
                host=host,
                gpu=gpu,
                minute=minute,
                activity=activity,
                sm_active=activity,
                tensor_active=activity * signals.tensor_share,
                samples=samples,
                sm_clock_mhz=clock,
                max_sm_clock_mhz=max_clock_mhz,
                nvlink_bytes_s=nvlink if per_node[host] > 1 else 0.0,
            )
            for (host, gpu), clock in clocks.items()
        )
        minute += timedelta(seconds=MINUTE)
    return minutes


def _links(
    workload: Workload,
    gang: Lockstep,
    gpus: Sequence[tuple[str, str]],
    started_at: datetime,
    work_from: datetime,
    work_until: datetime,
) -> list[SimulatedLink]:
    """Each node's InfiniBand ports while a job of several nodes runs (one node's GPUs talk
    over NVLink only): ``IB_BYTES_S`` at the gang's pace; a degraded link ``factor`` times
    less, with ``DEGRADED_ERRORS_PER_MIN × (factor − 1)`` symbol errors a minute."""
    nodes = sorted({host for host, _ in gpus})
    if len(nodes) < 2:
        return []
    straggler = workload.straggling
    degraded = None
    if straggler is not None and straggler.kind is StragglerKind.DEGRADED_LINK:
        degraded = gpus[straggler.rank][0]
    links = []
    for node in nodes:
        factor = straggler.factor if straggler is not None and node == degraded else 1.0
        links.append(
            SimulatedLink(
                node=node,
                reported_from=started_at,
                work_from=work_from,
                work_until=max(work_from, work_until),
                bytes_s=IB_BYTES_S * gang.pace / factor,
                errors_per_s=DEGRADED_ERRORS_PER_MIN * (factor - 1) / MINUTE,
            )
        )
    return links


def _minute_floor(moment: datetime) -> datetime:
    utc = moment.astimezone(UTC)
    return utc.replace(second=0, microsecond=0)


def minute_samples(
    telemetry: SimulatedTelemetry,
    *,
    started_at: datetime,
    finished_at: datetime | None,
    since: datetime,
    until: datetime,
) -> list[GpuSample]:
    """What a DCGM exporter scraped every ``SCRAPE_INTERVAL_S`` would have reported for the
    minutes of ``telemetry`` that were complete by ``until`` and not yet by ``since``: a
    minute is complete at its end, or at the job's end for the job's last minute. The
    samples carry timestamps, as a Prometheus query returns them."""
    samples: list[GpuSample] = []
    for minute in telemetry.minutes:
        complete_at = minute.minute + timedelta(seconds=MINUTE)
        if finished_at is not None:
            complete_at = min(complete_at, finished_at)
        if not since <= complete_at < until:
            continue
        first_ms = int(max(minute.minute, started_at).timestamp() * 1000)
        values = {
            GR_ENGINE_ACTIVE: minute.activity,
            SM_ACTIVE: minute.sm_active,
            TENSOR_ACTIVE: minute.tensor_active,
            SM_CLOCK: minute.sm_clock_mhz,
            MAX_SM_CLOCK: minute.max_sm_clock_mhz,
            NVLINK_TX: None if minute.nvlink_bytes_s is None else minute.nvlink_bytes_s / 2,
            NVLINK_RX: None if minute.nvlink_bytes_s is None else minute.nvlink_bytes_s / 2,
        }
        uuid = f"GPU-sim-{minute.host}-{minute.gpu}"
        for scrape in range(minute.samples):
            ts = first_ms + scrape * SCRAPE_INTERVAL_S * 1000
            samples.extend(
                GpuSample(minute.host, minute.gpu, uuid, metric, value, ts)
                for metric, value in values.items()
                if value is not None
            )
    return samples


def node_link_samples(
    links: Sequence[SimulatedLink], *, since: datetime, until: datetime
) -> list[LinkSample]:
    """What each node's node exporter, scraped every ``SCRAPE_INTERVAL_S`` (on multiples of
    it), reports in [since, until) while jobs of several nodes run there: its port's data
    counters (the node's jobs' traffic so far, half sent, half received) and its error
    counters (a degraded link's symbol errors so far, the others 0). A counter's value is a
    function of the time alone, so any split of the interval gives the same samples."""
    by_node: dict[str, list[SimulatedLink]] = defaultdict(list)
    for link in links:
        by_node[link.node].append(link)
    every_ms = SCRAPE_INTERVAL_S * 1000
    first = -(-int(since.timestamp() * 1000) // every_ms) * every_ms
    last = int(until.timestamp() * 1000)
    samples: list[LinkSample] = []
    for node in sorted(by_node):
        spans = [
            (_ms(link.reported_from), _ms(link.work_from), _ms(link.work_until), link)
            for link in by_node[node]
        ]
        for tick in range(first, last, every_ms):
            if not any(shown <= tick < end + every_ms for shown, _, end, _ in spans):
                continue
            moved = erred = 0.0
            for _, begin, end, link in spans:
                seconds = max(0, min(tick, end) - begin) / 1000
                moved += link.bytes_s * seconds
                erred += link.errors_per_s * seconds
            values = {
                IB_TRANSMITTED: math.floor(moved / 2),
                IB_RECEIVED: math.floor(moved / 2),
                IB_SYMBOL_ERRORS: math.floor(erred),
            }
            samples += [
                LinkSample(node, IB_DEVICE, IB_PORT, metric, float(values.get(metric, 0)), tick)
                for metric in (IB_TRANSMITTED, IB_RECEIVED, *ERROR_COUNTERS)
            ]
    return samples


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)
