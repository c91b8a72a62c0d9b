"""DCGM exporter output: parse the Prometheus text exposition, map samples to attempts, and
roll them up per attempt, GPU and minute. Pure: plain data in, plain data out.

The parser never raises on bad input (only on a body over the size cap): every line is
counted exactly once in ``ParseStats`` as a kept sample, a comment, a blank, a malformed
line, a sample of a metric Gantry does not use, or a kept metric with a non-finite or
out-of-range value. Timestamps are Unix milliseconds, as in the exposition format.
"""

import math
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_BODY_BYTES = 8 * 1024 * 1024  # a 64-GPU node with every DCGM field is ~1 MiB; 8x headroom

GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
FB_USED = "DCGM_FI_DEV_FB_USED"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"

# The largest value each kept gauge can take: ratios are 0-1, GPU_UTIL is a percentage;
# the rest are only bounded below (MiB, W, the last XID code).
VALUE_CEILING = {
    GR_ENGINE_ACTIVE: 1.0,
    SM_ACTIVE: 1.0,
    TENSOR_ACTIVE: 1.0,
    DRAM_ACTIVE: 1.0,
    GPU_UTIL: 100.0,
    FB_USED: math.inf,
    POWER_USAGE: math.inf,
    XID_ERRORS: math.inf,
}
KEPT_METRICS = frozenset(VALUE_CEILING)

# dcgm-exporter's label names, with the spellings of older releases and of master after
# d5e5f51 (``hostname``); the first name present wins.
HOST_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid")
POD_LABELS = ("pod", "pod_name")
NAMESPACE_LABELS = ("namespace", "pod_namespace")
CONTAINER_LABELS = ("container", "container_name")

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\[\\"n])*)"[ \t]*')
_LABEL_SEPARATOR = re.compile(r",[ \t]*")
_ESCAPE = re.compile(r"\\(.)")
_HELP_ESCAPE = re.compile(r"\\([\\n])")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_HEAD_CACHE_LIMIT = 200_000  # distinct (metric, label set) lines: ~40 per GPU, thousands of GPUs


class BodyTooLarge(ValueError):
    def __init__(self, size: int, limit: int = MAX_BODY_BYTES) -> None:
        super().__init__(
            f"exposition body is {size:,} bytes, over the {limit:,}-byte limit; "
            "scrape fewer fields or split the target"
        )
        self.size = size
        self.limit = limit


@dataclass(slots=True)
class GpuSample:
    host: str
    gpu: str  # the GPU index label, e.g. "0"
    uuid: str
    metric: str
    value: float
    ts: int  # Unix milliseconds
    pod: str = ""  # "" when absent, as dcgm-exporter writes for GPUs without a pod
    namespace: str = ""
    container: str = ""
    hpc_job: str = ""


@dataclass(slots=True)
class ParseStats:
    lines: int = 0
    samples: int = 0  # kept: a metric Gantry uses with a usable value
    comments: int = 0  # HELP, TYPE and other comment lines
    blanks: int = 0
    malformed: int = 0
    ignored: int = 0  # well-formed samples of metrics Gantry does not use
    non_finite: int = 0  # NaN / +Inf / -Inf on a kept gauge
    out_of_range: int = 0  # negative, or a ratio above 1, on a kept gauge

    def accounted(self) -> int:
        return (
            self.samples
            + self.comments
            + self.blanks
            + self.malformed
            + self.ignored
            + self.non_finite
            + self.out_of_range
        )

    def add(self, other: "ParseStats") -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(slots=True)
class ParseResult:
    samples: list[GpuSample]
    stats: ParseStats
    types: dict[str, str] = field(default_factory=dict)  # metric -> TYPE
    help: dict[str, str] = field(default_factory=dict)  # metric -> HELP text


# What a label set means to Gantry: host, gpu, uuid, pod, namespace, container, hpc_job.
_Series = tuple[str, str, str, str, str, str, str]
_Head = tuple[str, _Series | None, float | None]
_NO_LABELS: _Series = ("", "", "", "", "", "", "")
_MALFORMED: _Head = ("", None, None)
_MALFORMED_COMMENT = ("#", "", "")


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], value)


