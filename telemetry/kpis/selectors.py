"""Reads of the platform KPI page (design §7): queue and startup time, success rate,
failure reasons, checkpoint recovery, goodput and cluster allocation over a range of days.

Seven queries whatever the number of rows. Counts and sums are grouped in SQL; the wall
times behind percentiles come back as seconds the database computed (``SecondsBetween``) and
are ranked by ``telemetry.kpis.metrics`` in one pass for the total, every tenant and every flavor.
PostgreSQL's percentile_cont would need a query per grouping and has no SQLite counterpart;
this way both databases give the same answer (10,000 attempts: about 0.3 s on either).
Platform-wide: the caller checks access.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    F,
    FloatField,
    Func,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, Least

from clusters.models import ClusterFlavor
from jobs.durations import duration_text
from jobs.models import Attempt, AttemptState, Checkpoint, Run, RunState
from jobs.models import FailureReason as FailureReasonChoice
from telemetry import diagnosis
from telemetry.accounting import IDLE_THRESHOLD
from telemetry.kpis import metrics
from telemetry.kpis.metrics import Distribution, Ratio
from telemetry.models import AttemptAccounting, GpuMinute, StepWindow
from telemetry.selectors.finished_attempts import FINISHED_STATES
from telemetry.selectors.gpu_seconds import SECONDS_PER_HOUR

UNSUCCESSFUL_ATTEMPT_STATES = (
    AttemptState.FAILED,
    AttemptState.PREEMPTED,
    AttemptState.LOST,
    AttemptState.CANCELLED,
)
# Runs end SUCCEEDED, FAILED or CANCELLED; a preempted or requeued run has not ended, and
# an attempt lost by the backend fails its run once no restarts are left.
RATED_RUN_STATES = (RunState.SUCCEEDED, RunState.FAILED)


@dataclass(frozen=True, slots=True)
class KpiScope:
    """Which rows count: [since, until) and the optional filters (ids)."""

    since: datetime
    until: datetime
    now: datetime
    tenant_id: int | None = None
    flavor_id: int | None = None
    cluster_id: int | None = None

    def filters(self, run: str, cluster: str = "cluster_id") -> Q:
        """The filters as a Q on a model that reaches the run through ``run`` ("" for the
        run itself, else a path ending in "__") and its cluster through ``cluster``."""
        condition = Q()
        if self.tenant_id is not None:
            condition &= Q(**{f"{run}tenant_id": self.tenant_id})
        if self.flavor_id is not None:
            condition &= Q(**{f"{run}flavor_id": self.flavor_id})
        if self.cluster_id is not None:
            condition &= Q(**{cluster: self.cluster_id})
        return condition


@dataclass(frozen=True, slots=True)
class WallTimes:
    """Nearest-rank percentiles of wall times in seconds, with their text for people."""

    distribution: Distribution

    @classmethod
    def of(cls, seconds: list[float]) -> "WallTimes":
        return cls(metrics.distribution(seconds))

    @property
    def count(self) -> int:
        return self.distribution.count

    @property
    def p50_text(self) -> str:
        return "—" if self.distribution.p50 is None else duration_text(self.distribution.p50)

    @property
    def p95_text(self) -> str:
        return "—" if self.distribution.p95 is None else duration_text(self.distribution.p95)


@dataclass(frozen=True, slots=True)
class GroupKpis:
    """The KPIs of everything, of one tenant or of one flavor."""

    name: str
    queue: WallTimes
    startup: WallTimes
    success: Ratio  # succeeded ÷ (succeeded + failed) runs
    cancelled: int  # runs cancelled, left out of the success rate
    goodput: Ratio  # effective ÷ allocated GPU-seconds

    @property
    def effective_gpu_hours(self) -> float:
        return self.goodput.part / SECONDS_PER_HOUR

    @property
    def allocated_gpu_hours(self) -> float:
        return self.goodput.whole / SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class FailureCount:
    reason: str  # a FailureReason value
    label: str
    next_step: str
    count: int
    share: Ratio  # of all unsuccessful attempts


@dataclass(frozen=True, slots=True)
class Allocation:
    cluster: str
    flavor: str
    capacity_gpus: int | None  # None: the cluster no longer offers the flavor
    allocated_gpu_s: float
    rate: Ratio  # allocated ÷ capacity GPU-seconds

    @property
    def allocated_gpu_hours(self) -> float:
        return self.allocated_gpu_s / SECONDS_PER_HOUR

    @property
    def capacity_gpu_hours(self) -> float:
        return self.rate.whole / SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class PlatformKpis:
    total: GroupKpis
    by_tenant: list[GroupKpis]
    by_flavor: list[GroupKpis]
    failures: list[FailureCount]
    unsuccessful_attempts: int
    recovery: Ratio  # recovered ÷ resumed attempts
    allocation: list[Allocation]
    allocation_total: Ratio
    allocation_hours: float  # the range's hours up to now: the capacity's time

    @property
    def allocated_gpu_hours(self) -> float:
        return self.allocation_total.part / SECONDS_PER_HOUR

    @property
    def leading_failures(self) -> list[FailureCount]:
        """The reasons with the most unsuccessful attempts: one, or all of a tie."""
        if not self.failures:
            return []
        return [item for item in self.failures if item.count == self.failures[0].count]

    @property
    def capacity_gpu_hours(self) -> float:
        return self.allocation_total.whole / SECONDS_PER_HOUR


class SecondsBetween(Func):
    """``end - start`` in seconds, as a float computed by the database: the rows come back
    as plain numbers instead of timestamps to parse. EXTRACT(EPOCH …) on PostgreSQL,
    julianday arithmetic on SQLite (exact to the millisecond, as SQLite's dates are)."""

    arity = 2
    arg_joiner = " - "
    template = "EXTRACT(EPOCH FROM (%(expressions)s))::double precision"
    output_field = FloatField()

    def __init__(self, end, start) -> None:
        super().__init__(end, start)

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(
            compiler,
            connection,
            template="((julianday(%(expressions)s)) * 86400.0)",
            arg_joiner=") - julianday(",
            **extra_context,
        )


def _seconds(value: float) -> float:
    """Seconds to the millisecond, never negative (a clock that ran backwards)."""
    return max(0.0, round(value, 3))


@dataclass(slots=True)
class _Group:
    queue: list[float] = field(default_factory=list)
    startup: list[float] = field(default_factory=list)
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    effective_gpu_s: int = 0
    allocated_gpu_s: int = 0

    def add(self, other: "_Group") -> None:
        self.queue.extend(other.queue)
        self.startup.extend(other.startup)
        self.succeeded += other.succeeded
        self.failed += other.failed
        self.cancelled += other.cancelled
        self.effective_gpu_s += other.effective_gpu_s
        self.allocated_gpu_s += other.allocated_gpu_s

    def kpis(self, name: str) -> GroupKpis:
        return GroupKpis(
            name=name,
            queue=WallTimes.of(self.queue),
            startup=WallTimes.of(self.startup),
            success=Ratio(part=self.succeeded, whole=self.succeeded + self.failed),
            cancelled=self.cancelled,
            goodput=Ratio(part=self.effective_gpu_s, whole=self.allocated_gpu_s),
        )


class _Groups:
    """Rows land in the group of their (tenant, flavor); the totals, tenants and flavors
    are merged from those at the end, which keeps the work per row to one lookup."""

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str], _Group] = defaultdict(_Group)

    def of(self, tenant: str, flavor: str) -> _Group:
        return self.pairs[tenant, flavor]

    def merged(self) -> tuple[_Group, dict[str, _Group], dict[str, _Group]]:
        total = _Group()
        tenants: dict[str, _Group] = defaultdict(_Group)
        flavors: dict[str, _Group] = defaultdict(_Group)
        for (tenant, flavor), group in self.pairs.items():
            for merged in (total, tenants[tenant], flavors[flavor]):
                merged.add(group)
        return total, tenants, flavors


