"""Reads for start estimates: what the forward simulation needs (jobs.estimates), and the
stored forecast the submit preview looks up."""

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from jobs import admission, estimates
from jobs.models import (
    HOLDING_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    Run,
    RunState,
    StartForecast,
)

# How far back and how many finished runs the duration history reads.
HISTORY_DAYS = 90
HISTORY_RUNS = 20_000
HISTORY_PER_KEY = 20  # the most recent runs of each experiment, template or tenant shape


@dataclass(frozen=True)
class EstimateInputs:
    snapshot: admission.Snapshot
    latest_ends: dict[int, float | None]  # held run -> when it frees its GPUs at the latest
    expected_ends: dict[int, float | None]
    max_runtimes: dict[int, float | None]  # queued run -> seconds
    expected_runtimes: dict[int, float | None]


def _durations_by_key(*, now) -> dict[tuple, list[float]]:
    """Seconds that recent successful runs took, by experiment, template and tenant shape
    (newest first, at most HISTORY_PER_KEY each), in one query. An experiment is known by
    its project and name: submitting "resnet-baseline" again records a new experiment, and
    its runs are still the best guide to how long the next one takes."""
    rows = (
        Run.objects.filter(
            state=RunState.SUCCEEDED,
            started_at__isnull=False,
            finished_at__gte=now - timedelta(days=HISTORY_DAYS),
        )
        .order_by("-finished_at", "-id")
        .values_list(
            "experiment__project_id",
            "experiment__name",
            "experiment__template_id",
            "tenant__slug",
            "flavor__slug",
            "experiment__nodes",
            "experiment__gpus_per_node",
            "started_at",
            "finished_at",
        )[:HISTORY_RUNS]
    )
    history: dict[tuple, list[float]] = defaultdict(list)
    for project, name, template, tenant, flavor, nodes, gpus_per_node, started, finished in rows:
        experiment = (project, name)
        if started is None or finished is None:  # filtered out; the types do not know
            continue
        seconds = max(0.0, (finished - started).total_seconds())
        keys = [("experiment", experiment), ("shape", tenant, flavor, nodes, gpus_per_node)]
        if template is not None:
            keys.append(("template", template))
        for key in keys:
            if len(history[key]) < HISTORY_PER_KEY:
                history[key].append(seconds)
    return history


def _expected_runtime(history, *, experiment, template, shape, max_runtime_s: float) -> float:
    return estimates.expected_runtime(
        [
            history.get(("experiment", experiment), ()),
            history.get(("template", template), ()) if template is not None else (),
            history.get(("shape", *shape), ()),
        ],
        max_runtime_s=max_runtime_s,
    )


def estimate_inputs(*, snapshot: admission.Snapshot, now: datetime) -> EstimateInputs:
    """How long every run of the admission ``snapshot`` holds its GPUs, at the latest (max
    runtimes) and as expected (history), in three queries."""
    history = _durations_by_key(now=now)
    fields = (
        "id",
        "experiment__project_id",
        "experiment__name",
        "experiment__template_id",
        "tenant__slug",
        "flavor__slug",
        "experiment__nodes",
        "experiment__gpus_per_node",
        "experiment__max_runtime_minutes",
    )
    max_runtimes: dict[int, float | None] = {}
    expected_runtimes: dict[int, float | None] = {}
    for row in Run.objects.filter(state=RunState.QUEUED).values_list(*fields):
        run_id, project, name, template, tenant, flavor, nodes, gpus_per_node, minutes = row
        experiment = (project, name)
        max_runtimes[run_id] = minutes * 60.0
        expected_runtimes[run_id] = _expected_runtime(
            history,
            experiment=experiment,
            template=template,
            shape=(tenant, flavor, nodes, gpus_per_node),
            max_runtime_s=minutes * 60.0,
        )

    live_start = Attempt.objects.filter(
        run=OuterRef("pk"), state__in=LIVE_ATTEMPT_STATES, started_at__isnull=False
    ).order_by("-number")
    held = Run.objects.filter(state__in=HOLDING_STATES).annotate(
        attempt_started=Subquery(live_start.values("started_at")[:1])
    )
    grace = settings.GANTRY_PLACEMENT_GRACE_S
    latest_ends: dict[int, float | None] = {}
    expected_ends: dict[int, float | None] = {}
    at = now.timestamp()
    for row in held.values_list(*fields, "admitted_at", "submitted_at", "attempt_started"):
        run_id, project, name, template, tenant, flavor, nodes, gpus_per_node, minutes = row[:9]
        admitted, submitted, started = row[9:]
        experiment = (project, name)
        max_runtime_s = minutes * 60.0
        if started is not None:
            latest = started.timestamp() + max_runtime_s
        else:
            # Not started: it starts by the end of the placement grace, or goes back to the
            # queue then (jobs.services.backend_sync), freeing its GPUs either way.
            placed = (admitted or submitted).timestamp() + grace
            latest = max(at, placed) + max_runtime_s
        latest_ends[run_id] = latest
        expected_ends[run_id] = estimates.expected_end(
            started=started.timestamp() if started is not None else None,
            now=at,
            expected_s=_expected_runtime(
                history,
                experiment=experiment,
                template=template,
                shape=(tenant, flavor, nodes, gpus_per_node),
                max_runtime_s=max_runtime_s,
            ),
            latest_end=latest,
        )
    return EstimateInputs(
        snapshot=snapshot,
        latest_ends=latest_ends,
        expected_ends=expected_ends,
        max_runtimes=max_runtimes,
        expected_runtimes=expected_runtimes,
    )


