"""The built-in simulated cluster: virtual nodes with GPUs whose simulated work runs faster
than real time.

The speed-up shortens only the simulated work (a workload of 6 simulated hours takes 12
minutes at 30×); every time a person sets or reads is wall time: a run's time limit stops
it after that much wall time, and its start, end and duration are the wall clock's.

Its jobs live in the ``SimulatedJob`` table, so the web process, workers and beat all see
the same cluster. Cluster settings::

    {"speedup": 60, "topology": ["block", "leaf"],
     "pools": [{"flavor": "a100-80gb", "nodes": 8, "gpus_per_node": 8, "domains": [2, 2],
                "drained": {"sim-a100-80gb-03": "bad DIMM"}, "outside": {"sim-a100-80gb-00": 2}}]}

A pool may lay its nodes out in topology domains, drain nodes and carry load from outside
Gantry (``clusters.simulation.sim_layout``). A job placed by admission starts on exactly its
nodes once their GPUs are free; until then it is pending and says what it waits for.
"""

import json
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters.backends import register
from clusters.backends.base import (
    CheckpointReport,
    Inventory,
    JobRef,
    JobSpec,
    JobStatus,
    NodeInventory,
    PermanentBackendError,
    job_env,
)
from clusters.env_names import env_name_refusal
from clusters.job_env import job_environment_shown
from clusters.models import Cluster, SimulatedJob
from clusters.simulation import (
    STARTUP_S,
    SimLayout,
    SimNode,
    Workload,
    checkpoint_steps,
    outcome_at,
    place,
    sim_layout,
)

LIVE = ("PENDING", "RUNNING")