def _queue_times(scope: KpiScope, groups: _Groups) -> None:
    """Attempts that started in the range: the first attempt of a run waited from the
    run's submission, a later one from its creation at requeue (as
    ``telemetry.selectors.timeline.attempt_timeline``)."""
    waiting_since = Case(When(number=1, then=F("run__submitted_at")), default=F("created_at"))
    rows = Attempt.objects.filter(
        scope.filters("run__"), started_at__gte=scope.since, started_at__lt=scope.until
    ).values_list(
        "run__tenant__slug", "run__flavor__slug", SecondsBetween("started_at", waiting_since)
    )
    for tenant, flavor, waited in rows:
        groups.of(tenant, flavor).queue.append(_seconds(waited))


def _accounted(scope: KpiScope, groups: _Groups) -> None:
    """Startup time and goodput of the attempts that ended in the range and are accounted.

    Startup is measured only where the accounting found where work began, a step window
    or a GPU minute at or above the idle threshold: without either it books no startup,
    and counting that as an instant start would flatter the percentiles."""
    attempt = OuterRef("attempt_id")
    rows = (
        AttemptAccounting.objects.filter(
            scope.filters("attempt__run__", "attempt__cluster_id"),
            attempt__finished_at__gte=scope.since,
            attempt__finished_at__lt=scope.until,
        )
        .annotate(
            stepped=Exists(StepWindow.objects.filter(attempt_id=attempt)),
            active=Exists(
                GpuMinute.objects.filter(attempt_id=attempt, activity__gte=IDLE_THRESHOLD)
            ),
        )
        .values_list(
            "attempt__run__tenant__slug",
            "attempt__run__flavor__slug",
            "attempt__run__gpus",
            "startup_gpu_s",
            "effective_gpu_s",
            "allocated_gpu_s",
            "stepped",
            "active",
        )
    )
    for tenant, flavor, gpus, startup, effective, allocated, stepped, active in rows:
        group = groups.of(tenant, flavor)
        group.effective_gpu_s += effective
        group.allocated_gpu_s += allocated
        if stepped or active:
            group.startup.append(startup / gpus)


