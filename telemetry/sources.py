"""Where GPU telemetry comes from: dcgm-exporter endpoints scraped directly, or a Prometheus
server that already scrapes them. Every source delivers exposition text bodies (``Scrape``)
that ``telemetry.exposition`` parses; the collector stores them as they are.

No Django here: plain data and HTTP. Every request has a timeout, sends the User-Agent
``gantry-telemetry``, follows no redirects, ignores proxy variables and ``.netrc``, and
stops reading a body one byte past its size cap. Error messages are for operators: they
name the URL without its query string and never contain a token.
"""

import http.client
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

from telemetry.exposition.node_links import LINK_METRICS
from telemetry.exposition.parsing import (
    DCGM_FIELDS,
    HEALTH_CEILING,
    KEPT_METRICS,
    MAX_BODY_BYTES,
    BodyTooLarge,
)

logger = logging.getLogger(__name__)

USER_AGENT = "gantry-telemetry"
# Prometheus refuses a range query whose (end - start) / step exceeds 11,000.
PROMETHEUS_MAX_POINTS = 11_000
DCGM_TIMEOUT_S = 5.0
PROMETHEUS_TIMEOUT_S = 10.0
DEFAULT_STEP_S = 15
DCGM_WORKERS = 8  # targets scraped at once
_READ_SIZE = 64 * 1024
_ERROR_TEXT_LIMIT = 500  # characters of Prometheus' error text kept in a message

Clock = Callable[[], int]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Scrape:
    body: bytes  # exposition text, with per-sample timestamps when the source has them
    at_ms: int  # when it was fetched, Unix ms: the timestamp of samples without one
    origin: str  # the target URL without its query string, or "prometheus:<url>"


@dataclass(frozen=True, slots=True)
class ScrapeFailure:
    """A target that could not be read while others could."""

    origin: str
    reason: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.reason}"


class FetchResult(list[Scrape]):
    """The scrapes of one fetch, and the targets that failed (their bodies are missing)."""

    def __init__(
        self, scrapes: Iterable[Scrape] = (), failures: Iterable[ScrapeFailure] = ()
    ) -> None:
        super().__init__(scrapes)
        self.failures: list[ScrapeFailure] = list(failures)


class SourceError(Exception):
    """A source could not be read (unreachable, timeout, HTTP error, bad JSON, body over the
    cap). The message is for operators and never contains credentials or tokens."""

    def __init__(self, message: str, failures: Iterable[ScrapeFailure] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)


class TelemetrySource(Protocol):
    name: str

    def fetch(self, *, start_ms: int, end_ms: int) -> list[Scrape]:
        """Samples of [start_ms, end_ms) as exposition bodies. Raises SourceError when
        nothing could be read. A source with several targets returns a ``FetchResult``
        whose ``failures`` name the targets that failed while others answered; it also
        keeps them in its own ``failures`` attribute until the next fetch."""
        ...


# --- HTTP --------------------------------------------------------------------------------


class _Failed(Exception):
    """A request failed; the message is the reason, without the URL."""


class _OverLimit(_Failed):
    """The body is over the size limit."""