def _first(labels: dict[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        if name in labels:
            return labels[name]
    return ""


def parse_labels(text: str) -> dict[str, str] | None:
    """The labels between ``{`` and ``}``, or None if malformed (bad syntax, bad escape,
    duplicate name)."""
    labels: dict[str, str] = {}
    pos, end = 0, len(text)
    if not text.strip(" \t"):
        return labels
    while True:
        match = _LABEL.match(text, pos)
        if match is None:
            return None
        name = match.group(1)
        if name in labels:
            return None
        labels[name] = _unescape(match.group(2))
        pos = match.end()
        if pos == end:
            return labels
        separator = _LABEL_SEPARATOR.match(text, pos)
        if separator is None:
            return None
        pos = separator.end()
        if pos == end:  # a trailing comma is allowed
            return labels


def _series_of(labels: dict[str, str]) -> _Series:
    return (
        _first(labels, HOST_LABELS),
        labels.get("gpu", ""),
        _first(labels, UUID_LABELS),
        _first(labels, POD_LABELS),
        _first(labels, NAMESPACE_LABELS),
        _first(labels, CONTAINER_LABELS),
        labels.get("hpc_job", ""),
    )


class ExpositionParser:
    """Keeps what label sets mean between scrapes: dcgm-exporter repeats the same label
    set on every metric of a GPU and on every scrape, so each is parsed once."""

    def __init__(self) -> None:
        self._heads: dict[str, _Head] = {}
        self._comments: dict[str, tuple[str, str, str]] = {}

    def _head(self, head: str) -> "_Head":
        """What a sample line's name and labels mean, cached: (name, series or None if
        malformed, the value ceiling or None for a metric Gantry does not use)."""
        if len(self._heads) >= _HEAD_CACHE_LIMIT:
            self._heads.clear()
        brace = head.find("{")
        if brace < 0:
            name, series = head, _NO_LABELS
        elif head[-1] != "}":
            name, series = head, None
        else:
            name = head[:brace].rstrip(" \t")
            labels = parse_labels(head[brace + 1 : -1])
            series = None if labels is None else _series_of(labels)
        if _METRIC_NAME.fullmatch(name) is None:
            series = None
        parsed = self._heads[head] = (name, series, VALUE_CEILING.get(name))
        return parsed

    def parse(self, body: bytes | str, *, default_ts: int) -> ParseResult:
        """Parse one scrape. ``default_ts`` (Unix ms, the scrape time) stamps samples that
        carry no timestamp. Raises ``BodyTooLarge`` over ``MAX_BODY_BYTES``, nothing else."""
        size = len(body.encode() if isinstance(body, str) else body)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(size)
        stats = ParseStats()
        result = ParseResult(samples=[], stats=stats)
        lines, undecodable = _split_lines(body)
        stats.lines = len(lines) + undecodable
        stats.malformed = undecodable
        samples = result.samples
        append = samples.append
        isfinite = math.isfinite
        heads = self._heads
        comments = self._comments
        kept = ignored = comment_lines = 0
        for raw in lines:
            line = raw.strip(" \t")
            if not line:
                stats.blanks += 1
                continue
            if line[0] == "#":
                comment = comments.get(line) or self._comment(line)
                if comment is _MALFORMED_COMMENT:
                    stats.malformed += 1
                    continue
                comment_lines += 1
                kind, name, text = comment
                if kind == "TYPE":
                    result.types[name] = text
                elif kind == "HELP":
                    result.help[name] = text
                continue
            close = line.rfind("}")
            if close >= 0:
                head = heads.get(line[: close + 1]) or self._head(line[: close + 1])
                name, series, ceiling = head
                if ceiling is None and series is not None:  # a metric Gantry does not use
                    ignored += 1
                    continue
                rest = line[close + 1 :].split()
            else:
                tokens = line.split()
                rest = tokens[1:]
                head = heads.get(tokens[0]) or self._head(tokens[0]) if tokens else _MALFORMED
                name, series, ceiling = head
            if series is None or not 1 <= len(rest) <= 2:
                stats.malformed += 1
                continue
            text = rest[0]
            if "_" in text or not text.isascii():  # float() takes 1_0 and non-ASCII digits
                stats.malformed += 1
                continue
            try:
                value = float(text)
                ts = default_ts if len(rest) == 1 else _timestamp(rest[1])
            except ValueError:
                stats.malformed += 1
                continue
            if ceiling is None:
                ignored += 1
            elif not isfinite(value):
                stats.non_finite += 1
            elif value < 0 or value > ceiling:
                stats.out_of_range += 1
            else:
                kept += 1
                host, gpu, uuid, pod, namespace, container, hpc_job = series
                append(
                    GpuSample(host, gpu, uuid, name, value, ts, pod, namespace, container, hpc_job)
                )
        stats.samples, stats.ignored, stats.comments = kept, ignored, comment_lines
        return result

    def _comment(self, line: str) -> tuple[str, str, str]:
        """(HELP or TYPE or "", metric, text) of a comment line, cached; a HELP or TYPE
        line without a valid metric name or type is ``_MALFORMED_COMMENT``."""
        if len(self._comments) >= _HEAD_CACHE_LIMIT:
            self._comments.clear()
        parts = line[1:].split(None, 2)
        comment = ("", "", "")
        if parts and parts[0] in ("HELP", "TYPE"):
            text = parts[2] if len(parts) == 3 else ""
            if len(parts) < 2 or _METRIC_NAME.fullmatch(parts[1]) is None:
                comment = _MALFORMED_COMMENT
            elif parts[0] == "HELP":
                comment = (
                    "HELP",
                    parts[1],
                    _HELP_ESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], text),
                )
            elif text in ("counter", "gauge", "histogram", "summary", "untyped"):
                comment = ("TYPE", parts[1], text)
            else:
                comment = _MALFORMED_COMMENT
        self._comments[line] = comment
        return comment


