"""Failure attribution and its consequences (design §10): the cause class of an ended
attempt from the node-health events on its nodes (``jobs.attribution`` decides), the retry
of a hardware- or platform-ended run on other nodes, runs on a node that gets quarantined,
and the attempt-failures signal for a node where several tenants' attempts fail."""

import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import transaction

from clusters.health import NodeHealth, Signal, SignalClass, Source
from clusters.health_policy import Act, OnQuarantine
from clusters.models import Cluster, ClusterNode, NodeHealthEvent
from clusters.services.health import node_signals_record
from jobs import attribution
from jobs.models import (
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    CauseClass,
    Run,
)
from jobs.selectors.node_health import health_policy_value
from jobs.services.lifecycle import run_cancel, run_preempt

logger = logging.getLogger(__name__)

# The key of the SDK runtime report that carries the CUDA/NCCL error the job exited with.
RUNTIME_ERROR_KEY = "error_at_exit"


def attempt_nodes(attempt: Attempt) -> list[str]:
    """Where the attempt ran (the backend's word), else where it was placed."""
    return attempt.nodes


def _events(*, cluster_id: int, nodes: Sequence[str], start, end) -> list:
    """The node-health events on ``nodes`` of the cluster in [start, end + grace]: one
    query."""
    if not nodes:
        return []
    rows = NodeHealthEvent.objects.filter(
        cluster_id=cluster_id,
        node__in=list(nodes),
        observed_at__gte=start,
        observed_at__lte=end + timedelta(seconds=attribution.GRACE_S),
    ).values_list("node", "signal", "observed_at", "gpu", "code", "detail", "source")
    return [
        attribution.HealthEvent(node, signal, at.timestamp(), gpu, code, detail, source)
        for node, signal, at, gpu, code, detail, source in rows
    ]


def attempt_cause(
    *,
    attempt: Attempt,
    state: str,
    failure_reason: str,
    exit_code: int | None,
    message: str,
    finished_at: datetime,
    node_list: Sequence[str] = (),
    backend_error: bool = False,
) -> tuple[str, dict[str, str]]:
    """The cause class and evidence of the attempt's end (one query for the events)."""
    nodes = tuple(node_list or attempt_nodes(attempt))
    started = attempt.started_at
    facts = attribution.EndedAttempt(
        state=str(state),
        ended=finished_at.timestamp(),
        failure_reason=failure_reason,
        exit_code=exit_code,
        message=message,
        runtime_error=str((attempt.runtime_env or {}).get(RUNTIME_ERROR_KEY, ""))[:2000],
        nodes=nodes,
        gpus=tuple(attempt.gpu_uuids or ()),
        started=None if started is None else started.timestamp(),
        backend_error=backend_error,
    )
    if facts.state in ("SUCCEEDED", "CANCELLED"):
        return "", {}
    events = _events(
        cluster_id=attempt.cluster_id, nodes=nodes, start=started or finished_at, end=finished_at
    )
    return attribution.attribute(facts, events)


def excluded_after(run: Run, cause: str, evidence: dict[str, str]) -> list[str]:
    """The run's excluded nodes once this cause is known: the evidence's node added when
    the node is to blame (hardware, or taken out of service), not for a plain preemption."""
    node = evidence.get("node", "")
    blames_node = cause == CauseClass.HARDWARE or evidence.get("signal") in (
        attribution.PERSON_REMOVALS
    )
    excluded = list(run.excluded_nodes or [])
    if node and blames_node and node not in excluded:
        excluded.append(node)
    return excluded


def retry_words(*, attempt: Attempt, cause: str, evidence: dict[str, str], step: int | None) -> str:
    """The run's timeline line for a retried hardware or platform end."""
    where = f"from step {step}" if step is not None else "from the start"
    return (
        f"Attempt {attempt.number} ended: {attribution.cause_words(cause, evidence)}; "
        f"requeued {where} on other nodes, not counted against your restarts"
    )


def give_up_words(*, attempt: Attempt, cause: str, evidence: dict[str, str], limit: int) -> str:
    return (
        f"Attempt {attempt.number} ended: {attribution.cause_words(cause, evidence)}; not "
        f"retried again: the run already had {limit} retr{'y' if limit == 1 else 'ies'} after "
        f"hardware or platform faults, the cluster's limit"
    )


# --- runs on a quarantined node --------------------------------------------------------------