def _session(headers: Mapping[str, str]) -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no proxy variables, no .netrc credentials
    session.headers.update({"User-Agent": USER_AGENT, **headers})
    return session


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _reason(exc: BaseException) -> str:
    """What went wrong, from the innermost cause that says it; never the URL, which the
    outer exceptions of requests and urllib3 repeat with its query string."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return str(current.strerror)
        if isinstance(current, http.client.HTTPException) and not isinstance(
            current, http.client.InvalidURL
        ):
            name, text = type(current).__name__, str(current)
            return (text if text.startswith(name) else f"{name}: {text}")[:200]
        pending += [arg for arg in current.args if isinstance(arg, BaseException)]
        for linked in (getattr(current, "reason", None), current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                pending.append(linked)
    return type(exc).__name__


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    reason: str
    body: bytes


def _get(
    session: requests.Session,
    url: str,
    *,
    params: Mapping[str, str] | None = None,
    timeout_s: float,
    limit: int,
) -> _Response:
    """GET ``url`` and read at most ``limit`` bytes of its (decoded) body.

    ``timeout_s`` bounds the connection, every wait for data and the whole exchange (a body
    trickling in is abandoned once it has passed, so an exchange takes at most about twice
    ``timeout_s``). Raises ``_Failed`` with the reason, ``_OverLimit`` for a body over
    ``limit``."""
    deadline = time.monotonic() + timeout_s
    try:
        response = session.get(
            url, params=params, timeout=timeout_s, stream=True, allow_redirects=False
        )
    except requests.exceptions.ConnectTimeout:
        raise _Failed(f"timed out connecting after {_seconds(timeout_s)}") from None
    except requests.exceptions.ReadTimeout:
        raise _Failed(f"no answer within {_seconds(timeout_s)}") from None
    except (requests.exceptions.RequestException, ValueError) as exc:
        raise _Failed(f"could not connect: {_reason(exc)}") from None
    with response:
        declared = response.headers.get("Content-Length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            raise _OverLimit(str(BodyTooLarge(int(declared), limit)))
        raw = response.raw
        read = getattr(raw, "read1", raw.read)  # read1: at most one wait for the network
        body = bytearray()
        try:
            while chunk := read(_READ_SIZE, decode_content=True):
                body += chunk
                if len(body) > limit:
                    raise _OverLimit(
                        f"exposition body is over the {limit:,}-byte limit (stopped reading); "
                        "scrape fewer fields or split the target"
                    )
                if time.monotonic() > deadline:
                    raise _Failed(f"the answer did not arrive within {_seconds(timeout_s)}")
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
            raise _Failed(f"the answer stalled for {_seconds(timeout_s)}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Failed(f"the connection broke: {_reason(exc)}") from None
        return _Response(response.status_code, response.reason or "", bytes(body))


def _status_text(response: _Response) -> str:
    return f"HTTP {response.status} {response.reason}".rstrip()


# --- URLs --------------------------------------------------------------------------------


def url_problem(value: str) -> str | None:
    """What makes ``value`` no http(s) URL without credentials, said after the name of the
    setting that holds it; None when it is one. The URL is never repeated when it carries
    credentials."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return "is not a valid URL"
    if "@" in parts.netloc:
        return (
            "contains credentials (user:password@); they are refused: "
            "a Prometheus token goes in the environment variable named by token_env"
        )
    if re.search(r"[\x00-\x20\x7f]", value):
        return f"must not contain spaces or control characters: {value!r}"
    try:
        port = parts.port
    except ValueError:
        return f"has an invalid port: {value!r}"
    if parts.scheme not in ("http", "https"):
        return f"must be an http:// or https:// URL, not {value!r}"
    if not parts.hostname:
        return f"has no host: {value!r}"
    if port == 0:
        return f"has port 0: {value!r}"
    return None


def _check_url(value: Any, where: str) -> str:
    """An http(s) URL without credentials; ValueError naming ``where`` otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string URL")
    problem = url_problem(value)
    if problem is not None:
        raise ValueError(f"{where} {problem}")
    return value


def _origin(url: str) -> str:
    """The URL as messages and stored scrapes name it: without query string or fragment,
    where secrets would sit."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


# --- dcgm-exporter -----------------------------------------------------------------------


