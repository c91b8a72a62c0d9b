"""Reads of what-if reports: whether a request can be replayed (and how long it would take),
the quotas and pools a proposal starts from, and what a reader is shown of a report.

The checks here read the platform as it is now: a proposal names tenants, flavors and
clusters that must exist now (it is applied to today's platform), and its guarantees are
set against today's capacity. ``replay_check`` is the one judge, used by the service that
writes a report, the new-report page and the API alike.
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from clusters.models import ClusterFlavor
from jobs import admission_types
from jobs.models import Run
from jobs.replay_types import History, Proposal
from jobs.selectors.queue import cluster_nodes, quotas_now
from policy.access import report_tenant_scope
from policy.models import ReplayReport
from policy.proposals import ProposalShapeError, proposal_from_json, proposal_tenants
from policy.results import ReportView, report_view
from tenants.models import GpuFlavor, Tenant

# The longest window a report replays.
MAX_WINDOW_DAYS = 92
# How fast a replay goes, in recorded submissions per second of one worker, until reports
# have been replayed here: then the median of the last ones (``replay_rate``). A cautious
# guess below what the engine does on a 2-core machine; its speed is measured in bench/.
REPLAY_SUBMISSIONS_PER_S = 200.0
RATE_FROM_LAST_REPORTS = 5
# A report replays its window twice: under the policy in force, then under the proposal.
REPLAYS_PER_REPORT = 2
# Longer than this is refused, with the estimate: a replay holds a background worker.
MAX_REPLAY_ESTIMATE_S = 30 * 60
# A running report whose worker wrote nothing for this long lost its worker: it may be
# claimed again (its task redelivered, or run again by a person).
STALE_AFTER = timedelta(seconds=90)


@dataclass(frozen=True)
class ReplayCheck:
    """What ``replay_check`` found: errors by field (nothing may be written), the warnings a
    person must confirm, and what the replay would cover."""

    errors: dict[str, list[str]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    proposal: Proposal | None = None
    submissions: int = 0
    estimate_s: float = 0.0
    tenants: tuple[str, ...] = ()  # the slugs the proposal names or with runs in the window


def replay_rate() -> float:
    """Recorded submissions replayed per second (both replays of a report counted): the
    median of the last reports done here, or ``REPLAY_SUBMISSIONS_PER_S`` before any."""
    last = (
        ReplayReport.objects.filter(
            status=ReplayReport.Status.DONE,
            started_at__isnull=False,
            finished_at__isnull=False,
            submissions__gt=0,
        )
        .order_by("-finished_at", "-id")
        .values_list("submissions", "started_at", "finished_at")[:RATE_FROM_LAST_REPORTS]
    )
    rates = sorted(
        REPLAYS_PER_REPORT * submissions / seconds
        for submissions, started, finished in last
        if started is not None
        and finished is not None
        and (seconds := (finished - started).total_seconds()) > 0
    )
    return rates[len(rates) // 2] if rates else REPLAY_SUBMISSIONS_PER_S


def replay_estimate_s(submissions: int, *, rate: float) -> float:
    """Seconds a report over ``submissions`` recorded runs takes at ``rate``."""
    return REPLAYS_PER_REPORT * submissions / rate


def duration_words(seconds: float) -> str:
    """ "40 s", "12 min", "3.5 h": an estimate in the unit a person reads."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def platform_now(*, now: datetime) -> History:
    """The platform as it is, as a history without runs: what a proposal is judged against
    (its tenants, flavors, clusters, nodes and quotas now)."""
    start = now.timestamp()
    return History(
        start=start,
        end=start,
        submissions=(),
        holding=(),
        nodes=tuple(cluster_nodes(now=now)),
        quotas=quotas_now(),
        tenants=tuple(Tenant.objects.filter(active=True).values_list("slug", flat=True)),
        flavors=tuple(GpuFlavor.objects.values_list("slug", flat=True)),
    )


def _window_errors(start: datetime, end: datetime, now: datetime) -> list[str]:
    if end <= start:
        return ["The window must end after it starts."]
    if end > now:
        return ["The window must be in the past: it ends after now."]
    if end - start > timedelta(days=MAX_WINDOW_DAYS):
        return [f"A window of at most {MAX_WINDOW_DAYS} days can be replayed."]
    return []


def window_runs(*, start: datetime, end: datetime) -> tuple[int, tuple[str, ...]]:
    """Runs alive in [start, end) (submitted before its end, not ended before its start) and
    the slugs of their tenants, in two queries."""
    alive = Run.objects.filter(
        Q(submitted_at__lt=end) & (Q(finished_at__isnull=True) | Q(finished_at__gte=start))
    )
    tenants = alive.order_by().values_list("tenant__slug", flat=True).distinct()
    return alive.count(), tuple(sorted(tenants))


