"""The batch job for a ``JobSpec``: the script (with every user value quoted), its launcher
(pyxis, apptainer or none) and the same options as ``#SBATCH`` lines and as slurmrestd job
properties (``batch_job``). Pure: no Django, no processes.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from clusters.backends.base import COMMAND_SHELL, JobSpec, job_env
from clusters.backends.health_check import NAME as HEALTH_CHECK_NAME
from clusters.backends.slurm_fence import FenceError, node_name
from clusters.backends.slurm_quoting import LEVEL_NAME, RenderError, plain_word, shell_quote
from clusters.backends.slurm_settings import SlurmSettings
from clusters.env_names import env_name_refusal
from clusters.job_env import (
    ATTEMPT_TOKEN_ENV,
    WORKSPACE_BIND_ENV,
    WORKSPACE_HOME_ENV,
    WORKSPACE_TOKEN_ENV,
)


@dataclass(frozen=True, slots=True)
class BatchJob:
    """One Slurm batch job: its options, the script, and the environment it is submitted
    with. ``environment`` holds the attempt token; ``script`` never does."""

    name: str
    comment: str
    account: str
    partition: str
    qos: str
    nodes: int
    tasks_per_node: int
    gres: str  # per node: gpu:TYPE:N
    time_limit_min: int
    signal: str  # e.g. B:USR1@300 (CLI) or USR1@300 (REST); empty for none
    workdir: str
    output: str  # with %j, Slurm's job id
    script: str
    environment: dict[str, str] = field(repr=False)
    nodelist: str = ""  # the nodes admission chose, comma-separated; empty: Slurm places
    exclude: str = ""  # nodes the job must not run on (a hardware fault there), comma-separated
    switches: int = 0  # at most this many leaf switches (``--switches``); 0: no limit
    top_priority: bool = False  # it reclaims preempted GPUs: ``--priority=TOP``
    reservation: str = ""  # a health check held to a drained node by Gantry's reservation

    def sbatch_options(self) -> list[str]:
        """The options as sbatch arguments, in the order of the script's #SBATCH lines."""
        options = [f"--job-name={self.name}", f"--comment={self.comment}"]
        if self.account:  # a health check without one: the user's default account
            options.append(f"--account={self.account}")
        if self.reservation:
            options.append(f"--reservation={self.reservation}")
        if self.partition:
            options.append(f"--partition={self.partition}")
        if self.qos:
            options.append(f"--qos={self.qos}")
        options.append(f"--nodes={self.nodes}")
        if self.nodelist:
            options.append(f"--nodelist={self.nodelist}")
        if self.exclude:
            options.append(f"--exclude={self.exclude}")
        if self.switches:
            options.append(f"--switches={self.switches}")
        options += [
            f"--ntasks-per-node={self.tasks_per_node}",
            f"--gres={self.gres}",
            f"--time={self.time_limit_min}",
        ]
        if self.signal:
            options.append(f"--signal={self.signal}")
        if self.top_priority:
            options.append("--priority=TOP")
        options += ["--no-requeue", f"--chdir={self.workdir}", f"--output={self.output}"]
        return options

    def rest_submission(self) -> dict[str, Any]:
        """The body of ``POST /slurm/v0.0.38/job/submit``.

        slurmrestd 22.05 does not read ``#SBATCH`` lines: every option goes in ``job``. It
        ignores ``requeue: false`` (the cluster default applies), rejects ``B:`` signals and
        refuses a switch count ("Disabled key: required_switches"); it takes ``nodelist``
        and, for ``--exclude``, ``exclude_nodes`` (its v0.0.38 ``job_params``: the
        ``excluded_nodes`` it reports is disabled as an input).
        """
        job = {
            "name": self.name,
            "comment": self.comment,
            # A string: 22.05 silently ignores the [min, max] array form.
            "nodes": str(self.nodes),
            "tasks_per_node": self.tasks_per_node,
            "gres": self.gres,
            "time_limit": self.time_limit_min,
            "requeue": False,
            "current_working_directory": self.workdir,
            "standard_output": self.output,
            "environment": dict(self.environment),
        }
        if self.account:
            job["account"] = self.account
        if self.reservation:
            job["reservation"] = self.reservation
        if self.partition:
            job["partition"] = self.partition
        if self.qos:
            job["qos"] = self.qos
        if self.signal:
            job["signal"] = self.signal
        if self.nodelist:
            job["nodelist"] = self.nodelist
        if self.exclude:
            job["exclude_nodes"] = self.exclude
        return {"script": self.script, "job": job}


def enroot_image(reference: str) -> str:
    """``registry/path@sha256:…`` in enroot's syntax, ``registry#path:sha256:…``.

    enroot (which pyxis calls) parses ``[USER@][REGISTRY#]IMAGE[:TAG]``: the ``@`` of a
    digest reference would be read as a user name, and without ``#`` the first path
    component is taken as part of a Docker Hub image. A tag may contain ``:``, so
    ``:sha256:<hex>`` asks the registry for that exact manifest.
    """
    repository, at, digest = reference.partition("@")
    if not at or not digest.startswith("sha256:"):
        raise RenderError(f"image {reference!r} is not pinned by digest (repository@sha256:…)")
    first, slash, rest = repository.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}:{digest}"
    return f"{repository}:{digest}"


