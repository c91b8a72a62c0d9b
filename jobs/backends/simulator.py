"""The built-in simulated cluster: virtual nodes with GPUs, driven by a sped-up clock.

Its jobs live in the ``SimulatedJob`` table, so the web process, workers and beat all see
the same cluster. Cluster settings::

    {"speedup": 60, "pools": [{"flavor": "a100-80gb", "nodes": 4, "gpus_per_node": 8}]}
"""

import json
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.backends import register
from jobs.backends.base import (
    CheckpointReport,
    InventoryItem,
    JobRef,
    JobSpec,
    JobStatus,
    PermanentBackendError,
)
from jobs.models import Cluster, SimulatedJob
from jobs.reproducibility import job_environment
from jobs.simulation import STARTUP_S, Workload, checkpoint_steps, outcome_at, place

LIVE = ("PENDING", "RUNNING")


@register(Cluster.Backend.SIMULATOR)
class SimulatorBackend:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.speedup = float(cluster.settings.get("speedup", 1))
        self.pools = cluster.settings.get("pools", [])

    def render(self, spec: JobSpec) -> str:
        workload = self._workload(spec)
        return json.dumps(
            {
                "kind": "SimulatedJob",
                "name": spec.name,
                "cluster": self.cluster.name,
                "image": spec.image,
                "command": spec.command,
                "env": job_environment(spec.env, attempt_token=spec.attempt_token, redacted=True),
                "flavor": spec.flavor,
                "nodes": spec.nodes,
                "gpus_per_node": spec.gpus_per_node,
                "max_runtime_s": spec.max_runtime_s,
                "labels": {
                    "gantry.io/tenant": spec.tenant,
                    "gantry.io/project": spec.project,
                    "gantry.io/run": str(spec.run_id),
                    "gantry.io/attempt": str(spec.attempt_id),
                },
                "workload": _workload_dict(workload),
                "checkpoint_dir": spec.checkpoint_dir,
            },
            indent=2,
            sort_keys=True,
        )

    def submit(self, spec: JobSpec) -> str:
        workload = self._workload(spec)
        pool = self._pool(spec.flavor)
        if spec.gpus_per_node > pool["gpus_per_node"] or spec.nodes > pool["nodes"]:
            raise PermanentBackendError(
                f"{spec.nodes}×{spec.gpus_per_node} {spec.flavor} GPUs can never fit on "
                f"{pool['nodes']} nodes of {pool['gpus_per_node']} GPUs",
                failure_reason="UNKNOWN",
            )
        existing = SimulatedJob.objects.filter(name=spec.name).first()
        if existing is not None:
            return str(existing.pk)
        try:
            with transaction.atomic():
                job = SimulatedJob.objects.create(
                    cluster=self.cluster,
                    name=spec.name,
                    flavor=spec.flavor,
                    nodes=spec.nodes,
                    gpus_per_node=spec.gpus_per_node,
                    profile={
                        "workload": _workload_dict(workload),
                        "checkpoint_dir": spec.checkpoint_dir or "sim://checkpoints",
                    },
                    max_runtime_s=spec.max_runtime_s,
                    submitted_at=timezone.now(),
                )
        except IntegrityError:
            # A concurrent delivery of the same submit won the race: adopt its job.
            return str(SimulatedJob.objects.get(name=spec.name).pk)
        return str(job.pk)

    def sync(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        self._advance()
        jobs = SimulatedJob.objects.filter(name__in=[ref.name for ref in refs])
        return {job.name: self._status(job) for job in jobs}

    def cancel(self, ref: JobRef) -> None:
        now = timezone.now()
        SimulatedJob.objects.filter(name=ref.name, state__in=LIVE).update(
            state="CANCELLED", cancelled_at=now, finished_at=now
        )

    def logs(self, ref: JobRef, *, tail: int) -> str:
        job = SimulatedJob.objects.filter(name=ref.name).first()
        if job is None:
            return ""
        lines = [f"[simulator] {job.name} submitted at {job.submitted_at:%Y-%m-%d %H:%M:%S}Z"]
        if job.started_at:
            nodes = ", ".join(sorted(job.allocation)) or "-"
            lines.append(f"[simulator] started on {nodes}")
            lines.append(f"[simulator] workload {job.profile['workload']['profile']}")
        if job.finished_at:
            lines.append(f"[simulator] finished {job.state} exit={job.exit_code} {job.message}")
        return "\n".join(lines[-tail:])

    def inventory(self) -> list[InventoryItem]:
        return [
            InventoryItem(
                flavor=p["flavor"], nodes=int(p["nodes"]), gpus_per_node=int(p["gpus_per_node"])
            )
            for p in self.pools
        ]

    def _workload(self, spec: JobSpec) -> Workload:
        try:
            return Workload.from_env(spec.env)
        except ValueError as exc:
            raise PermanentBackendError(str(exc)) from None

    def _pool(self, flavor: str) -> dict:
        for pool in self.pools:
            if pool["flavor"] == flavor:
                return pool
        raise PermanentBackendError(f"cluster {self.cluster.name} has no {flavor} GPUs")

    def _node_names(self, pool: dict) -> list[str]:
        return [f"{self.cluster.name}-{pool['flavor']}-{i:02d}" for i in range(pool["nodes"])]

    @transaction.atomic
    def _advance(self) -> None:
        """Move the virtual cluster to now: finish what is done, then place what waits."""
        Cluster.objects.select_for_update().filter(pk=self.cluster.pk).first()
        now = timezone.now()
        live = list(
            SimulatedJob.objects.filter(cluster=self.cluster, state__in=LIVE).order_by("id")
        )
        for job in live:
            if job.state == "RUNNING":
                self._finish_if_done(job, now)
        for pool in self.pools:
            free = {name: list(range(pool["gpus_per_node"])) for name in self._node_names(pool)}
            for job in live:
                if job.state == "RUNNING" and job.flavor == pool["flavor"]:
                    for node, indices in job.allocation.items():
                        free[node] = [i for i in free.get(node, []) if i not in indices]
            for job in live:
                if job.state != "PENDING" or job.flavor != pool["flavor"]:
                    continue
                allocation = place(free, nodes=job.nodes, gpus_per_node=job.gpus_per_node)
                if allocation is None:
                    break  # FIFO on the virtual cluster, like a batch scheduler without backfill
                for node, indices in allocation.items():
                    free[node] = [i for i in free[node] if i not in indices]
                job.state, job.allocation, job.started_at = "RUNNING", allocation, now
                job.save(update_fields=["state", "allocation", "started_at"])

    def _finish_if_done(self, job: SimulatedJob, now) -> None:
        assert job.started_at is not None  # called for running jobs only
        workload = Workload(**job.profile["workload"])
        elapsed_s = (now - job.started_at).total_seconds() * self.speedup
        outcome = outcome_at(workload, elapsed_s=elapsed_s, max_runtime_s=job.max_runtime_s)
        if outcome.state == "RUNNING":
            return
        job.state = outcome.state
        job.exit_code = outcome.exit_code
        job.failure_reason = outcome.failure_reason
        job.finished_at = job.started_at + timedelta(seconds=outcome.ends_at_s / self.speedup)
        job.message = f"{workload.profile} workload ended after {outcome.ends_at_s:.0f}s"
        job.save(update_fields=["state", "exit_code", "failure_reason", "finished_at", "message"])

    def _status(self, job: SimulatedJob) -> JobStatus:
        return JobStatus(
            state=job.state,
            backend_job_id=str(job.pk),
            started_at=job.started_at,
            finished_at=job.finished_at,
            exit_code=job.exit_code,
            failure_reason=job.failure_reason or ("CANCELLED" if job.state == "CANCELLED" else ""),
            message=job.message,
            node_list=sorted(job.allocation),
            checkpoints=self._checkpoints(job),
        )

    def _checkpoints(self, job: SimulatedJob) -> tuple[CheckpointReport, ...]:
        """What the job-side SDK would have reported: a checkpoint every N steps of work."""
        if job.started_at is None:
            return ()
        workload = Workload(**job.profile["workload"])
        until = job.finished_at or timezone.now()
        elapsed_s = (until - job.started_at).total_seconds() * self.speedup
        prefix = job.profile["checkpoint_dir"].rstrip("/")
        return tuple(
            CheckpointReport(
                step=step,
                uri=f"{prefix}/{job.name}/step-{step}",
                saved_at=job.started_at
                + timedelta(seconds=(STARTUP_S + step - workload.resume_step) / self.speedup),
            )
            for step in checkpoint_steps(workload, elapsed_s=elapsed_s)
        )


def _workload_dict(workload: Workload) -> dict:
    return {
        "profile": workload.profile,
        "duration_s": workload.duration_s,
        "checkpoint_every_s": workload.checkpoint_every_s,
        "resume_step": workload.resume_step,
    }
