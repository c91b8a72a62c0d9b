"""Kubernetes objects for one attempt, rendered from plain data: no ORM, no client, no I/O.

``parse_settings`` turns a cluster's settings JSON into ``K8sSettings`` (strictly: unknown
keys and wrong types are errors). ``render(spec, settings)`` returns the objects the backend
creates, in creation order: Secret, Service (nodes > 1), PodGroup (Volcano), Job. The
attempt token appears in the Secret only when ``token`` is passed; what is stored on the
attempt is rendered without it.

Where the pods go: without Kueue, on the nodes admission chose (``spec.placement``),
pinned by required node affinity, one rank per node; with Kueue, which places admitted
workloads itself, only the topology level asked for, as Kueue's pod-set annotation.

Names and label values come partly from user input, so they are sanitized here: a value
that is already valid is kept, anything else is cleaned and gets ``--`` and ten hex digits
of its SHA-256, so two different inputs never share a result (short of a hash collision).
"""

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import yaml

from clusters.backends.base import (
    COMMAND_SHELL,
    MULTI_NODE_ENV,
    TELEMETRY_SETTINGS_KEY,
    JobSpec,
    PermanentBackendError,
    job_env,
)
from clusters.env_names import env_name_refusal
from clusters.job_env import ATTEMPT_TOKEN_ENV, REDACTED

LABEL_PREFIX = "gantry.io/"
TENANT_LABEL = "gantry.io/tenant"
PROJECT_LABEL = "gantry.io/project"
RUN_LABEL = "gantry.io/run"
ATTEMPT_LABEL = "gantry.io/attempt"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gantry"}
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
CONTAINER = "trainer"
TOKEN_ENV = ATTEMPT_TOKEN_ENV  # the one list: clusters.job_env
RANK_ENV = MULTI_NODE_ENV

# Job names leave room for the pod hostname ``<job>-<index>`` (a DNS label of at most 63)
# and for the ``-token`` suffix of the Secret.
MAX_OBJECT_NAME = 52
MAX_LABEL_VALUE = 63
_HASH_HEX = 10
_HASHED = re.compile(rf"--[0-9a-f]{{{_HASH_HEX}}}$")
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMAGE = re.compile(r"^[a-z0-9]+([._/:-][a-z0-9]+)*(:[\w][\w.-]{0,127})?@sha256:[0-9a-f]{64}$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-[0-9]+g\.[0-9]+gb)$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
# A topology level's name, as experiments name the level they need (at most 63 characters).
_LEVEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,62}$")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}


# --- settings ------------------------------------------------------------------------------


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
        if not isinstance(product, str) or not _LABEL_VALUE.match(product) or not product:
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
    if queueing == "kueue" and not (kueue_queue and _LABEL_VALUE.match(kueue_queue)):
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
    if token_env and not _C_IDENTIFIER.match(token_env):
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


# --- names and labels ----------------------------------------------------------------------


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]


def object_name(value: str, *, max_len: int = MAX_OBJECT_NAME) -> str:
    """A DNS-1035 label (what a Service name must be; valid for every object we create).

    Kept as is when valid; otherwise lower-cased, cleaned, cut and suffixed with a hash.
    """
    if len(value) <= max_len and _DNS_LABEL.match(value) and not _HASHED.search(value):
        return value
    cleaned = re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")
    if not cleaned[:1].isalpha():
        cleaned = f"g-{cleaned}"
    head = cleaned[: max_len - 2 - _HASH_HEX].rstrip("-")
    return f"{head}--{_digest(value)}"


