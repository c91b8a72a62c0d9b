"""DCGM exporter output: parse the Prometheus text exposition, map samples to attempts, and
roll them up per attempt, GPU and minute. Pure: plain data in, plain data out.

The parser never raises on bad input (only on a body over the size cap): every line is
counted exactly once in ``ParseStats`` as a kept sample, a comment, a blank, a malformed
line, a sample of a metric Gantry does not use, or a kept metric with a non-finite or
out-of-range value. Timestamps are Unix milliseconds, as in the exposition format.
"""

import enum
import math
import re
import sys
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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
        # A GPU's label set is the same on each of its metrics: parsed once for all.
        self._label_sets: dict[str, _Series | None] = {}
        self._comments: dict[str, tuple[str, str, str]] = {}

    def _head(self, head: str) -> "_Head":
        """What a sample line's name and labels mean, cached: (name, series or None if
        malformed, the value ceiling or None for a metric Gantry does not use)."""
        if len(self._heads) >= _HEAD_CACHE_LIMIT:
            self._heads.clear()
            self._label_sets.clear()
        brace = head.find("{")
        if brace < 0:
            name, series = head, _NO_LABELS
        elif head[-1] != "}":
            name, series = head, None
        else:
            name = head[:brace].rstrip(" \t")
            text = head[brace + 1 : -1]
            if text in self._label_sets:
                series = self._label_sets[text]
            else:
                labels = parse_labels(text)
                series = self._label_sets[text] = None if labels is None else _series_of(labels)
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
            decoded: list[str | None] = []
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
_FB_SLOT, _XID_SLOT, _XID_TS_SLOT, _COUNT_SLOT = 12, 13, 14, 15
# Where a kept metric's value goes: its accumulator slot (FB_USED and XID_ERRORS have their
# own rules) and its number among the kept metrics, part of the duplicate key.
_METRIC_SLOT = {**_MEAN_SLOT, FB_USED: _FB_SLOT, XID_ERRORS: _XID_SLOT}
_METRIC_NUMBER = {metric: number for number, metric in enumerate(sorted(KEPT_METRICS))}
# Keys are ints, not tuples: (minute << 32 | gpu) for an accumulator and
# (ts << 35 | gpu << 3 | metric) for a seen sample, where gpu numbers an (attempt, host,
# GPU). Shifting keeps them unique for negative minutes and timestamps too.
_GPU_BITS, _METRIC_BITS = 32, 3


# An accumulator: (sum, count) per mean metric, then the frame-buffer maximum (None before
# the first sample), the last XID code, its timestamp and the sample count.
_Accumulator = list[Any]


def _new_accumulator() -> _Accumulator:
    return [0.0, 0] * 6 + [None, 0, -1, 0]


def _mean(acc: _Accumulator, slot: int) -> float | None:
    return acc[slot] / acc[slot + 1] if acc[slot + 1] else None