def forecast_of(data: dict) -> estimates.Forecast:
    """A Forecast stored as JSON by ``jobs.services.estimates``, back as data."""
    return estimates.Forecast(
        starts={},
        steps=tuple(
            estimates.Step(at=at, free=free, usage=usage) for at, free, usage in data["steps"]
        ),
        until=data["until"],
        ready=data["ready"],
    )


@dataclass(frozen=True)
class StartPreview:
    expected: estimates.Start
    latest: estimates.Start
    computed_at: datetime  # of the forecast it comes from

    def summary(self, *, now: datetime) -> str:
        latest, expected = _moment(self.latest.at), _moment(self.expected.at)
        if latest is None:
            return f"no start estimate: {self.latest.why}"
        expected = min(expected or latest, latest)
        text = f"would start at about {when(expected, now=now)}"
        if latest > expected:
            text += f", by {when(latest, now=now)} at the latest"
        return text


def start_preview(
    *, probe: admission.QueuedRun, snapshot: admission.Snapshot
) -> StartPreview | None:
    """When ``probe``, submitted now behind every queued run, would start, from the last
    stored forecast of its flavor (no simulation here); None before the first one."""
    stored = StartForecast.objects.filter(flavor__slug=probe.flavor).first()
    if stored is None:
        return None
    quota = snapshot.quotas.get((probe.tenant, probe.flavor))
    found = {
        mode: estimates.first_fit(
            forecast_of(data), run=probe, quota=quota, nodes=snapshot.nodes, levels=snapshot.levels
        )
        for mode, data in (("latest", stored.latest), ("expected", stored.expected))
    }
    return StartPreview(
        expected=found["expected"], latest=found["latest"], computed_at=stored.computed_at
    )


def _moment(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


def when(moment: datetime, *, now: datetime) -> str:
    """A start time as people say it: "13:05" today, "Thu 13:05" this week, else the date."""
    local, today = timezone.localtime(moment), timezone.localtime(now)
    if local.date() == today.date():
        return f"{local:%H:%M}"
    if abs((local.date() - today.date()).days) < 7:
        return f"{local:%a %H:%M}"
    return f"{local:%Y-%m-%d %H:%M}"


@dataclass(frozen=True)
class StartEstimate:
    """What a queued run should expect, for one viewer."""

    latest: datetime | None
    expected: datetime | None
    note: str  # why there is no number
    cluster: str
    nodes: tuple[str, ...]
    behind: tuple[int, ...]  # runs of its own tenant it waits for, by id
    behind_elsewhere: int  # how many runs of other tenants (never named, issue 21.3)
    estimated_at: datetime | None

    def summary(self, *, now: datetime) -> str:
        if self.latest is None:
            return f"No start estimate: {self.note}" if self.note else ""
        expected = self.expected or self.latest
        text = f"Should start at about {when(expected, now=now)}"
        if self.latest > expected:
            text += f", by {when(self.latest, now=now)} at the latest"
        text += " unless other work is let in first"
        waits = [f"run {run_id}" for run_id in self.behind]
        if self.behind_elsewhere:
            waits.append(
                f"{self.behind_elsewhere} run{'s' if self.behind_elsewhere > 1 else ''} of "
                "other tenants"
            )
        if waits:
            text += f"; behind {_and(waits)}"
        if self.nodes:
            text += f"; {_and(list(self.nodes))} on {self.cluster} should free up then"
        return text


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def run_start_estimate(*, run: Run) -> StartEstimate | None:
    """The stored estimate of a queued run (None for other runs and before the first
    refresh). Runs it waits for are named only within its tenant: one query."""
    if run.state != RunState.QUEUED or run.start_estimated_at is None:
        return None
    behind = [int(run_id) for run_id in run.start_behind or []]
    own = set(
        Run.objects.filter(pk__among=behind, tenant_id=run.tenant_id).values_list("pk", flat=True)
    )
    placed = list(run.start_nodes or [])
    return StartEstimate(
        latest=run.start_latest_at,
        expected=run.start_expected_at,
        note=run.start_note,
        cluster=placed[0] if placed else "",
        nodes=tuple(placed[1:]),
        behind=tuple(sorted(own)),
        behind_elsewhere=len(set(behind) - own),
        estimated_at=run.start_estimated_at,
    )
