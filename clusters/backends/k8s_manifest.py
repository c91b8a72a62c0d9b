"""Kubernetes objects for one attempt, rendered from plain data: no ORM, no client, no I/O.

``render(spec, settings)`` (the ``K8sSettings`` of ``k8s_settings.parse_settings``) returns
the objects the backend creates, in creation order: a workspace's PersistentVolumeClaim (its
run's, kept across attempts: ``k8s_workspace``), Secret, Service (nodes > 1, or a
workspace's), PodGroup (Volcano), Job. The attempt token appears in the
Secret only when ``token`` is passed (a workspace's secret only when its spec holds it);
what is stored on the attempt is rendered without them.

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
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import yaml

from clusters.backends.base import (
    COMMAND_SHELL,
    MULTI_NODE_ENV,
    JobSpec,
    PermanentBackendError,
    job_env,
)
from clusters.backends.k8s_fence import FenceError, node_name
from clusters.backends.k8s_settings import (
    C_IDENTIFIER,
    KUEUE_TOPOLOGY_ANNOTATIONS,
    LABEL_VALUE,
    FlavorSettings,
    K8sSettings,
)
from clusters.backends.k8s_workspace import (
    claim_name,
    workspace_claim,
    workspace_env,
    workspace_mounts,
    workspace_ports,
    workspace_secret_data,
    workspace_security_context,
    workspace_service,
    workspace_volumes,
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
_IMAGE = re.compile(r"^[a-z0-9]+([._/:-][a-z0-9]+)*(:[\w][\w.-]{0,127})?@sha256:[0-9a-f]{64}$")


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
    if len(value) <= MAX_LABEL_VALUE and LABEL_VALUE.match(value) and not _HASHED.search(value):
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
        if not C_IDENTIFIER.match(key):
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
    return env + workspace_env(spec, secret=secret)


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


def _by_name(operator: str, node: str) -> dict[str, Any]:
    """A node field selector requirement on ``metadata.name``: the API server takes one
    value per requirement with In and NotIn (``ValidateNodeFieldSelectorRequirement``)."""
    return {"key": "metadata.name", "operator": operator, "values": [node]}


def excluded_names(spec: JobSpec) -> list[str]:
    """The nodes the job must avoid, sorted; a name that is not a node name is refused."""
    excluded = sorted(set(spec.excluded_nodes))
    for node in excluded:
        try:
            node_name(node)
        except FenceError as exc:
            raise PermanentBackendError(f"excluded node: {exc}") from None
    if both := sorted(set(excluded) & set(spec.placement)):
        raise PermanentBackendError(f"node {both[0]} is both in the placement and excluded")
    return excluded


def pinned_affinity(spec: JobSpec, *, attempt_label: str) -> dict[str, Any]:
    """The pods on the nodes admission chose, one rank per node: required node affinity
    to those nodes by name (``metadata.name``, exact even where a node's hostname label
    differs from its name; one term per node, the terms ORed) and, for a gang, required
    anti-affinity between the attempt's pods per ``kubernetes.io/hostname``."""
    if len(set(spec.placement)) != spec.nodes:
        raise PermanentBackendError(
            f"the placement must name {spec.nodes} distinct nodes, one per rank; it names "
            f"{', '.join(spec.placement)}"
        )
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [_by_name("In", node)]} for node in sorted(spec.placement)
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


def excluding_affinity(excluded: list[str]) -> dict[str, Any]:
    """Required node affinity that keeps the pods off ``excluded`` (nodes where an earlier
    attempt of the run met a hardware fault): one term whose requirements, ANDed, are
    ``metadata.name NotIn [node]`` for each."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [_by_name("NotIn", n) for n in excluded]}]
            }
        }
    }


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


def _rendezvous_service(metadata: dict[str, Any], attempt: str, *, port: int) -> dict[str, Any]:
    """The headless Service that gives a multi-node gang's pods their DNS names."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {ATTEMPT_LABEL: attempt},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def _pod_spec(
    spec: JobSpec,
    settings: K8sSettings,
    flavor: FlavorSettings,
    *,
    name: str,
    secret: str,
    attempt_label: str,
) -> dict[str, Any]:
    """The pod template's spec: one container running the experiment's command, on the
    flavor's nodes (pinned to the placement without Kueue)."""
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
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108 (shared memory for NCCL and data loaders)
            *workspace_mounts(spec),
        ],
    }
    if spec.nodes > 1:
        container["ports"] = [
            {"name": "rendezvous", "containerPort": settings.master_port, "protocol": "TCP"}
        ]
    elif spec.workspace is not None:
        container["ports"] = workspace_ports(spec)
    shm: dict[str, Any] = {"medium": "Memory"}
    if settings.shm_size:
        shm["sizeLimit"] = settings.shm_size
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "nodeSelector": {GPU_PRODUCT_LABEL: flavor.product, **flavor.node_selector},
    }
    if security := workspace_security_context(spec, settings):
        pod_spec["securityContext"] = security
    tolerations = [*settings.tolerations, *flavor.tolerations]
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]
    if settings.queueing == "volcano":
        pod_spec["schedulerName"] = "volcano"
    excluded = excluded_names(spec)
    if spec.placement and settings.queueing != "kueue":
        # Pinned to nodes none of which is excluded: the pin says it all.
        pod_spec["affinity"] = pinned_affinity(spec, attempt_label=attempt_label)
    elif excluded:
        pod_spec["affinity"] = excluding_affinity(excluded)
    if spec.nodes > 1:
        pod_spec["subdomain"] = name
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = [{"name": "dshm", "emptyDir": shm}, *workspace_volumes(spec)]
    return pod_spec


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

    objects: list[dict[str, Any]] = []
    if spec.workspace is not None:
        # The run's, not the attempt's: no attempt label, as it outlives the attempt.
        claim = meta(claim_name(spec.run_id))
        del claim["labels"][ATTEMPT_LABEL]
        objects.append(workspace_claim(claim, settings))
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(secret),
            "type": "Opaque",
            "stringData": {TOKEN_ENV: token or REDACTED, **workspace_secret_data(spec)},
        }
    )
    if spec.nodes > 1:
        objects.append(
            _rendezvous_service(meta(name), labels[ATTEMPT_LABEL], port=settings.master_port)
        )
    elif spec.workspace is not None:
        objects.append(workspace_service(meta(name), labels[ATTEMPT_LABEL]))
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

    pod_spec = _pod_spec(
        spec, settings, flavor, name=name, secret=secret, attempt_label=labels[ATTEMPT_LABEL]
    )

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
