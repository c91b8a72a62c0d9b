"""The Slurm backend's pure half: settings, the batch script, and what Slurm prints.

Plain data in and out, no Django and no processes, so it is easy to test and benchmark:

- ``SlurmSettings.parse``: a cluster's settings JSON, checked strictly;
- ``batch_job``: the batch job for a ``JobSpec`` — the script (with every user value quoted)
  and the same options as ``#SBATCH`` lines and as slurmrestd job properties;
- parsers for ``sbatch --parsable``, ``squeue --json`` / REST ``/jobs``, ``sacct -P``,
  slurmdbd REST ``/jobs``, ``scontrol -d show node -o`` / REST ``/nodes``, the GPUs jobs
  hold per node (``squeue -o``) and ``scontrol show topology`` (or topology.conf's lines);
- ``job_status``: a Slurm job record mapped to the run lifecycle and the failure taxonomy;
- ``node_inventory``: the GPU nodes, their use (by Gantry and by others), whether they take
  work and where they sit in the switch tree;
- ``expand_hostlist``: ``gpu-node[1-2]`` → ``gpu-node1``, ``gpu-node2``;
- ``quota_commands``: the ``sacctmgr`` commands that mirror tenants' GPU quotas.
"""

import base64
import json
import re
import shlex
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from clusters.backends.base import (
    COMMAND_SHELL,
    TELEMETRY_SETTINGS_KEY,
    Inventory,
    JobSpec,
    JobStatus,
    NodeInventory,
    job_env,
)
from clusters.env_names import env_name_refusal
from clusters.job_env import ATTEMPT_TOKEN_ENV

TRANSPORTS = ("rest", "cli")
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "none")
REST_API = "v0.0.38"
DEFAULT_SIGNAL_BEFORE_S = 300
DEFAULT_JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# sacct columns the backend reads, in this order (``sacct -P -o …``).
SACCT_FIELDS = (
    "JobIDRaw",
    "JobName",
    "Comment",
    "State",
    "Reason",
    "ExitCode",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "NodeList",
    "User",
)