class DcgmScrapeSource:
    """Scrapes dcgm-exporter ``/metrics`` endpoints: one GET per target, a few at a time.

    A scrape is "now": ``fetch`` ignores the interval. A target that fails does not stop
    the others: ``fetch`` returns a ``FetchResult`` with the bodies that arrived and a
    ``ScrapeFailure`` per failed target (also kept in ``self.failures`` until the next
    fetch); only when every target failed does it raise ``SourceError``. A body over
    ``max_body_bytes`` fails its target after reading one byte past the limit.
    """

    name = "dcgm"

    def __init__(
        self,
        targets: list[str],
        *,
        timeout_s: float = DCGM_TIMEOUT_S,
        clock: Clock = now_ms,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_workers: int = DCGM_WORKERS,
    ) -> None:
        if not targets:
            raise ValueError("a DCGM source needs at least one target URL")
        self.targets = [_check_url(target, f"target {i}") for i, target in enumerate(targets)]
        self.timeout_s = timeout_s
        self.clock = clock
        self.max_body_bytes = max_body_bytes
        self.max_workers = max_workers
        self.failures: list[ScrapeFailure] = []

    def __repr__(self) -> str:
        return f"DcgmScrapeSource(targets={[_origin(t) for t in self.targets]!r})"

    def fetch(self, *, start_ms: int, end_ms: int) -> FetchResult:
        workers = min(self.max_workers, len(self.targets))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dcgm-scrape") as pool:
            outcomes = list(pool.map(self._scrape, self.targets))
        result = FetchResult(
            (o for o in outcomes if isinstance(o, Scrape)),
            (o for o in outcomes if isinstance(o, ScrapeFailure)),
        )
        self.failures = result.failures
        if result.failures and not result:
            shown = "; ".join(str(failure) for failure in result.failures[:5])
            more = len(result.failures) - 5
            raise SourceError(
                f"no DCGM target answered: {shown}" + (f"; and {more} more" if more > 0 else ""),
                result.failures,
            )
        return result

    def _scrape(self, target: str) -> Scrape | ScrapeFailure:
        origin = _origin(target)
        at_ms = self.clock()
        accept = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
        try:
            with _session({"Accept": accept}) as session:
                response = _get(
                    session, target, timeout_s=self.timeout_s, limit=self.max_body_bytes
                )
        except _Failed as exc:
            return ScrapeFailure(origin, str(exc))
        if not 200 <= response.status < 300:
            redirect = " (redirects are not followed: use the final URL)"
            note = redirect if 300 <= response.status < 400 else ""
            return ScrapeFailure(origin, _status_text(response) + note)
        return Scrape(body=response.body, at_ms=at_ms, origin=origin)


# --- Prometheus --------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SAMPLE_VALUE = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN", re.ASCII
)


class _UnexpectedAnswer(Exception):
    pass


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def matrix_exposition(
    metric: str, result: Any, *, max_body_bytes: int = MAX_BODY_BYTES, kind: str = "gauge"
) -> list[bytes]:
    """A Prometheus range query's ``data.result`` (a matrix) for ``metric`` as exposition
    text with timestamps in ms, cut into bodies of at most ``max_body_bytes`` at line ends.

    Every label the format can carry is kept with its name (``Hostname`` or ``hostname``,
    ``pod``, ``hpc_job``…); values are written as Prometheus sent them, so NaN and +Inf
    reach the parser, which counts them. Raises ``_UnexpectedAnswer`` when ``result`` is
    not a matrix."""
    if not isinstance(result, list):
        raise _UnexpectedAnswer("data.result is not a list")
    header = f"# TYPE {metric} {kind}\n".encode()
    bodies: list[bytes] = []
    lines: list[bytes] = []
    size = len(header)
    for series in result:
        if not isinstance(series, dict):
            raise _UnexpectedAnswer("a series is not an object")
        labels, values = series.get("metric"), series.get("values")
        if not isinstance(labels, dict) or not isinstance(values, list):
            raise _UnexpectedAnswer('a series lacks "metric" or "values"')
        pairs = []
        for name, value in labels.items():
            if not isinstance(value, str):
                raise _UnexpectedAnswer(f"label {name!r} is not a string")
            # __name__ is the metric; names the text format cannot carry are no label of
            # dcgm-exporter's (Prometheus 3 allows any UTF-8 name).
            if name != "__name__" and _LABEL_NAME.fullmatch(name):
                pairs.append(f'{name}="{_escape(value)}"')
        head = f"{metric}{{{','.join(pairs)}}} ".encode()
        for point in values:
            if not isinstance(point, list) or len(point) != 2:
                raise _UnexpectedAnswer("a point is not a [time, value] pair")
            stamp, value = point
            if (
                not isinstance(stamp, int | float)
                or isinstance(stamp, bool)
                or not math.isfinite(stamp)
            ):
                raise _UnexpectedAnswer(f"a point's time is not a number: {stamp!r}")
            if not isinstance(value, str) or not _SAMPLE_VALUE.fullmatch(value):
                raise _UnexpectedAnswer(f"a point's value is not a number: {value!r:.40}")
            line = head + f"{value} {round(stamp * 1000)}\n".encode()
            if size + len(line) > max_body_bytes:
                if not lines:
                    raise _UnexpectedAnswer(f"one sample line is over {max_body_bytes:,} bytes")
                bodies.append(header + b"".join(lines))
                lines, size = [], len(header)
            lines.append(line)
            size += len(line)
    if lines:
        bodies.append(header + b"".join(lines))
    return bodies


