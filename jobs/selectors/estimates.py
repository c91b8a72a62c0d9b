"""Reads for start estimates: what the forward simulation needs (jobs.estimates), and the
stored forecast the submit preview looks up."""

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.utils import timezone

from clusters.models import Cluster
from clusters.simulation import Workload, work_wall_s
from jobs import admission_types, estimates
from jobs.durations import duration_text
from jobs.models import (
    HOLDING_STATES,
    LIVE_ATTEMPT_STATES,
    Attempt,
    Checkpoint,
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
    snapshot: admission_types.Snapshot
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


def _simulator_speedups(snapshot: admission_types.Snapshot) -> dict[str, float]:
    """flavor -> the speed-up a run of it gets when every enabled cluster that offers the
    flavor is a simulator (the slowest of them, so the longest wall time); flavors that a
    real cluster offers are absent: there, only history says how long a run takes."""
    kinds = {
        name: (backend, settings_)
        for name, backend, settings_ in Cluster.objects.filter(enabled=True).values_list(
            "name", "backend", "settings"
        )
    }
    found: dict[str, float] = {}
    real: set[str] = set()
    for node in snapshot.nodes:
        backend, cluster_settings = kinds.get(node.cluster, ("", {}))
        if backend != Cluster.Backend.SIMULATOR:
            real.add(node.flavor)
            continue
        speedup = float(cluster_settings.get("speedup", 1))
        found[node.flavor] = min(speedup, found.get(node.flavor, speedup))
    return {flavor: speedup for flavor, speedup in found.items() if flavor not in real}


def _simulated_s(env: dict, *, resume_step: int | None, speedup: float | None) -> float | None:
    """Wall seconds the simulated work of a run takes when its experiment declares that work
    (``GANTRY_SIM_DURATION_S``) and a simulator runs it: known to the second, as the
    simulator runs it exactly. None otherwise, and history predicts."""
    if speedup is None or speedup <= 0 or "GANTRY_SIM_DURATION_S" not in env:
        return None
    hints = {str(k): str(v) for k, v in env.items()}
    if resume_step:
        hints["GANTRY_RESUME_STEP"] = str(resume_step)
    try:
        return work_wall_s(Workload.from_env(hints), speedup=speedup)
    except ValueError:  # a hint the simulator refuses: its submit fails, nothing to predict
        return None


# What both reads take of a run: who, its experiment's shape, max runtime and environment.
_RUN_FIELDS = (
    "id",
    "experiment__project_id",
    "experiment__name",
    "experiment__template_id",
    "tenant__slug",
    "flavor__slug",
    "experiment__nodes",
    "experiment__gpus_per_node",
    "experiment__max_runtime_minutes",
    "experiment__env",
)


def estimate_inputs(*, snapshot: admission_types.Snapshot, now: datetime) -> EstimateInputs:
    """How long every run of the admission ``snapshot`` holds its GPUs, at the latest (max
    runtimes) and as expected, in five queries. Expected: for a run on a simulated cluster
    that declares its simulated work, that work's wall time (to the second); else history.
    Every figure is wall time, as every time limit is (clusters.simulation)."""
    history = _durations_by_key(now=now)
    max_runtimes, expected_runtimes = _queued_runtimes(
        history, speedups=_simulator_speedups(snapshot)
    )
    latest_ends, expected_ends = _held_ends(history, snapshot=snapshot, now=now)
    return EstimateInputs(
        snapshot=snapshot,
        latest_ends=latest_ends,
        expected_ends=expected_ends,
        max_runtimes=max_runtimes,
        expected_runtimes=expected_runtimes,
    )


def _queued_runtimes(
    history: dict[tuple, list[float]], *, speedups: dict[str, float]
) -> tuple[dict[int, float | None], dict[int, float | None]]:
    """Queued run -> seconds it holds its GPUs once started: at the latest (its max
    runtime), and as expected (its simulated work from its latest checkpoint, or history)."""
    max_runtimes: dict[int, float | None] = {}
    expected_runtimes: dict[int, float | None] = {}
    # A requeued run resumes from its latest checkpoint: its work left starts there.
    latest_checkpoint = (
        Checkpoint.objects.filter(run=OuterRef("pk")).order_by("-step").values("step")[:1]
    )
    queued = Run.objects.filter(state=RunState.QUEUED).annotate(
        resume_step=Subquery(latest_checkpoint)
    )
    for row in queued.values_list(*_RUN_FIELDS, "resume_step"):
        run_id, project, name, template, tenant, flavor, nodes, gpus_per_node, minutes = row[:9]
        env, resume_step = row[9:]
        experiment = (project, name)
        max_runtimes[run_id] = minutes * 60.0
        simulated = _simulated_s(env, resume_step=resume_step, speedup=speedups.get(flavor))
        expected_runtimes[run_id] = (
            min(minutes * 60.0, simulated)
            if simulated is not None
            else _expected_runtime(
                history,
                experiment=experiment,
                template=template,
                shape=(tenant, flavor, nodes, gpus_per_node),
                max_runtime_s=minutes * 60.0,
            )
        )
    return max_runtimes, expected_runtimes


def _held_ends(
    history: dict[tuple, list[float]], *, snapshot: admission_types.Snapshot, now: datetime
) -> tuple[dict[int, float | None], dict[int, float | None]]:
    """Held run -> when it frees its GPUs: at the latest (``HeldRun.latest_end``, as the
    snapshot read it), and as expected."""
    cluster_speedups = {
        name: float(cluster_settings.get("speedup", 1))
        for name, cluster_settings in Cluster.objects.filter(
            backend=Cluster.Backend.SIMULATOR
        ).values_list("name", "settings")
    }
    live = Attempt.objects.filter(run=OuterRef("pk"), state__in=LIVE_ATTEMPT_STATES).order_by(
        "-number"
    )
    held = Run.objects.filter(state__in=HOLDING_STATES).annotate(
        attempt_started=Subquery(live.filter(started_at__isnull=False).values("started_at")[:1]),
        attempt_resume_step=Subquery(live.values("resumed_from__step")[:1]),
    )
    in_snapshot = {run.id: run for run in snapshot.held}
    latest_ends: dict[int, float | None] = {}
    expected_ends: dict[int, float | None] = {}
    at = now.timestamp()
    for row in held.values_list(*_RUN_FIELDS, "attempt_started", "attempt_resume_step"):
        run_id, project, name, template, tenant, flavor, nodes, gpus_per_node, minutes = row[:9]
        env, started, resume_step = row[9:]
        snapshot_run = in_snapshot.get(run_id)
        if snapshot_run is None:  # it began holding after the snapshot was read
            continue
        latest = snapshot_run.latest_end
        latest_ends[run_id] = latest
        if latest is None:
            expected_ends[run_id] = None
            continue
        simulated = _simulated_s(
            env, resume_step=resume_step, speedup=cluster_speedups.get(snapshot_run.cluster)
        )
        expected_ends[run_id] = estimates.expected_end(
            started=started.timestamp() if started is not None else None,
            now=at,
            expected_s=(
                simulated
                if simulated is not None
                else _expected_runtime(
                    history,
                    experiment=(project, name),
                    template=template,
                    shape=(tenant, flavor, nodes, gpus_per_node),
                    max_runtime_s=minutes * 60.0,
                )
            ),
            latest_end=latest,
        )
    return latest_ends, expected_ends


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
    full_limits: estimates.Start  # if every run ahead uses its whole max runtime
    computed_at: datetime  # of the forecast it comes from

    def summary(self, *, now: datetime) -> str:
        full, expected = _moment(self.full_limits.at), _moment(self.expected.at)
        if full is None:
            return f"no start estimate: {self.full_limits.why}"
        # The forecast is up to a refresh old: a start it put before now is now at the
        # earliest, never a time already past.
        full = max(full, now)
        expected = max(min(expected or full, full), now)
        text = f"would start at about {when(expected, now=now)}"
        if full > expected:
            text += f"; about {when(full, now=now)} {FULL_LIMITS}"
        return text + f" (estimates of {when(self.computed_at, now=now)})"


def start_preview(
    *, probe: admission_types.QueuedRun, snapshot: admission_types.Snapshot
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
        for mode, data in (("full_limits", stored.latest), ("expected", stored.expected))
    }
    return StartPreview(
        expected=found["expected"], full_limits=found["full_limits"], computed_at=stored.computed_at
    )


def _moment(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


# The one name of the second estimate, wherever it is shown. Not "latest": it assumes no
# other work is let in first, which Gantry does not promise (docs/admission.md).
FULL_LIMITS = "if every run ahead uses its full time limit"


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

    full_limits: datetime | None  # if every run ahead uses its whole max runtime
    expected: datetime | None
    note: str  # why there is no number
    cluster: str
    nodes: tuple[str, ...]
    behind: tuple[int, ...]  # runs of its own tenant it waits for, by id
    behind_elsewhere: int  # how many runs of other tenants (never named, issue 21.3)
    estimated_at: datetime | None

    def summary(self, *, now: datetime) -> str:
        if self.full_limits is None:
            return f"No start estimate: {self.note}" if self.note else ""
        # Stored by the last refresh: a start it put before now reads as now, never as past.
        full = max(self.full_limits, now)
        expected = max(min(self.expected or full, full), now)
        text = f"Should start at about {when(expected, now=now)}"
        if full > expected:
            text += f"; about {when(full, now=now)} {FULL_LIMITS}"
        if self.estimated_at is not None:
            text += f" (estimates of {when(self.estimated_at, now=now)}"
        else:
            text += " (estimates"
        text += "; a run let in first can move them)"
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
        full_limits=run.start_full_limits_at,
        expected=run.start_expected_at,
        note=run.start_note,
        cluster=placed[0] if placed else "",
        nodes=tuple(placed[1:]),
        behind=tuple(sorted(own)),
        behind_elsewhere=len(set(behind) - own),
        estimated_at=run.start_estimated_at,
    )


# How far back the track record of the full-limits estimate looks.
START_RECORD_DAYS = 7


@dataclass(frozen=True)
class StartRecord:
    """How the full-limits estimates of one flavor fared: of its runs that first started
    in the last START_RECORD_DAYS with one standing (``Run.start_full_limits_was``), how
    many started by it. Counted over every tenant, never naming a run (issue 21.3)."""

    flavor: str
    started: int
    met: int  # started at or before it
    worst_miss_s: float | None  # the furthest a start came after its estimate; None: none did
    last_met_at: datetime | None  # the latest of the starts that met theirs

    def summary(self, *, now: datetime) -> str:
        """The record as the pages say it, after the estimate."""
        text = "an estimate, not a promise: "
        if not self.started:
            return text + (
                f"no {self.flavor} run has started with one in the last {START_RECORD_DAYS} days"
            )
        text += (
            f"met by {self.met} of {self.started} {self.flavor} run"
            f"{'s' if self.started > 1 else ''} started in the last {START_RECORD_DAYS} days"
        )
        if self.last_met_at is not None:
            text += f", last at {when(self.last_met_at, now=now)}"
        if self.worst_miss_s is not None:
            text += f"; at worst {duration_text(self.worst_miss_s)} late"
        return text

    def sentence(self, *, now: datetime) -> str:
        """The record as a sentence of its own (the run page)."""
        return f"The start time {FULL_LIMITS} is {self.summary(now=now)}."


def start_records(*, flavors: Iterable[str], now: datetime) -> dict[str, StartRecord]:
    """The track record of each of ``flavors`` (slugs) as of ``now``: one aggregate query
    over the runs that first started in the window with an estimate (an index of those
    alone, ``run_start_record``)."""
    wanted = sorted(set(flavors))
    if not wanted:
        return {}
    met = Q(start_missed_by_s__lte=0)
    rows = (
        Run.objects.filter(
            flavor__slug__in=wanted,
            start_missed_by_s__isnull=False,
            started_at__gte=now - timedelta(days=START_RECORD_DAYS),
            started_at__lte=now,
        )
        .order_by()
        .values("flavor__slug")
        .annotate(
            started=Count("id"),
            met=Count("id", filter=met),
            worst=Max("start_missed_by_s"),
            last_met_at=Max("started_at", filter=met),
        )
    )
    found: dict[str, dict[str, Any]] = {row["flavor__slug"]: dict(row) for row in rows}
    records = {}
    for flavor in wanted:
        row = found.get(flavor, {})
        worst = row.get("worst")
        records[flavor] = StartRecord(
            flavor=flavor,
            started=row.get("started", 0),
            met=row.get("met", 0),
            worst_miss_s=worst if worst is not None and worst > 0 else None,
            last_met_at=row.get("last_met_at"),
        )
    return records


def shows_full_limits(run: Run) -> bool:
    """Whether a page shows the run's full-limits estimate (and so its track record)."""
    return run.state == RunState.QUEUED and run.start_full_limits_at is not None


def start_records_shown(
    runs: Iterable[Run], *, flavor_of: Callable[[Run], str], now: datetime
) -> dict[str, StartRecord]:
    """The track records a list of ``runs`` shows beside their estimates: one query for
    the whole list, none when no run in it shows one."""
    return start_records(
        flavors=[flavor_of(run) for run in runs if shows_full_limits(run)], now=now
    )
