"""A Slurm cluster's settings JSON, checked strictly: ``SlurmSettings.parse`` (docs/slurm.md).

Pure: no Django, no processes.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clusters.backends.base import TELEMETRY_SETTINGS_KEY
from clusters.backends.slurm_quoting import ENV_NAME, LEVEL_NAME, PLAIN_PATH, PLAIN_WORD
from clusters.backends.slurm_topology import DERIVED_LEVEL_NAMES

TRANSPORTS = ("rest", "cli")
CONTAINER_RUNTIMES = ("pyxis", "apptainer", "none")
REST_API = "v0.0.38"
DEFAULT_SIGNAL_BEFORE_S = 300
DEFAULT_JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SettingsError(ValueError):
    """The cluster's settings are wrong: an operator must fix them."""


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
        reader = _Reader(raw, where=f"cluster {cluster}: " if cluster else "")
        if not isinstance(raw, Mapping):
            raise reader.fail("settings must be a JSON object")
        known = set(cls.__dataclass_fields__) | {TELEMETRY_SETTINGS_KEY}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise reader.fail(f"unknown Slurm setting(s): {', '.join(unknown)}")
        values = _scalars(reader)
        values.update(_lists(reader, transport=values["transport"]))
        values.update(_rest(reader, transport=values["transport"]))
        values["flavors"] = _flavors(reader)
        return cls(**values)

    @property
    def logs_at(self) -> str:
        return self.log_dir or self.job_dir

    @property
    def deepest_level(self) -> str:
        """The name of the leaf-switch level, the one ``--switches`` counts."""
        return self.topology_levels[-1] if self.topology_levels else DERIVED_LEVEL_NAMES[0]


class _Reader:
    """The settings JSON, read one key at a time: each error names the cluster and the key."""

    def __init__(self, raw: Mapping[str, Any], *, where: str):
        self.raw = raw
        self.where = where

    def fail(self, message: str) -> SettingsError:
        return SettingsError(f"{self.where}{message}")

    def text(
        self, name: str, pattern: re.Pattern[str] | None = None, *, required: bool = False
    ) -> str:
        value = self.raw.get(name, "")
        if not isinstance(value, str):
            raise self.fail(f"setting {name!r} must be a string")
        if required and not value:
            raise self.fail(f"setting {name!r} is required")
        if value and pattern is not None and not pattern.match(value):
            raise self.fail(
                f"setting {name!r} = {value!r} has characters Slurm options cannot take"
            )
        return value

    def number(
        self, name: str, default: float, low: float, high: float, kind: type[float] = int
    ) -> float:
        value = self.raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"setting {name!r} must be a number")
        if not low <= value <= high:
            raise self.fail(f"setting {name!r} must be between {low} and {high}")
        return kind(value)


def _scalars(reader: _Reader) -> dict[str, Any]:
    """The transport, paths, names, runtime and numbers."""
    raw, fail, text, number = reader.raw, reader.fail, reader.text, reader.number
    values: dict[str, Any] = {}
    values["transport"] = text("transport") or "rest"
    if values["transport"] not in TRANSPORTS:
        raise fail(f"setting 'transport' must be one of {', '.join(TRANSPORTS)}")
    values["job_dir"] = text("job_dir", PLAIN_PATH, required=True)
    values["log_dir"] = text("log_dir", PLAIN_PATH)
    values["slurm_conf"] = text("slurm_conf", PLAIN_PATH)
    values["partition"] = text("partition", PLAIN_WORD)
    values["qos"] = text("qos", PLAIN_WORD)
    values["qos_prefix"] = text("qos_prefix", re.compile(r"^[A-Za-z0-9_.-]{0,32}$"))
    if "qos_prefix" not in raw:
        values["qos_prefix"] = "gantry-"
    values["job_path"] = text("job_path", re.compile(r"^[A-Za-z0-9_./:+@=-]+$"))
    values["job_path"] = values["job_path"] or DEFAULT_JOB_PATH
    values["container_runtime"] = text("container_runtime") or "pyxis"
    if values["container_runtime"] not in CONTAINER_RUNTIMES:
        raise fail(f"setting 'container_runtime' must be one of {', '.join(CONTAINER_RUNTIMES)}")
    values["rest_timeout_s"] = number("rest_timeout_s", 10.0, 0.1, 600, float)
    values["cli_timeout_s"] = number("cli_timeout_s", 30.0, 0.1, 600, float)
    values["signal_before_s"] = number("signal_before_s", DEFAULT_SIGNAL_BEFORE_S, 0, 65535, int)
    values["adopt_window_days"] = number("adopt_window_days", 14, 1, 3650, int)
    return values


def _lists(reader: _Reader, *, transport: str) -> dict[str, Any]:
    """Tasks per node, the users who submit, the topology's level names and lines, and
    whether reclaiming jobs go first."""
    raw, fail = reader.raw, reader.fail
    values: dict[str, Any] = {}
    tasks = raw.get("tasks_per_node", 1)
    if tasks != "gpus" and (isinstance(tasks, bool) or not isinstance(tasks, int)):
        raise fail("setting 'tasks_per_node' must be a positive integer or \"gpus\"")
    if isinstance(tasks, int) and not 1 <= tasks <= 1024:
        raise fail("setting 'tasks_per_node' must be between 1 and 1024")
    values["tasks_per_node"] = tasks
    users = raw.get("submit_users", [])
    if not isinstance(users, list) or not all(
        isinstance(u, str) and PLAIN_WORD.match(u) for u in users
    ):
        raise fail("setting 'submit_users' must be a list of user names")
    values["submit_users"] = tuple(users)
    levels = raw.get("topology_levels", [])
    if not isinstance(levels, list) or not all(
        isinstance(level, str) and LEVEL_NAME.match(level) for level in levels
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
        if transport != "rest":
            raise fail(
                "setting 'topology' is for transport 'rest' (slurmrestd has no topology "
                "endpoint); the CLI reads `scontrol show topology` itself"
            )
        values["topology"] = tuple(lines)
    return values


def _rest(reader: _Reader, *, transport: str) -> dict[str, Any]:
    """slurmrestd's URL, user and token variable: required with transport rest."""
    fail, text = reader.fail, reader.text
    values: dict[str, Any] = {}
    values["rest_url"] = text("rest_url")
    values["rest_user"] = text("rest_user", PLAIN_WORD)
    values["rest_token_env"] = text("rest_token_env", ENV_NAME)
    if transport == "rest":
        url = values["rest_url"]
        if not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", url):
            raise fail(
                f"setting 'rest_url' = {url!r} is not an http(s) URL of slurmrestd "
                "(e.g. http://slurm-head:6820)"
            )
        for name in ("rest_user", "rest_token_env"):
            if not values[name]:
                raise fail(f"setting {name!r} is required with transport 'rest'")
    return values


def _flavors(reader: _Reader) -> dict[str, FlavorMapping]:
    """Each GPU flavor's Slurm GPU type, and optionally its partition and QOS."""
    raw, fail = reader.raw, reader.fail
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
            if not isinstance(value, str) or (value and not PLAIN_WORD.match(value)):
                raise fail(f"flavor {flavor!r}: {key} {value!r} is not a plain Slurm name")
        if not entry.get("gres_type"):
            raise fail(f"flavor {flavor!r}: gres_type is required")
        mapped[str(flavor)] = FlavorMapping(
            gres_type=entry["gres_type"],
            partition=entry.get("partition", ""),
            qos=entry.get("qos", ""),
        )
    return mapped