# Values that go into #SBATCH lines and sacctmgr arguments are never quoted there: they
# must be plain words. Everything a researcher typed goes into the script body, quoted.
_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+:@%=-]{0,127}$")
_PATH = re.compile(r"^/[A-Za-z0-9_./+@%:=-]{0,1023}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_JOB_ID = re.compile(r"^[0-9]+$")
# A topology level's name, as experiments name the level they need (at most 63 characters).
_LEVEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,62}$")
# Gantry's jobs are named after their attempt (``Attempt.name``: gantry-a<id>).
GANTRY_JOB_NAME = re.compile(r"gantry-a[0-9]+")

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
_PENDING_STATES = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
)
_RUNNING_STATES = frozenset(
    {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
)
# Slurm state → (lifecycle state, failure reason) for jobs that ended.
_FINISHED = {
    "COMPLETED": ("SUCCEEDED", ""),
    "FAILED": ("FAILED", "USER_EXIT"),
    "SPECIAL_EXIT": ("FAILED", "USER_EXIT"),
    "OUT_OF_MEMORY": ("FAILED", "OOM_HOST"),
    "NODE_FAIL": ("FAILED", "NODE_FAILURE"),
    "BOOT_FAIL": ("FAILED", "NODE_FAILURE"),
    "TIMEOUT": ("FAILED", "TIMEOUT"),
    "DEADLINE": ("FAILED", "TIMEOUT"),
    "PREEMPTED": ("PREEMPTED", "PREEMPTED"),
    "CANCELLED": ("CANCELLED", "CANCELLED"),
    "REVOKED": ("CANCELLED", "CANCELLED"),
}
# Pending reasons of a job Slurm refused at submission (it still gets an id and a record).
REFUSED_REASONS = frozenset({"BadConstraints"})
NOTHING_FOUND = 9003  # slurmdbd REST error number for an empty result


class SettingsError(ValueError):
    """The cluster's settings are wrong: an operator must fix them."""


class RenderError(ValueError):
    """The job cannot be expressed for this cluster (unmapped flavor, bad value)."""


# --- settings ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlavorMapping:
    gres_type: str
    partition: str = ""
    qos: str = ""


@dataclass(frozen=True, slots=True)
class SlurmSettings:
    """A Slurm cluster's connection settings and site choices (docs/slurm.md)."""

    job_dir: str
    flavors: Mapping[str, FlavorMapping]
    transport: str = "rest"
    rest_url: str = ""
    rest_user: str = ""
    rest_token_env: str = ""
    rest_timeout_s: float = 10.0
    slurm_conf: str = ""
    cli_timeout_s: float = 30.0
    partition: str = ""
    qos: str = ""
    container_runtime: str = "pyxis"
    tasks_per_node: int | str = 1  # an int, or "gpus" for one task per GPU
    signal_before_s: int = DEFAULT_SIGNAL_BEFORE_S
    job_path: str = DEFAULT_JOB_PATH
    log_dir: str = ""  # where this process sees job_dir; empty: job_dir itself
    submit_users: tuple[str, ...] = ()
    qos_prefix: str = "gantry-"
    adopt_window_days: int = 14
    # Names of the switch tree's levels, widest first; empty: derived from its depth.
    topology_levels: tuple[str, ...] = ()
    # topology.conf's lines, for transport rest (slurmrestd v0.0.38 has no topology
    # endpoint); None: not given.
    topology: tuple[str, ...] | None = None
    # A job that reclaims GPUs from a preemption is submitted with ``--priority=TOP`` before
    # the preempted jobs are cancelled, so Slurm starts it there before outside jobs that
    # were waiting (docs/slurm.md, "Reclaiming"). Needs the CLI as a Slurm operator.
    reclaim_priority: bool = True

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, cluster: str = "") -> "SlurmSettings":
        """Check every key; unknown keys and wrong types are errors, not silently ignored."""
        where = f"cluster {cluster}: " if cluster else ""

        def fail(message: str) -> SettingsError:
            return SettingsError(f"{where}{message}")

        if not isinstance(raw, Mapping):
            raise fail("settings must be a JSON object")
        known = set(cls.__dataclass_fields__) | {TELEMETRY_SETTINGS_KEY}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise fail(f"unknown Slurm setting(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}

        def text(
            name: str, pattern: re.Pattern[str] | None = None, *, required: bool = False
        ) -> str:
            value = raw.get(name, "")
            if not isinstance(value, str):
                raise fail(f"setting {name!r} must be a string")
            if required and not value:
                raise fail(f"setting {name!r} is required")
            if value and pattern is not None and not pattern.match(value):
                raise fail(f"setting {name!r} = {value!r} has characters Slurm options cannot take")
            return value

        def number(
            name: str, default: float, low: float, high: float, kind: type[float] = int
        ) -> float:
            value = raw.get(name, default)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise fail(f"setting {name!r} must be a number")
            if not low <= value <= high:
                raise fail(f"setting {name!r} must be between {low} and {high}")
            return kind(value)

        values["transport"] = text("transport") or "rest"
        if values["transport"] not in TRANSPORTS:
            raise fail(f"setting 'transport' must be one of {', '.join(TRANSPORTS)}")
        values["job_dir"] = text("job_dir", _PATH, required=True)
        values["log_dir"] = text("log_dir", _PATH)
        values["slurm_conf"] = text("slurm_conf", _PATH)
        values["partition"] = text("partition", _WORD)
        values["qos"] = text("qos", _WORD)
        values["qos_prefix"] = text("qos_prefix", re.compile(r"^[A-Za-z0-9_.-]{0,32}$"))
        if "qos_prefix" not in raw:
            values["qos_prefix"] = "gantry-"
        values["job_path"] = text("job_path", re.compile(r"^[A-Za-z0-9_./:+@=-]+$"))
        values["job_path"] = values["job_path"] or DEFAULT_JOB_PATH
        values["container_runtime"] = text("container_runtime") or "pyxis"
        if values["container_runtime"] not in CONTAINER_RUNTIMES:
            raise fail(
                f"setting 'container_runtime' must be one of {', '.join(CONTAINER_RUNTIMES)}"
            )
        values["rest_timeout_s"] = number("rest_timeout_s", 10.0, 0.1, 600, float)
        values["cli_timeout_s"] = number("cli_timeout_s", 30.0, 0.1, 600, float)
        values["signal_before_s"] = number(
            "signal_before_s", DEFAULT_SIGNAL_BEFORE_S, 0, 65535, int
        )
        values["adopt_window_days"] = number("adopt_window_days", 14, 1, 3650, int)
        tasks = raw.get("tasks_per_node", 1)
        if tasks != "gpus" and (isinstance(tasks, bool) or not isinstance(tasks, int)):
            raise fail("setting 'tasks_per_node' must be a positive integer or \"gpus\"")
        if isinstance(tasks, int) and not 1 <= tasks <= 1024:
            raise fail("setting 'tasks_per_node' must be between 1 and 1024")
        values["tasks_per_node"] = tasks
        users = raw.get("submit_users", [])
        if not isinstance(users, list) or not all(
            isinstance(u, str) and _WORD.match(u) for u in users
        ):
            raise fail("setting 'submit_users' must be a list of user names")
        values["submit_users"] = tuple(users)
        levels = raw.get("topology_levels", [])
        if not isinstance(levels, list) or not all(
            isinstance(level, str) and _LEVEL_NAME.match(level) for level in levels
        ):
            raise fail(
                "setting 'topology_levels' must be a list of level names, widest first "
                '(e.g. ["spine", "leaf"])'
            )
        if len(set(levels)) != len(levels):
            raise fail("setting 'topology_levels' names a level twice")
        values["topology_levels"] = tuple(levels)
        reclaim = raw.get("reclaim_priority", True)
        if not isinstance(reclaim, bool):
            raise fail("setting 'reclaim_priority' must be true or false")
        values["reclaim_priority"] = reclaim
        if "topology" in raw:
            lines = raw["topology"]
            if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
                raise fail("setting 'topology' must be a list of topology.conf lines")
            if values["transport"] != "rest":
                raise fail(
                    "setting 'topology' is for transport 'rest' (slurmrestd has no topology "
                    "endpoint); the CLI reads `scontrol show topology` itself"
                )
            values["topology"] = tuple(lines)

        values["rest_url"] = text("rest_url")
        values["rest_user"] = text("rest_user", _WORD)
        values["rest_token_env"] = text("rest_token_env", _ENV_NAME)
        if values["transport"] == "rest":
            url = values["rest_url"]
            if not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", url):
                raise fail(
                    f"setting 'rest_url' = {url!r} is not an http(s) URL of slurmrestd "
                    "(e.g. http://slurm-head:6820)"
                )
            for name in ("rest_user", "rest_token_env"):
                if not values[name]:
                    raise fail(f"setting {name!r} is required with transport 'rest'")

        flavors = raw.get("flavors")
        if not isinstance(flavors, Mapping) or not flavors:
            raise fail(
                "setting 'flavors' must map each GPU flavor to its Slurm GPU type, "
                'e.g. {"a100-80gb": "a100"}'
            )
        mapped = {}
        for flavor, entry in flavors.items():
            if isinstance(entry, str):
                entry = {"gres_type": entry}
            if not isinstance(entry, Mapping) or set(entry) - {"gres_type", "partition", "qos"}:
                raise fail(
                    f"flavor {flavor!r}: give the GPU type, or an object with gres_type "
                    "and optionally partition and qos"
                )
            for key in ("gres_type", "partition", "qos"):
                value = entry.get(key, "")
                if not isinstance(value, str) or (value and not _WORD.match(value)):
                    raise fail(f"flavor {flavor!r}: {key} {value!r} is not a plain Slurm name")
            if not entry.get("gres_type"):
                raise fail(f"flavor {flavor!r}: gres_type is required")
            mapped[str(flavor)] = FlavorMapping(
                gres_type=entry["gres_type"],
                partition=entry.get("partition", ""),
                qos=entry.get("qos", ""),
            )
        values["flavors"] = mapped
        return cls(**values)

    @property
    def logs_at(self) -> str:
        return self.log_dir or self.job_dir

    @property
    def deepest_level(self) -> str:
        """The name of the leaf-switch level, the one ``--switches`` counts."""
        return self.topology_levels[-1] if self.topology_levels else DERIVED_LEVEL_NAMES[0]


# --- quoting -------------------------------------------------------------------------------


def shell_quote(value: str) -> str:
    """One shell word whose value is exactly ``value``, on one line.

    Printable text is single-quoted (nothing inside is special to the shell). Text with
    control characters (newlines, CR, tabs, escape) uses bash's ``$'…'`` with every control
    character, backslash and quote escaped, so the script stays one line per value: sbatch
    never mistakes part of a value for an ``#SBATCH`` line or a DOS line break.
    """
    if "\x00" in value:
        raise RenderError("values cannot contain NUL characters")
    if not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return shlex.quote(value)
    escaped = []
    for char in value:
        code = ord(char)
        if char == "\\":
            escaped.append("\\\\")
        elif char == "'":
            escaped.append("\\'")
        elif code < 0x20 or code == 0x7F:
            escaped.append(f"\\x{code:02x}")
        else:
            escaped.append(char)
    return "$'" + "".join(escaped) + "'"


def _word(value: str, what: str) -> str:
    if not _WORD.match(value):
        raise RenderError(f"{what} {value!r} is not a plain Slurm name")
    return value


# --- the batch job -------------------------------------------------------------------------


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
    switches: int = 0  # at most this many leaf switches (``--switches``); 0: no limit
    top_priority: bool = False  # it reclaims preempted GPUs: ``--priority=TOP``

    def sbatch_options(self) -> list[str]:
        """The options as sbatch arguments, in the order of the script's #SBATCH lines."""
        options = [
            f"--job-name={self.name}",
            f"--comment={self.comment}",
            f"--account={self.account}",
        ]
        if self.partition:
            options.append(f"--partition={self.partition}")
        if self.qos:
            options.append(f"--qos={self.qos}")
        options.append(f"--nodes={self.nodes}")
        if self.nodelist:
            options.append(f"--nodelist={self.nodelist}")
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
        refuses a switch count ("Disabled key: required_switches"); it takes ``nodelist``.
        """
        job = {
            "name": self.name,
            "comment": self.comment,
            "account": self.account,
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
        if self.partition:
            job["partition"] = self.partition
        if self.qos:
            job["qos"] = self.qos
        if self.signal:
            job["signal"] = self.signal
        if self.nodelist:
            job["nodelist"] = self.nodelist
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
    name = _word(spec.name, "job name")
    account = _word(spec.tenant, "tenant (the Slurm account)")
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
    if spec.topology_required and not _LEVEL_NAME.match(spec.topology_level):
        raise RenderError(f"topology level {spec.topology_level!r} is not a level name")
    placement = [_word(node, "node name") for node in spec.placement]
    if placement and len(placement) != spec.nodes:
        raise RenderError(
            f"the placement names {len(placement)} nodes for a job of {spec.nodes} nodes"
        )
    if len(set(placement)) != len(placement):
        raise RenderError("the placement names a node twice")
    job_env = {"PATH": settings.job_path}
    if spec.attempt_token:
        job_env[ATTEMPT_TOKEN_ENV] = spec.attempt_token
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
        switches=1 if _one_leaf_switch(spec, settings) and settings.transport == "cli" else 0,
        top_priority=spec.reclaiming and reclaims_first(settings),
    )
    return replace(job, script=_script(job, spec, settings))


def reclaims_first(settings: SlurmSettings) -> bool:
    """Whether a reclaiming job is to start on the GPUs its preemption frees before outside
    jobs waiting for them: submitted with ``--priority=TOP`` (sbatch, as an operator) before
    the cancel. slurmrestd v0.0.38 cannot: its user is not an operator, and it creates no
    reservations either. Whether the CLI's user is an operator is checked apart
    (``is_operator``): Slurm ignores the option of anyone else without a word."""
    return settings.transport == "cli" and settings.reclaim_priority


# AdminLevel values (``sacctmgr show user … format=AdminLevel``) that may set a priority.
OPERATOR_LEVELS = frozenset({"Operator", "Administrator"})


def is_operator(admin_level: str) -> bool:
    """``sacctmgr -n -P show user NAME format=AdminLevel``: "Administrator", "Operator",
    "None", or nothing for a user Slurm does not know."""
    return admin_level.strip() in OPERATOR_LEVELS


def _one_leaf_switch(spec: JobSpec, settings: SlurmSettings) -> bool:
    """The gang must share one leaf switch: what ``--switches=1`` says (one node always
    does). Wider levels have no switch count: a spine's nodes hang off several leaves."""
    return (
        spec.topology_required and spec.nodes > 1 and spec.topology_level == settings.deepest_level
    )


def _script(job: BatchJob, spec: JobSpec, settings: SlurmSettings) -> str:
    lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in job.sbatch_options())]
    lines += [
        f"# Gantry run {int(spec.run_id)}, attempt {int(spec.attempt_id)}.",
        "# GANTRY_ATTEMPT_TOKEN=<redacted>: it comes with the submit environment, never in",
        "# this script.",
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
        f"{launch} {shell_quote(step_command(job_env(spec), spec.command))} &",
        "gantry_step=$!",
        "# wait returns early when a trapped signal arrives: wait until the step is gone.",
        'while kill -0 "$gantry_step" 2>/dev/null; do wait "$gantry_step"; done',
        'wait "$gantry_step"',
        "",
    ]
    return "\n".join(lines)