def _quarantine_evidence(
    attempt: Attempt, node: str, reason: str, since: datetime | None, now: datetime
) -> tuple[str, dict[str, str]]:
    """A hardware signal on the node during the attempt is the cause; else the quarantine
    itself (a person's, or a policy's on a non-hardware signal) is the platform's."""
    cause, evidence = attempt_cause(
        attempt=attempt,
        state="FAILED",
        failure_reason="",
        exit_code=None,
        message="",
        finished_at=now,
        node_list=[node],
    )
    if cause == CauseClass.HARDWARE:
        return cause, evidence
    at = since or now
    return CauseClass.PLATFORM, {
        "node": node,
        "gpu": "",
        "signal": Act.QUARANTINE.value,
        "code": "",
        "at": at.isoformat(),
        "detail": reason[:500],
    }


def quarantined_attempts_settle(*, cluster: Cluster, now: datetime) -> int:
    """Act on the live attempts on the cluster's quarantined nodes as the policy's
    ``on_quarantine`` says: requeue (preempt: checkpoint, back in the queue, the node
    excluded), stop (cancel the run) or finish (leave them). Idempotent: an attempt acted
    on already has its cause, and its run has left the holding states. Returns how many
    runs it acted on."""
    quarantined = {
        name: (reason, since)
        for name, reason, since in ClusterNode.objects.filter(
            cluster=cluster, health=NodeHealth.QUARANTINED
        ).values_list("name", "health_reason", "health_since")
    }
    action = health_policy_value(cluster, "on_quarantine")
    if not quarantined or action == OnQuarantine.FINISH:
        return 0
    acted = 0
    live = Attempt.objects.filter(
        cluster=cluster, state__in=LIVE_ATTEMPT_STATES, cause_class=""
    ).select_related("run", "cluster")
    for attempt in live:
        node = next((n for n in attempt_nodes(attempt) if n in quarantined), None)
        if node is None or attempt.run.cancel_requested_at is not None:
            continue
        reason, since = quarantined[node]
        cause, evidence = _quarantine_evidence(attempt, node, reason, since, now)
        Attempt.objects.filter(pk=attempt.pk, cause_class="").update(
            cause_class=cause, cause_evidence=evidence
        )
        why = f"node {node} was quarantined by Gantry ({reason or 'no reason given'})"
        if action == OnQuarantine.STOP:
            run_cancel(run=attempt.run, actor=None, system_reason=f"Stopped: {why}")
            acted += 1
            continue
        Run.objects.filter(pk=attempt.run_id).update(
            excluded_nodes=excluded_after(attempt.run, cause, evidence)
        )
        acted += run_preempt(
            run=attempt.run,
            message=f"Taken off its nodes: {why}; it resumes from its latest checkpoint on "
            "other nodes, not counted against your restarts",
        )
    return acted


# --- the attempt-failures signal ---------------------------------------------------------------


def attempt_failures_check(*, attempt: Attempt, cause: str, now: datetime) -> list[Signal]:
    """After an attempt ended failed with a user-class cause: each of its nodes where
    attempts of at least ``suspect_tenants`` tenants ended failed within
    ``suspect_window_s`` is signalled (ATTEMPT_FAILURES). One query. Returns the signals
    sent."""
    nodes = attempt_nodes(attempt)
    if cause != CauseClass.USER or not nodes:
        return []
    cluster = attempt.cluster
    window = int(health_policy_value(cluster, "suspect_window_s"))
    needed = int(health_policy_value(cluster, "suspect_tenants"))
    tenants: dict[str, set[int]] = defaultdict(set)
    for node_list, placement, tenant_id in Attempt.objects.filter(
        cluster=cluster,
        state=AttemptState.FAILED,
        finished_at__gte=now - timedelta(seconds=window),
    ).values_list("node_list", "placement", "run__tenant_id"):
        for node in node_list or placement or []:
            if node in nodes:
                tenants[node].add(tenant_id)
    signals = [
        Signal(
            node,
            SignalClass.ATTEMPT_FAILURES,
            Source.ATTEMPTS,
            now.timestamp(),
            detail=f"attempts of {len(tenants[node])} tenants failed on the node within "
            f"{window // 60} min",
        )
        for node in sorted(set(nodes))
        if len(tenants[node]) >= needed
    ]
    if signals:
        try:
            with transaction.atomic():  # a savepoint: the end is recorded whatever happens
                node_signals_record(cluster=cluster, signals=signals, now=now)
        except Exception:  # a signal not recorded never fails the attempt's end
            logger.exception("attempt %s: attempt-failures signal not recorded", attempt.pk)
    return signals