def label_value(value: str) -> str:
    """A valid label value: kept as is when valid, else cleaned, cut and suffixed with a hash."""
    if len(value) <= MAX_LABEL_VALUE and _LABEL_VALUE.match(value) and not _HASHED.search(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", value)
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
    head = re.sub(r"[^A-Za-z0-9]+$", "", cleaned[: MAX_LABEL_VALUE - 2 - _HASH_HEX])
    return f"{head}--{_digest(value)}" if head else _digest(value)


def job_name(spec_name: str) -> str:
    return object_name(spec_name)


def token_secret_name(name: str) -> str:
    return f"{name}-token"


def namespace_for(tenant: str, *, prefix: str) -> str:
    return object_name(f"{prefix}{tenant}", max_len=63)


def attempt_labels(spec: JobSpec) -> dict[str, str]:
    return {
        TENANT_LABEL: label_value(spec.tenant),
        PROJECT_LABEL: label_value(spec.project),
        RUN_LABEL: label_value(str(spec.run_id)),
        ATTEMPT_LABEL: label_value(str(spec.attempt_id)),
        **MANAGED_BY,
    }


def attempt_annotations(spec: JobSpec) -> dict[str, str]:
    """The unsanitized originals of the labels that came from user input."""
    return {TENANT_LABEL: spec.tenant, PROJECT_LABEL: spec.project}


# --- rendering -----------------------------------------------------------------------------


def literal(value: str) -> str:
    """``value`` written so that the container gets exactly these bytes.

    In a container's ``command``, ``args`` and ``env[].value``, Kubernetes replaces
    ``$(NAME)`` by the value of the container's variable NAME (the attempt token is one) and
    reads ``$$`` as ``$``; a ``$`` written twice always comes back as one, whatever follows
    it. Gantry expands nothing there on purpose, so every such value goes through this."""
    return value.replace("$", "$$")


def _env(spec: JobSpec, settings: K8sSettings, *, name: str, secret: str) -> list[dict[str, Any]]:
    managed = {TOKEN_ENV, *(RANK_ENV if spec.nodes > 1 else ())}
    for key in spec.env:
        if not _C_IDENTIFIER.match(key):
            raise PermanentBackendError(
                f"environment variable name {key!r} is not valid: letters, digits and _ only, "
                "not starting with a digit"
            )
        # The same names as at submit: the container's env reaches no host-side launcher
        # here, but a name must mean the same on every backend.
        refusal = env_name_refusal(key)
        if refusal is not None:
            raise PermanentBackendError(refusal)
        if key in managed:
            raise PermanentBackendError(f"environment variable {key} is set by Gantry")
    env: list[dict[str, Any]] = [
        {"name": key, "value": literal(value)} for key, value in job_env(spec).items()
    ]
    if spec.nodes > 1:
        env += [
            {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
            {"name": "MASTER_PORT", "value": str(settings.master_port)},
            {"name": "WORLD_SIZE", "value": str(spec.nodes)},
            {
                "name": "RANK",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
                    }
                },
            },
        ]
    env.append(
        {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": TOKEN_ENV}}}
    )
    return env


def _pod_failure_policy(settings: K8sSettings) -> dict[str, Any]:
    fatal = [code for code in range(1, 128) if code not in settings.retriable_exit_codes]
    rules: list[dict[str, Any]] = [
        {
            "action": settings.disruption_action,
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }
    ]
    if settings.retriable_exit_codes:
        # Kubernetes replaces the pod without counting the failure (bounded by the deadline).
        rules.append(
            {
                "action": "Ignore",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": list(settings.retriable_exit_codes),
                },
            }
        )
    if fatal:
        rules.append(
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": fatal},
            }
        )
    return {"rules": rules}


def pinned_affinity(spec: JobSpec, *, attempt_label: str) -> dict[str, Any]:
    """The pods on the nodes admission chose, one rank per node: required node affinity
    to those nodes by name (``metadata.name``, exact even where a node's hostname label
    differs from its name) and, for a gang, required anti-affinity between the attempt's
    pods per ``kubernetes.io/hostname``."""
    if len(set(spec.placement)) != spec.nodes:
        raise PermanentBackendError(
            f"the placement must name {spec.nodes} distinct nodes, one per rank; it names "
            f"{', '.join(spec.placement)}"
        )
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {
                                "key": "metadata.name",
                                "operator": "In",
                                "values": sorted(spec.placement),
                            }
                        ]
                    }
                ]
            }
        }
    }
    if spec.nodes > 1:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {ATTEMPT_LABEL: attempt_label}},
                    "topologyKey": HOSTNAME_LABEL,
                }
            ]
        }
    return affinity


def kueue_topology(spec: JobSpec, settings: K8sSettings) -> tuple[str, str] | None:
    """Kueue's topology annotation (key, node label) for the attempt's pods: the level the
    experiment asked for, required or preferred as it asked; otherwise the cluster's
    ``kueue_topology_level``. None: no topology constraint."""
    if spec.topology_level:
        label = settings.level_label(spec.topology_level)
        if label:
            mode = "required" if spec.topology_required else "preferred"
            return KUEUE_TOPOLOGY_ANNOTATIONS[mode], label
        if spec.topology_required:
            raise PermanentBackendError(
                f"the run needs its nodes in one {spec.topology_level}, a topology level this "
                f"cluster does not have (its levels: {', '.join(settings.levels) or 'none'})"
            )
    if settings.kueue_topology_level:
        key = KUEUE_TOPOLOGY_ANNOTATIONS[settings.kueue_topology_mode]
        return key, settings.kueue_topology_level
    return None