# --- what Slurm prints ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job as squeue, sacct or slurmrestd describe it."""

    job_id: str
    name: str
    state: str  # Slurm's base state: "CANCELLED by 0" → "CANCELLED"
    comment: str = ""
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    start: datetime | None = None
    end: datetime | None = None
    elapsed_s: int | None = None
    nodes: tuple[str, ...] = ()
    gpus: int | None = None  # allocated, from AllocTRES gres/gpu
    user: str = ""
    source: str = ""  # squeue, sacct, rest, slurmdb
    # Slurm's pending reason in full ("ReqNodeNotAvail, UnavailableNodes:gpu-node2") where
    # ``reason`` has only its code ("ReqNodeNotAvail").
    reason_detail: str = ""
    gpus_per_node: Mapping[str, int] = field(default_factory=dict)  # GPU type → count

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def refused(self) -> bool:
        """Slurm refused it at submission; the record exists only to carry the refusal."""
        return self.state == "FAILED" and self.reason in REFUSED_REASONS and not self.nodes


def parse_sbatch_job_id(stdout: str) -> str:
    """``sbatch --parsable`` prints ``<id>`` or ``<id>;<cluster>``."""
    first = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = first.split(";", 1)[0].strip()
    if not _JOB_ID.match(job_id):
        raise ValueError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")
    return job_id


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, expanded: ``gpu-node[1-3,7]``, ``n[01-02]-ib``,
    ``rack[1-2]-n[1-2]`` (every combination), several comma-separated at the top level."""
    hostlist = (hostlist or "").strip()
    if hostlist in ("", "(null)", "None", "None assigned"):
        return []
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist:
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            raise ValueError(f"unbalanced brackets in host list {hostlist!r}")
        current.append(char)
    if depth:
        raise ValueError(f"unbalanced brackets in host list {hostlist!r}")
    parts.append("".join(current))
    hosts: list[str] = []
    for part in parts:
        if part:
            hosts.extend(_expand_one(part))
    return hosts


def _expand_one(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if match is None:
        return [pattern]
    prefix, suffix = pattern[: match.start()], pattern[match.end() :]
    values: list[str] = []
    for item in match.group(1).split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad range {item!r} in host list {pattern!r}")
        width = len(low)
        stop = int(high) if dash else int(low)
        if stop < int(low) or stop - int(low) > 100_000:
            raise ValueError(f"bad range {item!r} in host list {pattern!r}")
        values.extend(str(n).zfill(width) for n in range(int(low), stop + 1))
    return [host for value in values for host in _expand_one(f"{prefix}{value}{suffix}")]


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=2,node=2,gres/gpu=16,gres/gpu:a100=16`` → a dict."""
    items = {}
    for part in (text or "").split(","):
        key, eq, value = part.partition("=")
        if eq and key:
            items[key.strip()] = value.strip()
    return items


