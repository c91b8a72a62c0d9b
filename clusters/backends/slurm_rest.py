"""The Slurm backend's REST transport: slurmrestd (API v0.0.38) with a JWT, each request with a
timeout (docs/slurm.md)."""

import os
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import requests
from django.utils import timezone

from clusters.backends.base import PendingClaim, PermanentBackendError, TransientBackendError
from clusters.backends.slurm_accounts import jwt_claims
from clusters.backends.slurm_batch import BatchJob
from clusters.backends.slurm_jobs import (
    ALREADY_DONE,
    SlurmJob,
    describe_errors,
    error_numbers,
    is_ours,
    is_transient_error_number,
    is_transient_text,
    parse_slurmdb_jobs,
    parse_squeue_json,
)
from clusters.backends.slurm_nodes import SlurmNode, parse_rest_nodes
from clusters.backends.slurm_pending import PendingError, parse_rest_pending
from clusters.backends.slurm_settings import REST_API, SlurmSettings


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
        if any(is_ours(job, name) for job in jobs):
            return jobs
        return jobs + (self._slurmdb_jobs([name], since_days=self.settings.adopt_window_days) or [])

    def cancel(self, job_id: str) -> None:
        status, payload = self.request("DELETE", f"/slurm/{REST_API}/job/{job_id}")
        errors = payload.get("errors") or []
        if not errors:
            return
        message = describe_errors(errors)
        if any(s in message.lower() for s in ALREADY_DONE):
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