def _run_outcomes(scope: KpiScope, groups: _Groups) -> None:
    """Runs that ended in the range, counted by state in SQL."""
    rows = (
        Run.objects.filter(
            scope.filters(""),
            finished_at__gte=scope.since,
            finished_at__lt=scope.until,
            state__in=(*RATED_RUN_STATES, RunState.CANCELLED),
        )
        .values_list("tenant__slug", "flavor__slug", "state")
        .annotate(runs=Count("pk"))
        .order_by()
    )
    outcome = {
        RunState.SUCCEEDED: "succeeded",
        RunState.FAILED: "failed",
        RunState.CANCELLED: "cancelled",
    }
    for tenant, flavor, state, runs in rows:
        group = groups.of(tenant, flavor)
        name = outcome[RunState(state)]
        setattr(group, name, getattr(group, name) + runs)


def _failure_reasons(scope: KpiScope) -> tuple[list[FailureCount], int]:
    """Attempts that ended unsuccessfully in the range, by normalized reason, most
    frequent first; an attempt without a known reason counts as UNKNOWN."""
    rows = (
        Attempt.objects.filter(
            scope.filters("run__"),
            finished_at__gte=scope.since,
            finished_at__lt=scope.until,
            state__in=UNSUCCESSFUL_ATTEMPT_STATES,
        )
        .values_list("failure_reason")
        .annotate(attempts=Count("pk"))
        .order_by()
    )
    counts: dict[str, int] = defaultdict(int)
    for reason, attempts in rows:
        if reason not in FailureReasonChoice.values:
            reason = FailureReasonChoice.UNKNOWN
        counts[reason] += attempts
    total = sum(counts.values())
    taxonomy = list(FailureReasonChoice.values)
    return [
        FailureCount(
            reason=reason,
            label=FailureReasonChoice(reason).label,
            next_step=diagnosis.NEXT_STEP[diagnosis.FailureReason(reason)],
            count=count,
            share=Ratio(part=count, whole=total),
        )
        for reason, count in sorted(
            counts.items(), key=lambda item: (-item[1], taxonomy.index(item[0]))
        )
    ], total


