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
}


def gantry_environment(
    *, api_url: str, image: str, checkpoint_dir: str, resume_uri: str, resume_step: int | None
) -> dict[str, str]:
    """Gantry's own variables of one job, all but the token (each backend passes that its
    own way): the same names and values on every backend. No API URL or checkpoint
    directory: not set; the checkpoint only when the attempt resumes from one."""
    env = {API_URL_ENV: api_url, IMAGE_ENV: image, CHECKPOINT_DIR_ENV: checkpoint_dir}
    env = {name: value for name, value in env.items() if value}
    if resume_step is not None:
        env |= {RESUME_FROM_ENV: resume_uri, RESUME_STEP_ENV: str(resume_step)}
    return env


def job_environment_shown(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a job runs with as it is stored and shown: its own variables plus
    its attempt token, redacted. Every job gets a token; it reaches the job apart from the
    stored spec (docs/security.md), so what is stored never holds it. Only the simulator
    calls this: the Kubernetes manifest and the Slurm script write the token's redaction
    their own way."""
    return {**env, ATTEMPT_TOKEN_ENV: REDACTED}
