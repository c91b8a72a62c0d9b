"""InfiniBand port counters from Prometheus' node exporter (its ``infiniband`` collector),
parsed and rolled up per node and minute. Pure: plain data in, plain data out.

The node exporter reads ``/sys/class/infiniband/<device>/ports/<port>/counters`` and writes
one counter per device and port, labelled ``device`` and ``port`` (collector
``infiniband_linux.go``; the data counters are already in bytes: procfs multiplies the
kernel's per-lane octets by 4). It writes no host label: a node's series are named by the
``Hostname``/``hostname`` label when a relabelling added one, else by Prometheus'
``instance`` without its port, else by the host of the URL Gantry scraped.

Counters become rates from their growth between consecutive samples of a series, as the
DCGM error counters become signals (``health_signals``): a counter that drops was reset (a
driver reload, a reboot), so the pair is skipped and the new value is the baseline; two
samples more than ``MAX_GAP_MS`` apart give no rate (nobody saw the time between); a sample
with the timestamp of an earlier one is a duplicate and counted once. Growth between two
samples belongs to the minute of the later one; a minute's traffic is its pairs' growth over
their time, summed over the node's ports.
"""

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from telemetry.exposition.parsing import parse_labels, split_lines

# The node exporter's names (collector/infiniband_linux.go, prefixed node_infiniband_).
IB_TRANSMITTED = "node_infiniband_port_data_transmitted_bytes_total"
IB_RECEIVED = "node_infiniband_port_data_received_bytes_total"
IB_SYMBOL_ERRORS = "node_infiniband_symbol_error_total"
IB_LINK_ERROR_RECOVERIES = "node_infiniband_link_error_recovery_total"
IB_LINK_DOWNED = "node_infiniband_link_downed_total"
IB_RECEIVE_ERRORS = "node_infiniband_port_errors_received_total"
TRAFFIC_COUNTERS = (IB_TRANSMITTED, IB_RECEIVED)
# Minor link errors on a lane, recoveries from a link error state, links that went down and
# received packets with an error: any growth is a sign of a bad cable, port or transceiver.
ERROR_COUNTERS = (IB_SYMBOL_ERRORS, IB_LINK_ERROR_RECOVERIES, IB_LINK_DOWNED, IB_RECEIVE_ERRORS)
LINK_METRICS = frozenset(TRAFFIC_COUNTERS + ERROR_COUNTERS)
# Every line of these metrics holds it: a body without it is skipped without being split.
MARKER = b"node_infiniband_"
_PREFIX = MARKER.decode()
MAX_GAP_MS = 300_000  # the health signals' PERSIST_GAP_MS: a longer silence is a gap
HOST_LABELS = ("Hostname", "hostname")


@dataclass(slots=True)
class LinkSample:
    host: str
    device: str  # the HCA, e.g. mlx5_0
    port: str
    metric: str
    value: float
    ts: int  # Unix milliseconds


@dataclass(slots=True)
class LinkParseStats:
    samples: int = 0  # kept
    rejected: int = 0  # malformed, non-finite or negative lines of these metrics
    nameless: int = 0  # no host label, no instance and no scrape host: no node to name


def instance_host(instance: str) -> str:
    """The host of a Prometheus ``instance`` label: ``gpu-07:9100`` → ``gpu-07``,
    ``[fd00::7]:9100`` → ``fd00::7``; an instance without a port is the host itself."""
    if instance.startswith("["):
        return instance[1:].partition("]")[0]
    host, colon, port = instance.rpartition(":")
    return host if colon and port.isdigit() and ":" not in host else instance


def scrape_host(origin: str) -> str:
    """The host of a scraped URL, which names the node of a node exporter's samples; "" for
    other origins (a Prometheus answer's series carry their ``instance``)."""
    if not origin.startswith(("http://", "https://")):
        return ""
    try:
        return urlsplit(origin).hostname or ""
    except ValueError:
        return ""


def _value_and_stamp(fields: list[str], default_ts: int) -> tuple[float | None, int | None]:
    """A sample line's value and timestamp (Unix ms, ``default_ts`` when it has none); None
    for what does not parse."""
    if not 1 <= len(fields) <= 2 or any("_" in f or not f.isascii() for f in fields):
        return None, None  # float() and int() take 1_0 and non-ASCII digits
    try:
        value: float | None = float(fields[0])
    except ValueError:
        value = None
    try:
        stamp: int | None = int(fields[1]) if len(fields) == 2 else default_ts
    except ValueError:
        stamp = None
    return value, stamp


