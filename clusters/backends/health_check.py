"""The active health check: a short job Gantry submits to one node on demand (a suspect node,
or a quarantined one before it returns to service), and what its end says. Pure: no Django,
no I/O.

A cluster's settings may hold ``"health_check": {"command": "dcgmi diag -r 1", ...}``: the
command (run through ``COMMAND_SHELL`` like every job's) and, on Kubernetes, the image it
runs in (pinned by digest); on Slurm it runs on the node itself, not in a container (it
probes the host: its driver, DCGM), under ``account`` if given (else the submitting user's
default account). ``max_runtime_s`` bounds it (default 600: DCGM's level 2, "~ 2 minutes",
with room; level 3 takes ~15 minutes and is an administrator's post-mortem tool).

The verdict is the job's end (``health_check_result``): exit 0 passes; any other exit fails.
dcgmi returns its ``dcgmReturn_t`` as its exit status: ``DCGM_ST_NVVS_ISOLATE_ERROR`` (-51,
exit 205) when a failure asks to isolate the GPU, ``DCGM_ST_NVVS_ERROR`` (-30, exit 226)
when a test failed (DCGM's dcgmi/Diag.cpp and dcgm_structs.h). A check that did not run to
its end (cancelled, timed out, its node lost) says nothing about the node: inconclusive.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clusters.backends.base import JobStatus
from clusters.health import Signal, SignalClass, Source

SETTINGS_KEY = "health_check"
DEFAULT_MAX_RUNTIME_S = 600
MAX_COMMAND = 4096
# Named after the check's id, apart from attempts (gantry-a<id>): Gantry's share of a
# node's GPUs counts attempts only.
NAME = re.compile(r"^gantry-hc[0-9]+$")
_IMAGE = re.compile(r"^[a-z0-9]+([._/:-][a-z0-9]+)*(:[\w][\w.-]{0,127})?@sha256:[0-9a-f]{64}$")
_ACCOUNT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_DCGM_EXITS = {
    205: "dcgmi diag asks to isolate a GPU (DCGM_ST_NVVS_ISOLATE_ERROR)",
    226: "a dcgmi diag test failed (DCGM_ST_NVVS_ERROR)",
}

RUNNING = "running"
PASSED = "passed"
FAILED = "failed"
INCONCLUSIVE = "inconclusive"


class HealthCheckSettingsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class HealthCheckSettings:
    command: str
    image: str = ""
    account: str = ""
    max_runtime_s: int = DEFAULT_MAX_RUNTIME_S


def parse_health_check(
    raw: Mapping[str, Any] | None, *, needs_image: bool
) -> HealthCheckSettings | None:
    """The ``health_check`` setting checked; None when the cluster has none."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise HealthCheckSettingsError(
            'setting health_check must be an object such as {"command": "dcgmi diag -r 1"}'
        )
    allowed = {"command", "max_runtime_s", *(("image",) if needs_image else ("account",))}
    if unknown := sorted(set(raw) - allowed):
        raise HealthCheckSettingsError(
            f"health_check: unknown setting(s) {', '.join(unknown)} (it takes "
            f"{', '.join(sorted(allowed))})"
        )
    command = raw.get("command")
    if not isinstance(command, str) or not command.strip():
        raise HealthCheckSettingsError("health_check: command is required (a shell line)")
    if "\x00" in command or len(command) > MAX_COMMAND:
        raise HealthCheckSettingsError(
            f"health_check: command must be text of at most {MAX_COMMAND} characters"
        )
    image = raw.get("image", "")
    if needs_image and (not isinstance(image, str) or not _IMAGE.match(image)):
        raise HealthCheckSettingsError(
            "health_check: image is required, pinned by digest (repository@sha256:…)"
        )
    account = raw.get("account", "")
    if not isinstance(account, str) or (account and not _ACCOUNT.match(account)):
        raise HealthCheckSettingsError(f"health_check: account {account!r} is not a Slurm name")
    runtime = raw.get("max_runtime_s", DEFAULT_MAX_RUNTIME_S)
    if isinstance(runtime, bool) or not isinstance(runtime, int) or not 10 <= runtime <= 86400:
        raise HealthCheckSettingsError(
            "health_check: max_runtime_s must be a whole number of seconds from 10 to 86400"
        )
    return HealthCheckSettings(command=command, image=image, account=account, max_runtime_s=runtime)


def settings_for_check(cluster: Any) -> Mapping[str, Any] | None:
    """The raw ``health_check`` setting of a cluster (None without one)."""
    raw = (getattr(cluster, "settings", None) or {}).get(SETTINGS_KEY)
    return None if raw is None else raw


def health_check_name(check_id: int) -> str:
    if isinstance(check_id, bool) or not isinstance(check_id, int) or check_id < 1:
        raise ValueError(f"a health check's id is a positive integer, not {check_id!r}")
    return f"gantry-hc{check_id}"


@dataclass(frozen=True, slots=True)
class HealthCheckResult:
    verdict: str  # RUNNING, PASSED, FAILED or INCONCLUSIVE
    exit_code: int | None = None
    detail: str = ""


def health_check_result(status: JobStatus | None) -> HealthCheckResult:
    """What the check's job status says of the node (``status`` None: the backend does not
    know the job, which has not started or was lost: still running, as far as is known)."""
    if status is None or status.state in ("PENDING", "RUNNING"):
        return HealthCheckResult(RUNNING, detail=status.message if status else "")
    if status.state == "SUCCEEDED":
        return HealthCheckResult(PASSED, 0, "the health check passed (exit 0)")
    code = status.exit_code
    if (
        status.state == "FAILED"
        and code not in (None, 0)
        and status.failure_reason
        in (
            "USER_EXIT",
            "UNKNOWN",
            "GPU_XID",
            "NCCL",
            "OOM_GPU",
        )
    ):
        words = _DCGM_EXITS.get(code, f"the health check failed with exit code {code}")
        return HealthCheckResult(FAILED, code, f"{words}: {status.message}".strip(": "))
    reason = status.failure_reason or status.state
    return HealthCheckResult(
        INCONCLUSIVE, code, f"the health check did not run to its end ({reason}): {status.message}"
    )


def health_check_signal(node: str, result: HealthCheckResult, *, at: float) -> Signal | None:
    """A failed check as a node-health signal (HEALTH_CHECK_FAILED); None otherwise."""
    if result.verdict != FAILED:
        return None
    return Signal(
        node=node,
        signal=SignalClass.HEALTH_CHECK_FAILED,
        source=Source.HEALTH_CHECK,
        at=at,
        code=f"exit {result.exit_code}",
        detail=result.detail,
    )
