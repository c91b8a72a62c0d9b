"""Submitting attempts to their cluster's backend, exactly once."""

import logging
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from clusters.backends import (
    JobRef,
    JobSpec,
    PermanentBackendError,
    TransientBackendError,
    WorkspaceSpec,
    backend_for,
)
from clusters.backends.calls import backend_call
from core.log_context import log_context
from jobs import attribution, reproducibility
from jobs.enqueue import (
    admission_cycle_enqueue,
    attempt_cancel_enqueue,
    attempt_submit_enqueue,
)
from jobs.models import (
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    AttemptToken,
    Experiment,
    Run,
    RunKind,
    RunState,
    Workspace,
    WorkspaceServer,
)
from jobs.selectors.runs import attempt_get_for_work
from jobs.services.lifecycle import attempt_accept, run_transition
from jobs.services.workspaces import workspace_base_path, workspace_server_token

logger = logging.getLogger(__name__)


def job_spec_for(attempt: Attempt) -> JobSpec:
    experiment = attempt.run.experiment
    checkpoint = attempt.resumed_from
    return JobSpec(
        name=attempt.name,
        attempt_id=attempt.pk,
        run_id=attempt.run_id,
        tenant=attempt.run.tenant.slug,
        project=experiment.project.slug,
        image=experiment.image_reference,
        command=experiment.command,
        # The experiment's own; each backend adds Gantry's (clusters.backends.base.job_env).
        env={str(k): str(v) for k, v in experiment.env.items()},
        flavor=experiment.flavor.slug,
        nodes=experiment.nodes,
        gpus_per_node=experiment.gpus_per_node,
        max_runtime_s=_backend_time_limit_s(attempt.run, experiment),
        checkpoint_dir=experiment.checkpoint_dir,
        # Where the job reports its runtime, with the token the backend passes it separately.
        api_url=f"{settings.GANTRY_PUBLIC_URL}/api/v1",
        resume_step=checkpoint.step if checkpoint else None,
        resume_uri=checkpoint.uri if checkpoint else "",
        placement=tuple(attempt.placement),
        topology_level=experiment.topology_level,
        topology_required=experiment.topology_required,
        reclaiming=attempt.reclaimed_from.exists(),
        # Where a hardware or platform fault ended an earlier attempt: never again for it.
        excluded_nodes=tuple(sorted(attempt.run.excluded_nodes or ())),
        workspace=_workspace_spec(attempt.run),
    )


def _workspace_spec(run: Run) -> WorkspaceSpec | None:
    """What a workspace's job needs, without its secret (``job_spec_with_secrets`` adds it)."""
    if run.kind != RunKind.INTERACTIVE:
        return None
    server = Workspace.objects.filter(run_id=run.pk).values_list("server", flat=True).first()
    return WorkspaceSpec(
        server=server or WorkspaceServer.JUPYTER, base_url=workspace_base_path(run.pk)
    )


def job_spec_with_secrets(spec: JobSpec, *, attempt_token: str) -> JobSpec:
    """The copy of ``spec`` handed to the backend's ``submit``: with the attempt's token and
    a workspace's server secret (derived from the attempt, never stored), which the rendered
    spec stored on the attempt never holds."""
    workspace = spec.workspace
    if workspace is not None:
        workspace = replace(workspace, token=workspace_server_token(spec.attempt_id))
    return replace(spec, attempt_token=attempt_token, workspace=workspace)


def attempt_submit(*, attempt_id: int) -> None:
    """Send an admitted attempt to its backend. Safe to call again for the same attempt:
    the backend adopts the job already named after the attempt. Once it is there (or was
    refused), the jobs preempted for it are cancelled (``attempt_cancel`` waits for this)."""
    attempt = attempt_get_for_work(attempt_id)
    with log_context(run_id=attempt.run_id, attempt_id=attempt.pk, cluster=attempt.cluster.name):
        _attempt_submit(attempt)
    attempt_cancel_preempted_for(attempt_id=attempt_id)


def attempt_cancel_preempted_for(*, attempt_id: int) -> None:
    """Send the cancels of the live jobs preempted for the attempt, if it left SUBMITTING."""
    submitted = ~Q(preempted_for__state__in=(AttemptState.CREATED, AttemptState.SUBMITTING))
    for victim in Attempt.objects.filter(
        submitted, preempted_for_id=attempt_id, state__in=LIVE_ATTEMPT_STATES
    ).values_list("pk", flat=True):
        attempt_cancel_enqueue(victim)


