"""The simulator's faults: which GPUs of a simulated cluster fail, when, and how. Pure: no
ORM, no clock.

A simulator cluster's settings may carry ``"faults"``::

    {"seed": 7,
     "rates_per_node_day": {"gpu_lost": 0.02, "ecc_uncorrectable": 0.01, "nvlink": 0.01},
     "lemons": {"<node>": {"class": "ecc_uncorrectable", "every_s": 3600, "gpu": 3}},
     "throttled": {"<node>": {"gpu": 2, "reasons": 64}}}

Faults are drawn from a seeded hash of (seed, node, hour bucket, class), never from a
stateful random generator: the web process, the worker and beat each compute the same
faults for the same window, a replay gives exactly the same ones, and asking for a window
twice (or in two halves) gives the same answer. Each class with a rate has one Bernoulli
draw per node and hour, with probability rate × 1/24, so the count over many node-days is
close to the rate; a lemon fails at its period, every ``every_s`` seconds (its phase drawn
from the seed); a throttled GPU reports its clock-event reasons all the time and slows the
jobs that use it (a gang runs at its slowest GPU's pace).
"""

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusters.health import (
    CLOCK_EVENT_HW_POWER_BRAKE,
    CLOCK_EVENT_HW_SLOWDOWN,
    CLOCK_EVENT_HW_THERMAL,
    HARDWARE_CLASSES,
    XIDS,
    SignalClass,
)

BUCKET_S = 3600  # one draw per node, class and hour
DAY_S = 86400
MAX_RATE_PER_NODE_DAY = 24.0  # one draw an hour: at most one fault of a class per hour
MIN_LEMON_EVERY_S = 60
MAX_LEMON_EVERY_S = 30 * DAY_S
MAX_SEED = 2**63 - 1
# dcgm-exporter's DCGM_FI_DEV_XID_ERRORS is the last XID the GPU reported: the simulator
# holds it this long after a fault, or until the node returns to service (a person released
# it after the repair, which resets the GPU), whichever comes first.
XID_HOLD_S = 6 * 3600
# The XID code each injectable class reports (NVIDIA's catalog via clusters.health.XIDS).
# XID_UNKNOWN's code is one the table does not list (a driver newer than the table).
CLASS_XID: dict[SignalClass, int] = {
    SignalClass.GPU_LOST: 79,
    SignalClass.ECC_UNCORRECTABLE: 48,
    SignalClass.NVLINK: 74,
    SignalClass.GPU_RESET_NEEDED: 119,
    SignalClass.ROW_REMAP_FAILURE: 64,
    SignalClass.ECC_PAGE_RETIREMENT: 63,
    SignalClass.XID_APPLICATION: 13,
    SignalClass.XID_UNKNOWN: 999,
}
INJECTABLE = tuple(CLASS_XID)
# Faults whose GPU needs the whole node rebooted (the catalog's RESTART_BM): every job on
# the node fails, as a node failure; the others fail the jobs using that GPU, as a GPU XID.
NODE_WIDE = frozenset({SignalClass.GPU_LOST})
# NVIDIA: these clock-event reasons cut the core clocks by half or more (dcgm_fields.h);
# the software ones (power cap, software thermal) cost less, here a fifth (an assumption).
HW_CLOCK_BITS = CLOCK_EVENT_HW_SLOWDOWN | CLOCK_EVENT_HW_THERMAL | CLOCK_EVENT_HW_POWER_BRAKE
HW_THROTTLED_SPEED = 0.5
SW_THROTTLED_SPEED = 0.8
MAX_CLOCK_REASONS = 0x1FF  # the bits dcgm_fields.h defines


@dataclass(frozen=True, slots=True)
class Lemon:
    signal: SignalClass
    every_s: int
    gpu: int = 0


@dataclass(frozen=True, slots=True)
class Throttle:
    gpu: int
    reasons: int  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits
    speed: float  # the share of its normal pace a job on it keeps


@dataclass(frozen=True, slots=True)
class FaultSettings:
    seed: int = 0
    rates: Mapping[SignalClass, float] = field(default_factory=dict)  # per node-day
    lemons: Mapping[str, Lemon] = field(default_factory=dict)
    throttled: Mapping[str, Throttle] = field(default_factory=dict)

    @property
    def injects(self) -> bool:
        """Whether any fault can occur (throttling is no fault: nothing fails)."""
        return bool(self.lemons) or any(rate > 0 for rate in self.rates.values())


NO_FAULTS = FaultSettings()


@dataclass(frozen=True, slots=True, order=True)
class Fault:
    at: float  # Unix seconds
    node: str
    gpu: int
    signal: SignalClass
    xid: int
    lemon: bool = False

    @property
    def fatal(self) -> bool:
        """Whether the jobs it hits fail (a hardware class); the others only show in the
        telemetry."""
        return self.signal in HARDWARE_CLASSES

    @property
    def node_wide(self) -> bool:
        return self.signal in NODE_WIDE

    @property
    def failure_reason(self) -> str:
        return "NODE_FAILURE" if self.node_wide else "GPU_XID"

    @property
    def exit_code(self) -> int:
        """A node that must be rebooted takes its processes with it (killed: 128 + SIGKILL,
        as Kubernetes reports a lost node's pods); a GPU error makes CUDA raise, and the
        program exits 1."""
        return 137 if self.node_wide else 1

    @property
    def description(self) -> str:
        xid = XIDS.get(self.xid)
        return f"XID {self.xid} ({xid.description})" if xid else f"XID {self.xid} (unknown)"

    def message(self) -> str:
        """What the failed job says: the node, the GPU, the XID."""
        what = "the node went down with it" if self.node_wide else "the job's processes exited"
        return f"{self.description} on GPU {self.gpu} of {self.node}: {what}"


