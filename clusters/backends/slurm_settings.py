"""A Slurm cluster's settings JSON, checked strictly against ``SETTINGS_SCHEMA``:
``SlurmSettings.parse`` (docs/slurm.md).

Pure: no Django, no processes.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clusters.backends.base import TELEMETRY_SETTINGS_KEY
from clusters.backends.slurm_quoting import ENV_NAME, LEVEL_NAME, PLAIN_PATH, PLAIN_WORD
from clusters.backends.slurm_topology import DERIVED_LEVEL_NAMES
from core.schema import JsonSchema

TRANSPORTS = ("rest", "cli")
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "none")
REST_API = "v0.0.38"
DEFAULT_SIGNAL_BEFORE_S = 300
DEFAULT_JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# The value of transport that is not slurmrestd: the settings of transport rest apply
# unless transport is this.
_CLI_TRANSPORT = {"properties": {"transport": {"const": "cli"}}, "required": ["transport"]}
_REST_URL = r"^https?://[^/\s?#]+(/[^\s?#]*)?$"


def _text(pattern: str | None = None) -> dict[str, Any]:
    """A string setting; when ``pattern`` is given, a value that is not empty must match it."""
    schema: dict[str, Any] = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = f"\\A\\Z|{pattern}"
    schema["messages"] = {
        "type": "setting $name must be a string",
        "pattern": "setting $name = $value has characters Slurm options cannot take",
    }
    return schema


def _choice(choices: tuple[str, ...]) -> dict[str, Any]:
    """A string setting among ``choices``; empty means the first."""
    return {
        "type": "string",
        "enum": ["", *choices],
        "messages": {
            "type": "setting $name must be a string",
            "enum": f"setting $name must be one of {', '.join(choices)}",
        },
    }


def _number(low: float, high: float) -> dict[str, Any]:
    return {
        "type": "number",
        "minimum": low,
        "maximum": high,
        "messages": {
            "type": "setting $name must be a number",
            "minimum": f"setting $name must be between {low} and {high}",
            "maximum": f"setting $name must be between {low} and {high}",
        },
    }


def _required_text(name: str, message: str) -> dict[str, Any]:
    """``name`` must be given and not empty, else ``message``."""
    return {"required": [name], "properties": {name: {"minLength": 1}}, "message": message}


def _plain_name(key: str, *, required: bool = False) -> dict[str, Any]:
    """A flavor's Slurm name (GPU type, partition, QOS): a plain word, or empty."""
    message = f"flavor $parent: {key} $value is not a plain Slurm name"
    schema: dict[str, Any] = {"type": "string", "pattern": f"\\A\\Z|{PLAIN_WORD.pattern}"}
    messages = {"type": message, "pattern": message}
    if required:
        schema["minLength"] = 1
        messages["minLength"] = f"flavor $parent: {key} is required"
    return schema | {"messages": messages}


_FLAVORS_MESSAGE = (
    'setting \'flavors\' must map each GPU flavor to its Slurm GPU type, e.g. {"a100-80gb": "a100"}'
)
_FLAVOR_ENTRY = {
    "if": {"type": "string"},
    # The GPU type alone.
    "then": {
        "minLength": 1,
        "pattern": PLAIN_WORD.pattern,
        "messages": {
            "minLength": "flavor $name: gres_type is required",
            "pattern": "flavor $name: gres_type $value is not a plain Slurm name",
        },
    },
    "else": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "gres_type": _plain_name("gres_type", required=True),
            "partition": _plain_name("partition"),
            "qos": _plain_name("qos"),
        },
        "required": ["gres_type"],
        "messages": {
            "type": "flavor $name: give the GPU type, or an object with gres_type "
            "and optionally partition and qos",
            "additionalProperties": "flavor $name: give the GPU type, or an object with "
            "gres_type and optionally partition and qos",
            "required": "flavor $parent: gres_type is required",
        },
    },
}

SETTINGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "messages": {
        "type": "settings must be a JSON object",
        "additionalProperties": "unknown Slurm setting(s): $unknown",
    },
    "additionalProperties": False,
    "properties": {
        "transport": _choice(TRANSPORTS),
        "job_dir": _text(PLAIN_PATH.pattern),
        "log_dir": _text(PLAIN_PATH.pattern),
        "slurm_conf": _text(PLAIN_PATH.pattern),
        "partition": _text(PLAIN_WORD.pattern),
        "qos": _text(PLAIN_WORD.pattern),
        "qos_prefix": _text(r"^[A-Za-z0-9_.-]{0,32}$"),
        "job_path": _text(r"^[A-Za-z0-9_./:+@=-]+$"),
        "workspace_bind": _text(r"^[0-9A-Fa-f.:]{2,45}$"),
        "container_runtime": _choice(CONTAINER_RUNTIMES),
        "rest_timeout_s": _number(0.1, 600),
        "cli_timeout_s": _number(0.1, 600),
        "signal_before_s": _number(0, 65535),
        "adopt_window_days": _number(1, 3650),
        "tasks_per_node": {
            "if": {"type": "string"},
            "then": {
                "const": "gpus",
                "message": "setting 'tasks_per_node' must be a positive integer or \"gpus\"",
            },
            "else": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1024,
                "messages": {
                    "type": "setting 'tasks_per_node' must be a positive integer or \"gpus\"",
                    "minimum": "setting 'tasks_per_node' must be between 1 and 1024",
                    "maximum": "setting 'tasks_per_node' must be between 1 and 1024",
                },
            },
        },
        "submit_users": {
            "type": "array",
            "items": {"type": "string", "pattern": PLAIN_WORD.pattern},
            "message": "setting 'submit_users' must be a list of user names",
        },
        "topology_levels": {
            "type": "array",
            "items": {"type": "string", "pattern": LEVEL_NAME.pattern},
            "uniqueItems": True,
            "message": "setting 'topology_levels' must be a list of level names, widest first "
            '(e.g. ["spine", "leaf"])',
            "messages": {"uniqueItems": "setting 'topology_levels' names a level twice"},
        },
        "reclaim_priority": {
            "type": "boolean",
            "message": "setting 'reclaim_priority' must be true or false",
        },
        "topology": {
            "type": "array",
            "items": {"type": "string"},
            "message": "setting 'topology' must be a list of topology.conf lines",
        },
        "rest_url": _text(),
        "rest_user": _text(PLAIN_WORD.pattern),
        "rest_token_env": _text(ENV_NAME.pattern),
        "flavors": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": _FLAVOR_ENTRY,
            "messages": {"type": _FLAVORS_MESSAGE, "minProperties": _FLAVORS_MESSAGE},
        },
        TELEMETRY_SETTINGS_KEY: {},  # the telemetry collector's, checked there
        "health_check": {},  # checked by clusters.backends.health_check
    },
    "allOf": [
        _required_text("job_dir", "setting 'job_dir' is required"),
        {"required": ["flavors"], "message": _FLAVORS_MESSAGE},
        {
            "if": _CLI_TRANSPORT,
            "then": {
                "not": {"required": ["topology"]},
                "message": "setting 'topology' is for transport 'rest' (slurmrestd has no "
                "topology endpoint); the CLI reads `scontrol show topology` itself",
            },
            # slurmrestd's URL, user and token variable.
            "else": {
                "allOf": [
                    {
                        "properties": {"rest_url": {"pattern": _REST_URL}},
                        "message": "setting 'rest_url' = $value is not an http(s) URL of "
                        "slurmrestd (e.g. http://slurm-head:6820)",
                    },
                    {
                        "required": ["rest_url"],
                        "message": "setting 'rest_url' = '' is not an http(s) URL of "
                        "slurmrestd (e.g. http://slurm-head:6820)",
                    },
                    _required_text(
                        "rest_user", "setting 'rest_user' is required with transport 'rest'"
                    ),
                    _required_text(
                        "rest_token_env",
                        "setting 'rest_token_env' is required with transport 'rest'",
                    ),
                ]
            },
        },
    ],
}
SETTINGS = JsonSchema(SETTINGS_SCHEMA)
# The settings taken as they are written; the others get defaults or change type.
# Every address of a workspace's node, where Gantry's proxy reaches its server.
DEFAULT_WORKSPACE_BIND = "0.0.0.0"  # noqa: S104
_AS_GIVEN = (
    "job_dir", "log_dir", "slurm_conf", "partition", "qos", "qos_prefix", "rest_url",
    "rest_user", "rest_token_env", "reclaim_priority", "tasks_per_node",
)  # fmt: skip


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
    # The address a workspace's server listens on, on its node (docs/workspaces.md): every
    # address of the node by default; the node's own address (NodeAddr) where the site
    # wants nothing on others (the test cluster: 127.0.0.1).
    workspace_bind: str = DEFAULT_WORKSPACE_BIND

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, cluster: str = "") -> "SlurmSettings":
        """Check every key against ``SETTINGS_SCHEMA``: unknown keys and wrong types are a
        ``SchemaError`` naming the cluster and the setting, not silently ignored."""
        SETTINGS.validate(raw, where=f"cluster {cluster}: " if cluster else "")
        transport = raw.get("transport") or "rest"
        values: dict[str, Any] = {name: raw[name] for name in _AS_GIVEN if name in raw}
        values |= {
            "transport": transport,
            "container_runtime": raw.get("container_runtime") or "pyxis",
            "job_path": raw.get("job_path") or DEFAULT_JOB_PATH,
            "workspace_bind": raw.get("workspace_bind") or DEFAULT_WORKSPACE_BIND,
            "submit_users": tuple(raw.get("submit_users", ())),
            "topology_levels": tuple(raw.get("topology_levels", ())),
            "flavors": {
                str(flavor): FlavorMapping(gres_type=entry)
                if isinstance(entry, str)
                else FlavorMapping(**entry)
                for flavor, entry in raw["flavors"].items()
            },
        }
        for name, kind in (
            ("rest_timeout_s", float),
            ("cli_timeout_s", float),
            ("signal_before_s", int),
            ("adopt_window_days", int),
        ):
            if name in raw:
                values[name] = kind(raw[name])
        if "topology" in raw:
            values["topology"] = tuple(raw["topology"])
        return cls(**values)

    @property
    def logs_at(self) -> str:
        return self.log_dir or self.job_dir

    @property
    def deepest_level(self) -> str:
        """The name of the leaf-switch level, the one ``--switches`` counts."""
        return self.topology_levels[-1] if self.topology_levels else DERIVED_LEVEL_NAMES[0]
