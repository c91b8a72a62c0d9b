"""Restart a run without one of its nodes (issue 36, point 4): the run leaves its nodes and
resumes from its latest checkpoint elsewhere, the node excluded from its placements from
then on; the same exclusion node health uses for a quarantined node (docs/user-guide.md,
"Restart excluding a node")."""

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from clusters.models import Cluster
from core.types import UserLike
from jobs import attribution, placement
from jobs.access import run_can_cancel
from jobs.models import LIVE_ATTEMPT_STATES, Attempt, CauseClass, Run, RunState
from jobs.selectors.queue import cluster_nodes
from jobs.services.lifecycle import run_preempt
from tenants.services.audit import audit_record

# The run states in which its attempt's job is on the cluster (placed, pending or running).
LIVE_RUN_STATES = (RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)


def _placeable_without(run: Run, excluded: list[str], *, now) -> str:
    """Why the run could be placed nowhere with ``excluded`` left out ("" when it could):
    on some enabled cluster, nodes of its flavor that take work (not quarantined, not
    drained) and are not excluded must make its gang, in one domain of its required
    topology level, counting every GPU as free: a run that would wait for busy nodes is
    placeable, one that no node could ever take is not. Two queries."""
    experiment = run.experiment
    flavor = run.flavor.slug
    nodes_by_cluster: dict[str, list[placement.Node]] = {}
    for node in cluster_nodes(now=now):
        if node.flavor == flavor:
            nodes_by_cluster.setdefault(node.cluster, []).append(
                placement.Node(
                    name=node.name, gpus=node.gpus, free=node.gpus,
                    schedulable=node.schedulable, path=node.path,
                )
            )  # fmt: skip
    levels = dict(
        Cluster.objects.filter(name__in=list(nodes_by_cluster)).values_list(
            "name", "topology_levels"
        )
    )
    need = f"it needs {experiment.nodes} × {experiment.gpus_per_node} {flavor} GPUs"
    if experiment.topology_required:
        need += f" in one {experiment.topology_level}"
    found = []
    for cluster, nodes in sorted(nodes_by_cluster.items()):
        names = tuple(str(level) for level in levels.get(cluster) or ())
        if experiment.topology_required and experiment.topology_level not in names:
            continue
        required = (
            names.index(experiment.topology_level) + 1 if experiment.topology_required else None
        )
        gang = placement.Gang(
            nodes=experiment.nodes,
            gpus_per_node=experiment.gpus_per_node,
            required_level=required,
            excluded=frozenset(excluded),
        )
        if placement.place(nodes, gang) is not None:
            return ""
        usable = sum(
            1
            for node in nodes
            if node.schedulable
            and node.gpus >= experiment.gpus_per_node
            and node.name not in excluded
        )
        found.append(f"{usable} on {cluster}")
    if not found:
        return f"{need}, and no enabled cluster has such nodes"
    return (
        f"{need}, and the nodes of that size that take work and are not excluded are "
        f"{', '.join(found)}"
    )


@transaction.atomic
def run_restart_excluding(*, run: Run, node: str, actor: UserLike) -> Run:
    """Take ``run`` off its nodes and requeue it to resume from its latest checkpoint
    without ``node``: the node joins ``Run.excluded_nodes``, its live attempt is preempted
    (its job cancelled; not counted against the run's restarts, nor its platform retries),
    and its end is the platform's, its evidence naming the node and the act. Audited as
    "run.restart_excluding"; the run's timeline says who asked.

    Who may: whoever may cancel the run (PermissionDenied otherwise). Refused with a
    ValidationError, nothing changed, when the run is not running on a cluster (or a cancel
    was asked for), the node is not one of its live attempt's, it is excluded already, or
    no node would be left to place the run on."""
    if not run_can_cancel(user=actor, run=run):
        raise PermissionDenied(
            "Only the submitter, a tenant admin or a platform admin can restart the run."
        )
    run = (
        Run.objects.select_for_update(of=("self",))
        .select_related("experiment", "flavor", "tenant")
        .get(pk=run.pk)
    )
    state_before = run.state
    node = node.strip()
    attempt = run.attempts.order_by("-number").first()
    if (
        run.state not in LIVE_RUN_STATES
        or run.cancel_requested_at is not None
        or attempt is None
        or attempt.state not in LIVE_ATTEMPT_STATES
    ):
        cancelling = run.state in LIVE_RUN_STATES and run.cancel_requested_at is not None
        why = "a cancel was requested" if cancelling else run.get_state_display().lower()
        raise ValidationError(
            {"node": [f"Run {run.pk} is not running on a cluster ({why}): only a run on its "
                      "nodes can be restarted without one of them."]}
        )  # fmt: skip
    excluded = list(run.excluded_nodes or [])
    if node in excluded:
        raise ValidationError({"node": [f"{node} is excluded from run {run.pk} already."]})
    nodes = attempt.nodes
    if node not in nodes:
        raise ValidationError(
            {"node": [f"{node or 'That'} is not one of the nodes run {run.pk} runs on "
                      f"({', '.join(nodes) or 'none known yet'})."]}
        )  # fmt: skip
    now = timezone.now()
    why_not = _placeable_without(run, [*excluded, node], now=now)
    if why_not:
        raise ValidationError(
            {"node": [f"Without {node}, run {run.pk} could not be placed anywhere: {why_not}."]}
        )
    who = actor.get_username()
    Attempt.objects.filter(pk=attempt.pk, cause_class="").update(
        cause_class=CauseClass.PLATFORM,
        cause_evidence={
            "node": node,
            "gpu": "",
            "signal": attribution.RESTART_EXCLUDING,
            "code": "",
            "at": now.isoformat(),
            "detail": f"restarted by {who} without {node}",
        },
    )
    Run.objects.filter(pk=run.pk).update(excluded_nodes=[*excluded, node])
    run.excluded_nodes = [*excluded, node]
    checkpoint = run.checkpoints.order_by("-step").values_list("step", flat=True).first()
    resume = f"checkpoint step {checkpoint}" if checkpoint is not None else "the start"
    run_preempt(
        run=run,
        message=f"Restarted by {who} without node {node}: it leaves its nodes and resumes "
        f"from {resume} on other nodes, not counted against your restarts",
        actor=actor,
    )
    audit_record(
        actor=actor,
        action="run.restart_excluding",
        target=f"run {run.pk}",
        tenant=run.tenant,
        before={"state": state_before, "excluded_nodes": excluded},
        after={"state": run.state, "excluded_nodes": run.excluded_nodes, "node": node},
    )
    return run
