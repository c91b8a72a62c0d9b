"""A Kubernetes cluster's settings JSON, checked strictly against ``SETTINGS_SCHEMA``:
``parse_settings`` → ``K8sSettings`` (unknown keys and wrong types are errors;
docs/kubernetes.md). Pure: no ORM, no client, no I/O.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from clusters.backends.base import (
    TELEMETRY_SETTINGS_KEY,
    PermanentBackendError,
)
from core.schema import JsonSchema, SchemaError

# Kueue's pod-set annotation for each kueue_topology_mode.
KUEUE_TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
# A size above zero: a digit other than 0 in the number (a claim of 0 bytes is refused).
# \A and \Z, not ^ and $: "$" also matches before a final line break.
_POSITIVE_SIZE = re.compile(
    r"\A([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?\Z"
)
# A StorageClass's name: a DNS-1123 subdomain.
_SUBDOMAIN = re.compile(r"\A[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-[0-9]+g\.[0-9]+gb)$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
# A topology level's name, as experiments name the level they need (at most 63 characters).
_LEVEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,62}$")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}


@dataclass(frozen=True, slots=True)
class FlavorSettings:
    product: str  # the value of nvidia.com/gpu.product on the flavor's nodes
    resource: str = "nvidia.com/gpu"  # or a MIG resource such as nvidia.com/mig-1g.10gb
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class TopologyLevel:
    """A level of the cluster's topology: its name in Gantry (what an experiment asks for,
    such as "rack") and the node label whose values are its domains."""

    name: str
    label: str


@dataclass(frozen=True, slots=True)
class K8sSettings:
    """A Kubernetes cluster's settings; secrets appear only as an env var name or a path."""

    flavors: Mapping[str, FlavorSettings]
    url: str = ""
    kubeconfig: str = ""
    context: str = ""
    token_env: str = ""
    token_file: str = ""
    ca_file: str = ""
    insecure_skip_tls_verify: bool = False
    timeout_s: float = 10.0
    namespace_prefix: str = "gantry-"
    create_namespaces: bool = True
    tolerations: tuple[Mapping[str, Any], ...] = ()
    ttl_seconds_after_finished: int = 3600
    retriable_exit_codes: tuple[int, ...] = ()
    disruption_action: str = "FailJob"
    master_port: int = 29500
    shm_size: str = ""
    queueing: str = "none"  # none | kueue | volcano
    kueue_queue: str = ""
    kueue_topology_level: str = ""
    kueue_topology_mode: str = "required"
    volcano_queue: str = "default"
    # A workspace's volume (docs/workspaces.md, "Backends"): its size, and its StorageClass
    # ("": the cluster's default class).
    workspace_volume_size: str = "20Gi"
    workspace_storage_class: str = ""
    # The group the volume's files are made to belong to (the pod's fsGroup), for an image
    # whose user is not root; None: as the StorageClass makes them.
    workspace_fs_group: int | None = None
    topology_labels: tuple[TopologyLevel, ...] = ()  # widest first

    @property
    def levels(self) -> tuple[str, ...]:
        return tuple(level.name for level in self.topology_labels)

    def level_label(self, name: str) -> str:
        """The node label of the topology level named ``name``; empty if there is none."""
        return next((level.label for level in self.topology_labels if level.name == name), "")

    def flavor(self, slug: str) -> FlavorSettings:
        try:
            return self.flavors[slug]
        except KeyError:
            raise PermanentBackendError(
                f"this cluster has no GPU flavor {slug!r} in its settings "
                f"(known: {', '.join(sorted(self.flavors)) or 'none'})"
            ) from None


WHERE = "Kubernetes cluster settings: "
_LEVEL_NAME_RULE = "must be 1 to 63 letters, digits, spaces, -, _ or ."
_PYTHON_TYPES = {"string": "str", "number": "float", "integer": "int", "boolean": "bool"}
_PYTHON_TYPES |= {"array": "list", "object": "dict"}


def _typed(json_type: str, message: str = "", **rules: Any) -> dict[str, Any]:
    """A setting of ``json_type`` (named as Python names it in the type's message) and
    ``rules``, whose failures say ``message``."""
    python = _PYTHON_TYPES[json_type]
    schema: dict[str, Any] = {"type": json_type, **rules}
    schema["messages"] = {
        "type": f"$path must be {python}, not $value",
        **rules.get("messages", {}),
    }
    if message:
        schema["message"] = message
    return schema


def _empty_or(pattern: re.Pattern[str]) -> str:
    return f"\\A\\Z|{pattern.pattern}"


