"""The variables Gantry itself puts in every job's environment, and how a job's environment
is stored and shown (its attempt token redacted): one list for the three backends, the
env-name rules (``clusters.env_names``) and the docs.

Plain data in, plain data out; no ORM, no settings.
"""

from collections.abc import Mapping

# The variables through which a job learns how to report about itself.
ATTEMPT_TOKEN_ENV = "GANTRY_ATTEMPT_TOKEN"  # noqa: S105 (a variable name)
API_URL_ENV = "GANTRY_API_URL"
REDACTED = "<redacted>"
IMAGE_ENV = "GANTRY_IMAGE"
CHECKPOINT_DIR_ENV = "GANTRY_CHECKPOINT_DIR"
RESUME_FROM_ENV = "GANTRY_RESUME_FROM"
RESUME_STEP_ENV = "GANTRY_RESUME_STEP"
# A workspace's (docs/workspaces.md, "Backends"): its server's secret (passed like the
# attempt token, never in a stored spec), the path it serves, which server, and where it
# listens (set by the backend: an address and, where the backend fixes one, a port).
WORKSPACE_TOKEN_ENV = "GANTRY_WORKSPACE_TOKEN"  # noqa: S105 (a variable name)
WORKSPACE_BASE_URL_ENV = "GANTRY_WORKSPACE_BASE_URL"
WORKSPACE_SERVER_ENV = "GANTRY_WORKSPACE_SERVER"
WORKSPACE_BIND_ENV = "GANTRY_WORKSPACE_BIND"
WORKSPACE_PORT_ENV = "GANTRY_WORKSPACE_PORT"
WORKSPACE_HOME_ENV = "GANTRY_WORKSPACE_HOME"
# Every variable Gantry itself puts in a job's environment, with what it carries: the one
# list. Every backend sets them from ``gantry_environment`` (the token its own way), and an
# experiment's env may not name them (``clusters.env_names``).
GANTRY_ENV = {
    ATTEMPT_TOKEN_ENV: "the attempt's token, with which the job reports about itself",
    API_URL_ENV: "the address the job reports to",
    IMAGE_ENV: "the image the job runs",
    CHECKPOINT_DIR_ENV: "the experiment's checkpoint directory",
    RESUME_FROM_ENV: "the checkpoint a resumed attempt starts from",
    RESUME_STEP_ENV: "the step of that checkpoint",
    WORKSPACE_TOKEN_ENV: "a workspace's server secret, which only Gantry's proxy sends",
    WORKSPACE_BASE_URL_ENV: "the path under which Gantry's proxy serves a workspace",
    WORKSPACE_SERVER_ENV: "a workspace's server (jupyter, vscode)",
    WORKSPACE_BIND_ENV: "the address a workspace's server listens on",
    WORKSPACE_PORT_ENV: "the port a workspace's server listens on, where the backend fixes it",
    WORKSPACE_HOME_ENV: "a workspace's files, the same for every attempt (kept across a resume)",
}


def gantry_environment(
    *,
    api_url: str,
    image: str,
    checkpoint_dir: str,
    resume_uri: str,
    resume_step: int | None,
    workspace_server: str = "",
    workspace_base_url: str = "",
) -> dict[str, str]:
    """Gantry's own variables of one job, all but the tokens (each backend passes those its
    own way): the same names and values on every backend. No API URL or checkpoint
    directory: not set; the checkpoint only when the attempt resumes from one; a
    workspace's server and base URL only for a workspace."""
    env = {API_URL_ENV: api_url, IMAGE_ENV: image, CHECKPOINT_DIR_ENV: checkpoint_dir}
    env = {name: value for name, value in env.items() if value}
    if resume_step is not None:
        env |= {RESUME_FROM_ENV: resume_uri, RESUME_STEP_ENV: str(resume_step)}
    if workspace_server:
        env |= {WORKSPACE_SERVER_ENV: workspace_server, WORKSPACE_BASE_URL_ENV: workspace_base_url}
    return env


def job_environment_shown(env: Mapping[str, str], *, workspace: bool = False) -> dict[str, str]:
    """The environment a job runs with as it is stored and shown: its own variables plus
    its attempt token (and a workspace's server secret), redacted. Every job gets a token;
    it reaches the job apart from the stored spec (docs/security.md), so what is stored
    never holds it. Only the simulator calls this: the Kubernetes manifest and the Slurm
    script write the tokens' redaction their own way."""
    shown = {**env, ATTEMPT_TOKEN_ENV: REDACTED}
    if workspace:
        shown[WORKSPACE_TOKEN_ENV] = REDACTED
    return shown