def gpus_of_tres(text: str) -> int | None:
    tres = parse_tres(text)
    if "gres/gpu" in tres:
        return _count(tres["gres/gpu"])
    typed = [_count(v) for k, v in tres.items() if k.startswith("gres/gpu:")]
    return sum(typed) if typed else None


def _count(value: str) -> int:
    # TRES counts may carry a unit suffix (mem=4000M); GPU counts never do, but be lenient.
    digits = re.match(r"^\d+", value)
    return int(digits.group()) if digits else 0


def _epoch(value: object) -> datetime | None:
    if isinstance(value, bool) or value in (None, "", 0):
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC) if value > 0 else None
    text = str(value).strip()
    if text.isdigit():
        return datetime.fromtimestamp(int(text), UTC) if int(text) > 0 else None
    return None


def _wait_status(status: object) -> tuple[int | None, int | None]:
    """squeue/REST ``exit_code`` is a wait(2) status: 768 is exit 3, 15 is SIGTERM."""
    if isinstance(status, bool) or not isinstance(status, int):
        return None, None
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, 0


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct's ``ExitCode`` is ``<return code>:<signal>``."""
    code, colon, sig = (text or "").partition(":")
    if not code.strip().isdigit():
        return None, None
    return int(code), int(sig) if colon and sig.strip().isdigit() else 0


def _base_state(state: str) -> str:
    return (state or "").split(" ", 1)[0].strip().upper()


def parse_squeue_json(payload: Mapping[str, Any], *, source: str = "squeue") -> list[SlurmJob]:
    """Jobs from ``squeue --json`` or slurmrestd ``GET /slurm/v0.0.38/jobs`` (one shape).

    Raises ValueError with Slurm's words when the answer carries errors and no jobs:
    ``squeue --json`` exits 0 even when it could not reach slurmctld.
    """
    errors = payload.get("errors") or []
    jobs = payload.get("jobs")
    if errors and not jobs:
        raise ValueError(describe_errors(errors))
    result = []
    for job in jobs or []:
        state = _base_state(str(job.get("job_state", "")))
        code, sig = _wait_status(job.get("exit_code"))
        start = _epoch(job.get("start_time")) if state not in _PENDING_STATES else None
        end = _epoch(job.get("end_time")) if state in TERMINAL_STATES else None
        result.append(
            SlurmJob(
                job_id=str(job.get("job_id", "")),
                name=str(job.get("name") or ""),
                state=state,
                comment=str(job.get("comment") or ""),
                reason=str(job.get("state_reason") or ""),
                exit_code=code,
                signal=sig,
                start=start,
                end=end,
                elapsed_s=int((end - start).total_seconds()) if start and end else None,
                nodes=tuple(expand_hostlist(str(job.get("nodes") or ""))),
                gpus=gpus_of_tres(str(job.get("tres_alloc_str") or "")),
                user=str(job.get("user_name") or ""),
                source=source,
                reason_detail=str(job.get("state_description") or ""),
                gpus_per_node=gpus_per_node_of(str(job.get("tres_per_node") or "")),
            )
        )
    return result


def parse_sacct(text: str) -> list[SlurmJob]:
    """Rows of ``sacct -X -P -n -o <SACCT_FIELDS>`` with ``SLURM_TIME_FORMAT=%s``.

    ``-P`` separates fields with ``|`` and ends rows with a newline; only the comment (our
    own name here, or a foreign job's free text) could contain either, so a row whose field
    count is off is joined back into the comment.
    """
    jobs = []
    n = len(SACCT_FIELDS)
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) < n:
            continue
        if len(cells) > n:  # a "|" inside the comment (field 3)
            extra = len(cells) - n
            cells = [*cells[:2], "|".join(cells[2 : 3 + extra]), *cells[3 + extra :]]
        row = dict(zip(SACCT_FIELDS, cells, strict=True))
        code, sig = parse_exit_code(row["ExitCode"])
        start, end = _epoch(row["Start"]), _epoch(row["End"])
        elapsed = row["ElapsedRaw"].strip()
        jobs.append(
            SlurmJob(
                job_id=row["JobIDRaw"].strip(),
                name=row["JobName"],
                state=_base_state(row["State"]),
                comment=row["Comment"],
                reason=row["Reason"],
                exit_code=code,
                signal=sig,
                start=start,
                end=end,
                elapsed_s=int(elapsed) if elapsed.isdigit() else None,
                nodes=tuple(expand_hostlist(row["NodeList"])),
                gpus=gpus_of_tres(row["AllocTRES"]),
                user=row["User"],
                source="sacct",
            )
        )
    return jobs