def _timestamp(text: str) -> int:
    if "_" in text or not text.isascii():
        raise ValueError(text)
    return int(text)


def _split_lines(body: bytes | str) -> tuple[list[str], int]:
    """The body's lines (a final newline ends the last line) and how many lines were not
    UTF-8; those are counted as malformed rather than guessed at."""
    undecodable = 0
    if isinstance(body, bytes):
        try:
            text = body.decode()
        except UnicodeDecodeError:
            decoded = []
            for raw in body.split(b"\n"):
                try:
                    decoded.append(raw.decode())
                except UnicodeDecodeError:
                    undecodable += 1
                    decoded.append(None)
            if decoded and decoded[-1] == "":
                decoded.pop()
            return [line for line in decoded if line is not None], undecodable
    else:
        text = body
    if not text:
        return [], 0
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines, undecodable


def parse(body: bytes | str, *, default_ts: int) -> ParseResult:
    """Parse one scrape with a fresh parser (see ``ExpositionParser.parse``)."""
    return ExpositionParser().parse(body, default_ts=default_ts)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(samples: Iterable[GpuSample], *, with_timestamps: bool = True) -> str:
    """Exposition text for ``samples`` in dcgm-exporter's label order (used by the simulator
    and tests); labels that are empty are left out, as ``parse`` reads them back as ""."""
    lines = []
    for sample in samples:
        labels = [
            ("gpu", sample.gpu),
            ("UUID", sample.uuid),
            ("Hostname", sample.host),
            ("container", sample.container),
            ("namespace", sample.namespace),
            ("pod", sample.pod),
            ("hpc_job", sample.hpc_job),
        ]
        text = ",".join(f'{name}="{_escape(value)}"' for name, value in labels if value)
        stamp = f" {sample.ts}" if with_timestamps else ""
        lines.append(f"{sample.metric}{{{text}}} {sample.value!r}{stamp}\n")
    return "".join(lines)


# Mapping samples to attempts ------------------------------------------------------------

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

    def map(
        self, samples: Iterable[GpuSample], unmapped_out: list[GpuSample] | None = None
    ) -> tuple[list[tuple[AttemptId, GpuSample]], int]:
        """(mapped (attempt, sample) pairs, how many samples mapped to no attempt); the
        unmapped samples themselves are appended to ``unmapped_out`` when given."""
        pods, jobs, windows, starts = self._pods, self._jobs, self._windows, self._starts
        mapped: list[tuple[AttemptId, GpuSample]] = []
        append = mapped.append
        unmapped = 0
        for sample in samples:
            if sample.pod:
                key = (sample.namespace, sample.pod)
                attempt = pods[key] if key in pods else self._pod_owner(*key)
            elif sample.hpc_job:
                attempt = jobs.get(sample.hpc_job)
            else:
                attempt = None
                key = (sample.host, sample.gpu)
                held_starts = starts.get(key)
                if held_starts is not None:
                    index = bisect_right(held_starts, sample.ts) - 1
                    if index >= 0:
                        _, end, candidate = windows[key][index]
                        if sample.ts < end:
                            attempt = candidate
            if attempt is None:
                unmapped += 1
                if unmapped_out is not None:
                    unmapped_out.append(sample)
            else:
                append((attempt, sample))
        return mapped, unmapped


def map_samples(
    samples: Iterable[GpuSample], allocations: Iterable[Allocation]
) -> tuple[list[tuple[AttemptId, GpuSample]], int]:
    """Attribute samples to attempts (see ``AllocationIndex``); returns (mapped, unmapped
    count): unmapped samples are counted, never silently dropped."""
    return AllocationIndex(allocations).map(samples)


# Minute rollups -------------------------------------------------------------------------


@dataclass(slots=True)
class MinuteRollup:
    attempt_id: AttemptId
    host: str  # with the GPU index, names the GPU: multi-node attempts repeat indices
    gpu: str
    minute: int  # Unix seconds at the start of the minute
    activity: float | None  # GR_ENGINE_ACTIVE, else GPU_UTIL / 100; 0-1
    sm_active: float | None
    tensor_active: float | None
    dram_active: float | None
    fb_used: float | None  # MiB, the minute's maximum
    power: float | None  # W, the minute's mean
    xid: int  # the last non-zero XID seen in the minute, 0 if none
    samples: int


