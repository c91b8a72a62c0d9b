"""``python -m portal.metrics_exporter --host HOST --port PORT [--dir DIR]``: the counters
and histograms that the processes of one pod recorded, served at ``/metrics`` for Prometheus.

A Celery worker serves no HTTP; its processes write what they record (task durations,
backend calls, admission cycles, telemetry samples: core/metrics.py) to files of their own
under the metrics directory (portal/metrics_files.py). On Kubernetes this exporter runs
beside the worker, as a second container of its pod sharing that directory (an emptyDir),
and answers each scrape with the sum over the files, as the web's /metrics does for
gunicorn's workers (portal/metrics.py). It reads files only: no Django, no database.

The same bearer token as the web's /metrics (``GANTRY_METRICS_TOKEN``), which it refuses to
start without. ``DIR`` is the metrics root (``GANTRY_METRICS_DIR`` by default); each host's
directory below it is read.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from portal.metrics_files import metric_files

logger = logging.getLogger(__name__)

TOKEN_ENV = "GANTRY_METRICS_TOKEN"  # noqa: S105 (the name of a variable)
METRICS_DIR_ENV = "GANTRY_METRICS_DIR"
PATH = "/metrics"
# A process's file can go between listing and reading it (the worker's container started
# again empties its directory): list again, a few times.
READ_TRIES = 3


class ProcessFilesCollector(Collector):
    """The counters and histograms of every process, from their files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def collect(self) -> Iterator[Metric]:
        for attempt in range(READ_TRIES):
            files = [str(path) for path in metric_files(self.root)]
            try:
                # prometheus_client leaves merge() unannotated; it answers a list of Metric.
                merged: list[Metric] = MultiProcessCollector.merge(  # type: ignore[no-untyped-call]
                    files, accumulate=True
                )
                return iter(merged)
            except FileNotFoundError:
                if attempt == READ_TRIES - 1:
                    raise
        raise AssertionError("unreachable")


def exposition(root: Path) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessFilesCollector(root))
    return generate_latest(registry)


def _handler(root: Path, token: str) -> type[BaseHTTPRequestHandler]:
    class MetricsHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != PATH:
                self._answer(404, b"404 Not Found: the metrics are at /metrics\n")
                return
            scheme, _, supplied = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                supplied.strip().encode(), token.encode()
            ):
                self._answer(
                    401,
                    b"401 Unauthorized: send Authorization: Bearer <GANTRY_METRICS_TOKEN>\n",
                    extra={"WWW-Authenticate": 'Bearer realm="gantry-metrics"'},
                )
                return
            self._answer(200, exposition(root), content_type=CONTENT_TYPE_LATEST)

        def _answer(
            self,
            status: int,
            body: bytes,
            *,
            content_type: str = "text/plain; charset=utf-8",
            extra: dict[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # A scrape every 30 s is not news; a refusal is.
            if str(code) != "200":
                logger.warning("metrics exporter: %s answered %s", self.requestline, code)

        def log_message(self, format: str, *args: object) -> None:
            logger.warning("metrics exporter: " + format, *args)

    return MetricsHandler


def serve(*, host: str, port: int, root: Path, token: str) -> ThreadingHTTPServer:
    """The server, bound; ``serve_forever()`` answers."""
    server = ThreadingHTTPServer((host, port), _handler(root, token))
    server.daemon_threads = True
    return server


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m portal.metrics_exporter")
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a pod")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, default=os.environ.get(METRICS_DIR_ENV))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        parser.error(f"{TOKEN_ENV} is not set: the metrics are served with its bearer token only")
    if args.dir is None:
        parser.error(f"give --dir or set {METRICS_DIR_ENV}: the metrics directory to serve")
    server = serve(host=args.host, port=args.port, root=args.dir, token=token)
    logger.info("metrics exporter: serving %s on http://%s:%d%s", args.dir, args.host,
                args.port, PATH)  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