def parse_slurmdb_jobs(payload: Mapping[str, Any]) -> list[SlurmJob]:
    """Jobs from slurmrestd ``GET /slurmdb/v0.0.38/jobs``.

    22.05's JSON reports a job that exited 3 as ``{"status": "SUCCESS", "return_code": 0}``
    (sacct -P says ``FAILED 3:0``): a failed job's exit code is taken as unknown here.
    """
    # 9003 "Nothing found" is how slurmdbd's API answers an empty result.
    errors = [e for e in payload.get("errors") or [] if error_numbers([e]) != [NOTHING_FOUND]]
    jobs = payload.get("jobs")
    if errors and not jobs:
        raise ValueError(describe_errors(errors))
    result = []
    for job in jobs or []:
        state_field = job.get("state") or {}
        state = _base_state(str(state_field.get("current", "")))
        exit_field = job.get("exit_code") or {}
        code = exit_field.get("return_code") if isinstance(exit_field, Mapping) else None
        sig_field = exit_field.get("signal") if isinstance(exit_field, Mapping) else None
        sig = sig_field.get("signal_id") if isinstance(sig_field, Mapping) else None
        if state != "COMPLETED" and code == 0 and not sig:
            code = None
        times = job.get("time") or {}
        start, end = _epoch(times.get("start")), _epoch(times.get("end"))
        allocated = (job.get("tres") or {}).get("allocated") or []
        gpus = next(
            (
                int(t.get("count") or 0)
                for t in allocated
                if t.get("type") == "gres" and t.get("name") == "gpu"
            ),
            None,
        )
        comment = job.get("comment") or {}
        result.append(
            SlurmJob(
                job_id=str(job.get("job_id", "")),
                name=str(job.get("name") or ""),
                state=state,
                comment=str((comment.get("job") if isinstance(comment, Mapping) else "") or ""),
                reason=str(state_field.get("reason") or ""),
                exit_code=code if isinstance(code, int) else None,
                signal=sig if isinstance(sig, int) else 0,
                start=start,
                end=end,
                elapsed_s=times.get("elapsed") if isinstance(times.get("elapsed"), int) else None,
                nodes=tuple(expand_hostlist(str(job.get("nodes") or ""))),
                gpus=gpus,
                user=str(job.get("user") or ""),
                source="slurmdb",
            )
        )
    return result


def describe_errors(errors: Iterable[object]) -> str:
    """Slurm's JSON errors as one line: ``Invalid job id specified (2017)``."""
    parts = []
    for error in errors:
        if not isinstance(error, Mapping):
            parts.append(str(error))
            continue
        text = str(error.get("error") or "error")
        detail = str(error.get("description") or "")
        number = error.get("error_number", error.get("error_code"))
        item = text
        if detail and detail != text:
            item += f": {detail}"
        if number not in (None, ""):
            item += f" ({number})"
        parts.append(item)
    return "; ".join(parts) or "unknown error"


def error_numbers(errors: Iterable[object]) -> list[int]:
    numbers = []
    for error in errors:
        if isinstance(error, Mapping):
            number = error.get("error_number", error.get("error_code"))
            if isinstance(number, int):
                numbers.append(number)
    return numbers


# Slurm error numbers that mean "could not talk to a daemon" (slurm_errno.h): generic
# failures (-1, how slurmrestd reports an unreachable slurmctld), communication errors,
# slurmctld communication errors, socket errors.
def is_transient_error_number(number: int) -> bool:
    return (
        number == -1
        or 1000 <= number < 1100
        or 1800 <= number < 1900
        or 5000 <= number < 5100
        or number in (2016, 2047)  # nodes busy; "unable to create job record, try again"
    )


_TRANSIENT_TEXT = re.compile(
    r"unable to contact slurm controller|socket timed out|zero bytes were transmitted|"
    r"connection refused|connection timed out|communication connection failure|"
    r"backup controller|problem talking to the database|slurmdbd|temporarily|try again|"
    r"unable to establish|no route to host|transport endpoint|not responding|"
    r"failed while looking for jobs|unable to load",
    re.IGNORECASE,
)


def is_transient_text(text: str) -> bool:
    return bool(_TRANSIENT_TEXT.search(text or ""))


def slurm_message(stderr: str) -> str:
    """The meaningful part of a Slurm client's error output."""
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    picked = [
        re.sub(
            r"^(sbatch|squeue|sacct|scancel|scontrol|sacctmgr|sinfo): (error: )?"
            r"(Batch job submission failed: )?",
            "",
            line,
        )
        for line in lines
        if "warning" not in line.lower()
    ] or lines
    return " ".join(picked)[:1000]


# --- the run lifecycle ---------------------------------------------------------------------


def job_status(job: SlurmJob) -> JobStatus:
    """A Slurm job mapped to the run lifecycle and the failure taxonomy."""
    nodes = list(job.nodes)
    where = f" on {', '.join(nodes)}" if nodes else ""
    gpus = f", {job.gpus} GPUs" if job.gpus else ""
    if job.state in _PENDING_STATES:
        # Slurm's own words for why it waits; its state while it has none to give yet.
        reason = job.reason_detail or job.reason
        return JobStatus(
            state="PENDING",
            backend_job_id=job.job_id,
            message=reason if reason and reason != "None" else job.state,
            # Only a configuring job (its nodes booting) has been given nodes.
            node_list=nodes if job.state == "CONFIGURING" else [],
        )
    if job.state in _RUNNING_STATES:
        return JobStatus(
            state="RUNNING",
            backend_job_id=job.job_id,
            started_at=job.start,
            node_list=nodes,
            message=f"Slurm job {job.job_id} {job.state}{where}{gpus}",
        )
    state, reason = _FINISHED.get(job.state, ("FAILED", "UNKNOWN"))
    exit_code = job.exit_code
    if job.signal:
        exit_code = 128 + job.signal
    detail = ""
    if job.exit_code is not None or job.signal:
        detail = f", exit code {job.exit_code or 0}:{job.signal or 0}"
    elif state == "FAILED":
        detail = ", exit code unknown"
    if job.state == "FAILED" and job.exit_code == 0 and not job.signal:
        reason = "UNKNOWN"  # e.g. JobLaunchFailure: the program never ran
    if job.reason and job.reason not in ("None", "NonZeroExitCode"):
        detail += f" ({job.reason})"
    if state == "SUCCEEDED":
        exit_code = 0
    return JobStatus(
        state=state,
        backend_job_id=job.job_id,
        started_at=job.start,
        finished_at=job.end or job.start,
        exit_code=exit_code,
        failure_reason=reason,
        node_list=nodes,
        message=f"Slurm job {job.job_id} {job.state}{detail}{where}{gpus}",
    )