def replay_check(
    *, window_start: datetime, window_end: datetime, proposal: object, now: datetime
) -> ReplayCheck:
    """Whether the window can be replayed under ``proposal`` (its JSON), judged against the
    platform now: errors for a window with no history, a proposal of the wrong shape or
    with impossible values (a negative quota, a tenant, flavor or cluster deleted since,
    more nodes removed than there are) or a replay estimated to take too long; warnings
    (an overcommitted flavor) to confirm."""
    errors: dict[str, list[str]] = {}
    window = _window_errors(window_start, window_end, now)
    if window:
        errors["window"] = window
    try:
        parsed = proposal_from_json(proposal)
    except ProposalShapeError as exc:
        errors["proposal"] = [str(exc)]
        return ReplayCheck(errors=errors)
    problems = parsed.validate(platform_now(now=now))
    if problems.errors:
        errors["proposal"] = list(problems.errors)
    if window:
        return ReplayCheck(errors=errors, proposal=parsed)
    submissions, tenants = window_runs(start=window_start, end=window_end)
    estimate = replay_estimate_s(submissions, rate=replay_rate())
    if not submissions:
        errors["window"] = [
            f"No run was submitted or held GPUs from {window_start:%Y-%m-%d %H:%M} to "
            f"{window_end:%Y-%m-%d %H:%M} UTC: there is no history to replay."
        ]
    elif estimate > MAX_REPLAY_ESTIMATE_S:
        errors["window"] = [
            f"Replaying {submissions:,} runs would take about {duration_words(estimate)}, "
            f"longer than the {duration_words(MAX_REPLAY_ESTIMATE_S)} a report may take: "
            "choose a shorter window."
        ]
    return ReplayCheck(
        errors=errors,
        warnings=problems.warnings,
        proposal=parsed,
        submissions=submissions,
        estimate_s=estimate,
        tenants=tuple(sorted(set(tenants) | proposal_tenants(parsed))),
    )


def report_running_other(*, report: ReplayReport, now: datetime) -> ReplayReport | None:
    """Another report being replayed now (its worker alive), which ``report`` waits for:
    reports are replayed one at a time, oldest first."""
    return (
        ReplayReport.objects.filter(
            status=ReplayReport.Status.RUNNING, heartbeat_at__gte=now - STALE_AFTER
        )
        .exclude(pk=report.pk)
        .order_by("created_at", "id")
        .first()
    )


def report_stale(*, report: ReplayReport, now: datetime) -> bool:
    """Running, but its worker has written nothing for ``STALE_AFTER``: it was lost."""
    return (
        report.status == ReplayReport.Status.RUNNING
        and report.heartbeat_at is not None
        and report.heartbeat_at < now - STALE_AFTER
    )


def queued_ahead(*, report: ReplayReport) -> int:
    """Reports queued or running that were asked for before ``report``."""
    if report.status != ReplayReport.Status.QUEUED:
        return 0
    return (
        ReplayReport.objects.filter(
            status__in=(ReplayReport.Status.QUEUED, ReplayReport.Status.RUNNING)
        )
        .filter(
            Q(created_at__lt=report.created_at) | Q(created_at=report.created_at, pk__lt=report.pk)
        )
        .count()
    )


@dataclass(frozen=True)
class ReportShown:
    """A report as one reader sees it: its view (when it has a result), the tenants whose
    rows they read (None: all) and the proposal's parts they may see."""

    report: ReplayReport
    scope: frozenset[str] | None
    view: ReportView | None
    proposal: dict[str, Any]
    tenants: tuple[str, ...]


def report_shown(*, user, report: ReplayReport) -> ReportShown:
    """``report`` as ``user`` may read it (``report_get_viewable`` found it for them)."""
    ids = report_tenant_scope(user=user, report=report)
    tenants = tuple(report.tenants.order_by("slug").values_list("slug", flat=True))
    scope = (
        None
        if ids is None
        else frozenset(Tenant.objects.filter(pk__in=ids).values_list("slug", flat=True))
    )
    proposal = dict(report.proposal)
    if scope is not None:
        proposal["quotas"] = [q for q in proposal.get("quotas", []) if q.get("tenant") in scope]
        proposal["tenant_queueing"] = {
            name: policy
            for name, policy in proposal.get("tenant_queueing", {}).items()
            if name in scope
        }
        tenants = tuple(slug for slug in tenants if slug in scope)
    view = None if report.result is None else report_view(report.result, tenants=scope)
    return ReportShown(report=report, scope=scope, view=view, proposal=proposal, tenants=tenants)


@dataclass(frozen=True)
class QuotaLine:
    """A quota as it is now, a line of the proposal editor."""

    tenant: str
    flavor: str
    quota: admission_types.Quota


@dataclass(frozen=True)
class PoolLine:
    """A cluster's pool of a flavor now, a line of the nodes part of the proposal editor."""

    cluster: str
    flavor: str
    nodes: int
    gpus_per_node: int


