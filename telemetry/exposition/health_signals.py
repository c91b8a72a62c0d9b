"""DCGM samples to node-health signals (``clusters.health.Signal``). Pure: plain data in,
plain data out; docs/node-health.md, "DCGM signals", says what each field means.

A signal belongs to the sample's node (its ``Hostname`` label, the name the backend gives
the node: mapping.py matches it against attempts' node lists the same way) and GPU (its
``gpu`` index label). Three kinds of field:

- the last XID (a gauge): a signal when it is non-zero and differs from the series' last
  value; the code's class from ``clusters.health.XIDS`` (unknown codes: XID_UNKNOWN).
- error counters: a signal when one grows between consecutive samples of its series. A
  counter that drops was reset (a driver reload, a GPU reset): no fault, the new value is
  the baseline. The first sample of a series has nothing to compare with, so it is no
  signal, except a volatile double-bit ECC count or the row-remap failure flag already
  above 0: both hold until the GPU is reset or repaired, so a GPU showing them *now* is
  faulty now, whenever the fault began. The aggregate DBE count is lifetime (kept in the
  InfoROM across resets) and says nothing about today at first sight.
- the clock-event reasons bitmask: a throttle class counts once it *persists*: set in at
  least ``PERSIST_SAMPLES`` consecutive samples spanning ``PERSIST_MS`` or more, with no gap
  over ``PERSIST_GAP_MS`` between them (a power cap for one sample is the GPU working as
  designed). While it persists, each batch gives one signal stamped with its onset.

``state`` carries each series' last value from batch to batch (the collector keeps it on
the cluster's ``ClusterTelemetry``), so growth across two fetches is seen. Samples come in
time order per series; one not newer than the series' last is skipped (a re-sent or
out-of-order sample). Signals carry the source's timestamp. A sample stamped more than
``FUTURE_TOLERANCE_MS`` after ``now_ms`` is refused (counted, no signal, state untouched),
as the rollups never count a sample into a minute that has not happened: a source whose
clock runs ahead must not place faults in the future. A flood (the same XID every second)
gives one signal per (node, GPU, class, code) per batch, the earliest.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from clusters.health import (
    XIDS,
    Signal,
    SignalClass,
    Source,
    throttle_classes,
    xid_class,
)
from telemetry.exposition.parsing import (
    CLOCK_EVENTS,
    ECC_DBE_AGG,
    ECC_DBE_VOL,
    NVLINK_CRC_DATA,
    NVLINK_CRC_FLIT,
    NVLINK_RECOVERY,
    NVLINK_REPLAY,
    PCIE_REPLAY,
    RETIRED_DBE,
    RETIRED_PENDING,
    RETIRED_SBE,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    ROWS_CORRECTABLE,
    ROWS_UNCORRECTABLE,
    XID_ERRORS,
    GpuSample,
)

PERSIST_SAMPLES = 2
PERSIST_MS = 60_000
PERSIST_GAP_MS = 300_000  # a longer silence starts a new run: nobody saw the time between
FUTURE_TOLERANCE_MS = 60_000  # NTP-synced clocks agree far better; a minute is a broken clock
STATE_RETENTION_MS = 7 * 86_400_000  # series unseen this long are forgotten (nodes removed)

# The error counters, with their class and what a person reads.
COUNTERS: dict[str, tuple[SignalClass, str]] = {
    ECC_DBE_VOL: (SignalClass.ECC_UNCORRECTABLE, "double-bit ECC errors (volatile)"),
    ECC_DBE_AGG: (SignalClass.ECC_UNCORRECTABLE, "double-bit ECC errors (aggregate)"),
    ROW_REMAP_FAILURE: (SignalClass.ROW_REMAP_FAILURE, "row-remap failure"),
    RETIRED_SBE: (SignalClass.ECC_PAGE_RETIREMENT, "pages retired for single-bit errors"),
    RETIRED_DBE: (SignalClass.ECC_PAGE_RETIREMENT, "pages retired for double-bit errors"),
    RETIRED_PENDING: (SignalClass.ECC_PAGE_RETIREMENT, "page retirement pending"),
    ROWS_UNCORRECTABLE: (SignalClass.ECC_PAGE_RETIREMENT, "rows remapped (uncorrectable)"),
    ROWS_CORRECTABLE: (SignalClass.ECC_PAGE_RETIREMENT, "rows remapped (correctable)"),
    ROW_REMAP_PENDING: (SignalClass.ECC_PAGE_RETIREMENT, "row remapping pending"),
    NVLINK_CRC_FLIT: (SignalClass.NVLINK_ERRORS, "NVLink CRC flit errors"),
    NVLINK_CRC_DATA: (SignalClass.NVLINK_ERRORS, "NVLink CRC data errors"),
    NVLINK_REPLAY: (SignalClass.NVLINK_ERRORS, "NVLink replay errors"),
    NVLINK_RECOVERY: (SignalClass.NVLINK_ERRORS, "NVLink recovery errors"),
    PCIE_REPLAY: (SignalClass.PCIE_REPLAY, "PCIe replays"),
}
# Counters whose value above 0 at first sight is a fault now (see the module's docstring).
FAULT_AT_FIRST_SIGHT = frozenset({ECC_DBE_VOL, ROW_REMAP_FAILURE})
THROTTLE_NAMES = {SignalClass.THERMAL_THROTTLE: "thermal", SignalClass.POWER_THROTTLE: "power"}

# A series' state: [last value, its ts] (the clock-events mask too), and [onset, last ts,
# samples] for a throttle class's run. JSON-friendly: lists of numbers under string keys.
State = dict[str, list[float]]


@dataclass(slots=True)
class HealthBatch:
    signals: list[Signal]
    state: State
    future: int = 0  # samples refused: stamped after now + FUTURE_TOLERANCE_MS
    nameless: int = 0  # samples without a Hostname label: no node to blame
    stale: int = 0  # samples not newer than their series' last
    latest_future_ms: int = 0  # the furthest ahead of now a refused sample was, in ms
    _sent: set[tuple[str, str, str, str]] = field(default_factory=set)

    def emit(self, signal: Signal) -> None:
        key = (signal.node, signal.gpu, signal.signal, signal.code)
        if key not in self._sent:  # samples come in time order: the first is the earliest
            self._sent.add(key)
            self.signals.append(signal)


def _key(sample: GpuSample, suffix: str = "") -> str:
    return f"{sample.host}\t{sample.gpu}\t{sample.metric}{suffix}"


def _signal(sample: GpuSample, signal: SignalClass, code: str, detail: str, at_ms: int) -> Signal:
    return Signal(
        node=sample.host,
        signal=signal,
        source=Source.DCGM,
        at=at_ms / 1000,
        gpu=sample.gpu,
        code=code,
        detail=detail,
    )


def _xid(batch: HealthBatch, sample: GpuSample) -> None:
    key = _key(sample)
    last = batch.state.get(key)
    code = int(sample.value)
    batch.state[key] = [code, sample.ts]
    if code == 0 or (last is not None and int(last[0]) == code):
        return
    xid = XIDS.get(code)
    what = xid.description if xid else "(a code not in Gantry's table of NVIDIA's XIDs)"
    batch.emit(_signal(sample, xid_class(code), str(code), f"XID {code} {what}", sample.ts))


def _counter(batch: HealthBatch, sample: GpuSample) -> None:
    key = _key(sample)
    last = batch.state.get(key)
    batch.state[key] = [sample.value, sample.ts]
    signal, label = COUNTERS[sample.metric]
    if last is None:
        if sample.metric in FAULT_AT_FIRST_SIGHT and sample.value > 0:
            detail = f"{label}: {sample.value:g} when Gantry first read this GPU"
            batch.emit(_signal(sample, signal, sample.metric, detail, sample.ts))
    elif sample.value > last[0]:  # a drop is a reset, not a fault
        detail = f"{label} grew from {last[0]:g} to {sample.value:g}"
        batch.emit(_signal(sample, signal, sample.metric, detail, sample.ts))


def _clock_events(batch: HealthBatch, sample: GpuSample) -> None:
    mask = int(sample.value)
    batch.state[_key(sample)] = [mask, sample.ts]
    showing = throttle_classes(mask)
    for signal, name in THROTTLE_NAMES.items():
        key = _key(sample, ":" + signal.value)
        run = batch.state.get(key)
        if signal not in showing:
            batch.state.pop(key, None)
            continue
        if run is None or sample.ts - run[1] > PERSIST_GAP_MS:
            run = [sample.ts, sample.ts, 1]
        else:
            run = [run[0], sample.ts, run[2] + 1]
        batch.state[key] = run
        onset, count = int(run[0]), int(run[2])
        if count >= PERSIST_SAMPLES and sample.ts - onset >= PERSIST_MS:
            seconds = (sample.ts - onset) // 1000
            detail = (
                f"{name} throttling: clock event reasons {mask:#x} for {seconds} s "
                f"({count} samples)"
            )
            batch.emit(_signal(sample, signal, CLOCK_EVENTS, detail, onset))


def health_signals(
    samples: Iterable[GpuSample], state: Mapping[str, Sequence[float]], *, now_ms: int
) -> HealthBatch:
    """The signals in ``samples`` (parsed with ``HEALTH_CEILING``) given the series' last
    values in ``state``; the batch holds the new state. ``state`` itself is not changed."""
    batch = HealthBatch(signals=[], state={key: list(entry) for key, entry in state.items()})
    horizon = now_ms + FUTURE_TOLERANCE_MS
    kept = []
    for sample in samples:
        if not sample.host:
            batch.nameless += 1
        elif sample.ts > horizon:
            batch.future += 1
            batch.latest_future_ms = max(batch.latest_future_ms, sample.ts - now_ms)
        else:
            kept.append(sample)
    kept.sort(key=lambda sample: sample.ts)
    for sample in kept:
        last = batch.state.get(_key(sample))
        if last is not None and sample.ts <= last[1]:
            batch.stale += 1
        elif sample.metric == XID_ERRORS:
            _xid(batch, sample)
        elif sample.metric == CLOCK_EVENTS:
            _clock_events(batch, sample)
        elif sample.metric in COUNTERS:
            _counter(batch, sample)
    cutoff = now_ms - STATE_RETENTION_MS
    batch.state = {key: entry for key, entry in batch.state.items() if entry[1] >= cutoff}
    return batch