def step_command(env: Mapping[str, str], command: str) -> str:
    """What the step's shell runs: ``env`` exported (sorted), then the user's command."""
    exports = "".join(f"export {key}={shell_quote(value)}; " for key, value in sorted(env.items()))
    return exports + command


def _launcher(spec: JobSpec, settings: SlurmSettings) -> tuple[list[str], str]:
    """Lines that find the launch programs, and the command line that starts the user's
    command in every task, up to the command.

    The programs are looked up in the batch shell, which never holds the user's variables (a
    user's PATH is meant for the program, and may not even be valid on the node), and kept
    read-only.
    """
    shell = " ".join(COMMAND_SHELL)
    find = [
        'readonly gantry_srun="$(command -v srun)"',
        '[ -n "$gantry_srun" ] || { echo "gantry: srun not found on $(hostname)" >&2; exit 127; }',
    ]
    if settings.container_runtime == "pyxis":
        image = shell_quote(enroot_image(spec.image))
        return find, f'"$gantry_srun" --container-image={image} {shell}'
    if settings.container_runtime == "apptainer":
        enroot_image(spec.image)  # the same check: pinned by digest
        find += [
            'readonly gantry_apptainer="$(command -v apptainer)"',
            '[ -n "$gantry_apptainer" ] || { echo "gantry: apptainer not found" >&2; exit 127; }',
        ]
        image = shell_quote("docker://" + spec.image)
        return find, f'"$gantry_srun" "$gantry_apptainer" exec --nv {image} {shell}'
    return find, f'"$gantry_srun" {shell}'


