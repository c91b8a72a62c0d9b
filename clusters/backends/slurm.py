"""The Slurm backend: slurmrestd (API v0.0.38, JWT) or the Slurm CLI, per cluster setting.

Cluster settings are described in docs/slurm.md. The calls go through one of two transports,
``slurm_cli.CliTransport`` or ``slurm_rest.RestTransport``; the pure half is in modules of its own:
``slurm_settings`` (the settings), ``slurm_batch`` (the script, quoted by ``slurm_quoting``),
``slurm_jobs`` (what Slurm prints about jobs, the state mapping), ``slurm_nodes`` and
``slurm_topology`` (the inventory), ``slurm_accounts`` (quotas, the token). Every call has a
timeout. Errors:

- ``TransientBackendError``: a daemon did not answer (slurmctld, slurmdbd, slurmrestd), or
  answered "try again"; nothing changed, retrying is safe;
- ``PermanentBackendError``: the settings are wrong (bad URL, missing or expired token,
  unmapped flavor) or Slurm refused the job; the message is Slurm's own.
"""

import os
import pwd
import time
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

from django.conf import settings as django_settings
from django.utils import timezone

from clusters.backends import register
from clusters.backends.base import (
    BackendError,
    Inventory,
    JobRef,
    JobSpec,
    JobStatus,
    PermanentBackendError,
    TransientBackendError,
)
from clusters.backends.health_check import (
    HealthCheckSettingsError,
    health_check_name,
    parse_health_check,
    settings_for_check,
)
from clusters.backends.slurm_accounts import QuotaLimit, is_operator, quota_commands
from clusters.backends.slurm_batch import BatchJob, batch_job, reclaims_first
from clusters.backends.slurm_cli import CliTransport
from clusters.backends.slurm_fence import (
    FenceError,
    fence_argv,
    is_drained,
    is_gantry_reason,
    is_permission_error,
    node_name,
    takes_work,
    unfence_argv,
)
from clusters.backends.slurm_jobs import SlurmJob, is_ours, is_transient_text, slurm_message
from clusters.backends.slurm_jobs import job_status as status_of
from clusters.backends.slurm_nodes import SlurmNode, node_inventory, parse_scontrol_nodes
from clusters.backends.slurm_quoting import RenderError
from clusters.backends.slurm_rest import RestTransport
from clusters.backends.slurm_settings import REST_API, SlurmSettings
from core.schema import SchemaError

LOG_READ_BYTES = 256 * 1024
# How long a health check of a drained node may take to start while the node is resumed
# for it (held by Gantry's reservation): a scheduling cycle or two.
CHECK_START_TIMEOUT_S = 60.0


