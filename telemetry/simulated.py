"""What the simulator's workload profiles look like to telemetry. Pure: plain data in and out.

A simulated job reports what a real job with the SDK and a DCGM exporter would: contiguous
step windows of ``WINDOW_S`` simulated seconds with the profile's data and communication
wait, and per-GPU minute activity (a little during the ``STARTUP_S`` of setup, the
profile's activity while working). The simulator runs ``speedup`` times faster than the
wall clock, so simulated seconds are divided by it; the output is in wall time.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from clusters.simulation import STARTUP_S, Workload
from telemetry.exposition.parsing import GR_ENGINE_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE, GpuSample

WINDOW_S = 60  # simulated seconds per step window
SCRAPE_INTERVAL_S = 15  # how often the pretend exporter is scraped, for the sample count
# Loading the model and the data keeps a GPU a little busy: above the idle threshold, so a
# minute that mixes setup and work never turns the work in it into idle time.
STARTUP_ACTIVITY = 0.10
MINUTE = 60


@dataclass(frozen=True, slots=True)
class ProfileSignals:
    activity: float  # GPU activity (0-1) while working
    tensor_share: float  # tensor-core activity as a share of the activity
    data_share: float  # share of step time waiting for input
    comm_share: float  # share of step time waiting on communication
    reports_steps: bool = True  # False: a notebook-like job without a training loop


SIGNALS = {
    "compute-bound": ProfileSignals(0.92, 0.7, 0.01, 0.02),
    "input-bound": ProfileSignals(0.30, 0.7, 0.60, 0.02),
    "comm-bound": ProfileSignals(0.45, 0.7, 0.03, 0.45),
    "idle": ProfileSignals(0.01, 0.0, 0.0, 0.0, reports_steps=False),
    "crash": ProfileSignals(0.90, 0.7, 0.03, 0.02),
    "oom": ProfileSignals(0.90, 0.7, 0.03, 0.02),
}


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
class SimulatedMinute:
    host: str
    gpu: str
    minute: datetime
    activity: float
    sm_active: float
    tensor_active: float
    samples: int


@dataclass(frozen=True, slots=True)
class SimulatedTelemetry:
    windows: list[SimulatedWindow]
    minutes: list[SimulatedMinute]


def simulated_telemetry(
    workload: Workload,
    *,
    started_at: datetime,
    until: datetime,
    finished: bool,
    speedup: float,
    gpus: list[tuple[str, str]],
) -> SimulatedTelemetry:
    """Telemetry of a job that started at ``started_at``, up to ``until`` (its end when
    ``finished``, else now). Only complete step windows are returned while the job runs,
    so a window's row never changes once written; the last minute may still grow."""
    signals = SIGNALS[workload.profile]
    elapsed = max(0.0, (until - started_at).total_seconds()) * speedup  # simulated seconds
    work_total = max(0, workload.end_step - workload.resume_step)
    work_end = min(elapsed, STARTUP_S + work_total)

    def wall(simulated_s: float) -> datetime:
        return started_at + timedelta(seconds=simulated_s / speedup)

    windows: list[SimulatedWindow] = []
    if signals.reports_steps:
        begin = float(STARTUP_S)
        seq = 1
        while begin < work_end:
            end = min(begin + WINDOW_S, work_end)
            if end - begin < WINDOW_S and not finished:
                break  # still running: the window is not over yet
            wall_s = (end - begin) / speedup
            steps = int(end - begin)
            windows.append(
                SimulatedWindow(
                    seq=seq,
                    start=wall(begin),
                    end=wall(end),
                    steps=steps,
                    step_time_s=wall_s / steps if steps else 0.0,
                    data_wait_s=wall_s * signals.data_share,
                    comm_wait_s=wall_s * signals.comm_share,
                    step=workload.resume_step + int(end - STARTUP_S),
                )
            )
            begin, seq = end, seq + 1

    startup_activity = STARTUP_ACTIVITY if signals.reports_steps else signals.activity
    phases = [  # (wall start, wall end, activity)
        (wall(0), wall(min(elapsed, STARTUP_S)), startup_activity),
        (wall(STARTUP_S), wall(max(STARTUP_S, elapsed)), signals.activity),
    ]
    end_of_data = wall(elapsed)
    minutes: list[SimulatedMinute] = []
    minute = _minute_floor(started_at)
    while minute < end_of_data:
        lo, hi = max(minute, started_at), min(minute + timedelta(seconds=MINUTE), end_of_data)
        covered = (hi - lo).total_seconds()
        busy = sum(
            activity * max(0.0, (min(hi, p_end) - max(lo, p_start)).total_seconds())
            for p_start, p_end, activity in phases
        )
        activity = busy / covered if covered else 0.0
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
            )
            for host, gpu in gpus
        )
        minute += timedelta(seconds=MINUTE)
    return SimulatedTelemetry(windows=windows, minutes=minutes)


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
        }
        uuid = f"GPU-sim-{minute.host}-{minute.gpu}"
        for scrape in range(minute.samples):
            ts = first_ms + scrape * SCRAPE_INTERVAL_S * 1000
            samples.extend(
                GpuSample(minute.host, minute.gpu, uuid, metric, value, ts)
                for metric, value in values.items()
            )
    return samples