def batch_job(
    spec: JobSpec,
    settings: SlurmSettings,
    *,
    environment: Mapping[str, str] | None = None,
    reservation: str = "",
) -> BatchJob:
    """The batch job that runs ``spec`` on the cluster.

    ``environment`` is what the job is submitted with (besides the script's own exports):
    by default a clean ``PATH`` and the attempt token, never the worker's environment.
    """
    mapping = settings.flavors.get(spec.flavor)
    if mapping is None:
        raise RenderError(
            f"this cluster maps no Slurm GPU type for flavor {spec.flavor} "
            f"(it maps {', '.join(sorted(settings.flavors)) or 'none'})"
        )
    if spec.nodes < 1 or spec.gpus_per_node < 1:
        raise RenderError("a job needs at least one node and one GPU per node")
    name = plain_word(spec.name, "job name")
    # Only a health check (named gantry-hc<id>) may go without an account.
    account = (
        plain_word(spec.tenant, "tenant (the Slurm account)")
        if spec.tenant or not HEALTH_CHECK_NAME.match(spec.name)
        else ""
    )
    partition = mapping.partition or settings.partition
    qos = mapping.qos or settings.qos
    # Settings hold a positive integer or "gpus" (one task per GPU).
    tasks = (
        settings.tasks_per_node if isinstance(settings.tasks_per_node, int) else spec.gpus_per_node
    )
    time_limit_min = max(1, -(-spec.max_runtime_s // 60))
    signal_before = min(settings.signal_before_s, max(0, spec.max_runtime_s // 2))
    if settings.transport == "cli":
        # B: signals only the batch shell; its trap decides whether the program hears it.
        signal = f"B:USR1@{signal_before}"
    else:
        # slurmrestd 22.05 rejects B:, and a plain signal reaches every task: a program that
        # does not handle USR1 would die from it, so only jobs that checkpoint ask for it.
        signal = f"USR1@{signal_before}" if spec.checkpoint_dir else ""

    for key in spec.env:
        refusal = env_name_refusal(key)
        if refusal is not None:
            raise RenderError(refusal)
    if spec.topology_required and not LEVEL_NAME.match(spec.topology_level):
        raise RenderError(f"topology level {spec.topology_level!r} is not a level name")
    placement = [plain_word(node, "node name") for node in spec.placement]
    if placement and len(placement) != spec.nodes:
        raise RenderError(
            f"the placement names {len(placement)} nodes for a job of {spec.nodes} nodes"
        )
    if len(set(placement)) != len(placement):
        raise RenderError("the placement names a node twice")
    try:
        excluded = sorted({node_name(node) for node in spec.excluded_nodes})
    except FenceError as exc:
        raise RenderError(f"excluded node: {exc}") from None
    if both := sorted(set(placement) & set(excluded)):
        raise RenderError(f"node {both[0]} is both in the placement and excluded")
    job_env = {"PATH": settings.job_path}
    if spec.attempt_token:
        job_env[ATTEMPT_TOKEN_ENV] = spec.attempt_token
    if spec.workspace is not None and spec.workspace.token:
        job_env[WORKSPACE_TOKEN_ENV] = spec.workspace.token
    if environment is not None:
        job_env = {**job_env, **environment}
    job = BatchJob(
        name=name,
        comment=name,
        account=account,
        partition=partition,
        qos=qos,
        nodes=spec.nodes,
        tasks_per_node=tasks,
        gres=f"gpu:{mapping.gres_type}:{spec.gpus_per_node}",
        time_limit_min=time_limit_min,
        signal=signal,
        workdir=settings.job_dir,
        output=f"{settings.job_dir.rstrip('/')}/{name}-%j.out",
        script="",
        environment=job_env,
        nodelist=",".join(placement),
        exclude=",".join(excluded),
        switches=1 if _one_leaf_switch(spec, settings) and settings.transport == "cli" else 0,
        top_priority=spec.reclaiming and reclaims_first(settings),
        reservation=plain_word(reservation, "reservation") if reservation else "",
    )
    return replace(job, script=_script(job, spec, settings))


def reclaims_first(settings: SlurmSettings) -> bool:
    """Whether a reclaiming job is to start on the GPUs its preemption frees before outside
    jobs waiting for them: submitted with ``--priority=TOP`` (sbatch, as an operator) before
    the cancel. slurmrestd v0.0.38 cannot: its user is not an operator, and it creates no
    reservations either. Whether the CLI's user is an operator is checked apart
    (``is_operator``): Slurm ignores the option of anyone else without a word."""
    return settings.transport == "cli" and settings.reclaim_priority


def _one_leaf_switch(spec: JobSpec, settings: SlurmSettings) -> bool:
    """The gang must share one leaf switch: what ``--switches=1`` says (one node always
    does). Wider levels have no switch count: a spine's nodes hang off several leaves."""
    return (
        spec.topology_required and spec.nodes > 1 and spec.topology_level == settings.deepest_level
    )


def _step_env(spec: JobSpec, settings: SlurmSettings) -> dict[str, str]:
    """What the step's shell exports: the job's variables, and a workspace's bind address
    and its files' directory: one per workspace under the cluster's job directory, the same
    for each of its attempts (so a resumed workspace finds its files), never another's."""
    env = job_env(spec)
    if spec.workspace is not None:
        env[WORKSPACE_BIND_ENV] = settings.workspace_bind
        env[WORKSPACE_HOME_ENV] = f"{settings.job_dir.rstrip('/')}/workspaces/{spec.run_id}"
    return env


def _script(job: BatchJob, spec: JobSpec, settings: SlurmSettings) -> str:
    lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in job.sbatch_options())]
    what = (
        f"health check of {','.join(spec.placement)}"
        if HEALTH_CHECK_NAME.match(spec.name)
        else f"run {int(spec.run_id)}, attempt {int(spec.attempt_id)}"
    )
    lines += [
        f"# Gantry {what}.",
        "# GANTRY_ATTEMPT_TOKEN=<redacted>: it comes with the submit environment, never in",
        "# this script.",
    ]
    if spec.workspace is not None:
        lines += [
            "# A workspace: gantry-workspace starts its server on this node on a free port and",
            "# reports the port; GANTRY_WORKSPACE_TOKEN=<redacted> comes like the attempt token.",
        ]
    if settings.transport == "rest":
        lines.append("# Submitted through slurmrestd, which takes these options as job properties.")
    if job.nodelist and spec.topology_required and spec.nodes > 1 and not job.switches:
        lines.append(
            f"# Required in one {spec.topology_level}: the node list holds the gang there "
            + (
                "(slurmrestd 22.05 takes no switch count)."
                if _one_leaf_switch(spec, settings)
                else "(a switch count cannot say it)."
            )
        )
    if job.exclude:
        lines.append(f"# Not on {job.exclude}: a node Gantry found faulty while this run used it.")
    if job.top_priority:
        lines.append(
            "# It takes GPUs a preemption frees: first in Slurm's queue, so no job waiting "
            "there takes them."
        )
    if settings.container_runtime == "none":
        lines.append("# container_runtime none: the command runs on the node, not in the image.")
    # This first command ends sbatch's scan for #SBATCH lines before any user value.
    if spec.checkpoint_dir:
        lines += [
            "# Near the time limit: pass USR1 on to the job step, so the program can checkpoint.",
            "trap 'kill -USR1 \"$gantry_step\" 2>/dev/null' USR1",
        ]
    else:
        lines += [
            "# No checkpoint directory: the program is not signalled before the time limit.",
            "trap 'echo \"gantry: the time limit is near\" >&2' USR1",
        ]
    find, launch = _launcher(spec, settings)
    lines += find
    lines += [
        "# The experiment's env is exported by the step's own shell, in the container, before",
        "# the command: this batch shell, srun and the container runtime never see it.",
        f"{launch} {shell_quote(step_command(_step_env(spec, settings), spec.command))} &",
        "gantry_step=$!",
        "# wait returns early when a trapped signal arrives: wait until the step is gone.",
        'while kill -0 "$gantry_step" 2>/dev/null; do wait "$gantry_step"; done',
        'wait "$gantry_step"',
        "",
    ]
    return "\n".join(lines)