def _checkpoint_recovery(scope: KpiScope) -> Ratio:
    """Resumed attempts that ended in the range, and those of them that recovered: got past
    the step of the checkpoint they restored (a step window or a checkpoint of their own
    beyond it) or succeeded (``telemetry.accounting.recovered``, in SQL)."""
    last_step = (
        StepWindow.objects.filter(attempt_id=OuterRef("pk"), step__isnull=False)
        .order_by("-step")
        .values("step")[:1]
    )
    last_checkpoint = (
        Checkpoint.objects.filter(attempt_id=OuterRef("pk")).order_by("-step").values("step")[:1]
    )
    counts = (
        Attempt.objects.filter(
            scope.filters("run__"),
            finished_at__gte=scope.since,
            finished_at__lt=scope.until,
            state__in=FINISHED_STATES,
            resumed_from__isnull=False,
        )
        .annotate(last_step=Subquery(last_step), last_checkpoint=Subquery(last_checkpoint))
        .aggregate(
            resumed=Count("pk"),
            recovered=Count(
                "pk",
                filter=Q(state=AttemptState.SUCCEEDED)
                | Q(last_step__gt=F("resumed_from__step"))
                | Q(last_checkpoint__gt=F("resumed_from__step")),
            ),
        )
    )
    return Ratio(part=counts["recovered"], whole=counts["resumed"])


def _allocation(scope: KpiScope) -> tuple[list[Allocation], Ratio, float]:
    """Allocated GPU-seconds inside the range (up to now) per cluster and flavor, against
    the current capacity of every cluster flavor over the same time."""
    until = min(scope.until, scope.now)
    range_s = metrics.span_seconds(scope.since, until)
    allocated: dict[tuple[str, str], float] = {}
    if range_s:
        # Each attempt's GPUs times its [start, end) clipped to [since, until), the end being
        # now (here: until) while it runs; summed in SQL per cluster and flavor.
        since = Value(scope.since, output_field=DateTimeField())
        end = Value(until, output_field=DateTimeField())
        inside = SecondsBetween(
            Least(Coalesce("finished_at", end), end), Greatest("started_at", since)
        )
        sums = (
            Attempt.objects.filter(scope.filters("run__"), started_at__lt=until)
            .filter(
                Q(finished_at__isnull=True)
                | (Q(finished_at__gt=scope.since) & Q(finished_at__gt=F("started_at")))
            )
            .values_list("cluster__name", "run__flavor__slug")
            .annotate(gpu_s=Sum(F("run__gpus") * inside))
            .order_by()
        )
        allocated = {(cluster, flavor): _seconds(gpu_s) for cluster, flavor, gpu_s in sums}
    # Capacity is the platform's, whoever used it: the tenant filter does not shrink it.
    cluster_flavors = ClusterFlavor.objects.all()
    if scope.flavor_id is not None:
        cluster_flavors = cluster_flavors.filter(flavor_id=scope.flavor_id)
    if scope.cluster_id is not None:
        cluster_flavors = cluster_flavors.filter(cluster_id=scope.cluster_id)
    capacity = {
        (cluster, flavor): nodes * gpus_per_node
        for cluster, flavor, nodes, gpus_per_node in cluster_flavors.values_list(
            "cluster__name", "flavor__slug", "nodes", "gpus_per_node"
        )
    }
    rows = []
    for key in sorted(set(capacity) | set(allocated)):
        gpus = capacity.get(key)
        rows.append(
            Allocation(
                cluster=key[0],
                flavor=key[1],
                capacity_gpus=gpus,
                allocated_gpu_s=allocated.get(key, 0.0),
                rate=Ratio(part=allocated.get(key, 0.0), whole=(gpus or 0) * range_s),
            )
        )
    total = sum((row.rate for row in rows if row.capacity_gpus is not None), Ratio())
    return rows, total, range_s / SECONDS_PER_HOUR


def platform_kpis(*, scope: KpiScope) -> PlatformKpis:
    """Every KPI of the page over the scope, in seven queries."""
    groups = _Groups()
    _queue_times(scope, groups)
    _accounted(scope, groups)
    _run_outcomes(scope, groups)
    total, tenants, flavors = groups.merged()
    failures, unsuccessful = _failure_reasons(scope)
    allocation, allocation_total, allocation_hours = _allocation(scope)
    return PlatformKpis(
        total=total.kpis("All"),
        by_tenant=[tenants[name].kpis(name) for name in sorted(tenants)],
        by_flavor=[flavors[name].kpis(name) for name in sorted(flavors)],
        failures=failures,
        unsuccessful_attempts=unsuccessful,
        recovery=_checkpoint_recovery(scope),
        allocation=allocation,
        allocation_total=allocation_total,
        allocation_hours=allocation_hours,
    )
