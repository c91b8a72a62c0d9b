"""Roll mapped samples up per attempt, GPU and minute. Pure: plain data in, plain data
out."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from telemetry.exposition.mapping import AttemptId
from telemetry.exposition.parsing import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    KEPT_METRICS,
    MAX_SM_CLOCK,
    NVLINK_RX,
    NVLINK_TX,
    POWER_USAGE,
    SM_ACTIVE,
    SM_CLOCK,
    TENSOR_ACTIVE,
    XID_ERRORS,
    GpuSample,
)


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
    sm_clock_mhz: float | None = None  # the minute's mean
    max_sm_clock_mhz: float | None = None  # the minute's mean (a constant of the GPU)
    nvlink_bytes_s: float | None = None  # mean transmitted + mean received; None without both


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
    SM_CLOCK: 12,
    MAX_SM_CLOCK: 14,
    NVLINK_TX: 16,
    NVLINK_RX: 18,
}
_MEANS = len(_MEAN_SLOT)
FB_SLOT, _XID_SLOT, _XID_TS_SLOT, COUNT_SLOT = (2 * _MEANS + i for i in range(4))
# Where a kept metric's value goes: its accumulator slot (FB_USED and XID_ERRORS have their
# own rules) and its number among the kept metrics, part of the duplicate key.
METRIC_SLOT = {**_MEAN_SLOT, FB_USED: FB_SLOT, XID_ERRORS: _XID_SLOT}
METRIC_NUMBER = {metric: number for number, metric in enumerate(sorted(KEPT_METRICS))}
# Keys are ints, not tuples: (minute << 32 | gpu) for an accumulator and
# (ts << 36 | gpu << 4 | metric) for a seen sample, where gpu numbers an (attempt, host,
# GPU). Shifting keeps them unique for negative minutes and timestamps too.
GPU_BITS, METRIC_BITS = 32, 4
SEEN_TS_SHIFT = GPU_BITS + METRIC_BITS
if len(METRIC_NUMBER) > 1 << METRIC_BITS:
    raise ImportError("more kept metrics than a seen sample's key can number: widen METRIC_BITS")


# An accumulator: (sum, count) per mean metric, then the frame-buffer maximum (None before
# the first sample), the last XID code, its timestamp and the sample count.
_Accumulator = list[Any]


def new_accumulator() -> _Accumulator:
    return [0.0, 0] * _MEANS + [None, 0, -1, 0]


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
            if len(self._gpus) >= 1 << GPU_BITS:
                raise OverflowError("more GPUs than one rollup can number")
            number = self._gpu_numbers[key] = len(self._gpus)
            self._gpus.append(key)
        return number

    def add_value(self, gpu_number: int, metric: str, value: float, ts: int) -> None:
        """One kept sample of the numbered GPU (``Ingestor.feed`` inlines this)."""
        seen_key = ts << SEEN_TS_SHIFT | gpu_number << METRIC_BITS
        seen_key |= METRIC_NUMBER[metric]
        if seen_key in self._seen:
            self.duplicates += 1
            return
        self._seen.add(seen_key)
        key = (ts // 60_000) << GPU_BITS | gpu_number
        acc = self._accumulators.get(key)
        if acc is None:
            acc = self._accumulators[key] = new_accumulator()
        accumulate(acc, METRIC_SLOT[metric], value, ts)

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
        gpus, mask = self._gpus, (1 << GPU_BITS) - 1
        for key, acc in self._accumulators.items():
            attempt, host, gpu = gpus[key & mask]
            activity = _mean(acc, 0)
            if activity is None:
                utilization = _mean(acc, 2)
                activity = None if utilization is None else utilization / 100
            nvlink_tx, nvlink_rx = _mean(acc, 16), _mean(acc, 18)
            rows.append(
                MinuteRollup(
                    attempt_id=attempt,
                    host=host,
                    gpu=gpu,
                    minute=(key >> GPU_BITS) * 60,
                    activity=activity,
                    sm_active=_mean(acc, 4),
                    tensor_active=_mean(acc, 6),
                    dram_active=_mean(acc, 8),
                    fb_used=acc[FB_SLOT],
                    power=_mean(acc, 10),
                    xid=acc[_XID_SLOT],
                    samples=acc[COUNT_SLOT],
                    sm_clock_mhz=_mean(acc, 12),
                    max_sm_clock_mhz=_mean(acc, 14),
                    nvlink_bytes_s=None
                    if nvlink_tx is None or nvlink_rx is None
                    else nvlink_tx + nvlink_rx,
                )
            )
        rows.sort(key=lambda row: (str(row.attempt_id), row.host, row.gpu, row.minute))
        return rows


def accumulate(acc: _Accumulator, slot: int, value: float, ts: int) -> None:
    if slot < FB_SLOT:
        acc[slot] += value
        acc[slot + 1] += 1
    elif slot == FB_SLOT:
        if acc[FB_SLOT] is None or value > acc[FB_SLOT]:
            acc[FB_SLOT] = value
    elif value and ts >= acc[_XID_TS_SLOT]:  # XID_ERRORS: the last non-zero code
        acc[_XID_SLOT] = int(value)
        acc[_XID_TS_SLOT] = ts
    acc[COUNT_SLOT] += 1


def rollup_minutes(
    mapped: Iterable[tuple[AttemptId, GpuSample]],
) -> tuple[list[MinuteRollup], RollupStats]:
    """Per (attempt, host, GPU, minute) rollups of mapped samples (see ``MinuteRollups``)."""
    rollups = MinuteRollups()
    rollups.add(mapped)
    return rollups.rows(), rollups.stats
