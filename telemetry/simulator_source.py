"""The simulator's telemetry source: its jobs as a DCGM exporter, a node exporter and the
job-side SDK would have reported them.

A simulator cluster's jobs exist only in the database (``SimulatedJob``), so its source reads
them there; the collector treats it like any other source (``telemetry.collection``
``SOURCES``). One computation per job (``telemetry.simulated.simulated_telemetry``) gives
what the exporters show, the minutes completed in the interval read and the InfiniBand
counters of the nodes of multi-node jobs, and what the SDK posts, the step windows and
every rank's windows completed so far, stored as the SDK's are (the same rows, the same
de-duplication key). The cluster's injected faults
(``clusters.sim_faults``) show as the exporter would show them, on every GPU they touch
whether a job runs there or not: a GPU's last XID (``DCGM_FI_DEV_XID_ERRORS``) from its
fault on, and a throttled GPU's clock-event reasons (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``).
"""

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from clusters.models import Cluster, SimulatedFence, SimulatedJob
from clusters.sim_faults import FaultSettings, fault_settings, gauge_readings
from clusters.simulation import Workload, gang_gpus, sim_layout
from jobs.models import Attempt
from telemetry.exposition.mapping import Allocation, HostAllocation
from telemetry.exposition.node_links import LinkSample, render_link_samples
from telemetry.exposition.parsing import GpuSample, render
from telemetry.models import RankStepWindow, StepWindow
from telemetry.simulated import (
    SCRAPE_INTERVAL_S,
    SimulatedLink,
    SimulatedRankWindow,
    SimulatedWindow,
    max_sm_clock_mhz,
    minute_samples,
    node_link_samples,
    simulated_telemetry,
)
from telemetry.sources import FetchResult, Scrape, ScrapeFailure

# The source name of the step windows the simulator's jobs report, as an SDK names its own.
SIMULATOR_SOURCE = "simulator"
# Jobs that ended longer ago than this are not read again for step windows; a first read
# looks this far back.
SIMULATOR_RECENT = timedelta(days=1)
# The exporter's names of the gauges faults move (dcgm-exporter, DCGM's field names).
GAUGE_METRICS = {
    "xid": "DCGM_FI_DEV_XID_ERRORS",
    "clock_reasons": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}
# Sample lines per body: ~120 bytes each, so a body stays far below the 8 MiB a source may
# deliver (a first read of a day of a large job is millions of lines).
LINES_PER_BODY = 40_000