# --- nodes and inventory -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    state: str  # lower case, flags joined with "+": "idle", "mixed+drain"
    partitions: tuple[str, ...]
    gpus: Mapping[str, int]  # GPU type ("" when untyped) → count
    gpus_used: Mapping[str, int] = field(default_factory=dict)  # held by any job now
    reason: str = ""  # why an operator or Slurm took it out of service, without who and when


# Job states in which a job holds its nodes' GPUs (what a node's GresUsed counts).
HOLDING_JOB_STATES = (
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "STOPPED",
    "SIGNALING",
    "STAGE_OUT",
    "RESIZING",
)
# ``squeue -o`` columns of the jobs holding GPUs (CLI): id, state, nodes, GPUs per node
# (TRES per node, ``gres:gpu:a100:8``), then name and comment, which may contain "|".
SQUEUE_GPU_FORMAT = "%i|%T|%N|%b|%j|%k"


def parse_gres(gres: str) -> dict[str, int]:
    """``gpu:a100:8(S:0-1),gpu:h100:4`` → ``{"a100": 8, "h100": 4}``; untyped under ``""``."""
    counts: dict[str, int] = defaultdict(int)
    for item in re.split(r",(?![^(]*\))", gres or ""):
        item = re.sub(r"\(.*\)$", "", item.strip())
        parts = item.split(":")
        if not parts or parts[0] != "gpu":
            continue
        if len(parts) == 2 and parts[1].isdigit():
            counts[""] += int(parts[1])
        elif len(parts) >= 3 and parts[-1].isdigit():
            counts[parts[1]] += int(parts[-1])
        elif len(parts) == 2:
            counts[parts[1]] += 1
    return dict(counts)


def gpus_per_node_of(tres_per_node: str) -> dict[str, int]:
    """A job's TRES per node as GPUs by type: ``gres:gpu:a100:4`` (22.05) or
    ``gres/gpu:a100=4`` (23.02 on) → ``{"a100": 4}``; untyped under ``""``."""
    items = [re.sub(r"^gres[:/]", "", item.strip()) for item in (tres_per_node or "").split(",")]
    return parse_gres(",".join(item.replace("=", ":") for item in items))


def _gpus_of_alloc_tres(text: str) -> dict[str, int]:
    """A node's ``AllocTRES`` (``cpu=1,gres/gpu=6,gres/gpu:a100=6``) as GPUs by type."""
    tres = parse_tres(text)
    typed = {k.removeprefix("gres/gpu:"): _count(v) for k, v in tres.items() if "gres/gpu:" in k}
    if typed:
        return typed
    return {"": _count(tres["gres/gpu"])} if "gres/gpu" in tres else {}


def _reason(text: str) -> str:
    """A node's Reason without the ``[user@time]`` that scontrol appends."""
    return re.sub(r"\s*\[[^\[\]@]*@[^\[\]]*\]$", "", (text or "").strip())


def parse_scontrol_nodes(text: str) -> list[SlurmNode]:
    """``scontrol -d show node -o``: one node per line of ``Key=Value`` pairs. ``-d`` adds
    ``GresUsed`` (GPUs held, whatever accounting tracks); without it ``AllocTRES`` counts
    GPUs only where ``AccountingStorageTRES`` lists ``gres/gpu``. ``Reason`` (spaces and all)
    runs to the end of the line, or to a ``Comment=``/``Extra=`` after it."""
    nodes = []
    for line in (text or "").splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        if not name:
            continue

        def value(key: str, line: str = line) -> str:
            found = re.search(rf"(?:^|\s){key}=(\S*)", line)
            return found.group(1) if found else ""

        reason = re.search(r"\sReason=(.*?)(?=\s+(?:Comment|Extra)=|$)", line)
        used = value("GresUsed")
        partitions = value("Partitions")
        nodes.append(
            SlurmNode(
                name=name.group(1),
                state=(value("State") or "unknown").lower(),
                partitions=tuple(partitions.split(",")) if partitions else (),
                gpus=parse_gres(value("Gres")),
                gpus_used=parse_gres(used) if used else _gpus_of_alloc_tres(value("AllocTRES")),
                reason=_reason(reason.group(1)) if reason else "",
            )
        )
    return nodes


def parse_rest_nodes(payload: Mapping[str, Any]) -> list[SlurmNode]:
    """slurmrestd ``GET /slurm/v0.0.38/nodes``: ``state`` is the base state, ``state_flags``
    the flags (``["DRAIN"]``), ``gres_used`` the GPUs held (``gpu:a100:6(IDX:0-5)``)."""
    errors = payload.get("errors") or []
    if errors and not payload.get("nodes"):
        raise ValueError(describe_errors(errors))
    nodes = []
    for node in payload.get("nodes") or []:
        state = str(node.get("state") or "unknown").lower()
        flags = [str(f).lower() for f in node.get("state_flags") or []]
        used = str(node.get("gres_used") or "")
        nodes.append(
            SlurmNode(
                name=str(node.get("name") or ""),
                state="+".join([state, *flags]),
                partitions=tuple(node.get("partitions") or ()),
                gpus=parse_gres(str(node.get("gres") or "")),
                gpus_used=(
                    parse_gres(used)
                    if used
                    else _gpus_of_alloc_tres(str(node.get("tres_used") or ""))
                ),
                reason=_reason(str(node.get("reason") or "")),
            )
        )
    return nodes


def parse_squeue_gpus(text: str) -> list[SlurmJob]:
    """Rows of ``squeue -h -o SQUEUE_GPU_FORMAT``: the jobs holding GPUs, with their nodes
    and GPUs per node."""
    jobs = []
    for line in (text or "").splitlines():
        cells = line.split("|", 4)
        if len(cells) != 5 or not _JOB_ID.match(cells[0].strip()):
            continue
        job_id, state, nodes, tres, rest = cells
        name, _, comment = rest.partition("|")
        jobs.append(
            SlurmJob(
                job_id=job_id.strip(),
                name=name,
                state=_base_state(state),
                comment="" if comment == "(null)" else comment,
                nodes=tuple(expand_hostlist(nodes)),
                gpus_per_node=gpus_per_node_of(tres),
                source="squeue",
            )
        )
    return jobs


def is_gantry_job(job: SlurmJob) -> bool:
    """Submitted by Gantry: named after an attempt, with the name as its comment (or none:
    squeue shows no comment for some jobs)."""
    return bool(GANTRY_JOB_NAME.fullmatch(job.name)) and job.comment in (job.name, "")


