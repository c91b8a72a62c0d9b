"""Parse the Prometheus text exposition of dcgm-exporter, and render it back. Pure: plain
data in, plain data out.

The parser never raises on bad input (only on a body over the size cap): every line is
counted exactly once in ``ParseStats`` as a kept sample, a comment, a blank, a malformed
line, a sample of a metric Gantry does not use, or a kept metric with a non-finite or
out-of-range value. Timestamps are Unix milliseconds, as in the exposition format.
"""

import math
import re
from collections.abc import Iterable, Mapping
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
# What a slow GPU or a slow link shows (issue 36, docs/telemetry-sources.md): the SM clock
# and its maximum in MHz (fields 100 and 113), NVLink traffic in bytes/s (1011, 1012).
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
MAX_SM_CLOCK = "DCGM_FI_DEV_MAX_SM_CLOCK"
NVLINK_TX = "DCGM_FI_PROF_NVLINK_TX_BYTES"
NVLINK_RX = "DCGM_FI_PROF_NVLINK_RX_BYTES"
# The node-health fields (docs/node-health.md, "DCGM signals"), by dcgm-exporter's names.
ECC_DBE_VOL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ECC_DBE_AGG = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
RETIRED_SBE = "DCGM_FI_DEV_RETIRED_SBE"
RETIRED_DBE = "DCGM_FI_DEV_RETIRED_DBE"
RETIRED_PENDING = "DCGM_FI_DEV_RETIRED_PENDING"
ROWS_UNCORRECTABLE = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
ROWS_CORRECTABLE = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
ROW_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
NVLINK_CRC_FLIT = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
NVLINK_CRC_DATA = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
NVLINK_REPLAY = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
NVLINK_RECOVERY = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"


@dataclass(frozen=True, slots=True)
class DcgmField:
    name: str  # dcgm-exporter's name (its default CSV's), the one Gantry uses inside
    field_id: int  # DCGM's field ID (dcgm_fields.h): the names change, the IDs do not
    alias: str  # the field's other name ("" if none): DCGM 4.6 renamed fields (the old
    # names stay as deprecated aliases), and field 112 was named *_THROTTLE_* before


