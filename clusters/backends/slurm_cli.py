"""The Slurm backend's CLI transport: sbatch, squeue, sacct, scancel, scontrol and sacctmgr, run
by this process on a Slurm client host, each with a timeout (docs/slurm.md)."""

import json
import os
import shutil
import subprocess

from clusters.backends.base import PendingClaim, PermanentBackendError, TransientBackendError
from clusters.backends.slurm_batch import BatchJob
from clusters.backends.slurm_jobs import (
    ALREADY_DONE,
    SACCT_FIELDS,
    SlurmJob,
    is_ours,
    is_transient_text,
    parse_sacct,
    parse_sbatch_job_id,
    parse_squeue_json,
    slurm_message,
)
from clusters.backends.slurm_nodes import (
    HOLDING_JOB_STATES,
    SQUEUE_GPU_FORMAT,
    SlurmNode,
    parse_scontrol_nodes,
    parse_squeue_gpus,
)
from clusters.backends.slurm_pending import (
    SQUEUE_PENDING_FORMAT,
    PendingError,
    parse_squeue_pending,
)
from clusters.backends.slurm_settings import SlurmSettings


class CliTransport:
    """sbatch, squeue, sacct, scancel, scontrol, run by this process (a Slurm client host)."""

    # Finished jobs are read with sacct -P: Slurm's accounting record, exit code included.
    exit_codes_from_accounting = True

    def __init__(self, settings: SlurmSettings):
        self.settings = settings
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
        }
        slurm_conf = settings.slurm_conf or os.environ.get("SLURM_CONF", "")
        if slurm_conf:
            env["SLURM_CONF"] = slurm_conf
        # Only these: the worker's own environment (database URL, secrets) never reaches a
        # job, and a SLURM_JWT in it would switch the clients away from munge.
        self.base_env = env

    def run(
        self, argv: list[str], *, input_text: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        # Found on the worker's PATH: a job's PATH (job_path) is for the job.
        program = shutil.which(argv[0], path=self.base_env["PATH"]) or argv[0]
        try:
            return subprocess.run(  # noqa: S603 (fixed programs, arguments as a list)
                [program, *argv[1:]],
                input=input_text,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.settings.cli_timeout_s,
                env={**self.base_env, **(env or {})},
                check=False,
            )
        except FileNotFoundError:
            raise PermanentBackendError(
                f"{argv[0]} is not installed on this Gantry worker: install the Slurm client "
                "(Debian: slurm-client) or use transport 'rest'"
            ) from None
        except subprocess.TimeoutExpired:
            raise TransientBackendError(
                f"{argv[0]} got no answer from Slurm within {self.settings.cli_timeout_s:g} s"
            ) from None

    def read(self, argv: list[str], *, env: dict[str, str] | None = None) -> str:
        """A query: any failure is the cluster not answering (transient)."""
        done = self.run(argv, env=env)
        if done.returncode != 0:
            raise TransientBackendError(
                f"{argv[0]} failed: {slurm_message(done.stderr) or f'exit {done.returncode}'}"
            )
        return done.stdout

    def submit(self, job: BatchJob) -> str:
        done = self.run(["sbatch", "--parsable"], input_text=job.script, env=job.environment)
        message = slurm_message(done.stderr)
        if done.returncode != 0:
            if is_transient_text(message):
                raise TransientBackendError(f"sbatch: {message}")
            raise PermanentBackendError(f"Slurm refused the job: {message}")
        try:
            return parse_sbatch_job_id(done.stdout)
        except ValueError as exc:
            raise TransientBackendError(str(exc)) from None

    def live_jobs(self) -> list[SlurmJob]:
        """Every job slurmctld holds (pending, running, and ended within MinJobAge)."""
        text = self.read(["squeue", "--json"])
        try:
            return parse_squeue_json(json.loads(text))
        except ValueError as exc:
            # squeue --json exits 0 even when slurmctld did not answer; the error is inside.
            raise TransientBackendError(
                f"squeue could not load jobs from slurmctld: {exc}"
            ) from None

    def accounting(self, job_ids: list[str], names: list[str]) -> list[SlurmJob]:
        if not job_ids:
            return []
        text = self.read(
            [
                "sacct",
                "-X",
                "-P",
                "-n",
                "-a",
                "-j",
                ",".join(job_ids),
                "-o",
                ",".join(SACCT_FIELDS),
            ],
            env={"SLURM_TIME_FORMAT": "%s"},
        )
        return parse_sacct(text)

    def find(self, name: str) -> list[SlurmJob]:
        """Jobs named ``name``: slurmctld first (authoritative for live jobs, which reach
        slurmdbd a moment later), then accounting for jobs that already left slurmctld."""
        text = self.read(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i|%j|%k|%T|%r|%N"])
        jobs = []
        for line in text.splitlines():
            cells = line.split("|")
            if len(cells) == 6:
                job_id, job_name, comment, state, reason, nodes = cells
                jobs.append(
                    SlurmJob(
                        job_id=job_id.strip(),
                        name=job_name,
                        comment=comment,
                        state=state.strip(),
                        reason=reason,
                        nodes=() if nodes in ("", "(null)") else (nodes,),
                        source="squeue",
                    )
                )
        if any(is_ours(job, name) for job in jobs):
            return jobs
        text = self.read(
            [
                "sacct",
                "-X",
                "-P",
                "-n",
                "-a",
                f"--name={name}",
                "-S",
                f"now-{self.settings.adopt_window_days}days",
                "-E",
                "now",
                "-o",
                ",".join(SACCT_FIELDS),
            ],
            env={"SLURM_TIME_FORMAT": "%s"},
        )
        return jobs + parse_sacct(text)

    def cancel(self, job_id: str) -> None:
        done = self.run(["scancel", job_id])
        message = slurm_message(done.stderr)
        if done.returncode == 0 or any(s in message.lower() for s in ALREADY_DONE):
            return
        if is_transient_text(message) or not message:
            raise TransientBackendError(f"scancel: {message or f'exit {done.returncode}'}")
        raise PermanentBackendError(f"scancel refused: {message}")

    def nodes(self) -> list[SlurmNode]:
        # -d adds GresUsed: the GPUs jobs hold, whether or not accounting tracks gres/gpu.
        return parse_scontrol_nodes(self.read(["scontrol", "-d", "-o", "show", "node"]))

    def gpu_jobs(self) -> list[SlurmJob]:
        """The jobs holding nodes now, with their GPUs per node (every partition)."""
        states = ",".join(HOLDING_JOB_STATES)
        return parse_squeue_gpus(
            self.read(["squeue", "-a", "-h", "-t", states, "-o", SQUEUE_GPU_FORMAT])
        )

    def queue(self) -> tuple[list[SlurmJob], list[PendingClaim], str]:
        """The jobs holding nodes; the outside jobs waiting for GPUs, with their priority,
        expected start and planned nodes (``squeue -t PD``); and why those could not be
        read ("" when they could)."""
        holding = self.gpu_jobs()
        text = self.read(
            ["squeue", "-a", "-h", "-t", "PD", "-o", SQUEUE_PENDING_FORMAT],
            env={"SLURM_TIME_FORMAT": "%s"},
        )
        try:
            return holding, parse_squeue_pending(text, self.settings), ""
        except PendingError as exc:
            return holding, [], f"squeue's pending jobs could not be read: {exc}"

    def topology(self) -> str | None:
        """``scontrol show topology``: empty without topology/tree (22.05 then says "No
        topology information available" on stderr and exits 0)."""
        return self.read(["scontrol", "show", "topology"])