_TOLERATIONS = {
    "type": "array",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "properties": {key: {} for key in sorted(_TOLERATION_KEYS)},
        "message": f"$path: $value is not a toleration (keys {sorted(_TOLERATION_KEYS)})",
    },
    "messages": {"type": "$path must be a list of tolerations"},
}
_FLAVOR_KEYS_MESSAGE = "$path must have keys among product, resource, node_selector, tolerations"
_PRODUCT_MESSAGE = "$path must be a node label value such as NVIDIA-A100-SXM4-80GB"
_FLAVOR = {
    "type": "object",
    "additionalProperties": False,
    "messages": {
        "type": _FLAVOR_KEYS_MESSAGE,
        "additionalProperties": _FLAVOR_KEYS_MESSAGE,
        "required": _PRODUCT_MESSAGE,
    },
    "properties": {
        "product": {
            "type": "string",
            "minLength": 1,
            "pattern": LABEL_VALUE.pattern,
            "message": _PRODUCT_MESSAGE,
        },
        "resource": {
            "type": "string",
            "pattern": _RESOURCE.pattern,
            "message": "$path must be nvidia.com/gpu or nvidia.com/mig-<g>g.<m>gb",
        },
        "node_selector": {
            "type": "object",
            "propertyNames": {"pattern": _LABEL_KEY.pattern},
            "additionalProperties": {"type": "string"},
            "message": "$path must map label keys to strings",
        },
        "tolerations": _TOLERATIONS,
    },
    "required": ["product"],
}
_NOT_A_LABEL_KEY = "topology_labels: $value is not a node label key"
_TOPOLOGY_LEVEL = {
    "if": {"type": "string"},
    "then": {"pattern": _LABEL_KEY.pattern, "message": _NOT_A_LABEL_KEY},
    "else": {
        "type": "object",
        "required": ["name", "label"],
        "additionalProperties": False,
        "message": "topology_labels: $value is neither a node label key nor "
        '{"name": <level>, "label": <node label key>}',
        "properties": {
            "label": {
                "type": "string",
                "pattern": _LABEL_KEY.pattern,
                "message": _NOT_A_LABEL_KEY,
            },
            "name": {
                "type": "string",
                "pattern": _LEVEL_NAME.pattern,
                "message": f"topology_labels: level name $value {_LEVEL_NAME_RULE}",
            },
        },
    },
}
_KUEUE = {"properties": {"queueing": {"const": "kueue"}}, "required": ["queueing"]}

SETTINGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "messages": {
        "type": "settings must be a JSON object",
        "additionalProperties": "unknown key(s) $unknown",
    },
    "additionalProperties": False,
    "properties": {
        "flavors": _typed("object", additionalProperties=_FLAVOR),
        "url": _typed("string"),
        "kubeconfig": _typed("string"),
        "context": _typed("string"),
        "token_env": _typed(
            "string",
            "token_env is the NAME of an environment variable, not the token itself",
            pattern=_empty_or(C_IDENTIFIER),
        ),
        "token_file": _typed("string"),
        "ca_file": _typed("string"),
        "insecure_skip_tls_verify": _typed("boolean"),
        "timeout_s": _typed(
            "number",
            "timeout_s must be between 0 and 300",
            exclusiveMinimum=0,
            maximum=300,
        ),
        "namespace_prefix": _typed(
            "string",
            "namespace_prefix must be lower-case letters, digits and dashes",
            pattern=r"\A\Z|^[a-z0-9]([-a-z0-9]*)?$",
        ),
        "create_namespaces": _typed("boolean"),
        "tolerations": _TOLERATIONS,
        "ttl_seconds_after_finished": _typed(
            "integer", "ttl_seconds_after_finished must not be negative", minimum=0
        ),
        "retriable_exit_codes": _typed(
            "array",
            items={
                "type": "integer",
                "minimum": 1,
                "maximum": 255,
                "message": "retriable_exit_codes must be integers between 1 and 255",
            },
        ),
        "disruption_action": _typed(
            "string", "disruption_action must be FailJob or Ignore", enum=["FailJob", "Ignore"]
        ),
        "master_port": _typed(
            "integer", "master_port must be a TCP port", minimum=1, maximum=65535
        ),
        "shm_size": _typed(
            "string", "shm_size must be a quantity such as 16Gi", pattern=_empty_or(_QUANTITY)
        ),
        "queueing": _typed(
            "string", "queueing must be none, kueue or volcano", enum=["none", "kueue", "volcano"]
        ),
        "kueue_queue": _typed("string"),
        "kueue_topology_level": _typed(
            "string",
            "kueue_topology_level must be a node label key",
            pattern=_empty_or(_LABEL_KEY),
        ),
        "kueue_topology_mode": _typed(
            "string",
            "kueue_topology_mode must be required or preferred",
            enum=list(KUEUE_TOPOLOGY_ANNOTATIONS),
        ),
        "volcano_queue": _typed("string"),
        "workspace_volume_size": _typed(
            "string",
            "workspace_volume_size must be a size above zero such as 20Gi (a number and one of "
            "Ki, Mi, Gi, Ti, Pi, k, M, G, T, P), not $value",
            pattern=_POSITIVE_SIZE.pattern,
        ),
        "workspace_storage_class": _typed(
            "string",
            "workspace_storage_class must be the name of a StorageClass (lower-case letters, "
            "digits, - and .), not $value",
            maxLength=253,
            pattern=_empty_or(_SUBDOMAIN),
        ),
        "workspace_fs_group": _typed(
            "integer",
            "workspace_fs_group must be a group id from 0 to 2147483647, not $value",
            minimum=0,
            maximum=2**31 - 1,
        ),
        "topology_labels": _typed(
            "array",
            items=_TOPOLOGY_LEVEL,
            messages={"type": "topology_labels must be a list, widest level first"},
        ),
        TELEMETRY_SETTINGS_KEY: {},  # the telemetry collector's, checked there
        "health_check": {},  # checked by clusters.backends.health_check
    },
    "allOf": [
        {
            "anyOf": [
                {"required": [key], "properties": {key: {"minLength": 1}}}
                for key in ("url", "kubeconfig")
            ],
            "message": "either url or kubeconfig is required",
        },
        {
            "if": _KUEUE,
            "then": {
                "required": ["kueue_queue"],
                "properties": {
                    "kueue_queue": {"minLength": 1, "pattern": LABEL_VALUE.pattern},
                },
            },
            "message": "kueue_queue (the LocalQueue in each tenant namespace) is required "
            "with Kueue",
        },
    ],
}
SETTINGS = JsonSchema(SETTINGS_SCHEMA)
# The settings taken as they are written; the others get defaults or change type.
_AS_GIVEN = (
    "kubeconfig", "context", "token_env", "token_file", "ca_file", "insecure_skip_tls_verify",
    "namespace_prefix", "create_namespaces", "ttl_seconds_after_finished", "disruption_action",
    "master_port", "shm_size", "queueing", "kueue_queue", "kueue_topology_level",
    "kueue_topology_mode", "volcano_queue", "workspace_volume_size", "workspace_storage_class",
    "workspace_fs_group",
)  # fmt: skip