class MinuteRollups:
    """Accumulates mapped samples, in any order and over several calls, into per
    (attempt, host, GPU, minute) rollups; a repeat of the same attempt, GPU, metric and
    timestamp is counted and skipped."""

    def __init__(self) -> None:
        self.duplicates = 0
        self._gpu_numbers: dict[tuple[AttemptId, str, str], int] = {}
        self._gpus: list[tuple[AttemptId, str, str]] = []
        self._seen: set[int] = set()
        self._accumulators: dict[int, _Accumulator] = {}

    def gpu_number(self, attempt: AttemptId, host: str, gpu: str) -> int:
        """A small int naming an attempt's GPU, the same for the life of this object."""
        key = (attempt, host, gpu)
        number = self._gpu_numbers.get(key)
        if number is None:
            if len(self._gpus) >= 1 << _GPU_BITS:
                raise OverflowError("more GPUs than one rollup can number")
            number = self._gpu_numbers[key] = len(self._gpus)
            self._gpus.append(key)
        return number

    def add_value(self, gpu_number: int, metric: str, value: float, ts: int) -> None:
        """One kept sample of the numbered GPU (``Ingestor.feed`` inlines this)."""
        seen_key = ts << (_GPU_BITS + _METRIC_BITS) | gpu_number << _METRIC_BITS
        seen_key |= _METRIC_NUMBER[metric]
        if seen_key in self._seen:
            self.duplicates += 1
            return
        self._seen.add(seen_key)
        key = (ts // 60_000) << _GPU_BITS | gpu_number
        acc = self._accumulators.get(key)
        if acc is None:
            acc = self._accumulators[key] = _new_accumulator()
        _accumulate(acc, _METRIC_SLOT[metric], value, ts)

    @property
    def stats(self) -> RollupStats:
        return RollupStats(samples=len(self._seen), duplicates=self.duplicates)

    def add(self, mapped: Iterable[tuple[AttemptId, GpuSample]]) -> None:
        for attempt, sample in mapped:
            self.add_value(
                self.gpu_number(attempt, sample.host, sample.gpu),
                sample.metric,
                sample.value,
                sample.ts,
            )

    def rows(self) -> list[MinuteRollup]:
        rows = []
        gpus, mask = self._gpus, (1 << _GPU_BITS) - 1
        for key, acc in self._accumulators.items():
            attempt, host, gpu = gpus[key & mask]
            activity = _mean(acc, 0)
            if activity is None:
                utilization = _mean(acc, 2)
                activity = None if utilization is None else utilization / 100
            rows.append(
                MinuteRollup(
                    attempt_id=attempt,
                    host=host,
                    gpu=gpu,
                    minute=(key >> _GPU_BITS) * 60,
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


def _accumulate(acc: _Accumulator, slot: int, value: float, ts: int) -> None:
    if slot < _FB_SLOT:
        acc[slot] += value
        acc[slot + 1] += 1
    elif slot == _FB_SLOT:
        if acc[_FB_SLOT] is None or value > acc[_FB_SLOT]:
            acc[_FB_SLOT] = value
    elif value and ts >= acc[_XID_TS_SLOT]:  # XID_ERRORS: the last non-zero code
        acc[_XID_SLOT] = int(value)
        acc[_XID_TS_SLOT] = ts
    acc[_COUNT_SLOT] += 1


def rollup_minutes(
    mapped: Iterable[tuple[AttemptId, GpuSample]],
) -> tuple[list[MinuteRollup], RollupStats]:
    """Per (attempt, host, GPU, minute) rollups of mapped samples (see ``MinuteRollups``)."""
    rollups = MinuteRollups()
    rollups.add(mapped)
    return rollups.rows(), rollups.stats


# Parse + map + roll up in one pass ------------------------------------------------------


# What a sample line's head (name and labels) means to an ``Ingestor``: a metric Gantry
# does not use, or a kept metric with where its values go.
class _Ignored(enum.Enum):
    IGNORED = "ignored"


_IGNORED = _Ignored.IGNORED


# (accumulator slot, metric number, value ceiling, the attempt's GPU number for a
# labelled series (None: no attempt), and for an unlabelled series, whose attempt depends
# on the sample's time, a [lo, hi, GPU number] cell remembering the last answer and the
# span of time it holds for, else None). A tuple: it is unpacked once per sample.
_Route = tuple[int, int, float, int | None, list[Any] | None]
_LARGEST_FLOAT = sys.float_info.max  # a ceiling that lets every finite value through
_UNBOUNDED_MS = 1 << 256  # past any timestamp: an open window's bound


class Ingestor:
    """Parse, map and roll up scrapes in one pass: what ``ingest`` and the collector run.

    It gives exactly what ``ExpositionParser.parse`` → ``AllocationIndex.map`` →
    ``MinuteRollups.add`` give (a property test holds them equal), faster: dcgm-exporter
    repeats each label set on every scrape, so a line's head is looked up once per
    ingestor to learn its metric, its GPU and, for pod- and ``hpc_job``-labelled series,
    its attempt; then its value goes straight into the minute's accumulator, with no
    sample object in between. Lines it has not seen (and comments it has not cached,
    blanks with spaces, samples without labels) go through the parser one at a time.

    Samples stamped outside [start_ms, end_ms) are parsed and counted but not rolled up;
    samples that map to no attempt are counted per (minute, origin) in ``unmapped``.
    """

    def __init__(
        self,
        allocations: Iterable[Allocation],
        *,
        parser: ExpositionParser | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> None:
        self.parser = parser or ExpositionParser()
        self.index = AllocationIndex(allocations)
        self.rollups = MinuteRollups()
        self.stats = ParseStats()
        self.unmapped: Counter[tuple[int, str]] = Counter()  # (minute in Unix s, origin)
        # Ints, not infinities, when open: comparing ints with ints is the fast path.
        self.start_ms = -_UNBOUNDED_MS if start_ms is None else start_ms
        self.end_ms = _UNBOUNDED_MS if end_ms is None else end_ms
        self._routes: dict[str, _Route | _Ignored] = {}

    def rows(self) -> list[MinuteRollup]:
        return self.rollups.rows()

    def feed(self, body: bytes | str, *, default_ts: int, origin: str = "") -> None:
        """Ingest one scrape; ``default_ts`` (Unix ms) stamps samples without a timestamp.
        Raises ``BodyTooLarge`` over ``MAX_BODY_BYTES``, nothing else."""
        size = len(body.encode() if isinstance(body, str) else body)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(size)
        lines, undecodable = _split_lines(body)
        stats = self.stats
        stats.lines += len(lines) + undecodable
        stats.malformed += undecodable
        routes, comments = self._routes, self.parser._comments
        rollups = self.rollups
        seen, accumulators = rollups._seen, rollups._accumulators
        unmapped = self.unmapped
        start_ms, end_ms = self.start_ms, self.end_ms
        isfinite = math.isfinite
        kept = ignored = comment_lines = malformed = non_finite = out_of_range = duplicates = 0
        for line in lines:
            # A line's head is its name and labels, up to its last "}" (label values may
            # hold one); a line without one gets "" here, never a key of ``routes``.
            head, brace, rest = line.rpartition("}")
            route = routes.get(head)
            if route is None and brace:
                route = self._learn(head)
            if route is None:
                if not line:
                    stats.blanks += 1
                    continue
                comment = comments.get(line)
                if comment is None:
                    self._feed_line(line, default_ts, origin)
                elif comment is _MALFORMED_COMMENT:
                    malformed += 1
                else:
                    comment_lines += 1
                continue
            if route is _IGNORED:
                ignored += 1
                continue
            fields = rest.split()
            if len(fields) == 1:
                ts = default_ts
            elif len(fields) == 2 and "_" not in fields[1] and fields[1].isascii():
                try:
                    ts = int(fields[1])
                except ValueError:
                    malformed += 1
                    continue
            else:
                malformed += 1
                continue
            text = fields[0]
            if "_" in text or not text.isascii():  # float() takes 1_0 and non-ASCII digits
                malformed += 1
                continue
            try:
                value = float(text)
            except ValueError:
                malformed += 1
                continue
            slot, metric_number, ceiling, number, window = route
            if not 0 <= value <= ceiling:  # NaN fails every comparison
                if isfinite(value):
                    out_of_range += 1
                else:
                    non_finite += 1
                continue
            kept += 1
            if not start_ms <= ts < end_ms:
                continue
            if window is not None:
                if not window[0] <= ts < window[1]:
                    self._window_update(window, ts)
                number = window[2]
            if number is None:
                unmapped[(ts // 60_000 * 60, origin)] += 1
                continue
            # MinuteRollups.add_value, inlined: this is the loop every sample goes through.
            seen_key = ts << 35 | number << 3 | metric_number
            if seen_key in seen:
                duplicates += 1
                continue
            seen.add(seen_key)
            key = (ts // 60_000) << 32 | number
            acc = accumulators.get(key)
            if acc is None:
                acc = accumulators[key] = _new_accumulator()
            if slot < _FB_SLOT:
                acc[slot] += value
                acc[slot + 1] += 1
                acc[_COUNT_SLOT] += 1
            else:
                _accumulate(acc, slot, value, ts)
        rollups.duplicates += duplicates
        stats.samples += kept
        stats.ignored += ignored
        stats.comments += comment_lines
        stats.malformed += malformed
        stats.non_finite += non_finite
        stats.out_of_range += out_of_range

    def _feed_line(self, line: str, default_ts: int, origin: str) -> None:
        """The slow path: parse one line on its own (a comment seen for the first time, a
        malformed line, a sample without labels)."""
        result = self.parser.parse(line, default_ts=default_ts)
        result.stats.lines = 0  # counted by feed()
        self.stats.add(result.stats)
        inside = [s for s in result.samples if self.start_ms <= s.ts < self.end_ms]
        missed: list[GpuSample] = []
        mapped, _ = self.index.map(inside, missed)
        self.rollups.add(mapped)
        for sample in missed:
            self.unmapped[(sample.ts // 60_000 * 60, origin)] += 1

    def _learn(self, key: str) -> _Route | _Ignored | None:
        """The route of a sample line's head (the line before its last ``}``), remembered;
        None when the line is a comment or its head is malformed (the slow path counts
        it). The head means what ``ExpositionParser.parse`` makes of it."""
        head = key.lstrip(" \t") + "}"
        if head[0] == "#":
            return None
        name, series, ceiling = self.parser._heads.get(head) or self.parser._head(head)
        if series is None:
            return None
        if len(self._routes) >= _HEAD_CACHE_LIMIT:
            self._routes.clear()
        if ceiling is None:
            self._routes[key] = _IGNORED
            return _IGNORED
        host, gpu, _, pod, namespace, _, hpc_job = series
        number = window = None
        if pod or hpc_job:
            attempt = self.index.labelled_attempt(namespace, pod, hpc_job)
            if attempt is not None:
                number = self.rollups.gpu_number(attempt, host, gpu)
        else:
            window = [math.inf, -math.inf, None, host, gpu]  # empty span: looked up first
        ceiling = min(ceiling, _LARGEST_FLOAT)
        route = (_METRIC_SLOT[name], _METRIC_NUMBER[name], ceiling, number, window)
        self._routes[key] = route
        return route

    def _window_update(self, window: list[Any], ts: int) -> None:
        """Point an unlabelled series' window cell at the answer for ``ts``."""
        host, gpu = window[3], window[4]
        lo, hi, attempt = self.index.window_at(host, gpu, ts)
        number = None if attempt is None else self.rollups.gpu_number(attempt, host, gpu)
        window[:3] = lo, hi, number


def ingest(
    bodies: Iterable[tuple[bytes | str, int]],
    allocations: Iterable[Allocation],
    *,
    parser: ExpositionParser | None = None,
) -> tuple[list[MinuteRollup], ParseStats, int, RollupStats]:
    """Parse, map and roll up scrapes given as (body, scrape time in Unix ms); returns the
    rollups, the summed parse counts, the unmapped sample count and the rollup counts."""
    ingestor = Ingestor(allocations, parser=parser)
    for body, scraped_at in bodies:
        ingestor.feed(body, default_ts=scraped_at)
    return ingestor.rows(), ingestor.stats, ingestor.unmapped.total(), ingestor.rollups.stats
