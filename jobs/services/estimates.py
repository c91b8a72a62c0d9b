"""Start estimates: simulate the queue forward and write what each waiting run should
expect (jobs.estimates). Run by jobs.tasks.estimate_starts every GANTRY_ESTIMATE_INTERVAL_S,
never per request. A refresh simulates up to GANTRY_ESTIMATE_MAX_STEPS cycles twice, each
cycle on what changed since the one before (jobs.estimates_state): a few seconds with
10,000 queued runs (docs/benchmarks.md), so refreshes are spaced by
GANTRY_ESTIMATE_COST_FACTOR times what the last one took."""

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.bulk import rows_update
from jobs import estimates
from jobs.models import Run, RunState, StartForecast
from jobs.selectors.estimates import estimate_inputs
from jobs.selectors.queue import admission_snapshot
from tenants.models import GpuFlavor

ESTIMATE_LOCK_KEY = 0x67616E747273  # one refresh at a time (PostgreSQL advisory lock)

_FIELDS = [
    "start_full_limits_at",
    "start_expected_at",
    "start_note",
    "start_nodes",
    "start_behind",
    "start_estimated_at",
]


@dataclass(frozen=True)
class EstimateSummary:
    queued: int
    with_bound: int  # runs with a start estimate (a number, not a reason)
    changed: int  # rows written


def _moment(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


def _lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ESTIMATE_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def _forecast_json(forecast: estimates.Forecast, *, flavor: str, nodes: set[str]) -> dict:
    """The part of ``forecast`` that concerns ``flavor``: its nodes, its tenants' usage."""
    suffix = f"/{flavor}"
    steps: list[list] = []
    for step in forecast.steps:
        free = {key: value for key, value in step.free.items() if key in nodes}
        usage = {key: value for key, value in step.usage.items() if key.endswith(suffix)}
        if free or usage or not steps:
            steps.append([step.at, free, usage])
    ready = {key: value for key, value in forecast.ready.items() if key.endswith(suffix)}
    return {"steps": steps, "until": forecast.until, "ready": ready}


def _too_soon(now: datetime) -> bool:
    """Whether the last refresh was too recent for its cost: a refresh that took d seconds
    is followed by the next one no sooner than GANTRY_ESTIMATE_COST_FACTOR × d later."""
    last = StartForecast.objects.order_by("-computed_at").values("computed_at", "duration_s")
    latest = last.first()
    if latest is None:
        return False
    waited = (now - latest["computed_at"]).total_seconds()
    return 0 <= waited < settings.GANTRY_ESTIMATE_COST_FACTOR * latest["duration_s"]


@transaction.atomic
def estimates_refresh(
    *, now: datetime | None = None, force: bool = False
) -> EstimateSummary | None:
    """Estimate every queued run's start, write the rows whose estimate changed and the
    forecast per flavor. None if another refresh is running, or (unless ``force``) if the
    last one is too recent for what it cost."""
    if not _lock():
        return None
    now = now or timezone.now()
    if not force and _too_soon(now):
        return None
    began = time.perf_counter()  # a duration, not a moment: the clock stays ``now``
    snapshot, _ = admission_snapshot(now=now)
    inputs = estimate_inputs(snapshot=snapshot, now=now)
    horizon_s = settings.GANTRY_ESTIMATE_HORIZON_H * 3600.0
    max_steps = settings.GANTRY_ESTIMATE_MAX_STEPS
    latest = estimates.simulate(
        inputs.snapshot,
        ends=inputs.latest_ends,
        runtimes=inputs.max_runtimes,
        horizon_s=horizon_s,
        max_steps=max_steps,
    )
    expected = estimates.simulate(
        inputs.snapshot,
        ends=inputs.expected_ends,
        runtimes=inputs.expected_runtimes,
        horizon_s=horizon_s,
        max_steps=max_steps,
    )

    written = {
        row[0]: tuple(row[1:-1])
        for row in Run.objects.filter(state=RunState.QUEUED).values_list("id", *_FIELDS)
    }
    changed = []
    with_bound = 0
    for run in inputs.snapshot.queued:
        bound, likely = latest.starts[run.id], expected.starts[run.id]
        if bound.at is not None:
            with_bound += 1
        # Expected never after the bound: where the two simulations part ways (an early end
        # lets a later run in first), the bound is what the run can count on.
        expected_at = likely.at
        if bound.at is not None and (expected_at is None or expected_at > bound.at):
            expected_at, likely = bound.at, bound
        where = likely if likely.at is not None else bound
        row = (
            _moment(bound.at),
            _moment(expected_at),
            "" if bound.at is not None else bound.why[:300],
            [where.cluster, *where.nodes] if where.cluster else [],
            list(where.behind),
        )
        if written.get(run.id) != row:
            changed.append((run.id, *row, now))
    rows_update(Run, _FIELDS, changed, state=RunState.QUEUED)

    flavors = dict(GpuFlavor.objects.values_list("slug", "pk"))
    nodes_by_flavor: dict[str, set[str]] = {}
    for node in inputs.snapshot.nodes:
        nodes_by_flavor.setdefault(node.flavor, set()).add(f"{node.cluster}/{node.name}")
    for slug, flavor_id in flavors.items():
        nodes = nodes_by_flavor.get(slug, set())
        StartForecast.objects.update_or_create(
            flavor_id=flavor_id,
            defaults={
                "computed_at": now,
                "latest": _forecast_json(latest, flavor=slug, nodes=nodes),
                "expected": _forecast_json(expected, flavor=slug, nodes=nodes),
                "duration_s": time.perf_counter() - began,
            },
        )
    return EstimateSummary(
        queued=len(inputs.snapshot.queued), with_bound=with_bound, changed=len(changed)
    )