@register("slurm")
class SlurmBackend:
    honours_placement = True  # --nodelist

    @property
    def inventory_max_age_s(self) -> float:
        """Its nodes change without Gantry (other jobs, drains): trusted only this long."""
        return float(django_settings.GANTRY_INVENTORY_MAX_AGE_S)

    def __init__(self, cluster):
        self.cluster = cluster
        try:
            self._settings: SlurmSettings | None = SlurmSettings.parse(
                cluster.settings, cluster=cluster.name
            )
            self._error = ""
        except SchemaError as exc:
            # Raised on first use, so a misconfigured cluster fails the attempt with a
            # reason rather than failing the task that looked the backend up.
            self._settings, self._error = None, str(exc)
        self._transport: CliTransport | RestTransport | None = None
        self._reclaim_first: bool | None = None

    @property
    def settings(self) -> SlurmSettings:
        if self._settings is None:
            raise PermanentBackendError(self._error)
        return self._settings

    @property
    def transport(self) -> CliTransport | RestTransport:
        if self._transport is None:
            settings = self.settings
            self._transport = (
                RestTransport(settings) if settings.transport == "rest" else CliTransport(settings)
            )
        return self._transport

    def job(self, spec: JobSpec) -> BatchJob:
        try:
            return batch_job(spec, self.settings)
        except RenderError as exc:
            raise PermanentBackendError(
                f"cluster {self.cluster.name}: {exc}", failure_reason="UNKNOWN"
            ) from None

    def render(self, spec: JobSpec) -> str:
        return self.job(spec).script

    def submit(self, spec: JobSpec, *, may_exist: bool = True) -> str:
        """Adopt the job already named after the attempt, else submit one.

        The look-up (``squeue --name`` and ``sacct``, or their REST calls) costs more than
        the submit itself, so it is made only when an earlier try may have reached Slurm
        (``may_exist``). Two deliveries that race past the lookup both submit; the attempt
        records one of the two jobs, and ``sync`` cancels the other.
        """
        job = self.job(spec)
        if may_exist:
            ours = [j for j in self.transport.find(spec.name) if is_ours(j, spec.name)]
            if ours:
                return min(ours, key=lambda j: int(j.job_id)).job_id
        return self.transport.submit(job)

    def sync(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        """One query of slurmctld for every live job, plus one accounting query for the
        jobs among ``refs`` that ended or that slurmctld no longer holds."""
        if not refs:
            return {}
        live = self.transport.live_jobs()
        by_id = {job.job_id: job for job in live}
        by_name: dict[str, SlurmJob] = {}
        for job in live:
            if is_ours(job, job.name) and (
                job.name not in by_name or int(job.job_id) > int(by_name[job.name].job_id)
            ):
                by_name[job.name] = job
        self._cancel_duplicates(refs, live)
        statuses: dict[str, JobStatus] = {}
        ended: list[tuple[JobRef, SlurmJob | None]] = []
        for ref in refs:
            held = by_id.get(ref.backend_job_id) if ref.backend_job_id else by_name.get(ref.name)
            if held is not None and held.name != ref.name:
                held = None  # a job id reused after the cluster's state was reset
            if held is None or (held.finished and self.transport.exit_codes_from_accounting):
                ended.append((ref, held))
            else:
                statuses[ref.name] = status_of(held)
        if ended:
            ids = [ref.backend_job_id for ref, _ in ended if ref.backend_job_id]
            names = [ref.name for ref, _ in ended]
            accounted = {
                job.job_id: job
                for job in self.transport.accounting(ids, names)
                if job.finished and not job.refused
            }
            for ref, held in ended:
                record = accounted.get(ref.backend_job_id or (held.job_id if held else ""))
                if record is not None and record.name == ref.name:
                    # sacct -P: the exit code Slurm recorded (22.05's JSON misreports it).
                    statuses[ref.name] = status_of(_merge(record, held))
                elif held is not None:
                    statuses[ref.name] = status_of(held)
                # else: Slurm knows nothing of it; the services mark it LOST after a grace.
        return statuses

    def _cancel_duplicates(self, refs: list[JobRef], live: list[SlurmJob]) -> None:
        """A live job named after an attempt that recorded another job id is a duplicate
        from two submits that raced: the recorded job is the attempt's, the other goes."""
        recorded = {ref.name: ref.backend_job_id for ref in refs if ref.backend_job_id}
        for job in live:
            wanted = recorded.get(job.name)
            if wanted and job.job_id != wanted and is_ours(job, job.name) and not job.finished:
                with suppress(TransientBackendError):  # the next sync tries again
                    self.transport.cancel(job.job_id)

    def cancel(self, ref: JobRef) -> None:
        if ref.backend_job_id:
            self.transport.cancel(ref.backend_job_id)
            return
        for job in self.transport.find(ref.name):
            if is_ours(job, ref.name) and not job.finished:
                self.transport.cancel(job.job_id)

    def workspace_address(self, ref: JobRef, *, port: int) -> tuple[str, int]:
        """The NodeAddr of the node the running job holds (a workspace has one node): what
        slurmctld says, never the job. Two queries: the live jobs and the nodes."""
        job = next((j for j in self.transport.live_jobs() if j.job_id == ref.backend_job_id), None)
        if job is None or job.name != ref.name or job.finished:
            raise PermanentBackendError(f"Slurm holds no running job {ref.backend_job_id}")
        if job.state != "RUNNING" or not job.nodes:
            raise TransientBackendError(f"job {job.job_id} is {job.state.lower()}, not running")
        node = job.nodes[0]
        address = next((n.address for n in self.transport.nodes() if n.name == node), "")
        if not address:
            raise TransientBackendError(f"Slurm gave no address of node {node}")
        return address, port

    def workspace_release(self, *, run_id: int, tenant: str) -> None:
        """Nothing to let go of: the workspace's directory stays in the job directory."""

    def logs(self, ref: JobRef, *, tail: int) -> str:
        """The last ``tail`` lines of the job's output file, read where this process sees
        the cluster's job directory (``log_dir``, default ``job_dir``)."""
        if not ref.backend_job_id:
            return ""
        path = Path(self.settings.logs_at) / f"{ref.name}-{ref.backend_job_id}.out"
        try:
            with path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - LOG_READ_BYTES))
                data = handle.read()
        except FileNotFoundError:
            return (
                f"(no output at {path} yet: the job has not started, or Gantry's workers "
                "do not see the cluster's job directory; see log_dir in docs/slurm.md)"
            )
        except OSError as exc:
            return f"(cannot read {path}: {exc.strerror})"
        lines = data.decode("utf-8", errors="replace").splitlines()
        return "\n".join(lines[-tail:]) if tail > 0 else ""

    def log_chunks(self, ref: JobRef) -> Iterator[bytes] | None:
        """The job's whole output file in chunks, for a download (``logs`` reads only its
        end); None while there is none to read."""
        if not ref.backend_job_id:
            return None
        path = Path(self.settings.logs_at) / f"{ref.name}-{ref.backend_job_id}.out"
        try:
            handle = path.open("rb")
        except OSError:
            return None

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(LOG_READ_BYTES):
                    yield chunk

        return chunks()

    @property
    def reclaim_first(self) -> bool:
        """The settings ask for it and the CLI's user may set a job's priority (root, or a
        Slurm operator: sbatch ignores ``--priority`` of anyone else without a word). Asked
        of Slurm once per backend, with the inventory that records it."""
        if self._reclaim_first is None:
            try:
                wanted = reclaims_first(self.settings)
            except PermanentBackendError:
                wanted = False
            self._reclaim_first = wanted and self._may_set_priority()
        return self._reclaim_first

    def _may_set_priority(self) -> bool:
        if os.getuid() == 0:
            return True
        cli = self.transport if isinstance(self.transport, CliTransport) else None
        if cli is None:
            return False
        level = cli.read(
            ["sacctmgr", "-n", "-P", "show", "user", _current_user(), "format=AdminLevel"]
        )
        return is_operator(level)

    def inventory(self) -> Inventory:
        """Four fixed CLI calls (``scontrol -d show node``, ``squeue`` of the jobs holding
        nodes and of those pending, ``scontrol show topology``) or two REST calls
        (``/nodes``, ``/jobs``), whatever the number of nodes and jobs."""
        transport = self.transport
        jobs, claims, claims_error = transport.queue()
        found = node_inventory(
            transport.nodes(),
            self.settings,
            jobs=jobs,
            topology=transport.topology(),
            now=timezone.now().timestamp(),
        )
        self._reclaim_first = None  # asked again with each inventory
        return replace(found, claims=tuple(claims), claims_error=claims_error)

    # --- fencing: scontrol drain and resume (docs/node-health.md) ---------------------------

    def fence(self, node: str, reason: str) -> None:
        """Drain ``node`` with reason ``gantry: <reason>``: Slurm starts no new job there and
        lets the running ones finish. Idempotent. A node already drained (or failing) for
        a reason of someone else's is left as it is: it takes no work already, and its reason
        stays theirs. A node that is only DOWN is drained, so that it stays out when it
        comes back (its reason, often Slurm's own "Not responding", becomes Gantry's)."""
        cli = self._fence_cli("drain")
        current = self._node(cli, node)
        if is_drained(current.state) and (is_gantry_reason(current.reason) or current.reason):
            return
        self._scontrol(cli, fence_argv(node, reason), node, "drain")

    def unfence(self, node: str) -> None:
        """Resume ``node`` if Gantry drained it. A node drained or taken down for another
        reason is never resumed: BackendError says whose reason it is."""
        cli = self._fence_cli("resume")
        current = self._node(cli, node)
        if takes_work(current.state):
            return
        if not is_gantry_reason(current.reason):
            why = f"for {current.reason!r}" if current.reason else "without a reason"
            raise PermanentBackendError(
                f"Slurm node {node} is {current.state.upper()} {why}, not by Gantry: Gantry "
                "resumes only the nodes it drained itself; a Slurm administrator resumes it "
                f"(scontrol update NodeName={node} State=RESUME) once it is fit"
            )
        self._scontrol(cli, unfence_argv(node), node, "resume")

    def _fence_cli(self, what: str) -> CliTransport:
        """scontrol: slurmrestd's API v0.0.38 has no node update (only GET /nodes and
        /node/{name}); through REST, the CLI is used where the settings name a slurm.conf."""
        settings = self.settings
        if isinstance(self.transport, CliTransport):
            return self.transport
        if settings.slurm_conf:
            return CliTransport(settings)
        raise PermanentBackendError(
            f"cluster {self.cluster.name}: slurmrestd's API {REST_API} cannot {what} nodes "
            "(it has no endpoint that changes a node): give the setting slurm_conf, so that "
            "Gantry runs scontrol on its workers as a Slurm administrator, or turn the "
            "health policy's fence_backend off (Gantry then only keeps the node out of its "
            "own placement)"
        )

    def _node(self, cli: CliTransport, node: str) -> SlurmNode:
        try:
            name = node_name(node)
        except FenceError as exc:
            raise PermanentBackendError(str(exc)) from None
        done = cli.run(["scontrol", "-o", "show", "node", name])
        message = slurm_message(done.stderr + "\n" + done.stdout)
        if done.returncode != 0:
            if is_transient_text(message):
                raise TransientBackendError(f"scontrol show node {node}: {message}")
            raise PermanentBackendError(f"Slurm has no node {node}: {message}")
        found = [n for n in parse_scontrol_nodes(done.stdout) if n.name == node]
        if not found:
            raise PermanentBackendError(f"Slurm has no node {node}")
        return found[0]

    def _scontrol(self, cli: CliTransport, argv: list[str], node: str, what: str) -> None:
        done = cli.run(argv)
        if done.returncode == 0:
            return
        message = slurm_message(done.stderr + "\n" + done.stdout)
        message = message.removeprefix("slurm_update error: ")
        if is_permission_error(message):
            raise PermanentBackendError(
                f"Slurm refused to {what} node {node} ({message}): only Slurm administrators "
                "may drain or resume nodes; give Gantry's Slurm user AdminLevel=Admin "
                "(sacctmgr modify user <user> set AdminLevel=Admin)"
            )
        if is_transient_text(message):
            raise TransientBackendError(f"scontrol could not {what} node {node}: {message}")
        raise PermanentBackendError(f"Slurm refused to {what} node {node}: {message}")

    # --- the health check on demand (clusters.backends.health_check) ---------------------------

    def health_check(self, node: str, *, check_id: int, flavor: str, gpus: int) -> JobRef:
        """Submit the cluster's health check to ``node``, holding its ``gpus`` GPUs of
        ``flavor``; ``sync`` then reads its end (``health_check_result``). It runs on the
        node itself, not in a container. A node Gantry drained starts no job: it is held
        for the check by a maintenance reservation for Gantry's Slurm user (so no other job
        starts there), resumed until the check starts, and drained again with its reason
        (a drain lets the running check finish); the reservation lapses with the check's
        time limit. A node drained by someone else is not checked."""
        settings = self.settings
        try:
            check = parse_health_check(settings_for_check(self.cluster), needs_image=False)
        except HealthCheckSettingsError as exc:
            raise PermanentBackendError(f"cluster {self.cluster.name}: {exc}") from None
        if check is None:
            raise PermanentBackendError(
                f"cluster {self.cluster.name} has no health_check setting (its command)"
            )
        spec = JobSpec(
            name=health_check_name(check_id),
            attempt_id=0,
            run_id=0,
            tenant=check.account,
            project="health-check",
            image="",
            command=check.command,
            env={},
            flavor=flavor,
            nodes=1,
            gpus_per_node=gpus,
            max_runtime_s=check.max_runtime_s,
            placement=(node,),
        )
        on_node = replace(settings, container_runtime="none")
        cli = self._fence_cli("check")
        current = self._node(cli, node)
        if not is_drained(current.state):
            return JobRef(spec.name, self.transport.submit(self._check_job(spec, on_node)))
        if not is_gantry_reason(current.reason):
            raise PermanentBackendError(
                f"Slurm node {node} is drained for {current.reason!r}, not by Gantry: Gantry "
                "checks only nodes that take work or that it drained itself"
            )
        return self._check_drained(cli, spec, on_node, current)

    def _check_job(self, spec: JobSpec, settings: SlurmSettings, reservation: str = "") -> BatchJob:
        try:
            return batch_job(spec, settings, reservation=reservation)
        except RenderError as exc:
            raise PermanentBackendError(f"cluster {self.cluster.name}: {exc}") from None

    def _check_drained(
        self, cli: CliTransport, spec: JobSpec, settings: SlurmSettings, node: SlurmNode
    ) -> JobRef:
        user = settings.rest_user if settings.transport == "rest" else _current_user()
        minutes = -(-spec.max_runtime_s // 60) + 2
        self._scontrol(
            cli,
            [
                "scontrol", "create", "reservation", f"ReservationName={spec.name}",
                "StartTime=now", f"Duration={minutes}", f"Nodes={node.name}",
                f"Users={user}", "Flags=MAINT,IGNORE_JOBS",
            ],
            node.name,
            "reserve",
        )  # fmt: skip
        redrain = ["scontrol", "update", f"NodeName={node.name}", "State=DRAIN"]
        redrain.append(f"Reason={node.reason}")
        job_id = ""
        try:
            self._scontrol(cli, unfence_argv(node.name), node.name, "resume")
            job_id = self.transport.submit(self._check_job(spec, settings, spec.name))
            deadline = time.monotonic() + CHECK_START_TIMEOUT_S
            while time.monotonic() < deadline:
                status = self.sync([JobRef(spec.name, job_id)]).get(spec.name)
                if status is not None and status.state != "PENDING":
                    return JobRef(spec.name, job_id)
                time.sleep(0.5)
            raise TransientBackendError(
                f"the health check of {node.name} did not start within "
                f"{CHECK_START_TIMEOUT_S:g} s; it was cancelled"
            )
        except BaseException:
            if job_id:
                with suppress(BackendError):
                    self.transport.cancel(job_id)
            raise
        finally:
            # Drained again whatever happened: the quarantine stands until a person ends it.
            # Then the reservation ends now: a running check keeps its node (Slurm refuses
            # to delete a reservation in use, but ends it), and none waits for it. Ending it
            # in the second it began is "Invalid time specified": then it is deleted (a
            # check over that fast holds nothing; one still running keeps it until its
            # Duration).
            try:
                self._scontrol(cli, redrain, node.name, "drain")
            finally:
                end = ["scontrol", "update", f"ReservationName={spec.name}", "EndTime=now"]
                delete = ["scontrol", "delete", f"ReservationName={spec.name}"]
                with suppress(BackendError):
                    try:
                        self._scontrol(cli, end, node.name, "release the reservation of")
                    except BackendError:
                        self._scontrol(cli, delete, node.name, "delete the reservation of")

    def mirror_quotas(self, quotas: Iterable[QuotaLimit]) -> list[list[str]]:
        """Make Slurm enforce the tenants' GPU limits too: an account and a QOS with
        ``GrpTRES`` per tenant (``sacctmgr``, run here: it needs Slurm admin rights)."""
        settings = self.settings
        users = settings.submit_users or (
            (settings.rest_user,) if settings.transport == "rest" else (_current_user(),)
        )
        try:
            commands = quota_commands(quotas, settings, users=users)
        except RenderError as exc:
            raise PermanentBackendError(str(exc)) from None
        cli = self.transport if isinstance(self.transport, CliTransport) else None
        cli = cli or CliTransport(settings)
        for argv in commands:
            done = cli.run(argv)
            message = slurm_message(done.stderr + "\n" + done.stdout)
            if done.returncode == 0:
                continue
            lowered = message.lower()
            if argv[2] == "add" and ("nothing new added" in lowered or "already" in lowered):
                continue
            if argv[2] == "modify" and "nothing modified" in lowered:
                continue
            if is_transient_text(message):
                raise TransientBackendError(f"sacctmgr: {message}")
            raise PermanentBackendError(f"sacctmgr {' '.join(argv[2:5])}: {message}")
        return commands


def _merge(record: SlurmJob, live: SlurmJob | None) -> SlurmJob:
    """The accounting record, with what only slurmctld knew filled in.

    The exit code is slurmctld's while it still holds the job: squeue's ``exit_code`` is
    the raw wait(2) status, exact, while sacct's ``ExitCode`` folds a return code of 128 or
    more into code - 128 (a job that ran ``exit 226`` reads ``98:0``; observed on 22.05).
    """
    if live is None:
        return record
    knows_exit = live.exit_code is not None or live.signal or record.exit_code is None
    ended = live if knows_exit else record
    return replace(
        record,
        nodes=record.nodes or live.nodes,
        gpus=record.gpus if record.gpus is not None else live.gpus,
        start=record.start or live.start,
        end=record.end or live.end,
        exit_code=ended.exit_code,
        signal=ended.signal,
    )


def _current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def mirror_quotas(cluster, quotas: Iterable[QuotaLimit]) -> list[list[str]]:
    """Mirror tenants' GPU limits into the Slurm cluster's accounts and QOS (see
    ``SlurmBackend.mirror_quotas``). Returns the sacctmgr commands it ran."""
    return SlurmBackend(cluster).mirror_quotas(quotas)


__all__ = ["QuotaLimit", "SlurmBackend", "mirror_quotas"]
