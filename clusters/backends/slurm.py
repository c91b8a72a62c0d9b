"""The Slurm backend: slurmrestd (API v0.0.38, JWT) or the Slurm CLI, per cluster setting.

Cluster settings are described in docs/slurm.md; the pure half is in modules of its own:
``slurm_settings`` (the settings), ``slurm_batch`` (the script, quoted by ``slurm_quoting``),
``slurm_jobs`` (what Slurm prints about jobs, the state mapping), ``slurm_nodes`` and
``slurm_topology`` (the inventory), ``slurm_accounts`` (quotas, the token). Every call has a
timeout. Errors:

- ``TransientBackendError``: a daemon did not answer (slurmctld, slurmdbd, slurmrestd), or
  answered "try again"; nothing changed, retrying is safe;
- ``PermanentBackendError``: the settings are wrong (bad URL, missing or expired token,
  unmapped flavor) or Slurm refused the job; the message is Slurm's own.
"""

import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import requests
from django.conf import settings as django_settings
from django.utils import timezone

from clusters.backends import register
from clusters.backends.base import (
    Inventory,
    JobRef,
    JobSpec,
    JobStatus,
    PendingClaim,
    PermanentBackendError,
    TransientBackendError,
)
from clusters.backends.slurm_accounts import QuotaLimit, is_operator, jwt_claims, quota_commands
from clusters.backends.slurm_batch import BatchJob, batch_job, reclaims_first
from clusters.backends.slurm_jobs import (
    SACCT_FIELDS,
    SlurmJob,
    describe_errors,
    error_numbers,
    is_transient_error_number,
    is_transient_text,
    parse_sacct,
    parse_sbatch_job_id,
    parse_slurmdb_jobs,
    parse_squeue_json,
    slurm_message,
)
from clusters.backends.slurm_jobs import job_status as status_of
from clusters.backends.slurm_nodes import (
    HOLDING_JOB_STATES,
    SQUEUE_GPU_FORMAT,
    SlurmNode,
    node_inventory,
    parse_rest_nodes,
    parse_scontrol_nodes,
    parse_squeue_gpus,
)
from clusters.backends.slurm_pending import (
    SQUEUE_PENDING_FORMAT,
    PendingError,
    parse_rest_pending,
    parse_squeue_pending,
)
from clusters.backends.slurm_quoting import RenderError
from clusters.backends.slurm_settings import REST_API, SettingsError, SlurmSettings

LOG_READ_BYTES = 256 * 1024
# Slurm's "nothing to do" answers to a cancel: the job ended or is unknown.
_ALREADY_DONE = ("already completing or completed", "invalid job id specified")


def _ours(job: SlurmJob, name: str) -> bool:
    """A job Gantry submitted for ``name``: name and comment both carry it (accounting
    stores the comment only when the job ends), and Slurm did not refuse it at submission
    (a refused job still gets a record)."""
    return job.name == name and job.comment in (name, "") and not job.refused


# --- transports ----------------------------------------------------------------------------


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
        self, argv: list[str], *, input_text: str | None = None, env: dict | None = None
    ) -> subprocess.CompletedProcess:
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

    def read(self, argv: list[str], *, env: dict | None = None) -> str:
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
        if any(_ours(job, name) for job in jobs):
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
        if done.returncode == 0 or any(s in message.lower() for s in _ALREADY_DONE):
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