def node_condition(state: str) -> str:
    """Why a node in ``state`` (``idle+drain``, ``down*``) takes no new work, in Slurm's
    words, most telling first; "" when it takes work. Planned, powered-down (Slurm powers
    it up on demand), cloud and completing nodes take work."""
    base, *rest = state.lower().split("+")
    flags = set(rest)
    if base.endswith("*"):  # sinfo's and older scontrol's mark of a node not responding
        base = base.rstrip("*")
        flags.add("not_responding")
    if "invalid_reg" in flags or base == "inval":
        return "invalid"  # it registered with less than slurm.conf says it has
    if "drain" in flags:
        busy = base in ("allocated", "mixed") or "completing" in flags
        return "draining" if busy else "drained"
    if "fail" in flags:
        return "failing"
    if base == "down":
        return "down"
    if "not_responding" in flags:
        return "not responding"
    if "maintenance" in flags:
        return "in maintenance"
    if flags & {"reboot_requested", "reboot_issued"}:
        return "rebooting"
    if "reserved" in flags:
        return "reserved"
    if flags & {"power_down", "powering_down"}:
        return "powering down"
    if base not in ("idle", "mixed", "allocated"):
        return base or "unknown"  # future, unknown, error
    return ""


def _of_type(counts: Mapping[str, int], gres_type: str, node_gpus: Mapping[str, int]) -> int:
    """The count of ``gres_type`` GPUs; an untyped count where the node has one type."""
    if gres_type in counts:
        return counts[gres_type]
    return counts.get("", 0) if len(node_gpus) == 1 else 0


def gantry_gpus_by_node(jobs: Iterable[SlurmJob]) -> dict[str, dict[str, int]]:
    """node → GPU type → GPUs held by Gantry's jobs there now."""
    held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job in jobs:
        if job.state not in HOLDING_JOB_STATES or not is_gantry_job(job):
            continue
        for node in job.nodes:
            for gres_type, count in job.gpus_per_node.items():
                held[node][gres_type] += count
    return {node: dict(counts) for node, counts in held.items()}


# --- topology ------------------------------------------------------------------------------

# Level names from the leaves up when the settings name none: leaf, spine, core, level-3, …
DERIVED_LEVEL_NAMES = ("leaf", "spine", "core")
UNKNOWN_TOPOLOGY = (
    "topology unknown: slurmrestd v0.0.38 has no topology endpoint; give topology.conf's "
    "lines in the cluster setting 'topology' (or [] for a cluster without one)"
)
_LISTED = 8  # nodes or switches named in one problem before the rest are counted


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    level: int  # 0 for a leaf switch, one more than its highest child switch above
    nodes: frozenset[str]  # every node under it, directly or through its child switches
    children: tuple[str, ...] = ()


def _listing(names: Iterable[str]) -> str:
    names = sorted(names)
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def parse_topology(text: str) -> tuple[dict[str, Switch], list[str]]:
    """``scontrol show topology`` (``SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu-node1``,
    ``SwitchName=spine Level=1 … Nodes=gpu-node[1-2] Switches=leaf[1-2]``), or the lines of
    topology.conf, which name only direct children: the switches by name, with every node
    under each and their levels, computed here from the tree. Returns the problems found
    (a line without a switch, an unknown child, a loop) instead of raising; with a loop
    there is no usable tree and no switch is returned."""
    direct: dict[str, set[str]] = {}
    children: dict[str, list[str]] = {}
    problems: list[str] = []
    for raw_line in (text or "").splitlines():
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {}
        for token in line.split():
            key, eq, value = token.partition("=")
            if eq:
                fields[key.lower()] = value
        name = fields.get("switchname", "")
        if not name:
            problems.append(f"topology: {line[:80]!r} names no switch (SwitchName=)")
            continue
        try:
            direct[name] = set(expand_hostlist(fields.get("nodes", "")))
            children[name] = expand_hostlist(fields.get("switches", ""))
        except ValueError as exc:
            problems.append(f"topology: switch {name}: {exc}")
            direct.pop(name, None)
    for name, kids in children.items():
        unknown = [kid for kid in kids if kid not in direct]
        if unknown:
            problems.append(f"topology: switch {name} names unknown switches {_listing(unknown)}")
            children[name] = [kid for kid in kids if kid in direct]

    levels: dict[str, int] = {}
    under: dict[str, frozenset[str]] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in levels:
            return
        if name in path:
            raise ValueError(" → ".join([*path[path.index(name) :], name]))
        for kid in children[name]:
            visit(kid, (*path, name))
        levels[name] = 1 + max((levels[kid] for kid in children[name]), default=-1)
        under[name] = frozenset(direct[name]).union(*(under[kid] for kid in children[name]))

    try:
        for name in sorted(direct):
            visit(name, ())
    except ValueError as loop:
        return {}, [*problems, f"topology: switches form a loop ({loop}): topology ignored"]
    switches = {
        name: Switch(name, levels[name], under[name], tuple(children[name])) for name in direct
    }
    return switches, problems


def derived_level_names(depth: int) -> tuple[str, ...]:
    """Names for a tree ``depth`` levels deep, widest first: ("spine", "leaf") for two."""
    return tuple(
        DERIVED_LEVEL_NAMES[level] if level < len(DERIVED_LEVEL_NAMES) else f"level-{level}"
        for level in range(depth - 1, -1, -1)
    )


def topology_paths(
    switches: Mapping[str, Switch], nodes: Iterable[str]
) -> tuple[dict[str, tuple[str, ...]], int, list[str]]:
    """Each node's switches, widest level first, one per level of the tree; its depth; and
    the problems (nodes under no switch, top switches that no switch joins).

    Where a node has no switch at a level (a tree of uneven depth), its nearest switch
    below stands in (a node hanging off a spine directly: that spine at the leaf level
    too), or, above its top switch, that top switch: the domain is then exactly its nodes,
    which is true of every level it lacks."""
    depth = 1 + max((switch.level for switch in switches.values()), default=-1)
    paths: dict[str, tuple[str, ...]] = {}
    outside = []
    for node in nodes:
        mine = sorted((s.level, s.name) for s in switches.values() if node in s.nodes)
        if not mine:
            if switches:
                outside.append(node)
            paths[node] = ()
            continue
        path = []
        for level in range(depth - 1, -1, -1):
            at_or_above = [entry for entry in mine if entry[0] >= level]
            path.append(min(at_or_above)[1] if at_or_above else mine[-1][1])
        paths[node] = tuple(path)
    problems = []
    if outside:
        problems.append(
            f"topology: node{'s' if len(outside) > 1 else ''} {_listing(outside)} "
            f"{'are' if len(outside) > 1 else 'is'} under no switch (topology.conf)"
        )
    tops = {path[0] for path in paths.values() if path}
    if len(tops) > 1:
        problems.append(
            f"topology: no switch joins the top switches {_listing(tops)}: Slurm's "
            "topology/tree runs no job across them"
        )
    return paths, depth, problems