@dataclass(slots=True)
class RollupStats:
    samples: int = 0
    duplicates: int = 0  # same attempt, GPU, metric and timestamp as an earlier sample


# Accumulator slots per minute: sums and counts of the mean-valued metrics, then the
# maximum FB_USED, the last XID (value, timestamp) and the sample count.
_MEAN_SLOT = {
    GR_ENGINE_ACTIVE: 0,
    GPU_UTIL: 2,
    SM_ACTIVE: 4,
    TENSOR_ACTIVE: 6,
    DRAM_ACTIVE: 8,
    POWER_USAGE: 10,
}
_FB_SLOT, _XID_SLOT, _XID_TS_SLOT, _COUNT_SLOT, _SLOTS = 12, 13, 14, 15, 16


def _mean(acc: list, slot: int) -> float | None:
    return acc[slot] / acc[slot + 1] if acc[slot + 1] else None


class MinuteRollups:
    """Accumulates mapped samples, in any order and over several calls, into per
    (attempt, host, GPU, minute) rollups; a repeat of the same attempt, GPU, metric and
    timestamp is counted and skipped."""

    def __init__(self) -> None:
        self.stats = RollupStats()
        self._seen: set[tuple] = set()
        self._accumulators: dict[tuple[AttemptId, str, str, int], list] = {}

    def add(self, mapped: Iterable[tuple[AttemptId, GpuSample]]) -> None:
        stats, seen, accumulators = self.stats, self._seen, self._accumulators
        mean_slot = _MEAN_SLOT
        for attempt, sample in mapped:
            ts = sample.ts
            before = len(seen)
            seen.add((attempt, sample.host, sample.gpu, sample.metric, ts))
            if len(seen) == before:
                stats.duplicates += 1
                continue
            stats.samples += 1
            key = (attempt, sample.host, sample.gpu, ts // 60_000 * 60)
            acc = accumulators.get(key)
            if acc is None:
                acc = accumulators[key] = [0.0, 0] * 6 + [None, 0, -1, 0]
            metric = sample.metric
            value = sample.value
            slot = mean_slot.get(metric)
            if slot is not None:
                acc[slot] += value
                acc[slot + 1] += 1
            elif metric == FB_USED:
                if acc[_FB_SLOT] is None or value > acc[_FB_SLOT]:
                    acc[_FB_SLOT] = value
            elif value and ts >= acc[_XID_TS_SLOT]:  # XID_ERRORS: the last non-zero code
                acc[_XID_SLOT] = int(value)
                acc[_XID_TS_SLOT] = ts
            acc[_COUNT_SLOT] += 1

    def rows(self) -> list[MinuteRollup]:
        rows = []
        for (attempt, host, gpu, minute), acc in self._accumulators.items():
            activity = _mean(acc, 0)
            if activity is None:
                utilization = _mean(acc, 2)
                activity = None if utilization is None else utilization / 100
            rows.append(
                MinuteRollup(
                    attempt_id=attempt,
                    host=host,
                    gpu=gpu,
                    minute=minute,
                    activity=activity,
                    sm_active=_mean(acc, 4),
                    tensor_active=_mean(acc, 6),
                    dram_active=_mean(acc, 8),
                    fb_used=acc[_FB_SLOT],
                    power=_mean(acc, 10),
                    xid=acc[_XID_SLOT],
                    samples=acc[_COUNT_SLOT],
                )
            )
        rows.sort(key=lambda row: (str(row.attempt_id), row.host, row.gpu, row.minute))
        return rows


def rollup_minutes(
    mapped: Iterable[tuple[AttemptId, GpuSample]],
) -> tuple[list[MinuteRollup], RollupStats]:
    """Per (attempt, host, GPU, minute) rollups of mapped samples (see ``MinuteRollups``)."""
    rollups = MinuteRollups()
    rollups.add(mapped)
    return rollups.rows(), rollups.stats


def ingest(
    bodies: Iterable[tuple[bytes | str, int]],
    allocations: Iterable[Allocation],
    *,
    parser: ExpositionParser | None = None,
) -> tuple[list[MinuteRollup], ParseStats, int, RollupStats]:
    """Parse, map and roll up scrapes given as (body, scrape time in Unix ms); returns the
    rollups, the summed parse counts, the unmapped sample count and the rollup counts.
    One scrape at a time: samples do not outlive their scrape."""
    parser = parser or ExpositionParser()
    index = AllocationIndex(allocations)
    rollups = MinuteRollups()
    totals = ParseStats()
    unmapped = 0
    for body, scraped_at in bodies:
        result = parser.parse(body, default_ts=scraped_at)
        totals.add(result.stats)
        mapped, missed = index.map(result.samples)
        unmapped += missed
        rollups.add(mapped)
    return rollups.rows(), totals, unmapped, rollups.stats