class RestTransport:
    """slurmrestd's REST API v0.0.38 with a JWT (``X-SLURM-USER-NAME``/``-TOKEN``)."""

    # slurmdbd's v0.0.38 JSON misreports exit codes: a finished job is read from slurmctld
    # while it holds it (MinJobAge), and from slurmdbd only once it is gone.
    exit_codes_from_accounting = False

    def __init__(self, settings: SlurmSettings):
        self.settings = settings
        self.url = settings.rest_url.rstrip("/")
        self.session = requests.Session()

    def _token(self) -> str:
        name = self.settings.rest_token_env
        token = os.environ.get(name, "").strip()
        if not token:
            raise PermanentBackendError(
                f"the slurmrestd token is read from environment variable {name}, which is not "
                "set in Gantry's workers"
            )
        try:
            claims = jwt_claims(token)
        except ValueError as exc:
            raise PermanentBackendError(f"the token in {name} is {exc}") from None
        expires = claims.get("exp")
        if isinstance(expires, int | float) and expires < timezone.now().timestamp():
            when = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%d %H:%M UTC")
            raise PermanentBackendError(
                f"the slurmrestd token in {name} expired at {when}: mint a new one "
                f"(scontrol token username={self.settings.rest_user} lifespan=…)"
            )
        subject = claims.get("sun")
        if subject not in (None, self.settings.rest_user):
            raise PermanentBackendError(
                f"the token in {name} is for Slurm user {subject!r}, but rest_user is "
                f"{self.settings.rest_user!r}"
            )
        return token

    def request(self, method: str, path: str, *, body: dict | None = None) -> tuple[int, dict]:
        headers = {
            "X-SLURM-USER-NAME": self.settings.rest_user,
            "X-SLURM-USER-TOKEN": self._token(),
        }
        url = f"{self.url}{path}"
        try:
            response = self.session.request(
                method, url, json=body, headers=headers, timeout=self.settings.rest_timeout_s
            )
        except requests.Timeout:
            raise TransientBackendError(
                f"slurmrestd at {self.url} did not answer within {self.settings.rest_timeout_s:g} s"
            ) from None
        except requests.ConnectionError as exc:
            raise TransientBackendError(
                f"slurmrestd at {self.url} is unreachable ({_reason(exc)}); if this lasts, "
                "check that it runs and the cluster's rest_url"
            ) from None
        except requests.RequestException as exc:
            raise PermanentBackendError(f"slurmrestd at {self.url}: {exc}") from None
        if response.status_code in (401, 403):
            raise PermanentBackendError(
                f"slurmrestd at {self.url} refused the credentials of user "
                f"{self.settings.rest_user} (token from {self.settings.rest_token_env}): "
                f"{response.text.strip()[:200]}"
            )
        if response.status_code == 404:
            raise PermanentBackendError(
                f"no Slurm REST API {REST_API} at {url} (HTTP 404): check rest_url, and that "
                f"slurmrestd loads openapi/{REST_API}"
            )
        try:
            payload = response.json()
        except ValueError:
            text = response.text.strip()[:200]
            if response.status_code >= 500:
                raise TransientBackendError(
                    f"slurmrestd at {self.url}: HTTP {response.status_code} {text}"
                ) from None
            raise PermanentBackendError(
                f"{url} did not answer like slurmrestd (HTTP {response.status_code}, not JSON)"
            ) from None
        if not isinstance(payload, dict):
            raise PermanentBackendError(f"{url} did not answer like slurmrestd")
        return response.status_code, payload

    def read(self, path: str) -> dict:
        status, payload = self.request("GET", path)
        errors = payload.get("errors") or []
        if status >= 400 and errors:
            # With JWT "pass through", slurmctld itself checks the token: an unreachable
            # slurmctld and a token it rejects both come back as "Unspecified error".
            raise TransientBackendError(
                f"slurmrestd at {self.url}: {describe_errors(errors)} (slurmctld unreachable, "
                "or it rejected the token)"
            )
        return payload

    def submit(self, job: BatchJob) -> str:
        _, payload = self.request(
            "POST", f"/slurm/{REST_API}/job/submit", body=job.rest_submission()
        )
        if payload.get("job_id"):
            # Some notices come as errors with a job id, e.g. 2042 "job is held".
            return str(payload["job_id"])
        errors = payload.get("errors") or []
        message = describe_errors(errors)
        numbers = error_numbers(errors)
        if (numbers and all(is_transient_error_number(n) for n in numbers)) or (
            not numbers and is_transient_text(message)
        ):
            raise TransientBackendError(f"slurmrestd at {self.url}: {message}")
        raise PermanentBackendError(f"Slurm refused the job: {message}")

    def live_jobs(self) -> list[SlurmJob]:
        return self._jobs(self.read(f"/slurm/{REST_API}/jobs"))

    def _jobs(self, payload: dict) -> list[SlurmJob]:
        try:
            return parse_squeue_json(payload, source="rest")
        except ValueError as exc:
            raise TransientBackendError(f"slurmrestd at {self.url}: {exc}") from None

    def queue(self) -> tuple[list[SlurmJob], list[PendingClaim], str]:
        """As the CLI's, from one ``GET /jobs`` (v0.0.38 cannot filter by state)."""
        payload = self.read(f"/slurm/{REST_API}/jobs")
        jobs = self._jobs(payload)
        try:
            return jobs, parse_rest_pending(payload, self.settings), ""
        except PendingError as exc:
            return jobs, [], f"slurmrestd's pending jobs could not be read: {exc}"

    def _slurmdb_jobs(self, names: list[str], *, since_days: int = 0) -> list[SlurmJob] | None:
        """Jobs by name from slurmdbd; None when slurmrestd does not serve the slurmdbd API
        (the dbv0.0.38 plugin is not loaded)."""
        # The list separator must be sent as %2C: 22.05 answers a literal comma with 400.
        query = "job_name=" + quote(",".join(names), safe="")
        if since_days:
            since = timezone.now() - timedelta(days=since_days)
            query += f"&submit_time={since:%Y-%m-%d}"
        try:
            _, payload = self.request("GET", f"/slurmdb/{REST_API}/jobs?{query}")
        except PermanentBackendError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise
        try:
            return parse_slurmdb_jobs(payload)
        except ValueError as exc:
            raise TransientBackendError(f"slurmrestd at {self.url}: {exc}") from None

    def accounting(self, job_ids: list[str], names: list[str]) -> list[SlurmJob]:
        """Jobs that left slurmctld, from slurmdbd by name (v0.0.38 has no job id filter).
        Without the slurmdbd API there is no history: such jobs become LOST."""
        return (self._slurmdb_jobs(names) or []) if names else []

    def find(self, name: str) -> list[SlurmJob]:
        """slurmctld first: a job reaches slurmdbd a second or so after submission, and a
        second delivery must see it at once. v0.0.38 cannot filter GET /jobs, so this
        lookup costs time in proportion to the jobs slurmctld holds. Then slurmdbd, which
        filters by name, for jobs that already left slurmctld."""
        jobs = [job for job in self.live_jobs() if job.name == name]
        if any(_ours(job, name) for job in jobs):
            return jobs
        return jobs + (self._slurmdb_jobs([name], since_days=self.settings.adopt_window_days) or [])

    def cancel(self, job_id: str) -> None:
        status, payload = self.request("DELETE", f"/slurm/{REST_API}/job/{job_id}")
        errors = payload.get("errors") or []
        if not errors:
            return
        message = describe_errors(errors)
        if any(s in message.lower() for s in _ALREADY_DONE):
            return
        numbers = error_numbers(errors)
        if status >= 500 or any(is_transient_error_number(n) for n in numbers):
            raise TransientBackendError(f"slurmrestd at {self.url}: {message}")
        raise PermanentBackendError(f"Slurm refused to cancel job {job_id}: {message}")

    def nodes(self) -> list[SlurmNode]:
        payload = self.read(f"/slurm/{REST_API}/nodes")
        try:
            return parse_rest_nodes(payload)
        except ValueError as exc:
            raise TransientBackendError(f"slurmrestd at {self.url}: {exc}") from None

    def gpu_jobs(self) -> list[SlurmJob]:
        return self.live_jobs()  # v0.0.38 cannot filter GET /jobs by state

    def topology(self) -> str | None:
        """v0.0.38 has no topology endpoint: the operator's copy of topology.conf in the
        settings, or None (unknown)."""
        lines = self.settings.topology
        return None if lines is None else "\n".join(lines)


