"""A Kubernetes cluster's settings JSON, checked strictly: ``parse_settings`` → ``K8sSettings``
(unknown keys and wrong types are errors; docs/kubernetes.md). Pure: no ORM, no client, no I/O.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from clusters.backends.base import (
    TELEMETRY_SETTINGS_KEY,
    PermanentBackendError,
)

# Kueue's pod-set annotation for each kueue_topology_mode.
KUEUE_TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
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


_T = TypeVar("_T")


def _fail(message: str) -> NoReturn:
    raise PermanentBackendError(f"Kubernetes cluster settings: {message}")


def _typed(raw: Mapping[str, Any], key: str, kind: type[_T], default: _T) -> _T:
    value = raw.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        _fail(f"{key} must be {getattr(kind, '__name__', kind)}, not {value!r}")
    return value


def _tolerations(raw: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(raw, list):
        _fail(f"{where} must be a list of tolerations")
    for item in raw:
        if not isinstance(item, dict) or not set(item) <= _TOLERATION_KEYS:
            _fail(f"{where}: {item!r} is not a toleration (keys {sorted(_TOLERATION_KEYS)})")
    return tuple(dict(item) for item in raw)


def _string_map(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and _LABEL_KEY.match(k) and isinstance(v, str) for k, v in raw.items()
    ):
        _fail(f"{where} must map label keys to strings")
    return dict(raw)


def level_name_of(label: str) -> str:
    """The name a topology label gives its level when the settings do not name it: the
    label's name part without a ``topology-`` prefix (``topology.kubernetes.io/zone`` is
    "zone", ``cloud.provider.com/topology-block`` is "block")."""
    name = label.rpartition("/")[2]
    return name.removeprefix("topology-") or name


def _topology_levels(raw: Any) -> tuple[TopologyLevel, ...]:
    if not isinstance(raw, list):
        _fail("topology_labels must be a list, widest level first")
    levels = []
    for item in raw:
        if isinstance(item, str):
            label, name = item, level_name_of(item)
        elif isinstance(item, dict) and set(item) == {"name", "label"}:
            label, name = item["label"], item["name"]
        else:
            _fail(
                f"topology_labels: {item!r} is neither a node label key nor "
                '{"name": <level>, "label": <node label key>}'
            )
        if not isinstance(label, str) or not _LABEL_KEY.match(label):
            _fail(f"topology_labels: {label!r} is not a node label key")
        if not isinstance(name, str) or not _LEVEL_NAME.match(name):
            _fail(
                f"topology_labels: level name {name!r} must be 1 to 63 letters, digits, "
                "spaces, -, _ or ."
            )
        levels.append(TopologyLevel(name=name, label=label))
    for attribute in ("name", "label"):
        values = [getattr(level, attribute) for level in levels]
        repeated = sorted({value for value in values if values.count(value) > 1})
        if repeated:
            _fail(f"topology_labels: level {attribute} {', '.join(repeated)} given twice")
    return tuple(levels)


def parse_settings(raw: Mapping[str, Any]) -> K8sSettings:
    """Read a cluster's settings JSON; every problem is a PermanentBackendError saying which."""
    if not isinstance(raw, Mapping):
        _fail("settings must be a JSON object")
    known = set(K8sSettings.__dataclass_fields__) | {TELEMETRY_SETTINGS_KEY}
    unknown = sorted(set(raw) - known)
    if unknown:
        _fail(f"unknown key(s) {', '.join(unknown)}")
    flavors_raw = _typed(raw, "flavors", dict, {})
    flavors = {}
    for slug, item in flavors_raw.items():
        if not isinstance(item, dict) or set(item) - set(FlavorSettings.__dataclass_fields__):
            _fail(
                f"flavors.{slug} must have keys among product, resource, node_selector, tolerations"
            )
        product = item.get("product")
        if not isinstance(product, str) or not LABEL_VALUE.match(product) or not product:
            _fail(
                f"flavors.{slug}.product must be a node label value such as NVIDIA-A100-SXM4-80GB"
            )
        resource = item.get("resource", "nvidia.com/gpu")
        if not isinstance(resource, str) or not _RESOURCE.match(resource):
            _fail(f"flavors.{slug}.resource must be nvidia.com/gpu or nvidia.com/mig-<g>g.<m>gb")
        flavors[slug] = FlavorSettings(
            product=product,
            resource=resource,
            node_selector=_string_map(
                item.get("node_selector", {}), f"flavors.{slug}.node_selector"
            ),
            tolerations=_tolerations(item.get("tolerations", []), f"flavors.{slug}.tolerations"),
        )
    if not raw.get("url") and not raw.get("kubeconfig"):
        _fail("either url or kubeconfig is required")
    queueing = _typed(raw, "queueing", str, "none")
    if queueing not in ("none", "kueue", "volcano"):
        _fail("queueing must be none, kueue or volcano")
    kueue_queue = _typed(raw, "kueue_queue", str, "")
    if queueing == "kueue" and not (kueue_queue and LABEL_VALUE.match(kueue_queue)):
        _fail("kueue_queue (the LocalQueue in each tenant namespace) is required with Kueue")
    mode = _typed(raw, "kueue_topology_mode", str, "required")
    if mode not in KUEUE_TOPOLOGY_ANNOTATIONS:
        _fail("kueue_topology_mode must be required or preferred")
    level = _typed(raw, "kueue_topology_level", str, "")
    if level and not _LABEL_KEY.match(level):
        _fail("kueue_topology_level must be a node label key")
    disruption = _typed(raw, "disruption_action", str, "FailJob")
    if disruption not in ("FailJob", "Ignore"):
        _fail("disruption_action must be FailJob or Ignore")
    codes = _typed(raw, "retriable_exit_codes", list, [])
    if not all(isinstance(c, int) and 1 <= c <= 255 for c in codes):
        _fail("retriable_exit_codes must be integers between 1 and 255")
    shm = _typed(raw, "shm_size", str, "")
    if shm and not _QUANTITY.match(shm):
        _fail("shm_size must be a quantity such as 16Gi")
    prefix = _typed(raw, "namespace_prefix", str, "gantry-")
    if prefix and not re.match(r"^[a-z0-9]([-a-z0-9]*)?$", prefix):
        _fail("namespace_prefix must be lower-case letters, digits and dashes")
    port = _typed(raw, "master_port", int, 29500)
    if not 1 <= port <= 65535:
        _fail("master_port must be a TCP port")
    ttl = _typed(raw, "ttl_seconds_after_finished", int, 3600)
    if ttl < 0:
        _fail("ttl_seconds_after_finished must not be negative")
    timeout = _typed(raw, "timeout_s", float, 10.0)
    if not 0 < timeout <= 300:
        _fail("timeout_s must be between 0 and 300")
    token_env = _typed(raw, "token_env", str, "")
    if token_env and not C_IDENTIFIER.match(token_env):
        _fail("token_env is the NAME of an environment variable, not the token itself")
    return K8sSettings(
        flavors=flavors,
        url=_typed(raw, "url", str, "").rstrip("/"),
        kubeconfig=_typed(raw, "kubeconfig", str, ""),
        context=_typed(raw, "context", str, ""),
        token_env=token_env,
        token_file=_typed(raw, "token_file", str, ""),
        ca_file=_typed(raw, "ca_file", str, ""),
        insecure_skip_tls_verify=_typed(raw, "insecure_skip_tls_verify", bool, False),
        timeout_s=timeout,
        namespace_prefix=prefix,
        create_namespaces=_typed(raw, "create_namespaces", bool, True),
        tolerations=_tolerations(raw.get("tolerations", []), "tolerations"),
        ttl_seconds_after_finished=ttl,
        retriable_exit_codes=tuple(sorted(set(codes))),
        disruption_action=disruption,
        master_port=port,
        shm_size=shm,
        queueing=queueing,
        kueue_queue=kueue_queue,
        kueue_topology_level=level,
        kueue_topology_mode=mode,
        volcano_queue=_typed(raw, "volcano_queue", str, "default"),
        topology_labels=_topology_levels(raw.get("topology_labels", [])),
    )
