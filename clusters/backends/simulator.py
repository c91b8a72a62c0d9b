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

``settings["faults"]`` injects hardware faults (``clusters.sim_faults``): a job on a GPU
that faults fails at that instant (GPU_XID, or NODE_FAILURE for a GPU that takes its node
down), and a throttled GPU slows the jobs on it. An experiment's env may put a straggler in
its gang (``GANTRY_SIM_STRAGGLER``, ``clusters.sim_stragglers``), and a gang placed across
leaf switches pays for the spine: either slows the job as its lockstep says. ``fence``
drains a node the way Slurm's drain does (``SimulatedFence``): running jobs go on, no new
one starts there.
"""

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters.backends import register, sim_workspace
from clusters.backends.base import (
    BackendError,
    CheckpointReport,
    Inventory,
    JobRef,
    JobSpec,
    JobStatus,
    NodeInventory,
    PermanentBackendError,
    TransientBackendError,
    job_env,
)
from clusters.backends.health_check import NAME as HEALTH_CHECK_NAME
from clusters.backends.health_check import health_check_name
from clusters.env_names import env_name_refusal
from clusters.job_env import job_environment_shown
from clusters.models import Cluster, SimulatedFence, SimulatedJob
from clusters.sim_faults import (
    XID_HOLD_S,
    FaultSettings,
    fault_settings,
    faults_between,
    first_fault_hitting,
    gang_speed,
)
from clusters.simulation import (
    STARTUP_S,
    SimLayout,
    SimNode,
    Workload,
    checkpoint_steps,
    gang_lockstep,
    outcome_at,
    place,
    sim_layout,
)

LIVE = ("PENDING", "RUNNING")
# A simulated health check's length in simulated seconds (dcgmi diag -r 1 takes about a
# minute); its exit when it finds a fault: dcgmi's DCGM_ST_NVVS_ERROR as an 8-bit status.
HEALTH_CHECK_S = 60.0
HEALTH_CHECK_FAILED_EXIT = 226


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
        self._faults: FaultSettings | None = None

    @property
    def layout(self) -> SimLayout:
        if self._layout is None:
            self._layout = sim_layout(self.cluster.name, self.cluster.settings)
        return self._layout

    @property
    def gpus_of(self) -> dict[str, int]:
        return {node.name: node.gpus for node in self.layout.nodes}

    @property
    def faults(self) -> FaultSettings:
        """The cluster's fault settings; wrong ones refuse every use of the backend with the
        reason (as a Slurm cluster's wrong settings do), rather than run without them."""
        if self._faults is None:
            try:
                self._faults = fault_settings(
                    self.cluster.settings.get("faults"), nodes=self.gpus_of
                )
            except ValueError as exc:
                raise PermanentBackendError(f"cluster {self.cluster.name}: {exc}") from None
        return self._faults

    def fence(self, node: str, reason: str) -> None:
        """Drain ``node`` with Gantry's reason: its running jobs go on, no new one starts
        there, and the inventory says why. Fencing a fenced node changes nothing but the
        reason."""
        self._known(node)
        text = (reason if reason.startswith("gantry:") else f"gantry: {reason}")[:500]
        now = timezone.now()
        with transaction.atomic():
            fence, created = SimulatedFence.objects.select_for_update().get_or_create(
                cluster=self.cluster, node=node, defaults={"reason": text, "fenced_at": now}
            )
            if created or (fence.released_at is None and fence.reason == text):
                return
            if fence.released_at is not None:
                fence.fenced_at, fence.released_at = now, None
            fence.reason = text
            fence.save(update_fields=["reason", "fenced_at", "released_at"])

    def unfence(self, node: str) -> None:
        """Undo ``fence``: the node takes new jobs again; idempotent."""
        self._known(node)
        SimulatedFence.objects.filter(
            cluster=self.cluster, node=node, released_at__isnull=True
        ).update(released_at=timezone.now())

    def _known(self, node: str) -> None:
        if node not in self.gpus_of:
            raise BackendError(f"cluster {self.cluster.name} has no node named {node}")

    def _fenced(self) -> dict[str, str]:
        """The nodes fenced now, with Gantry's reason."""
        return dict(
            SimulatedFence.objects.filter(
                cluster=self.cluster, released_at__isnull=True
            ).values_list("node", "reason")
        )

    def render(self, spec: JobSpec) -> str:
        workload = self._workload(spec)
        return json.dumps(
            {
                "kind": "SimulatedJob",
                "name": spec.name,
                "cluster": self.cluster.name,
                "image": spec.image,
                "command": spec.command,
                "env": job_environment_shown(job_env(spec), workspace=bool(spec.workspace)),
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
                **sim_workspace.spec_fields(spec),
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
                        "excluded_nodes": sorted(spec.excluded_nodes),
                        **sim_workspace.spec_fields(spec),
                    },
                    max_runtime_s=spec.max_runtime_s,
                    submitted_at=timezone.now(),
                    placement=list(spec.placement),
                )
        except IntegrityError:
            # A concurrent delivery of the same submit won the race: adopt its job.
            return str(SimulatedJob.objects.get(name=spec.name).pk)
        if spec.workspace is not None:
            sim_workspace.spawn_for(job, spec)
        return str(job.pk)

    def sync(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        self._advance()
        checks = [ref for ref in refs if HEALTH_CHECK_NAME.match(ref.name)]
        jobs = SimulatedJob.objects.filter(name__among=[ref.name for ref in refs])
        found = {job.name: self._status(job) for job in jobs}
        found.update((ref.name, self._check_status(ref)) for ref in checks)
        return found

    def workspace_address(self, ref: JobRef, *, port: int) -> tuple[str, int]:
        """Every simulated node is this machine: its server listens on 127.0.0.1."""
        job = SimulatedJob.objects.filter(name=ref.name).first()
        if job is None or "workspace" not in job.profile:
            raise PermanentBackendError(f"the simulator has no workspace job {ref.name}")
        if job.state == "PENDING":
            raise TransientBackendError(f"job {ref.name} has not started yet")
        if job.state != "RUNNING":
            raise PermanentBackendError(f"job {ref.name} has ended ({job.state.lower()})")
        return sim_workspace.BIND, port

    def workspace_release(self, *, run_id: int, tenant: str) -> None:
        """The workspace's directory under the data directory is deleted, as a Kubernetes
        workspace's volume is: it has ended for good."""
        sim_workspace.files_release(run_id)

    def health_check(self, node: str, *, check_id: int, flavor: str, gpus: int) -> JobRef:
        """A simulated health check pinned to ``node``: it runs ``HEALTH_CHECK_S`` simulated
        seconds from now and fails (exit 226, as dcgmi diag does when a test fails) if the
        node is a lemon or a fatal fault hit it within ``XID_HOLD_S`` before the check's
        end (the fault still shows, as the exporter's XID does); else it passes. Computed,
        not stored: the ref carries the node and the start, so any process can follow it.
        It holds no GPUs (a quarantined node takes no work anyway)."""
        self._known(node)
        return JobRef(health_check_name(check_id), f"{node}@{timezone.now().timestamp():.6f}")

    def _check_status(self, ref: JobRef) -> JobStatus:
        node, _, at = ref.backend_job_id.rpartition("@")
        try:
            start = float(at)
        except ValueError:
            start = None
        if start is None or node not in self.gpus_of:
            return JobStatus(
                state="FAILED",
                backend_job_id=ref.backend_job_id,
                failure_reason="LOST",
                message=f"the simulator has no health check {ref.backend_job_id!r}",
            )
        end = start + HEALTH_CHECK_S / self.speedup
        started = datetime.fromtimestamp(start, tz=UTC)
        running = JobStatus(
            "RUNNING", backend_job_id=ref.backend_job_id, started_at=started, node_list=[node]
        )
        if timezone.now().timestamp() < end:
            return running
        finished = datetime.fromtimestamp(end, tz=UTC)
        faults = [
            fault
            for fault in faults_between(
                {node: self.gpus_of[node]}, self.faults, start=end - XID_HOLD_S, end=end
            )
            if fault.fatal
        ]
        if faults:
            last = faults[-1]
            found = f"{last.description} on GPU {last.gpu}"
        elif node in self.faults.lemons:
            lemon = self.faults.lemons[node]
            found = f"GPU {lemon.gpu} fails its memory test"
        else:
            return replace(running, state="SUCCEEDED", exit_code=0, finished_at=finished)
        return replace(
            running,
            state="FAILED",
            exit_code=HEALTH_CHECK_FAILED_EXIT,
            failure_reason="USER_EXIT",
            finished_at=finished,
            message=f"dcgmi diag -r 1 on {node}: {found}",
        )

    def cancel(self, ref: JobRef) -> None:
        now = timezone.now()
        SimulatedJob.objects.filter(name=ref.name, state__in=LIVE).update(
            state="CANCELLED", cancelled_at=now, finished_at=now
        )
        job = SimulatedJob.objects.filter(name=ref.name).first()
        if job is not None and "workspace" in job.profile:
            sim_workspace.stop(job.name, job.profile["workspace"])

    def logs(self, ref: JobRef, *, tail: int) -> str:
        job = SimulatedJob.objects.filter(name=ref.name).first()
        if job is None:
            return ""
        lines = [f"[simulator] {job.name} submitted at {job.submitted_at:%Y-%m-%d %H:%M:%S}Z"]
        if job.started_at:
            nodes = ", ".join(sorted(job.allocation)) or "-"
            lines.append(f"[simulator] started on {nodes}")
            lines.append(f"[simulator] workload {job.profile['workload']['profile']}")
        if "workspace" in job.profile:
            lines += sim_workspace.log_tail(job.name, lines=tail)
        if job.finished_at:
            lines.append(f"[simulator] finished {job.state} exit={job.exit_code} {job.message}")
        return "\n".join(lines[-tail:])

    def inventory(self) -> Inventory:
        self._advance()
        fenced = self._fenced()
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
                    schedulable=not node.drained and node.name not in fenced,
                    reason=f"drained: {node.drained}"
                    if node.drained
                    else fenced.get(node.name, ""),
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
            workload = Workload.from_env(job_env(spec))
        except ValueError as exc:
            raise PermanentBackendError(str(exc)) from None
        ranks = spec.nodes * spec.gpus_per_node
        if workload.straggler and workload.straggler_rank >= ranks:
            raise PermanentBackendError(
                f"GANTRY_SIM_STRAGGLER_RANK {workload.straggler_rank} is not a rank of the "
                f"run's {ranks} GPUs (ranks 0 to {ranks - 1})"
            )
        return workload

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
        faults = self.faults
        now = timezone.now()
        live = list(
            SimulatedJob.objects.filter(cluster=self.cluster, state__in=LIVE).order_by("id")
        )
        for job in live:
            if job.state == "RUNNING":
                self._finish_if_done(job, now, faults)
        nodes = {node.name: node for node in self.layout.nodes}
        fenced = self._fenced()
        free = {
            node.name: list(range(node.gpus - node.outside)) for node in self.layout.nodes
        }  # the outside load holds the highest GPU indices
        for job in live:
            if job.state == "RUNNING":
                for node, indices in job.allocation.items():
                    free[node] = [i for i in free.get(node, []) if i not in indices]
        taking = {
            name: indices
            for name, indices in free.items()
            if not nodes[name].drained and name not in fenced
        }
        blocked_flavors: set[str] = set()
        for job in live:
            if job.state != "PENDING":
                continue
            if job.placement:
                allocation, message = _on_placement(job, nodes, taking, fenced)
            else:
                if job.flavor in blocked_flavors:
                    continue  # FIFO, like a batch scheduler without backfill
                excluded = set(job.profile.get("excluded_nodes", ()))
                pool_free = {
                    n: i
                    for n, i in taking.items()
                    if nodes[n].flavor == job.flavor and n not in excluded
                }
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
            # A throttled GPU, a straggler or a placement across leaf switches slows the gang
            # for as long as it runs: its pace is set once, the slowest of them.
            paths = {name: node.path for name, node in nodes.items()}
            pace = gang_lockstep(Workload(**job.profile["workload"]), allocation, paths).pace
            speed = min(gang_speed(allocation, faults), pace)
            if speed < 1:
                job.profile = {**job.profile, "speed": speed}
            job.save(update_fields=["state", "allocation", "started_at", "message", "profile"])
            if "workspace" in job.profile:
                sim_workspace.start(job.name)

    def _finish_if_done(self, job: SimulatedJob, now, faults: FaultSettings) -> None:
        assert job.started_at is not None  # called for running jobs only
        if "workspace" in job.profile:
            sim_workspace.finish_if_done(job, now)
            return
        workload = Workload(**job.profile["workload"])
        speedup = self.speedup * _speed(job)
        outcome = outcome_at(
            workload,
            elapsed_s=(now - job.started_at).total_seconds(),
            max_runtime_s=job.max_runtime_s,
            speedup=speedup,
        )
        if faults.injects:
            ends = now
            if outcome.state != "RUNNING":
                ends = min(now, job.started_at + timedelta(seconds=outcome.ends_at_s))
            fault = first_fault_hitting(
                job.allocation,
                self.gpus_of,
                faults,
                start=job.started_at.timestamp(),
                end=ends.timestamp(),
            )
            if fault is not None:
                job.state, job.exit_code = "FAILED", fault.exit_code
                job.failure_reason = fault.failure_reason
                job.finished_at = datetime.fromtimestamp(fault.at, tz=UTC)
                job.message = fault.message()
                job.save(
                    update_fields=["state", "exit_code", "failure_reason", "finished_at", "message"]
                )
                return
        if outcome.state == "RUNNING":
            return
        job.state = outcome.state
        job.exit_code = outcome.exit_code
        job.failure_reason = outcome.failure_reason
        job.finished_at = job.started_at + timedelta(seconds=outcome.ends_at_s)
        job.message = simulated_outcome_message(
            profile=workload.profile,
            simulated_s=outcome.ends_at_s * speedup,
            speedup=speedup,
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
        speedup = self.speedup * _speed(job)
        elapsed_s = (until - job.started_at).total_seconds() * speedup
        prefix = job.profile["checkpoint_dir"].rstrip("/")
        return tuple(
            CheckpointReport(
                step=step,
                uri=f"{prefix}/{job.name}/step-{step}",
                saved_at=job.started_at
                + timedelta(seconds=(STARTUP_S + step - workload.resume_step) / speedup),
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
    shape = {
        "profile": workload.profile,
        "duration_s": workload.duration_s,
        "checkpoint_every_s": workload.checkpoint_every_s,
        "resume_step": workload.resume_step,
    }
    if workload.straggler:  # only then: the specs of other runs read as they always did
        shape |= {
            "straggler": workload.straggler,
            "straggler_rank": workload.straggler_rank,
            "straggler_factor": workload.straggler_factor,
        }
    return shape


def _speed(job: SimulatedJob) -> float:
    """The share of its normal pace the job keeps (below 1 on a throttled GPU)."""
    return float(job.profile.get("speed", 1.0))


def _on_placement(
    job: SimulatedJob,
    nodes: dict[str, SimNode],
    free: dict[str, list[int]],
    fenced: dict[str, str],
) -> tuple[dict[str, list[int]] | None, str]:
    """GPUs for ``job`` on exactly the nodes it was placed on, or why not yet."""
    allocation: dict[str, list[int]] = {}
    short = []
    for name in job.placement:
        node = nodes.get(name)
        if node is None:
            short.append(f"{name} is not a node of this cluster")
        elif node.drained or name in fenced:
            short.append(f"{name} is drained: {node.drained or fenced[name]}")
        elif len(free.get(name, [])) < job.gpus_per_node:
            short.append(f"{name} has {len(free.get(name, []))} of {job.gpus_per_node} free")
        else:
            allocation[name] = sorted(free[name])[: job.gpus_per_node]
    if short:
        return None, "waiting for GPUs on its nodes: " + "; ".join(short)
    return allocation, ""
