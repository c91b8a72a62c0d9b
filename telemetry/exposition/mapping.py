"""Map samples to the attempts that held the GPUs: by pod, by Kubernetes Job, by Slurm job,
or by host, GPU and time. Pure: plain data in, plain data out."""

import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from telemetry.exposition.parsing import GpuSample

AttemptId = int | str


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """Kubernetes: the pod of an attempt (dcgm-exporter run with ``--kubernetes``)."""

    namespace: str
    pod: str
    attempt_id: AttemptId


@dataclass(frozen=True, slots=True)
class KubernetesJobAllocation:
    """Kubernetes: every pod of the Job an attempt created. A Job's pods are named
    ``<job>-<random>``, or ``<job>-<index>-<random>`` for an Indexed Job."""

    namespace: str
    job: str
    attempt_id: AttemptId


@dataclass(frozen=True, slots=True)
class SlurmAllocation:
    """Slurm: the job id dcgm-exporter writes as ``hpc_job``."""

    hpc_job: str
    attempt_id: AttemptId


@dataclass(frozen=True, slots=True)
class HostAllocation:
    """Any backend: a GPU of a host held by an attempt over [start_ms, end_ms)."""

    host: str
    gpu: str
    start_ms: int
    end_ms: int | None  # None: still running
    attempt_id: AttemptId


Allocation = PodAllocation | KubernetesJobAllocation | SlurmAllocation | HostAllocation


class AllocationIndex:
    """Allocations indexed for mapping samples to attempts.

    A sample labelled with a pod is mapped by namespace and pod only, one labelled with
    ``hpc_job`` by the job only: a label names the workload, so a pod or job that is not
    Gantry's is someone else's use of the GPU, never a Gantry attempt's. Unlabelled samples
    are mapped by host, GPU index and time against the allocations' windows.
    """

    def __init__(self, allocations: Iterable[Allocation]) -> None:
        self._pods: dict[tuple[str, str], AttemptId | None] = {}
        self._k8s_jobs: dict[tuple[str, str], AttemptId] = {}
        self._jobs: dict[str, AttemptId] = {}
        self._windows: dict[tuple[str, str], list[tuple[int, float, AttemptId]]] = {}
        for allocation in allocations:
            if isinstance(allocation, PodAllocation):
                self._pods[(allocation.namespace, allocation.pod)] = allocation.attempt_id
            elif isinstance(allocation, KubernetesJobAllocation):
                self._k8s_jobs[(allocation.namespace, allocation.job)] = allocation.attempt_id
            elif isinstance(allocation, SlurmAllocation):
                self._jobs[allocation.hpc_job] = allocation.attempt_id
            else:
                end = math.inf if allocation.end_ms is None else allocation.end_ms
                self._windows.setdefault((allocation.host, allocation.gpu), []).append(
                    (allocation.start_ms, end, allocation.attempt_id)
                )
        self._starts: dict[tuple[str, str], list[int]] = {}
        for key, held in self._windows.items():
            held.sort(key=lambda window: window[0])
            self._starts[key] = [window[0] for window in held]

    def _pod_owner(self, namespace: str, pod: str) -> AttemptId | None:
        """The attempt whose Job owns the pod, remembered per pod (also when none does)."""
        attempt = None
        parts = pod.rsplit("-", 2)
        for job in (parts[0], "-".join(parts[:2])) if len(parts) == 3 else parts[:1]:
            attempt = self._k8s_jobs.get((namespace, job))
            if attempt is not None:
                break
        self._pods[(namespace, pod)] = attempt
        return attempt

    def labelled_attempt(self, namespace: str, pod: str, hpc_job: str) -> AttemptId | None:
        """The attempt of a series labelled with a pod or an ``hpc_job`` (None: not
        Gantry's). Only for series that carry one of those labels."""
        if pod:
            key = (namespace, pod)
            return self._pods[key] if key in self._pods else self._pod_owner(namespace, pod)
        return self._jobs.get(hpc_job)

    def attempt_at(self, host: str, gpu: str, ts: int) -> AttemptId | None:
        """The attempt holding the host's GPU at ``ts`` (Unix ms), for unlabelled series."""
        return self.window_at(host, gpu, ts)[2]

    def window_at(self, host: str, gpu: str, ts: int) -> tuple[float, float, AttemptId | None]:
        """(lo, hi, attempt): the attempt holding the host's GPU at ``ts`` (None: no
        attempt) and the widest [lo, hi) around ``ts`` over which that answer holds."""
        held_starts = self._starts.get((host, gpu))
        if held_starts is None:
            return -math.inf, math.inf, None
        index = bisect_right(held_starts, ts) - 1
        following = held_starts[index + 1] if index + 1 < len(held_starts) else math.inf
        if index < 0:
            return -math.inf, following, None
        start, end, attempt = self._windows[(host, gpu)][index]
        if ts < end:
            return start, min(end, following), attempt
        return end, following, None

    def map(
        self, samples: Iterable[GpuSample], unmapped_out: list[GpuSample] | None = None
    ) -> tuple[list[tuple[AttemptId, GpuSample]], int]:
        """(mapped (attempt, sample) pairs, how many samples mapped to no attempt); the
        unmapped samples themselves are appended to ``unmapped_out`` when given."""
        mapped: list[tuple[AttemptId, GpuSample]] = []
        unmapped = 0
        for sample in samples:
            if sample.pod or sample.hpc_job:
                attempt = self.labelled_attempt(sample.namespace, sample.pod, sample.hpc_job)
            else:
                attempt = self.attempt_at(sample.host, sample.gpu, sample.ts)
            if attempt is None:
                unmapped += 1
                if unmapped_out is not None:
                    unmapped_out.append(sample)
            else:
                mapped.append((attempt, sample))
        return mapped, unmapped


def map_samples(
    samples: Iterable[GpuSample], allocations: Iterable[Allocation]
) -> tuple[list[tuple[AttemptId, GpuSample]], int]:
    """Attribute samples to attempts (see ``AllocationIndex``); returns (mapped, unmapped
    count): unmapped samples are counted, never silently dropped."""
    return AllocationIndex(allocations).map(samples)