def proposal_editor_lines() -> tuple[list[QuotaLine], list[PoolLine]]:
    """Every active tenant's quotas and every enabled cluster's pools, as they are now, in
    the order the editor lists them."""
    quotas = [
        QuotaLine(tenant, flavor, quota) for (tenant, flavor), quota in sorted(quotas_now().items())
    ]
    pools = [
        PoolLine(cluster, flavor, nodes, per_node)
        for cluster, flavor, nodes, per_node in ClusterFlavor.objects.filter(cluster__enabled=True)
        .order_by("cluster__name", "flavor__slug")
        .values_list("cluster__name", "flavor__slug", "nodes", "gpus_per_node")
    ]
    return quotas, pools


@dataclass(frozen=True)
class ApplyLine:
    """A quota the proposal sets: as it is now (None: the tenant has none of the flavor)
    and as proposed."""

    tenant: Tenant
    flavor: GpuFlavor
    current: admission_types.Quota | None
    proposed: admission_types.Quota

    @property
    def changed(self) -> bool:
        return self.current != self.proposed

    @property
    def budget(self) -> int | None:
        """The proposed monthly budget in whole GPU-hours, as the quota form takes it."""
        hours = self.proposed.budget_gpu_hours
        return None if hours is None else int(hours)


@dataclass(frozen=True)
class ApplyPlan:
    """What applying a report's proposal would change, what it cannot, and why it may not
    be applied at all (``errors``)."""

    changes: tuple[ApplyLine, ...] = ()
    unchanged: tuple[ApplyLine, ...] = ()
    not_applied: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


def _not_applied(proposal: Proposal) -> list[str]:
    """The parts of a proposal that are no quota, in words: what a person does instead."""
    lines = []
    for change in proposal.nodes:
        count = abs(change.count)
        what = f"{count} {change.flavor} node{'s' if count != 1 else ''}"
        where = f"to {change.cluster}" if change.count > 0 else f"from {change.cluster}"
        lines.append(
            f"{'Add' if change.count > 0 else 'Remove'} {what} {where}: nodes are hardware, "
            "changed on the cluster (a simulator cluster's pools on its capacity page)."
        )
    if proposal.preemption is False:
        lines.append(
            "No preemption of borrowed runs: Gantry has no setting for it; the report shows "
            "what it would change."
        )
    elif proposal.preemption is True:
        lines.append("Preemption of borrowed runs: as Gantry does today.")
    if proposal.starvation_after_s is not None:
        lines.append(
            f"Hold GPUs for a run waiting longer than {proposal.starvation_after_s:g} s: set "
            f"GANTRY_STARVATION_AFTER_S={proposal.starvation_after_s:g} in the deployment's "
            "environment (docs/admission.md)."
        )
    for kind, policies in (("cluster", proposal.queueing), ("tenant", proposal.tenant_queueing)):
        lines.extend(
            f"Queueing of {kind} {name}: {policy.value}, set on the {kind} in the admin "
            "(audited there)."
            for name, policy in sorted(policies.items())
        )
    if proposal.fair_share_half_life_s is not None:
        hours = proposal.fair_share_half_life_s / 3600
        lines.append(
            f"Fair-share half-life of {hours:g} h: set GANTRY_FAIR_SHARE_HALF_LIFE_H={hours:g} "
            "in the deployment's environment."
        )
    return lines


def apply_plan(*, report: ReplayReport) -> ApplyPlan:
    """The quotas applying ``report``'s proposal sets, against today's quotas."""
    if report.status != ReplayReport.Status.DONE:
        return ApplyPlan(
            errors=(
                f"Report {report.pk} is {report.get_status_display().lower()}: a proposal "
                "is applied once its replay is done and read.",
            )
        )
    proposal = Proposal.from_json(report.proposal)
    slugs = {tenant for tenant, _ in proposal.quotas}
    flavor_slugs = {flavor for _, flavor in proposal.quotas}
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=slugs, active=True)}
    flavors = {f.slug: f for f in GpuFlavor.objects.filter(slug__in=flavor_slugs)}
    errors = [
        f"There is no tenant {slug} any more (deleted or deactivated since the report): "
        "nothing was applied."
        for slug in sorted(slugs - set(tenants))
    ] + [
        f"There is no GPU flavor {slug} any more (deleted since the report): nothing was applied."
        for slug in sorted(flavor_slugs - set(flavors))
    ]
    for (tenant, flavor), quota in sorted(proposal.quotas.items()):
        hours = quota.budget_gpu_hours
        if hours is not None and not float(hours).is_integer():
            errors.append(
                f"{tenant} {flavor}: a budget of {hours:g} GPU-hours cannot be set; the quota "
                "form takes whole GPU-hours."
            )
    if errors:
        return ApplyPlan(errors=tuple(errors))
    now = quotas_now()
    lines = [
        ApplyLine(tenants[tenant], flavors[flavor], now.get((tenant, flavor)), quota)
        for (tenant, flavor), quota in sorted(proposal.quotas.items())
    ]
    return ApplyPlan(
        changes=tuple(line for line in lines if line.changed),
        unchanged=tuple(line for line in lines if not line.changed),
        not_applied=tuple(_not_applied(proposal)),
    )