@register(Cluster.Backend.SIMULATOR)
class SimulatorBackend:
    inventory_max_age_s = None  # its nodes are its settings, its load its own jobs
    honours_placement = True
    # Nothing but Gantry runs on it: no job from outside waits for what a preemption frees
    # (its inventory has no claims), so there is no order of submit and cancel to keep.
    reclaim_first = False

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.speedup = float(cluster.settings.get("speedup", 1))
        self.pools = cluster.settings.get("pools", [])
        self._layout: SimLayout | None = None

    @property
    def layout(self) -> SimLayout:
        if self._layout is None:
            self._layout = sim_layout(self.cluster.name, self.cluster.settings)
        return self._layout

    def render(self, spec: JobSpec) -> str:
        workload = self._workload(spec)
        return json.dumps(
            {
                "kind": "SimulatedJob",
                "name": spec.name,
                "cluster": self.cluster.name,
                "image": spec.image,
                "command": spec.command,
                "env": job_environment_shown(job_env(spec)),
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

    def submit(self, spec: JobSpec, *, may_exist: bool = True) -> str:
        # The look-up is one indexed query: made every time (the unique name makes it so).
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
                    placement=list(spec.placement),
                )
        except IntegrityError:
            # A concurrent delivery of the same submit won the race: adopt its job.
            return str(SimulatedJob.objects.get(name=spec.name).pk)
        return str(job.pk)

    def sync(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        self._advance()
        jobs = SimulatedJob.objects.filter(name__among=[ref.name for ref in refs])
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

    def inventory(self) -> Inventory:
        self._advance()
        used: dict[str, int] = {}
        for allocation in SimulatedJob.objects.filter(
            cluster=self.cluster, state="RUNNING"
        ).values_list("allocation", flat=True):
            for node, indices in allocation.items():
                used[node] = used.get(node, 0) + len(indices)
        return Inventory(
            nodes=tuple(
                NodeInventory(
                    name=node.name,
                    flavor=node.flavor,
                    gpus=node.gpus,
                    gpus_used=min(node.gpus, used.get(node.name, 0) + node.outside),
                    gpus_used_by_gantry=used.get(node.name, 0),
                    schedulable=not node.drained,
                    reason=f"drained: {node.drained}" if node.drained else "",
                    path=node.path,
                )
                for node in self.layout.nodes
            ),
            levels=self.layout.levels,
            problems=self.layout.problems,
        )

    def _workload(self, spec: JobSpec) -> Workload:
        # The names every backend refuses, so a run means the same here as on a cluster.
        for key in spec.env:
            refusal = env_name_refusal(key)
            if refusal is not None:
                raise PermanentBackendError(refusal)
        try:
            return Workload.from_env(job_env(spec))
        except ValueError as exc:
            raise PermanentBackendError(str(exc)) from None

    def _pool(self, flavor: str) -> dict:
        for pool in self.pools:
            if pool["flavor"] == flavor:
                return pool
        raise PermanentBackendError(f"cluster {self.cluster.name} has no {flavor} GPUs")

    @transaction.atomic
    def _advance(self) -> None:
        """Move the virtual cluster to now: finish what is done, then start what waits. A
        job placed by admission starts on its nodes once they have its GPUs free; one
        placed by nobody takes the first nodes that fit, in submission order."""
        Cluster.objects.select_for_update().filter(pk=self.cluster.pk).first()
        now = timezone.now()
        live = list(
            SimulatedJob.objects.filter(cluster=self.cluster, state__in=LIVE).order_by("id")
        )
        for job in live:
            if job.state == "RUNNING":
                self._finish_if_done(job, now)
        nodes = {node.name: node for node in self.layout.nodes}
        free = {
            node.name: list(range(node.gpus - node.outside)) for node in self.layout.nodes
        }  # the outside load holds the highest GPU indices
        for job in live:
            if job.state == "RUNNING":
                for node, indices in job.allocation.items():
                    free[node] = [i for i in free.get(node, []) if i not in indices]
        taking = {name: indices for name, indices in free.items() if not nodes[name].drained}
        blocked_flavors: set[str] = set()
        for job in live:
            if job.state != "PENDING":
                continue
            if job.placement:
                allocation, message = _on_placement(job, nodes, taking)
            else:
                if job.flavor in blocked_flavors:
                    continue  # FIFO, like a batch scheduler without backfill
                pool_free = {n: i for n, i in taking.items() if nodes[n].flavor == job.flavor}
                allocation = place(pool_free, nodes=job.nodes, gpus_per_node=job.gpus_per_node)
                message = "waiting for free GPUs"
                if allocation is None:
                    blocked_flavors.add(job.flavor)
            if allocation is None:
                if job.message != message:
                    job.message = message
                    job.save(update_fields=["message"])
                continue
            for node, indices in allocation.items():
                taking[node] = [i for i in taking[node] if i not in indices]
            job.state, job.allocation, job.started_at, job.message = "RUNNING", allocation, now, ""
            job.save(update_fields=["state", "allocation", "started_at", "message"])

    def _finish_if_done(self, job: SimulatedJob, now) -> None:
        assert job.started_at is not None  # called for running jobs only
        workload = Workload(**job.profile["workload"])
        outcome = outcome_at(
            workload,
            elapsed_s=(now - job.started_at).total_seconds(),
            max_runtime_s=job.max_runtime_s,
            speedup=self.speedup,
        )
        if outcome.state == "RUNNING":
            return
        job.state = outcome.state
        job.exit_code = outcome.exit_code
        job.failure_reason = outcome.failure_reason
        job.finished_at = job.started_at + timedelta(seconds=outcome.ends_at_s)
        job.message = simulated_outcome_message(
            profile=workload.profile,
            simulated_s=outcome.ends_at_s * self.speedup,
            speedup=self.speedup,
        )
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


def simulated_outcome_message(*, profile: str, simulated_s: float, speedup: float) -> str:
    """What a finished simulated job says: the work it simulated and the wall time it took,
    which differ by the cluster's speedup (a run page shows the wall time)."""
    wall_s = simulated_s / speedup
    if speedup == 1:
        return f"{profile} workload (simulated) ended after {_duration_text(wall_s)}"
    return (
        f"{profile} workload ended: {_duration_text(simulated_s)} of simulated work in "
        f"{_duration_text(wall_s)} ({speedup:g}× faster than real time)"
    )


def _duration_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _workload_dict(workload: Workload) -> dict:
    return {
        "profile": workload.profile,
        "duration_s": workload.duration_s,
        "checkpoint_every_s": workload.checkpoint_every_s,
        "resume_step": workload.resume_step,
    }


def _on_placement(
    job: SimulatedJob, nodes: dict[str, SimNode], free: dict[str, list[int]]
) -> tuple[dict[str, list[int]] | None, str]:
    """GPUs for ``job`` on exactly the nodes it was placed on, or why not yet."""
    allocation: dict[str, list[int]] = {}
    short = []
    for name in job.placement:
        node = nodes.get(name)
        if node is None:
            short.append(f"{name} is not a node of this cluster")
        elif node.drained:
            short.append(f"{name} is drained: {node.drained}")
        elif len(free.get(name, [])) < job.gpus_per_node:
            short.append(f"{name} has {len(free.get(name, []))} of {job.gpus_per_node} free")
        else:
            allocation[name] = sorted(free[name])[: job.gpus_per_node]
    if short:
        return None, "waiting for GPUs on its nodes: " + "; ".join(short)
    return allocation, ""