def topology_levels(depth: int, configured: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The level names: the settings' ``topology_levels`` when they fit the tree, else the
    derived ones and a problem saying what does not fit."""
    derived = derived_level_names(depth)
    if not configured or len(configured) == depth:
        return configured or derived, []
    if not depth:
        return (), [
            f"setting 'topology_levels' names {len(configured)} levels, but Slurm reports no "
            "switch tree (TopologyPlugin=topology/tree with a topology.conf)"
        ]
    return derived, [
        f"setting 'topology_levels' names {len(configured)} level"
        f"{'s' if len(configured) > 1 else ''} ({', '.join(configured)}), but the switch "
        f"tree has {depth} ({', '.join(derived)}): using {', '.join(derived)}"
    ]


def node_inventory(
    nodes: Iterable[SlurmNode],
    settings: SlurmSettings,
    *,
    jobs: Iterable[SlurmJob] = (),
    topology: str | None = "",
) -> Inventory:
    """The GPU nodes of the cluster's flavors: a node with the flavor's GPU type (in its
    partition, if it names one), the GPUs jobs hold on it and those of them Gantry's jobs
    hold (from ``jobs``), whether it takes work (with Slurm's state and the operator's
    reason, "drained: bad DIMM"), and its path in the switch tree ``topology`` (text of
    ``scontrol show topology``; "" for none, None when it cannot be known)."""
    gantry = gantry_gpus_by_node(jobs)
    found = []
    for node in nodes:
        for flavor, mapping in sorted(settings.flavors.items()):
            partition = mapping.partition or settings.partition
            gpus = node.gpus.get(mapping.gres_type, 0)
            if gpus <= 0 or (partition and partition not in node.partitions):
                continue
            condition = node_condition(node.state)
            reason = f"{condition}: {node.reason}" if condition and node.reason else condition
            found.append(
                NodeInventory(
                    name=node.name,
                    flavor=flavor,
                    gpus=gpus,
                    gpus_used=_of_type(node.gpus_used, mapping.gres_type, node.gpus),
                    gpus_used_by_gantry=_of_type(
                        gantry.get(node.name, {}), mapping.gres_type, node.gpus
                    ),
                    schedulable=not condition,
                    reason=reason,
                )
            )
            break  # a node serves one flavor
    switches: dict[str, Switch]
    if topology is None:
        switches, problems = {}, [UNKNOWN_TOPOLOGY]
    else:
        switches, problems = parse_topology(topology)
    paths, depth, path_problems = topology_paths(switches, [node.name for node in found])
    levels, level_problems = topology_levels(depth, settings.topology_levels)
    if topology is None:
        level_problems = []  # the tree is unknown, not absent
    return Inventory(
        nodes=tuple(replace(node, path=paths.get(node.name, ())) for node in found),
        levels=levels,
        problems=tuple(problems + path_problems + level_problems),
    )


# --- quotas --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaLimit:
    """The most GPUs of a flavor a tenant may hold at once (guaranteed + borrow limit)."""

    tenant: str
    flavor: str
    gpus: int


def quota_commands(
    quotas: Iterable[QuotaLimit], settings: SlurmSettings, *, users: Iterable[str]
) -> list[list[str]]:
    """``sacctmgr -i`` commands that give each tenant an account with a QOS of its own,
    ``GrpTRES=gres/gpu=<total>,gres/gpu:<type>=<n>`` for every GPU type the cluster maps
    (0 for a type the tenant has no quota for), as the account's default QOS.

    Adding what already exists fails harmlessly; the ``modify`` commands make the limits
    exactly these, whatever they were before.
    """
    per_tenant: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    types = sorted({m.gres_type for m in settings.flavors.values()})
    for quota in quotas:
        mapping = settings.flavors.get(quota.flavor)
        if mapping is None:
            continue
        if quota.gpus < 0:
            raise RenderError(f"tenant {quota.tenant}: a GPU limit cannot be negative")
        per_tenant[_word(quota.tenant, "tenant")][mapping.gres_type] += int(quota.gpus)
    users = [_word(u, "user") for u in users]
    commands: list[list[str]] = []
    for tenant, by_type in sorted(per_tenant.items()):
        qos = _word(f"{settings.qos_prefix}{tenant}", "QOS name")
        tres = ",".join(
            [f"gres/gpu={sum(by_type.values())}"]
            + [f"gres/gpu:{t}={by_type.get(t, 0)}" for t in types]
        )
        commands += [
            ["sacctmgr", "-i", "add", "qos", qos],
            ["sacctmgr", "-i", "modify", "qos", "where", f"name={qos}", "set", f"GrpTRES={tres}"],
            ["sacctmgr", "-i", "add", "account", tenant, "Description=gantry tenant"],
        ]
        if users:
            commands.append(["sacctmgr", "-i", "add", "user", ",".join(users), f"account={tenant}"])
        commands.append(
            [
                "sacctmgr",
                "-i",
                "modify",
                "account",
                "where",
                f"name={tenant}",
                "set",
                f"QOS+={qos}",
                f"DefaultQOS={qos}",
            ]
        )
        if users:
            commands.append(
                [
                    "sacctmgr",
                    "-i",
                    "modify",
                    "user",
                    "where",
                    f"name={','.join(users)}",
                    f"account={tenant}",
                    "set",
                    f"QOS+={qos}",
                    f"DefaultQOS={qos}",
                ]
            )
    return commands


# --- JWT -----------------------------------------------------------------------------------


def jwt_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, unverified (only slurmctld holds the key). Used to tell a
    malformed, expired or foreign token apart from an unreachable cluster: slurmrestd
    answers both with the same "Unspecified error"."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT (expected three dot-separated parts)")
    padded = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(padded))
    except (ValueError, UnicodeDecodeError):
        raise ValueError("not a JWT (its claims are not base64url JSON)") from None
    if not isinstance(claims, dict):
        raise ValueError("not a JWT (its claims are not an object)")
    return claims