class _TooLarge(Exception):
    pass


_OTHER_NAME = {field.name: field.alias for field in DCGM_FIELDS if field.alias}


def prometheus_queries(selector: str, node_selector: str | None = None) -> list[tuple[str, str]]:
    """(metric, PromQL) for each field Gantry reads: the rollups' gauges and the
    node-health fields, a field with two names (DCGM 4.6 renamed fields) under either
    (``a{sel} or b{sel}``: set operators keep each series' own metric name); then the node
    exporter's InfiniBand counters, as raw counters (Gantry takes their growth itself, as
    from a direct scrape), with ``node_selector`` when given, else ``selector``."""
    queries = []
    for metric in sorted(KEPT_METRICS | HEALTH_CEILING.keys()):
        names = (metric, _OTHER_NAME[metric]) if metric in _OTHER_NAME else (metric,)
        queries.append((metric, " or ".join(f"{name}{selector}" for name in names)))
    node = selector if node_selector is None else node_selector
    queries += [(metric, f"{metric}{node}") for metric in sorted(LINK_METRICS)]
    return queries


class PrometheusSource:
    """Reads the gauges Gantry keeps back from a Prometheus server's HTTP API.

    One ``query_range`` per field (``prometheus_queries``: the rollups' gauges, the
    node-health fields and the node exporter's InfiniBand counters, those with
    ``node_selector`` when given) and window: per-field queries keep each answer to one field's
    series, so the size cap is reached much later than with one ``__name__`` regex query,
    and a rejected selector names the query. Each series is written under the field's
    exporter name, whichever name Prometheus stored it under.
    The interval is read on an absolute grid of ``step_s`` (points at multiples of the step,
    ``start_ms <= t < end_ms``), so consecutive fetches neither overlap nor leave gaps;
    windows hold at most ``max_points`` points (Prometheus refuses more than 11,000 per
    series). An answer over ``max_response_bytes`` is asked again for half its window, and
    the rest of the fetch keeps the smaller windows. Any failure fails the whole fetch with
    ``SourceError``: the collector reads the interval again.

    The bearer token is read from the environment variable ``token_env`` on every fetch
    (or given as ``bearer_token``); it is sent only in the Authorization header.
    """

    name = "prometheus"

    def __init__(
        self,
        url: str,
        *,
        step_s: int = DEFAULT_STEP_S,
        selector: str = "",
        node_selector: str | None = None,
        timeout_s: float = PROMETHEUS_TIMEOUT_S,
        bearer_token: str | None = None,
        token_env: str | None = None,
        clock: Clock = now_ms,
        max_points: int = PROMETHEUS_MAX_POINTS,
        max_response_bytes: int = MAX_BODY_BYTES,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.url = _check_url(url, "url").rstrip("/")
        if not 1 <= step_s <= 3600:
            raise ValueError("step_s must be from 1 to 3600 seconds")
        if not 1 <= max_points <= PROMETHEUS_MAX_POINTS:
            raise ValueError(f"max_points must be from 1 to {PROMETHEUS_MAX_POINTS}")
        self.step_s = step_s
        self.selector = selector
        self.node_selector = node_selector
        self.timeout_s = timeout_s
        self.token_env = token_env
        self._bearer_token = bearer_token
        self.clock = clock
        self.max_points = max_points
        self.max_response_bytes = max_response_bytes
        self.max_body_bytes = max_body_bytes
        self.origin = f"prometheus:{_origin(self.url)}"
        self.failures: list[ScrapeFailure] = []  # always empty: a failure fails the fetch

    def __repr__(self) -> str:
        token = (
            "env " + self.token_env if self.token_env else "given" if self._bearer_token else None
        )
        return (
            f"PrometheusSource(url={_origin(self.url)!r}, step_s={self.step_s}, "
            f"selector={self.selector!r}, token={token!r})"
        )

    def _token(self) -> str | None:
        if self.token_env:
            token = os.environ.get(self.token_env, "").strip()
            if not token:
                raise SourceError(
                    f"the environment variable {self.token_env} that holds the token for "
                    f"Prometheus at {_origin(self.url)} is not set on this host"
                )
            return token
        return self._bearer_token

    def fetch(self, *, start_ms: int, end_ms: int) -> FetchResult:
        step_ms = self.step_s * 1000
        first = -(-start_ms // step_ms) * step_ms
        last = (end_ms - 1) // step_ms * step_ms
        result = FetchResult()
        if first > last:
            return result
        token = self._token()
        at_ms = self.clock()
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        points = self.max_points  # per window; halved for the rest of the fetch when too big
        with _session(headers) as session:
            for metric, query in prometheus_queries(self.selector, self.node_selector):
                start = first
                while start <= last:
                    end = min(last, start + (points - 1) * step_ms)
                    try:
                        matrix = self._query(session, query, start, end)
                    except _TooLarge:
                        if start == end:
                            raise SourceError(
                                f"Prometheus at {_origin(self.url)}: the answer to "
                                f"{query} for a single step is over the "
                                f"{self.max_response_bytes:,}-byte limit; narrow the selector"
                            ) from None
                        points = ((end - start) // step_ms + 2) // 2
                        continue
                    try:
                        bodies = matrix_exposition(
                            metric,
                            matrix,
                            max_body_bytes=self.max_body_bytes,
                            kind="counter" if metric in LINK_METRICS else "gauge",
                        )
                    except _UnexpectedAnswer as exc:
                        raise self._error(query, f"sent an unexpected answer: {exc}") from None
                    result += (Scrape(body=b, at_ms=at_ms, origin=self.origin) for b in bodies)
                    start = end + step_ms
        return result

    def _error(self, query: str, what: str) -> SourceError:
        return SourceError(f"Prometheus at {_origin(self.url)} {what} (query {query})")

    def _query(self, session: requests.Session, query: str, start: int, end: int) -> Any:
        params = {
            "query": query,
            "start": f"{start // 1000}.{start % 1000:03d}",
            "end": f"{end // 1000}.{end % 1000:03d}",
            "step": str(self.step_s),
        }
        try:
            response = _get(
                session,
                f"{self.url}/api/v1/query_range",
                params=params,
                timeout_s=self.timeout_s,
                limit=self.max_response_bytes,
            )
        except _OverLimit:
            raise _TooLarge from None
        except _Failed as exc:
            raise SourceError(f"Prometheus at {_origin(self.url)}: {exc}") from None
        try:
            answer = json.loads(response.body)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("status") == "error":
            kind = str(answer.get("errorType", "error"))
            text = str(answer.get("error", ""))[:_ERROR_TEXT_LIMIT]
            raise self._error(query, f"refused the query: {kind}: {text}")
        if not 200 <= response.status < 300:
            raise self._error(query, f"answered {_status_text(response)}")
        if not isinstance(answer, dict):
            raise self._error(query, "sent an answer that is not a JSON object")
        data = answer.get("data")
        if answer.get("status") != "success" or not isinstance(data, dict):
            raise self._error(query, 'sent an answer without "status": "success" and "data"')
        if data.get("resultType") != "matrix":
            raise self._error(query, f"sent a {data.get('resultType')!r} instead of a matrix")
        for warning in answer.get("warnings") or ():
            logger.warning("Prometheus at %s: %s", _origin(self.url), str(warning)[:200])
        return data.get("result")