def _where(path: str) -> str:
    return f"faults.{path}" if path else "faults"


def _int(value: object, path: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{_where(path)} must be a whole number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{_where(path)} must be from {low} to {high}, got {value}")
    return value


def _object(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{_where(path)} must be an object, got {type(value).__name__}")
    return value


def _keys(value: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(key) for key in value if key not in allowed)
    if unknown:
        raise ValueError(
            f"{_where(path)}: unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )


def _class(value: object, path: str) -> SignalClass:
    if value not in CLASS_XID:
        raise ValueError(
            f"{_where(path)}: the simulator cannot inject {value!r}; it injects "
            f"{', '.join(INJECTABLE)}"
        )
    return SignalClass(str(value))


def _node(name: str, path: str, nodes: Mapping[str, int]) -> int:
    if name not in nodes:
        raise ValueError(f"{_where(path)}: no node named {name} in this cluster")
    return nodes[name]


def fault_settings(raw: object, *, nodes: Mapping[str, int]) -> FaultSettings:
    """The fault settings ``raw`` (a cluster's ``settings["faults"]``, or None) describe, for
    a cluster whose nodes have ``nodes`` (name -> GPUs). Anything wrong is a ValueError that
    names the setting and says what is allowed; nothing is left out silently."""
    if raw is None:
        return NO_FAULTS
    settings = _object(raw, "")
    _keys(settings, "", ("seed", "rates_per_node_day", "lemons", "throttled"))
    seed = _int(settings.get("seed", 0), "seed", 0, MAX_SEED)
    rates: dict[SignalClass, float] = {}
    for key, rate in _object(settings.get("rates_per_node_day", {}), "rates_per_node_day").items():
        path = f"rates_per_node_day.{key}"
        signal = _class(key, path)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
            raise ValueError(f"{_where(path)} must be a number, got {rate!r}")
        if not 0 <= rate <= MAX_RATE_PER_NODE_DAY:
            raise ValueError(
                f"{_where(path)} must be from 0 to {MAX_RATE_PER_NODE_DAY:g} faults per "
                f"node-day, got {rate}"
            )
        rates[signal] = float(rate)
    lemons: dict[str, Lemon] = {}
    for name, entry in _object(settings.get("lemons", {}), "lemons").items():
        path = f"lemons.{name}"
        gpus = _node(name, path, nodes)
        lemon = _object(entry, path)
        _keys(lemon, path, ("class", "every_s", "gpu"))
        if "class" not in lemon or "every_s" not in lemon:
            raise ValueError(f"{_where(path)} needs a class and every_s")
        lemons[name] = Lemon(
            signal=_class(lemon["class"], f"{path}.class"),
            every_s=_int(lemon["every_s"], f"{path}.every_s", MIN_LEMON_EVERY_S, MAX_LEMON_EVERY_S),
            gpu=_int(lemon.get("gpu", 0), f"{path}.gpu", 0, gpus - 1),
        )
    throttled: dict[str, Throttle] = {}
    for name, entry in _object(settings.get("throttled", {}), "throttled").items():
        path = f"throttled.{name}"
        gpus = _node(name, path, nodes)
        throttle = _object(entry, path)
        _keys(throttle, path, ("gpu", "reasons", "speed"))
        reasons = _int(throttle.get("reasons"), f"{path}.reasons", 1, MAX_CLOCK_REASONS)
        speed = throttle.get("speed", throttled_speed(reasons))
        if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0 < speed <= 1:
            raise ValueError(f"{_where(path)}.speed must be a number above 0, at most 1")
        throttled[name] = Throttle(
            gpu=_int(throttle.get("gpu", 0), f"{path}.gpu", 0, gpus - 1),
            reasons=reasons,
            speed=float(speed),
        )
    return FaultSettings(seed=seed, rates=rates, lemons=lemons, throttled=throttled)


def throttled_speed(reasons: int) -> float:
    """The pace a GPU keeps with these clock-event reasons."""
    return HW_THROTTLED_SPEED if reasons & HW_CLOCK_BITS else SW_THROTTLED_SPEED


def gang_speed(allocation: Mapping[str, Iterable[int]], settings: FaultSettings) -> float:
    """The pace of a job holding ``allocation`` (node -> GPU indices): a synchronous gang
    waits for its slowest GPU."""
    speed = 1.0
    for node, gpus in allocation.items():
        throttle = settings.throttled.get(node)
        if throttle is not None and throttle.gpu in set(gpus):
            speed = min(speed, throttle.speed)
    return speed


def _draw(*parts: object) -> bytes:
    text = "|".join(str(part) for part in parts)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _unit(data: bytes) -> float:
    """A number in [0, 1) from 8 bytes."""
    return int.from_bytes(data[:8]) / 2**64


def _random_faults(
    node: str, gpus: int, settings: FaultSettings, start: float, end: float
) -> list[Fault]:
    found = []
    chances = [(signal, rate * BUCKET_S / DAY_S) for signal, rate in settings.rates.items()]
    chances = [(signal, chance) for signal, chance in chances if chance]
    for bucket in range(math.floor(start / BUCKET_S), math.ceil(end / BUCKET_S)):
        for signal, chance in chances:
            draw = _draw(settings.seed, node, bucket, signal.value)
            if _unit(draw) >= chance:
                continue
            at = bucket * BUCKET_S + int.from_bytes(draw[8:12]) / 2**32 * BUCKET_S
            if start <= at < end:
                gpu = int.from_bytes(draw[12:16]) % gpus
                found.append(Fault(at, node, gpu, signal, CLASS_XID[signal]))
    return found


def lemon_phase_s(node: str, lemon: Lemon, seed: int) -> int:
    """Seconds past each multiple of ``every_s`` (from the Unix epoch) at which it fails."""
    return int.from_bytes(_draw(seed, node, "lemon")[:8]) % lemon.every_s


def _lemon_faults(node: str, lemon: Lemon, seed: int, start: float, end: float) -> list[Fault]:
    phase = lemon_phase_s(node, lemon, seed)
    first = math.ceil((start - phase) / lemon.every_s)
    found = []
    k = first
    while (at := k * lemon.every_s + phase) < end:
        if at >= start:
            found.append(
                Fault(float(at), node, lemon.gpu, lemon.signal, CLASS_XID[lemon.signal], True)
            )
        k += 1
    return found


def faults_between(
    nodes: Mapping[str, int], settings: FaultSettings, *, start: float, end: float
) -> list[Fault]:
    """Every fault on ``nodes`` (name -> GPUs) in [start, end), Unix seconds, by time. The
    same for any split of the window: a fault belongs to the instant it occurs at."""
    if not settings.injects or end <= start:
        return []
    found: list[Fault] = []
    for node, gpus in nodes.items():
        if gpus < 1:
            continue
        found += _random_faults(node, gpus, settings, start, end)
        lemon = settings.lemons.get(node)
        if lemon is not None:
            found += _lemon_faults(node, lemon, settings.seed, start, end)
    return sorted(found)


def first_fault_hitting(
    allocation: Mapping[str, Iterable[int]],
    gpus_of: Mapping[str, int],
    settings: FaultSettings,
    *,
    start: float,
    end: float,
) -> Fault | None:
    """The first fatal fault in [start, end) that hits a job holding ``allocation`` (node ->
    GPU indices): on one of its GPUs, or anywhere on one of its nodes for a node-wide one."""
    held = {node: set(gpus) for node, gpus in allocation.items()}
    nodes = {node: gpus_of[node] for node in held if node in gpus_of}
    for fault in faults_between(nodes, settings, start=start, end=end):
        if fault.fatal and (fault.node_wide or fault.gpu in held[fault.node]):
            return fault
    return None


@dataclass(frozen=True, slots=True)
class GaugeReading:
    node: str
    gpu: int
    at: float  # Unix seconds
    metric: str  # "xid" or "clock_reasons"
    value: int


def gauge_readings(
    nodes: Mapping[str, int],
    settings: FaultSettings,
    *,
    start: float,
    end: float,
    every_s: int,
    released: Mapping[str, float] | None = None,
) -> list[GaugeReading]:
    """What the exporter, scraped every ``every_s`` seconds (on multiples of it), reports in
    [start, end) for the GPUs faults touched: each faulty GPU's last XID, from its fault for
    ``XID_HOLD_S`` or until its node's return to service (``released``: node -> Unix s)
    after the fault; and each throttled GPU's clock-event reasons, all the time."""
    released = released or {}
    readings: list[GaugeReading] = []
    faults = faults_between(nodes, settings, start=start - XID_HOLD_S, end=end)
    last: dict[tuple[str, int], list[Fault]] = {}
    for fault in faults:
        last.setdefault((fault.node, fault.gpu), []).append(fault)
    first_tick = math.ceil(start / every_s) * every_s
    ticks = range(first_tick, math.ceil(end / every_s) * every_s, every_s)
    for (node, gpu), seen in sorted(last.items()):
        index = 0
        for tick in ticks:
            while index < len(seen) and seen[index].at <= tick:
                index += 1
            if index == 0:
                continue
            fault = seen[index - 1]
            if tick - fault.at < XID_HOLD_S and not fault.at < released.get(node, -1) <= tick:
                readings.append(GaugeReading(node, gpu, float(tick), "xid", fault.xid))
    for node, throttle in sorted(settings.throttled.items()):
        if node in nodes:
            readings += [
                GaugeReading(node, throttle.gpu, float(tick), "clock_reasons", throttle.reasons)
                for tick in ticks
            ]
    return readings