def render(spec: JobSpec, settings: K8sSettings, *, token: str = "") -> list[dict[str, Any]]:
    """The objects of one attempt in creation order. ``token`` fills the Secret; without it
    the Secret holds a placeholder, which is what the attempt stores and shows."""
    if not _IMAGE.match(spec.image):
        raise PermanentBackendError(f"image {spec.image!r} is not pinned as repository@sha256:…")
    if not spec.command.strip():
        raise PermanentBackendError("the experiment has no command")
    if spec.nodes < 1 or spec.gpus_per_node < 1 or spec.max_runtime_s < 1:
        raise PermanentBackendError("nodes, GPUs per node and max runtime must be positive")
    flavor = settings.flavor(spec.flavor)
    name = job_name(spec.name)
    namespace = namespace_for(spec.tenant, prefix=settings.namespace_prefix)
    secret = token_secret_name(name)
    labels = attempt_labels(spec)
    annotations = attempt_annotations(spec)

    def meta(object_name_: str) -> dict[str, Any]:
        return {
            "name": object_name_,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": dict(annotations),
        }

    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(secret),
            "type": "Opaque",
            "stringData": {TOKEN_ENV: token or REDACTED},
        }
    ]
    if spec.nodes > 1:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": meta(name),
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": {ATTEMPT_LABEL: labels[ATTEMPT_LABEL]},
                    "ports": [
                        {
                            "name": "rendezvous",
                            "port": settings.master_port,
                            "targetPort": settings.master_port,
                            "protocol": "TCP",
                        }
                    ],
                },
            }
        )
    pod_annotations = dict(annotations)
    job_labels = dict(labels)
    if settings.queueing == "volcano":
        objects.append(
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": meta(name),
                "spec": {
                    "minMember": spec.nodes,
                    "queue": settings.volcano_queue,
                    "minResources": {flavor.resource: str(spec.nodes * spec.gpus_per_node)},
                },
            }
        )
        pod_annotations[VOLCANO_GROUP_ANNOTATION] = name
    if settings.queueing == "kueue":
        job_labels[KUEUE_QUEUE_LABEL] = settings.kueue_queue
        topology = kueue_topology(spec, settings)
        if topology is not None:
            pod_annotations[topology[0]] = topology[1]

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        # The experiment's command is the shell line its author typed: it runs through the
        # same shell as on every backend, as one argv element, never spliced into a string,
        # with every "$" as typed.
        "command": [*COMMAND_SHELL, literal(spec.command)],
        "env": _env(spec, settings, name=name, secret=secret),
        "resources": {"limits": {flavor.resource: str(spec.gpus_per_node)}},
        # The tail of the log becomes the termination message of a failed container: how
        # "CUDA out of memory" reaches the failure taxonomy.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],  # noqa: S108 (shared memory for NCCL and data loaders),
    }
    if spec.nodes > 1:
        container["ports"] = [
            {"name": "rendezvous", "containerPort": settings.master_port, "protocol": "TCP"}
        ]
    shm: dict[str, Any] = {"medium": "Memory"}
    if settings.shm_size:
        shm["sizeLimit"] = settings.shm_size
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "nodeSelector": {GPU_PRODUCT_LABEL: flavor.product, **flavor.node_selector},
    }
    tolerations = [*settings.tolerations, *flavor.tolerations]
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]
    if settings.queueing == "volcano":
        pod_spec["schedulerName"] = "volcano"
    if spec.placement and settings.queueing != "kueue":
        pod_spec["affinity"] = pinned_affinity(spec, attempt_label=labels[ATTEMPT_LABEL])
    if spec.nodes > 1:
        pod_spec["subdomain"] = name
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = [{"name": "dshm", "emptyDir": shm}]

    job_spec: dict[str, Any] = {
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,  # Gantry owns restarts: a new attempt resumes from a checkpoint
        "activeDeadlineSeconds": spec.max_runtime_s,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": _pod_failure_policy(settings),
    }
    if settings.queueing == "kueue":
        job_spec["suspend"] = True  # Kueue unsuspends it on admission
    job_spec["template"] = {
        "metadata": {"labels": dict(labels), "annotations": pod_annotations},
        "spec": pod_spec,
    }
    job_meta = meta(name)
    job_meta["labels"] = job_labels
    objects.append(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": job_spec}
    )
    return objects


_YAML_BREAKS = frozenset("\x85\u2028\u2029")


if TYPE_CHECKING:
    _BaseDumper = yaml.SafeDumper
else:  # libyaml's, where built: 4 times faster
    _BaseDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BaseDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if any(char in _YAML_BREAKS for char in value):
        style = '"'  # escaped: a YAML reader would take them for line breaks
    elif "\n" in value:
        style = "|"  # multi-line commands stay readable
    else:
        style = None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _list_presenter(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.Node:
    flow = bool(value) and all(isinstance(item, int) for item in value)  # exit codes
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


_Dumper.add_representer(str, _str_presenter)
_Dumper.add_representer(list, _list_presenter)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """The objects as one YAML stream, in the order given, keys in the order written."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def to_json(objects: list[dict[str, Any]]) -> str:
    """The objects as the attempt stores them: a JSON list, keys in the order written.

    JSON, not YAML, on the submit path: it is what the API server receives and ~25 times
    cheaper to write (docs/benchmarks.md); a person reads it as YAML (``stored_as_yaml``)."""
    return json.dumps(objects, ensure_ascii=False)


# The run page shows each attempt's spec on every load (its poll when it changes), and YAML's
# emitter is slow; a spec never changes once stored, and the YAML depends on nothing else
# (the whole stored text is the key), so the latest ones are kept.
@lru_cache(maxsize=64)
def stored_as_yaml(stored: str) -> str:
    """A stored manifest list as YAML for a person to read; other text as it is (attempts
    stored before manifests were kept as JSON hold YAML already)."""
    try:
        objects = json.loads(stored)
    except ValueError:
        return stored
    if not (isinstance(objects, list) and all(isinstance(obj, dict) for obj in objects)):
        return stored
    return to_yaml(objects)