def _attempt_submit(attempt: Attempt) -> None:
    if attempt.state not in (AttemptState.CREATED, AttemptState.SUBMITTING):
        return  # already submitted: a redelivered or re-driven task has nothing to do
    run = attempt.run
    backend = backend_for(attempt.cluster)
    spec = job_spec_for(attempt)
    # Whether an earlier try of this attempt may have reached the backend: not if this call
    # is the one that records the intent to submit (CREATED -> SUBMITTING, committed before
    # the backend is called), so the backend may skip looking for a job to adopt. A
    # redelivered task, a retry after a timeout or a crash finds SUBMITTING and looks.
    may_exist = True
    with transaction.atomic():
        if attempt.state == AttemptState.CREATED:
            if not run_transition(
                run=run,
                to=RunState.SUBMITTING,
                expected=(RunState.ADMITTED,),
                reason="SUBMITTING",
                message=f"Submitting to {attempt.cluster.name}",
                attempt=attempt,
            ):
                return  # cancelled (or otherwise moved on) before we got to it
            try:
                rendered = backend.render(spec)
            except PermanentBackendError as exc:
                rendered = ""
                _attempt_fail_submit(attempt, run, exc)
                return
            claimed = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.CREATED).update(
                state=AttemptState.SUBMITTING, rendered_spec=rendered
            )
            attempt.state = AttemptState.SUBMITTING
            may_exist = not claimed
        # Committed before the backend is called, so a job that starts before this worker
        # records it (or after this worker died) can report. A retry adds a token and keeps
        # the earlier ones: the job it may adopt holds one of those.
        token = attempt_token_issue(attempt=attempt)
    try:
        with backend_call(cluster=attempt.cluster.name, operation="submit"):
            job_id = backend.submit(
                job_spec_with_secrets(spec, attempt_token=token), may_exist=may_exist
            )
    except TransientBackendError as exc:
        waited = (timezone.now() - attempt.created_at).total_seconds()
        logger.warning("submit to %s failed, retrying: %s", attempt.cluster.name, exc)
        if waited <= settings.GANTRY_SUBMIT_GIVE_UP_S:
            Attempt.objects.filter(pk=attempt.pk).update(
                backend_error=f"backend unreachable: {exc}"[:2000]
            )
            raise
        # A cluster that never answers (wrong URL, long outage) must not hold a run forever.
        given_up = PermanentBackendError(
            f"backend unreachable for {waited / 60:.0f} minutes, giving up: {exc}"
        )
        with transaction.atomic():
            _attempt_fail_submit(attempt, run, given_up)
        return
    except PermanentBackendError as exc:
        with transaction.atomic():
            _attempt_fail_submit(attempt, run, exc)
        return
    with transaction.atomic():
        moved, accepted = attempt_accept(attempt=attempt, job_id=job_id, now=timezone.now())
    logger.info("submitted: %s holds it as job %s", attempt.cluster.name, job_id)
    run.refresh_from_db(fields=["state", "cancel_requested_at"])
    if moved and (not accepted or run.cancel_requested_at is not None):
        # Cancelled or preempted while the job was on its way: take it off the cluster too.
        with backend_call(cluster=attempt.cluster.name, operation="cancel"):
            backend.cancel(JobRef(name=attempt.name, backend_job_id=job_id))


def attempt_token_issue(*, attempt: Attempt) -> str:
    """A new random token for a job of ``attempt``: its digest is stored, the token itself
    is returned once, for the backend to hand to the job, and never stored or logged."""
    token = reproducibility.attempt_token_new(attempt_id=attempt.pk)
    AttemptToken.objects.create(
        attempt=attempt,
        digest=reproducibility.attempt_token_digest(token),
        issued_at=timezone.now(),
    )
    return token