def level_name_of(label: str) -> str:
    """The name a topology label gives its level when the settings do not name it: the
    label's name part without a ``topology-`` prefix (``topology.kubernetes.io/zone`` is
    "zone", ``cloud.provider.com/topology-block`` is "block")."""
    name = label.rpartition("/")[2]
    return name.removeprefix("topology-") or name


def _topology_levels(raw: list[Any]) -> tuple[TopologyLevel, ...]:
    """The levels, each named: a label alone is named by ``level_name_of``. The schema has
    checked each item; what it cannot see is a derived name's shape and a repeated one."""
    levels = []
    for item in raw:
        if isinstance(item, str):
            label, name = item, level_name_of(item)
        else:
            label, name = item["label"], item["name"]
        if not _LEVEL_NAME.match(name):
            _fail(f"topology_labels: level name {name!r} {_LEVEL_NAME_RULE}")
        levels.append(TopologyLevel(name=name, label=label))
    for attribute in ("name", "label"):
        values = [getattr(level, attribute) for level in levels]
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            _fail(f"topology_labels: level {attribute} {', '.join(repeated)} given twice")
    return tuple(levels)


def _fail(message: str) -> NoReturn:
    raise SchemaError(f"{WHERE}{message}")


def parse_settings(raw: Mapping[str, Any]) -> K8sSettings:
    """Read a cluster's settings JSON, checked against ``SETTINGS_SCHEMA``; every problem
    is a ``SchemaError`` saying which."""
    SETTINGS.validate(raw, where=WHERE)
    flavors = {
        slug: FlavorSettings(
            product=item["product"],
            resource=item.get("resource", "nvidia.com/gpu"),
            node_selector=dict(item.get("node_selector", {})),
            tolerations=tuple(dict(t) for t in item.get("tolerations", [])),
        )
        for slug, item in raw.get("flavors", {}).items()
    }
    given = {name: raw[name] for name in _AS_GIVEN if name in raw}
    return K8sSettings(
        flavors=flavors,
        url=raw.get("url", "").rstrip("/"),
        timeout_s=float(raw.get("timeout_s", 10.0)),
        tolerations=tuple(dict(t) for t in raw.get("tolerations", [])),
        retriable_exit_codes=tuple(sorted(set(raw.get("retriable_exit_codes", [])))),
        topology_labels=_topology_levels(raw.get("topology_labels", [])),
        **given,
    )
