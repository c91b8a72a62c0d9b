"""The simulator's pure parts: workload profiles and node placement. No ORM, no clock."""

from dataclasses import dataclass

PROFILES = {
    # name: (share of the run before the outcome, outcome state, exit code, failure reason)
    "compute-bound": (1.0, "SUCCEEDED", 0, ""),
    "input-bound": (1.0, "SUCCEEDED", 0, ""),
    "comm-bound": (1.0, "SUCCEEDED", 0, ""),
    "idle": (1.0, "SUCCEEDED", 0, ""),
    "crash": (0.6, "FAILED", 1, "USER_EXIT"),
    "oom": (0.3, "FAILED", 137, "OOM_GPU"),
}
DEFAULT_PROFILE = "compute-bound"
DEFAULT_DURATION_S = 1200
STARTUP_S = 30


@dataclass(frozen=True, slots=True)
class Workload:
    profile: str
    duration_s: int  # simulated seconds of work when nothing goes wrong

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Workload":
        """Read the workload hint an experiment gives the simulator through its env."""
        profile = env.get("GANTRY_SIM_PROFILE", DEFAULT_PROFILE)
        if profile not in PROFILES:
            raise ValueError(
                f"GANTRY_SIM_PROFILE must be one of {', '.join(sorted(PROFILES))}, got {profile!r}"
            )
        raw = env.get("GANTRY_SIM_DURATION_S", str(DEFAULT_DURATION_S))
        try:
            duration = int(raw)
        except ValueError:
            raise ValueError(f"GANTRY_SIM_DURATION_S must be an integer, got {raw!r}") from None
        if not 1 <= duration <= 30 * 86400:
            raise ValueError("GANTRY_SIM_DURATION_S must be between 1 and 2592000")
        return cls(profile=profile, duration_s=duration)


@dataclass(frozen=True, slots=True)
class Outcome:
    state: str  # RUNNING, SUCCEEDED, FAILED
    ends_at_s: float  # simulated seconds after start when the job ends
    exit_code: int | None = None
    failure_reason: str = ""


def outcome_at(workload: Workload, *, elapsed_s: float, max_runtime_s: int) -> Outcome:
    """Where a job that started ``elapsed_s`` simulated seconds ago stands."""
    share, state, exit_code, reason = PROFILES[workload.profile]
    ends_at = STARTUP_S + workload.duration_s * share
    if max_runtime_s < ends_at:
        if elapsed_s >= max_runtime_s:
            return Outcome("FAILED", max_runtime_s, None, "TIMEOUT")
        return Outcome("RUNNING", max_runtime_s)
    if elapsed_s >= ends_at:
        return Outcome(state, ends_at, exit_code, reason)
    return Outcome("RUNNING", ends_at)


def place(
    free: dict[str, list[int]], *, nodes: int, gpus_per_node: int
) -> dict[str, list[int]] | None:
    """First-fit gang placement: ``nodes`` nodes with ``gpus_per_node`` free GPUs each, or None.

    ``free`` maps node name -> free GPU indices; nodes are tried in name order.
    """
    chosen: dict[str, list[int]] = {}
    for node in sorted(free):
        indices = sorted(free[node])
        if len(indices) >= gpus_per_node:
            chosen[node] = indices[:gpus_per_node]
            if len(chosen) == nodes:
                return chosen
    return None
