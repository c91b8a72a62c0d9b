"""Parse, map and roll up scrapes in one pass: what the collector runs. Pure: plain data
in, plain data out.

The ``Ingestor`` is the fused fast path of ``ExpositionParser``, ``AllocationIndex`` and
``MinuteRollups``: it reads their caches and accumulators directly, so that each sample
line costs a dictionary lookup and a few comparisons."""

import enum
import math
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

from telemetry.exposition.mapping import Allocation, AllocationIndex
from telemetry.exposition.parsing import (
    HEAD_CACHE_LIMIT,
    MALFORMED_COMMENT,
    MAX_BODY_BYTES,
    BodyTooLarge,
    ExpositionParser,
    GpuSample,
    ParseStats,
    split_lines,
)
from telemetry.exposition.rollups import (
    COUNT_SLOT,
    FB_SLOT,
    GPU_BITS,
    METRIC_BITS,
    METRIC_NUMBER,
    METRIC_SLOT,
    SEEN_TS_SHIFT,
    MinuteRollup,
    MinuteRollups,
    RollupStats,
    accumulate,
    new_accumulator,
)


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
        # It stays whole: its loop is what every sample goes through, with every name it
        # reads bound to a local first; a helper would cost a call per line.
        size = len(body.encode() if isinstance(body, str) else body)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(size)
        lines, undecodable = split_lines(body)
        stats = self.stats
        stats.lines += len(lines) + undecodable
        stats.malformed += undecodable
        routes, comments = self._routes, self.parser._comments
        rollups = self.rollups
        seen, accumulators = rollups._seen, rollups._accumulators
        unmapped = self.unmapped
        start_ms, end_ms = self.start_ms, self.end_ms
        isfinite = math.isfinite
        ts_shift, metric_bits, gpu_bits = SEEN_TS_SHIFT, METRIC_BITS, GPU_BITS
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
                elif comment is MALFORMED_COMMENT:
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
            seen_key = ts << ts_shift | number << metric_bits | metric_number
            if seen_key in seen:
                duplicates += 1
                continue
            seen.add(seen_key)
            key = (ts // 60_000) << gpu_bits | number
            acc = accumulators.get(key)
            if acc is None:
                acc = accumulators[key] = new_accumulator()
            if slot < FB_SLOT:
                acc[slot] += value
                acc[slot + 1] += 1
                acc[COUNT_SLOT] += 1
            else:
                accumulate(acc, slot, value, ts)
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
        if len(self._routes) >= HEAD_CACHE_LIMIT:
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
        route = (METRIC_SLOT[name], METRIC_NUMBER[name], ceiling, number, window)
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