def _attempt_fail_submit(attempt: Attempt, run: Run, exc: PermanentBackendError) -> None:
    """The backend refused the job for good: the attempt and its run fail (not retried: it
    would be refused again). The cause is the cluster's, but for an image it cannot pull."""
    now = timezone.now()
    cause, evidence = attribution.attribute(
        attribution.EndedAttempt(
            state=AttemptState.FAILED,
            ended=now.timestamp(),
            failure_reason=exc.failure_reason,
            message=str(exc),
            backend_error=exc.failure_reason != "IMAGE_PULL",
        ),
        (),
    )
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.FAILED,
        finished_at=now,
        failure_reason=exc.failure_reason,
        failure_message=str(exc)[:2000],
        cause_class=cause,
        cause_evidence=evidence,
    )
    run_transition(
        run=run,
        to=RunState.FAILED,
        expected=(RunState.SUBMITTING, RunState.ADMITTED),
        reason=exc.failure_reason,
        message=f"The cluster refused the job: {exc}",
        attempt=attempt,
        finished_at=now,
        failure_reason=exc.failure_reason,
    )
    admission_cycle_enqueue()


STUCK_SUBMIT_AFTER = timedelta(seconds=30)
STUCK_SUBMIT_MAX_WAIT = timedelta(minutes=5)


def attempt_redrive_deferred_cancels() -> int:
    """Re-send the cancels of preempted jobs whose reclaiming attempt was submitted long
    enough ago that its own submit should have sent them (a worker that died in between)."""
    cutoff = timezone.now() - STUCK_SUBMIT_AFTER
    ids = list(
        Attempt.objects.filter(
            state__in=LIVE_ATTEMPT_STATES,
            run__state=RunState.PREEMPTED,
            preempted_for__isnull=False,
            preempted_for__created_at__lt=cutoff,
        )
        .exclude(preempted_for__state__in=(AttemptState.CREATED, AttemptState.SUBMITTING))
        .values_list("pk", flat=True)
    )
    for attempt_id in ids:
        attempt_cancel_enqueue(attempt_id)
    return len(ids)


def _redrive_due(now) -> Q:
    """Submits whose last send is older than their wait: ``STUCK_SUBMIT_AFTER`` from the
    admission that created the attempt, then twice the wait before after each re-drive, at
    most ``STUCK_SUBMIT_MAX_WAIT``."""
    due = Q(submit_redrives=0, created_at__lt=now - STUCK_SUBMIT_AFTER)
    redrives = 1
    while (wait := STUCK_SUBMIT_AFTER * 2**redrives) < STUCK_SUBMIT_MAX_WAIT:
        due |= Q(submit_redrives=redrives, submit_redriven_at__lt=now - wait)
        redrives += 1
    longest = Q(submit_redrives__gte=redrives, submit_redriven_at__lt=now - STUCK_SUBMIT_MAX_WAIT)
    return due | longest


def attempt_redrive_stuck_submits(*, now=None) -> int:
    """Re-enqueue submits whose task may have been lost (broker restart, worker killed).
    Harmless if the task is merely slow (a second submit adopts the first job), but not free:
    a burst of submits queued behind each other, or a backend that keeps refusing, would be
    sent again on every sync, faster than the workers take them. So each attempt is re-driven
    after its wait (``_redrive_due``), and the re-drive is recorded under a row lock before
    the message goes (two syncs at once send it once)."""
    now = now or timezone.now()
    with transaction.atomic():
        ids = list(
            Attempt.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(
                _redrive_due(now),
                state__in=(AttemptState.CREATED, AttemptState.SUBMITTING),
                run__state__in=(RunState.ADMITTED, RunState.SUBMITTING, RunState.PREEMPTED),
            )
            .values_list("pk", flat=True)
        )
        Attempt.objects.filter(pk__in=ids).update(
            submit_redrives=F("submit_redrives") + 1, submit_redriven_at=now
        )
        attempt_submit_enqueue(ids)  # sent once this commits
    return len(ids)


def _backend_time_limit_s(run: Run, experiment: Experiment) -> int:
    """The time limit the backend enforces. A workspace's is its tenant's longest: an
    Extend must not need the running job changed, so Gantry ends a workspace at its own
    limit (its hours and extensions: ``telemetry.workspace_policy``), the backend's is the
    ceiling in case Gantry cannot."""
    if run.kind == RunKind.INTERACTIVE:
        return max(experiment.max_runtime_minutes, run.tenant.workspace_max_hours * 60) * 60
    return experiment.max_runtime_minutes * 60
