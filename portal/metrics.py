"""/metrics: Gantry's own metrics in the Prometheus text format, for a bearer token only.

A scrape answers with what every process of the deployment recorded (counters and
histograms of core/metrics.py, summed over their files) and with gauges computed now from
the database and the broker: runs waiting to start, and messages waiting in the Celery
queue. Gauges are computed at scrape time because a gauge kept by each process would be
as stale as its last write, and wrong once the process is gone.
"""

import hmac
import logging
from collections.abc import Iterator
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from clusters.health import NodeHealth
from clusters.models import ClusterNode, NodeHealthEvent
from jobs.models import Run, RunState, WaitReason
from portal import task_queues
from portal.metrics_exporter import ProcessFilesCollector

logger = logging.getLogger(__name__)

# A queued run that no admission cycle has looked at yet has no wait reason.
NOT_YET_DECIDED = "NEW"
WAITING_STATES = (RunState.QUEUED, RunState.PENDING)
BROKER_TIMEOUT_S = 2


class ScrapeTimeCollector(Collector):
    """Gauges read from the database and the broker at the moment of the scrape."""

    def collect(self) -> Iterator[Metric]:
        yield self._runs_pending()
        yield from self._node_health()
        yield self._node_health_events()
        queue = self._celery_queue_length()
        if queue is not None:
            yield queue

    def _runs_pending(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "gantry_runs_pending",
            "Runs waiting to start (queued, or held by the cluster), per tenant, GPU flavor "
            "and wait reason",
            labels=["tenant", "flavor", "reason"],
        )
        rows = (
            Run.objects.filter(state__in=WAITING_STATES)
            .values_list("tenant__slug", "flavor__slug", "wait_reason")
            .annotate(runs=Count("id"))
            .order_by("tenant__slug", "flavor__slug", "wait_reason")
        )
        for tenant, flavor, reason, runs in rows:
            family.add_metric([tenant, flavor, _reason_label(reason)], runs)
        return family

    def _node_health(self) -> Iterator[GaugeMetricFamily]:
        """Nodes per cluster and health state (every state, zeros too, so a panel sums them),
        and the quarantined ones alone for alerting."""
        by_state = GaugeMetricFamily(
            "gantry_cluster_nodes",
            "GPU nodes per cluster and Gantry's health state (healthy, suspect, quarantined)",
            labels=["cluster", "health"],
        )
        quarantined = GaugeMetricFamily(
            "gantry_nodes_quarantined",
            "GPU nodes Gantry has quarantined (no new work), per cluster",
            labels=["cluster"],
        )
        counts: dict[str, dict[str, int]] = {}
        rows = ClusterNode.objects.values_list("cluster__name", "health").annotate(n=Count("id"))
        for cluster, health, nodes in rows.order_by("cluster__name", "health"):
            counts.setdefault(cluster, dict.fromkeys(NodeHealth, 0))[health] = nodes
        for cluster, states in counts.items():
            for health, nodes in states.items():
                by_state.add_metric([cluster, str(health)], nodes)
            quarantined.add_metric([cluster], states[NodeHealth.QUARANTINED])
        yield by_state
        yield quarantined

    def _node_health_events(self) -> CounterMetricFamily:
        """Node-health events recorded, per cluster, signal class (or a person's act) and
        source: a counter, as rows are only ever added (a flood of one signal is one row)."""
        family = CounterMetricFamily(
            "gantry_node_health_events",
            "Node-health events Gantry recorded, per cluster, signal class and source",
            labels=["cluster", "signal", "source"],
        )
        rows = (
            NodeHealthEvent.objects.values_list("cluster__name", "signal", "source")
            .annotate(n=Count("id"))
            .order_by("cluster__name", "signal", "source")
        )
        for cluster, signal, source, events in rows:
            family.add_metric([cluster, signal, source], events)
        return family

    def _celery_queue_length(self) -> GaugeMetricFamily | None:
        """Messages waiting in each Celery queue (portal/task_queues.py); only a Redis broker
        can tell (it keeps a queue as a list)."""
        url = settings.CELERY_BROKER_URL
        if not url.startswith(("redis://", "rediss://")):
            return None
        # Any: redis' stubs type llen() as answering either an int or an awaitable.
        client: Any = redis.Redis.from_url(
            url, socket_timeout=BROKER_TIMEOUT_S, socket_connect_timeout=BROKER_TIMEOUT_S
        )
        try:
            lengths = {queue: int(client.llen(queue)) for queue in task_queues.QUEUES}
        except redis.RedisError as exc:
            logger.warning("metrics: the Celery queue lengths are unknown: %s", exc)
            return None
        finally:
            client.close()
        family = GaugeMetricFamily(
            "gantry_celery_queue_length",
            "Tasks waiting in the Celery queue for a worker",
            labels=["queue"],
        )
        for queue, length in lengths.items():
            family.add_metric([queue], length)
        return family


def _reason_label(reason: str) -> str:
    if not reason:
        return NOT_YET_DECIDED
    return reason if reason in WaitReason.values else "UNKNOWN"


def _token_matches(request: HttpRequest) -> bool:
    scheme, _, supplied = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(supplied.strip().encode(), settings.GANTRY_METRICS_TOKEN.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """404 while no token is configured; 401 without the right bearer token."""
    if not settings.GANTRY_METRICS_TOKEN:
        raise Http404
    if not _token_matches(request):
        response = HttpResponse(
            "401 Unauthorized: send Authorization: Bearer <GANTRY_METRICS_TOKEN>\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="gantry-metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessFilesCollector(settings.GANTRY_METRICS_DIR))
    registry.register(ScrapeTimeCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