# The one table of DCGM field names Gantry reads: every name a series may carry maps to
# the field's name above (``FIELD_NAMES``), so a DCGM 4.6 exporter's series count as the
# same field. Sources: DCGM 4.6 dcgmlib/dcgm_fields.h, "Deprecated: renamed per DCGM Field
# Naming Standard"; dcgm-exporter etc/default-counters.csv.
DCGM_FIELDS = (
    DcgmField(XID_ERRORS, 230, "DCGM_FI_DEV_XID_ERROR"),
    DcgmField(ECC_DBE_VOL, 311, ""),
    DcgmField(ECC_DBE_AGG, 313, ""),
    DcgmField(RETIRED_SBE, 390, "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL"),
    DcgmField(RETIRED_DBE, 391, "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL"),
    DcgmField(RETIRED_PENDING, 392, "DCGM_FI_DEV_PAGE_RETIRED_PENDING"),
    DcgmField(ROWS_UNCORRECTABLE, 393, "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
    DcgmField(ROWS_CORRECTABLE, 394, "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"),
    DcgmField(ROW_REMAP_FAILURE, 395, "DCGM_FI_DEV_ROW_REMAP_FAILED"),
    DcgmField(ROW_REMAP_PENDING, 396, ""),
    DcgmField(CLOCK_EVENTS, 112, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    DcgmField(NVLINK_CRC_FLIT, 409, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL"),
    DcgmField(NVLINK_CRC_DATA, 419, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"),
    DcgmField(NVLINK_REPLAY, 429, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL"),
    DcgmField(NVLINK_RECOVERY, 439, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"),
    DcgmField(PCIE_REPLAY, 202, "DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
)
FIELD_NAMES = {name: dcgm.name for dcgm in DCGM_FIELDS for name in (dcgm.name, dcgm.alias) if name}

# The largest value each kept gauge can take: ratios are 0-1, GPU_UTIL is a percentage;
# the rest are only bounded below (MiB, W, the last XID code, MHz, bytes/s).
VALUE_CEILING = {
    GR_ENGINE_ACTIVE: 1.0,
    SM_ACTIVE: 1.0,
    TENSOR_ACTIVE: 1.0,
    DRAM_ACTIVE: 1.0,
    GPU_UTIL: 100.0,
    FB_USED: math.inf,
    POWER_USAGE: math.inf,
    XID_ERRORS: math.inf,
    SM_CLOCK: math.inf,
    MAX_SM_CLOCK: math.inf,
    NVLINK_TX: math.inf,
    NVLINK_RX: math.inf,
}
KEPT_METRICS = frozenset(VALUE_CEILING)
# What a node-health parser keeps (``ExpositionParser(HEALTH_CEILING)``): every health
# field, bounded only below (counts, 0/1 flags, the XID code, the clock-events bitmask).
HEALTH_CEILING = {dcgm.name: math.inf for dcgm in DCGM_FIELDS}

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
HEAD_CACHE_LIMIT = 200_000  # distinct (metric, label set) lines: ~40 per GPU, thousands of GPUs


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
MALFORMED_COMMENT = ("#", "", "")


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

    def __init__(self, ceilings: Mapping[str, float] = VALUE_CEILING) -> None:
        # The metrics this parser keeps, with the largest value each can take: the gauges
        # of the minute rollups by default, the node-health fields with HEALTH_CEILING.
        self._ceilings = ceilings
        self._heads: dict[str, _Head] = {}
        # A GPU's label set is the same on each of its metrics: parsed once for all.
        self._label_sets: dict[str, _Series | None] = {}
        self._comments: dict[str, tuple[str, str, str]] = {}

    def _head(self, head: str) -> "_Head":
        """What a sample line's name and labels mean, cached: (name, series or None if
        malformed, the value ceiling or None for a metric Gantry does not use)."""
        if len(self._heads) >= HEAD_CACHE_LIMIT:
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
        name = FIELD_NAMES.get(name, name)  # a DCGM 4.6 name is the field's exporter name
        parsed = self._heads[head] = (name, series, self._ceilings.get(name))
        return parsed

    def parse(self, body: bytes | str, *, default_ts: int) -> ParseResult:
        """Parse one scrape. ``default_ts`` (Unix ms, the scrape time) stamps samples that
        carry no timestamp. Raises ``BodyTooLarge`` over ``MAX_BODY_BYTES``, nothing else."""
        size = len(body.encode() if isinstance(body, str) else body)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(size)
        stats = ParseStats()
        result = ParseResult(samples=[], stats=stats)
        lines, undecodable = split_lines(body)
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
                if comment is MALFORMED_COMMENT:
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
        line without a valid metric name or type is ``MALFORMED_COMMENT``."""
        if len(self._comments) >= HEAD_CACHE_LIMIT:
            self._comments.clear()
        parts = line[1:].split(None, 2)
        comment = ("", "", "")
        if parts and parts[0] in ("HELP", "TYPE"):
            text = parts[2] if len(parts) == 3 else ""
            if len(parts) < 2 or _METRIC_NAME.fullmatch(parts[1]) is None:
                comment = MALFORMED_COMMENT
            elif parts[0] == "HELP":
                comment = (
                    "HELP",
                    parts[1],
                    _HELP_ESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], text),
                )
            elif text in ("counter", "gauge", "histogram", "summary", "untyped"):
                comment = ("TYPE", parts[1], text)
            else:
                comment = MALFORMED_COMMENT
        self._comments[line] = comment
        return comment


def _timestamp(text: str) -> int:
    if "_" in text or not text.isascii():
        raise ValueError(text)
    return int(text)


def split_lines(body: bytes | str) -> tuple[list[str], int]:
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