def _reason(exc: requests.ConnectionError) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "No route to host"):
        if marker in text:
            return marker.lower()
    return exc.__class__.__name__


# --- the backend ---------------------------------------------------------------------------


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
        except SettingsError as exc:
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
            ours = [j for j in self.transport.find(spec.name) if _ours(j, spec.name)]
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
            if _ours(job, job.name) and (
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
            if wanted and job.job_id != wanted and _ours(job, job.name) and not job.finished:
                with suppress(TransientBackendError):  # the next sync tries again
                    self.transport.cancel(job.job_id)

    def cancel(self, ref: JobRef) -> None:
        if ref.backend_job_id:
            self.transport.cancel(ref.backend_job_id)
            return
        for job in self.transport.find(ref.name):
            if _ours(job, ref.name) and not job.finished:
                self.transport.cancel(job.job_id)

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
            transport.nodes(), self.settings, jobs=jobs, topology=transport.topology()
        )
        self._reclaim_first = None  # asked again with each inventory
        return replace(found, claims=tuple(claims), claims_error=claims_error)

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
    """The accounting record, with what only slurmctld knew filled in."""
    if live is None:
        return record
    return replace(
        record,
        nodes=record.nodes or live.nodes,
        gpus=record.gpus if record.gpus is not None else live.gpus,
        start=record.start or live.start,
        end=record.end or live.end,
        exit_code=record.exit_code if record.exit_code is not None else live.exit_code,
        signal=record.signal if record.exit_code is not None else live.signal,
    )


def _current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def mirror_quotas(cluster, quotas: Iterable[QuotaLimit]) -> list[list[str]]:
    """Mirror tenants' GPU limits into the Slurm cluster's accounts and QOS (see
    ``SlurmBackend.mirror_quotas``). Returns the sacctmgr commands it ran."""
    return SlurmBackend(cluster).mirror_quotas(quotas)


__all__ = ["QuotaLimit", "SlurmBackend", "mirror_quotas"]