class LinkParser:
    """Reads the InfiniBand counters out of exposition bodies (any other line is skipped),
    keeping what label sets mean between bodies."""

    def __init__(self) -> None:
        self._series: dict[str, tuple[str, str, str] | None] = {}

    def _labels(self, text: str, default_host: str) -> tuple[str, str, str] | None:
        """(host, device, port) of a label set; None when malformed or nameless ("" host)."""
        key = f"{default_host}\n{text}"
        if key in self._series:
            return self._series[key]
        labels = parse_labels(text)
        series = None
        if labels is not None:
            host = next((labels[name] for name in HOST_LABELS if labels.get(name)), "")
            host = host or instance_host(labels.get("instance", "")) or default_host
            series = (host, labels.get("device", ""), labels.get("port", ""))
        if len(self._series) >= 100_000:
            self._series.clear()
        self._series[key] = series
        return series

    def parse(
        self, body: bytes | str, *, default_ts: int, default_host: str = ""
    ) -> tuple[list[LinkSample], LinkParseStats]:
        """The counters' samples in ``body``; ``default_ts`` (Unix ms) stamps samples without
        a timestamp, ``default_host`` names the node of series without a host label."""
        stats = LinkParseStats()
        samples: list[LinkSample] = []
        if MARKER not in (body if isinstance(body, bytes) else body.encode()):
            return samples, stats
        lines, _ = split_lines(body)
        for raw in lines:
            line = raw.strip(" \t")
            if not line.startswith(_PREFIX):
                continue
            brace = line.find("{")
            close = line.rfind("}")
            if brace < 0 or close < brace:
                name, _, rest = line.partition(" ")
                text = ""
            else:
                name, text, rest = (
                    line[:brace].rstrip(" \t"),
                    line[brace + 1 : close],
                    line[close + 1 :],
                )
            if name not in LINK_METRICS:
                continue
            series = self._labels(text, default_host)
            value, stamp = _value_and_stamp(rest.split(), default_ts)
            if series is None or value is None or stamp is None or not 0 <= value < math.inf:
                stats.rejected += 1
            elif not series[0]:
                stats.nameless += 1
            else:
                stats.samples += 1
                samples.append(LinkSample(*series, name, value, stamp))
        return samples, stats


@dataclass(frozen=True, slots=True)
class NodeLinkRollup:
    host: str
    minute: int  # Unix seconds at the start of the minute
    ib_bytes_s: float | None  # transmitted + received over the node's ports; None: no rate
    ib_errors: int  # growth of the error counters over the node's ports
    ports: int  # (device, port) pairs with a traffic rate in the minute
    samples: int  # counter samples stamped in the minute


_Series = tuple[str, str, str, str]  # host, device, port, metric


class NodeLinkRollups:
    """Accumulates counter samples, in any order and over several calls, into per (node,
    minute) rollups of the minutes of [start_ms, end_ms); samples before ``start_ms`` are
    baselines only (the collector reads ``MAX_GAP_MS`` before a window for them)."""

    def __init__(self, *, start_ms: int, end_ms: int) -> None:
        self.start_ms, self.end_ms = start_ms, end_ms
        self.duplicates = 0
        self._values: dict[_Series, dict[int, float]] = defaultdict(dict)

    def add(self, samples: Iterable[LinkSample]) -> None:
        for sample in samples:
            if sample.ts >= self.end_ms:
                continue
            series = self._values[(sample.host, sample.device, sample.port, sample.metric)]
            if sample.ts in series:
                self.duplicates += 1
            else:
                series[sample.ts] = sample.value

    def rows(self) -> list[NodeLinkRollup]:
        # Per (host, minute): samples; per (host, minute, device, port, metric) of traffic:
        # [growth, milliseconds]; per (host, minute): error growth.
        counted: dict[tuple[str, int], int] = defaultdict(int)
        traffic: dict[tuple[str, int, str, str, str], list[float]] = {}
        errors: dict[tuple[str, int], float] = defaultdict(float)
        for (host, device, port, metric), values in self._values.items():
            stamps = sorted(values)
            for i, ts in enumerate(stamps):
                if ts < self.start_ms:
                    continue
                minute = ts // 60_000 * 60
                counted[(host, minute)] += 1
                if i == 0 or ts - stamps[i - 1] > MAX_GAP_MS:
                    continue
                growth = values[ts] - values[stamps[i - 1]]
                if growth < 0:  # a reset: the new value is the baseline
                    continue
                if metric in ERROR_COUNTERS:
                    errors[(host, minute)] += growth
                    continue
                cell = traffic.setdefault((host, minute, device, port, metric), [0.0, 0])
                cell[0] += growth
                cell[1] += ts - stamps[i - 1]
        rates: dict[tuple[str, int], float] = defaultdict(float)
        ports: dict[tuple[str, int], set[tuple[str, str]]] = defaultdict(set)
        for (host, minute, device, port, _), (growth, ms) in traffic.items():
            rates[(host, minute)] += growth * 1000 / ms
            ports[(host, minute)].add((device, port))
        return [
            NodeLinkRollup(
                host=host,
                minute=minute,
                ib_bytes_s=rates.get((host, minute)),
                ib_errors=round(errors.get((host, minute), 0.0)),
                ports=len(ports.get((host, minute), ())),
                samples=count,
            )
            for (host, minute), count in sorted(counted.items())
        ]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_link_samples(samples: Iterable[LinkSample]) -> str:
    """Exposition text for ``samples`` as a Prometheus answer gives them back: labelled
    with ``instance`` (the host and the exporter's port 9100), ``device`` and ``port``, with
    timestamps (used by the simulator and tests)."""
    return "".join(
        f'{s.metric}{{device="{_escape(s.device)}",instance="{_escape(s.host)}:9100",'
        f'port="{_escape(s.port)}"}} {s.value!r} {s.ts}\n'
        for s in samples
    )