def _moment(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _started_jobs(
    cluster: Cluster, *, before: datetime, not_ended_before: datetime
) -> dict[str, SimulatedJob]:
    """The cluster's jobs that started before ``before`` and had not ended before
    ``not_ended_before``, by job id (what their attempts hold as ``backend_job_id``)."""
    jobs = (
        SimulatedJob.objects.filter(
            cluster=cluster, started_at__isnull=False, started_at__lt=before
        )
        .exclude(finished_at__lt=not_ended_before)
        .order_by("pk")
    )
    return {str(job.pk): job for job in jobs}


def _attempt_ids(cluster: Cluster, jobs: Iterable[str]) -> dict[str, int]:
    """The attempt of each of ``jobs`` that has one, by job id."""
    return dict(
        Attempt.objects.filter(cluster=cluster, backend_job_id__among=list(jobs)).values_list(
            "backend_job_id", "pk"
        )
    )


def simulated_allocations(*, cluster: Cluster, start: datetime, end: datetime) -> list[Allocation]:
    """The GPUs each attempt of the simulator ``cluster`` held during [start, end): its job's
    GPU indices on each node, from the job's start to its end."""
    jobs = _started_jobs(cluster, before=end, not_ended_before=start)
    allocations: list[Allocation] = []
    for job_id, attempt_id in _attempt_ids(cluster, jobs).items():
        job = jobs[job_id]
        assert job.started_at is not None  # only started jobs
        finished = _ms(job.finished_at) if job.finished_at else None
        allocations += [
            HostAllocation(node, str(gpu), _ms(job.started_at), finished, attempt_id)
            for node, gpus in job.allocation.items()
            for gpu in gpus
        ]
    return allocations


class SimulatorSource:
    """The simulator's jobs of one cluster as telemetry.

    ``fetch`` returns, as a scrape with timestamps, every minute a job completed in the
    interval, on its hosts and GPU indices (``simulated_allocations`` maps them to the job's
    attempt). It also stores the step windows the jobs' SDK would have posted by the end of
    the interval (idempotent: a window is written once complete, keyed by its seq), in the
    collector's transaction.
    """

    name = "simulator"
    first_lookback = SIMULATOR_RECENT

    def __init__(self, cluster: Cluster) -> None:
        if cluster.backend != Cluster.Backend.SIMULATOR:
            raise ValueError(
                f"the simulator telemetry source reads simulated jobs; cluster {cluster.name} "
                f"is a {cluster.backend} cluster"
            )
        self.cluster = cluster
        self.failures: list[ScrapeFailure] = []  # always empty: there is one "target"

    def fetch(self, *, start_ms: int, end_ms: int) -> FetchResult:
        since, until = _moment(start_ms), _moment(end_ms)
        speedup = float(self.cluster.settings.get("speedup", 1))
        jobs = _started_jobs(
            self.cluster, before=until, not_ended_before=min(since, until - SIMULATOR_RECENT)
        )
        attempts = _attempt_ids(self.cluster, jobs)
        paths = {
            node.name: node.path
            for node in sim_layout(self.cluster.name, self.cluster.settings).nodes
        }
        samples: list[GpuSample] = []
        links: list[SimulatedLink] = []
        for job_id, job in jobs.items():
            assert job.started_at is not None  # filtered on started_at__isnull=False
            finished_at = job.finished_at if job.finished_at and job.finished_at < until else None
            telemetry = simulated_telemetry(
                Workload(**job.profile["workload"]),
                started_at=job.started_at,
                until=finished_at or until,
                finished=finished_at is not None,
                speedup=speedup * float(job.profile.get("speed", 1.0)),
                gpus=[(node, str(gpu)) for node, gpu in gang_gpus(job.allocation)],
                paths=paths,
                max_clock_mhz=max_sm_clock_mhz(job.flavor),
            )
            samples += minute_samples(
                telemetry,
                started_at=job.started_at,
                finished_at=finished_at,
                since=since,
                until=until,
            )
            links += telemetry.links
            if job_id in attempts:
                simulated_windows_store(
                    attempt_id=attempts[job_id], source=SIMULATOR_SOURCE, windows=telemetry.windows
                )
                simulated_rank_windows_store(
                    attempt_id=attempts[job_id],
                    windows=[w for w in telemetry.rank_windows if w.end >= since],
                )
        samples += self._fault_samples(start_ms=start_ms, end_ms=end_ms)
        counters = node_link_samples(links, since=since, until=until)
        origin = f"simulator:{self.cluster.name}"
        return FetchResult(
            Scrape(body=body, at_ms=end_ms, origin=origin) for body in _bodies(samples, counters)
        )

    def _fault_samples(self, *, start_ms: int, end_ms: int) -> list[GpuSample]:
        """The XID and clock-event gauges the cluster's faults set in [start, end)."""
        layout = sim_layout(self.cluster.name, self.cluster.settings)
        nodes = {node.name: node.gpus for node in layout.nodes}
        try:
            settings = fault_settings(self.cluster.settings.get("faults"), nodes=nodes)
        except ValueError:
            return []  # the backend refuses the cluster and says why (its inventory error)
        if not (settings.injects or settings.throttled):
            return []
        released = {
            fence.node: fence.released_at.timestamp()
            for fence in SimulatedFence.objects.filter(
                cluster=self.cluster, released_at__isnull=False
            )
            if fence.released_at is not None
        }
        return fault_gauge_samples(
            nodes, settings, start_ms=start_ms, end_ms=end_ms, released=released
        )


def fault_gauge_samples(
    nodes: dict[str, int],
    settings: FaultSettings,
    *,
    start_ms: int,
    end_ms: int,
    released: dict[str, float],
) -> list[GpuSample]:
    """The exporter's samples of the faults' gauges, scraped every ``SCRAPE_INTERVAL_S``."""
    return [
        GpuSample(
            reading.node,
            str(reading.gpu),
            f"GPU-sim-{reading.node}-{reading.gpu}",
            GAUGE_METRICS[reading.metric],
            float(reading.value),
            int(reading.at * 1000),
        )
        for reading in gauge_readings(
            nodes,
            settings,
            start=start_ms / 1000,
            end=end_ms / 1000,
            every_s=SCRAPE_INTERVAL_S,
            released=released,
        )
    ]


def _bodies(samples: list[GpuSample], counters: list[LinkSample]) -> list[bytes]:
    """The exposition bodies of ``samples`` and ``counters``, ``LINES_PER_BODY`` lines each
    at most."""
    bodies = [
        render(samples[i : i + LINES_PER_BODY]).encode()
        for i in range(0, len(samples), LINES_PER_BODY)
    ]
    bodies += [
        render_link_samples(counters[i : i + LINES_PER_BODY]).encode()
        for i in range(0, len(counters), LINES_PER_BODY)
    ]
    return bodies


def simulated_rank_windows_store(
    *, attempt_id: int, windows: Iterable[SimulatedRankWindow]
) -> None:
    """Every rank's windows a simulated job reported, stored as the SDK's ``rank_window``
    events are; a window already stored (same attempt, rank and seq) is left as it is. The
    simulator reports only the GPUs its job holds, at the SDK's pace, so none of the checks
    of a job's own claims (``telemetry.rank_windows``) applies."""
    RankStepWindow.objects.bulk_create(
        [
            RankStepWindow(
                attempt_id=attempt_id,
                rank=w.rank,
                seq=w.seq,
                world_size=w.world_size,
                local_rank=w.local_rank,
                host=w.host,
                gpu=w.gpu,
                start=w.start,
                end=w.end,
                steps=w.steps,
                step_time_s=w.step_time_s,
                data_wait_s=w.data_wait_s,
                comm_wait_s=w.comm_wait_s,
            )
            for w in windows
        ],
        ignore_conflicts=True,
        batch_size=2000,
    )


def simulated_windows_store(
    *, attempt_id: int, source: str, windows: Iterable[SimulatedWindow]
) -> None:
    """The step windows a simulated job reported (``telemetry.simulated``), stored as the SDK's
    would be; a window already stored (same attempt, source and seq) is left as it is."""
    StepWindow.objects.bulk_create(
        [
            StepWindow(
                attempt_id=attempt_id,
                source=source,
                seq=window.seq,
                start=window.start,
                end=window.end,
                steps=window.steps,
                step_time_s=window.step_time_s,
                data_wait_s=window.data_wait_s,
                comm_wait_s=window.comm_wait_s,
                step=window.step,
            )
            for window in windows
        ],
        ignore_conflicts=True,
    )
