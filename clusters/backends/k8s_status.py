"""What Kubernetes objects say about an attempt, in Gantry's terms. Plain dicts in (as the
API server sends them), plain data out: no client, no ORM, no I/O.

``job_status(job, pods)`` maps one Job and its pods to a ``JobStatus``, with the failure
taxonomy of design §4; ``node_inventory(nodes, pods, settings)`` turns nodes and the pods
bound to them into the cluster's GPU nodes: what is used on each, by whom, whether it
takes work and where it sits in the topology.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clusters.backends.base import Inventory, JobStatus, NodeInventory
from clusters.backends.k8s_fence import node_signals
from clusters.backends.k8s_manifest import (
    ATTEMPT_LABEL,
    COMPLETION_INDEX_ANNOTATION,
    CONTAINER,
    GPU_PRODUCT_LABEL,
    KUEUE_QUEUE_LABEL,
)
from clusters.backends.k8s_settings import K8sSettings

IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
PREEMPTION_REASONS = frozenset(
    {"PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI"}
)
NODE_LOSS_REASONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})
NODE_POD_REASONS = frozenset(
    {"NodeLost", "Shutdown", "NodeShutdown", "Terminated", "UnexpectedAdmissionError"}
)
_GPU_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"
    r"|RESOURCE_EXHAUSTED: Out of memory",
    re.IGNORECASE,
)
_GPU_XID = re.compile(
    r"\bXid\b|uncorrectable ECC|ECC_UNCORRECTABLE|fallen off the bus", re.IGNORECASE
)
_NCCL = re.compile(
    r"NCCL error|nccl(System|Internal|Remote|UnhandledCuda|InvalidUsage)Error|NCCL WARN"
    r"|ProcessGroupNCCL|Watchdog caught collective operation timeout"
)
_POLICY_EXIT = re.compile(r"failed with exit code (\d+)")
# Which cause explains a failed gang best: what happened to a rank from outside (it was
# preempted, its node died, its GPU failed) before what it did itself, and specific causes
# before the NCCL errors and exits of the ranks that lost their peer.
PRECEDENCE = (
    "PREEMPTED",
    "NODE_FAILURE",
    "GPU_XID",
    "OOM_GPU",
    "OOM_HOST",
    "IMAGE_PULL",
    "TIMEOUT",
    "NCCL",
    "USER_EXIT",
    "UNKNOWN",
)
MAX_MESSAGE = 1000


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def backend_job_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def split_backend_job_id(value: str) -> tuple[str, str] | None:
    namespace, slash, name = value.partition("/")
    return (namespace, name) if slash and namespace and name else None


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str
    rank: int
    exit_code: int | None
    detail: str
    at: datetime | None


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def _true(conditions: dict[str, dict[str, Any]], kind: str) -> dict[str, Any] | None:
    condition = conditions.get(kind)
    return condition if condition and condition.get("status") == "True" else None


def pod_rank(pod: dict[str, Any]) -> int:
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION) or (
        meta.get("labels") or {}
    ).get(COMPLETION_INDEX_ANNOTATION, "0")
    try:
        return int(value)
    except ValueError:
        return 0


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses: list[dict[str, Any]] = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == CONTAINER:
            return status
    return statuses[0] if statuses else {}


def _waiting(pod: dict[str, Any]) -> dict[str, Any]:
    return (_container(pod).get("state") or {}).get("waiting") or {}


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return (_container(pod).get("state") or {}).get("terminated") or {}


def _started(pod: dict[str, Any]) -> datetime | None:
    state = _container(pod).get("state") or {}
    for key in ("running", "terminated"):
        if state.get(key, {}).get("startedAt"):
            return parse_time(state[key]["startedAt"])
    return None


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def classify_message(message: str) -> str | None:
    """A cause recognizable in what a program printed last, whatever its exit code."""
    if _GPU_OOM.search(message):
        return "OOM_GPU"
    if _GPU_XID.search(message):
        return "GPU_XID"
    if _NCCL.search(message):
        return "NCCL"
    return None


def pod_failure(pod: dict[str, Any]) -> Failure | None:
    """Why one pod failed (or cannot start), in the taxonomy; None if nothing went wrong."""
    status = pod.get("status") or {}
    rank = pod_rank(pod)
    node = (pod.get("spec") or {}).get("nodeName") or "no node"
    where = f"rank {rank} ({(pod.get('metadata') or {}).get('name', '?')} on {node})"
    terminated = _terminated(pod)
    exit_code = terminated.get("exitCode")
    at = parse_time(terminated.get("finishedAt")) or parse_time(
        (_true(_conditions(pod), "DisruptionTarget") or {}).get("lastTransitionTime")
    )
    disruption = _true(_conditions(pod), "DisruptionTarget")
    if disruption:
        why = disruption.get("reason", "")
        detail = f"{where}: {why}: {disruption.get('message', '')}"
        if why in NODE_LOSS_REASONS or (
            why == "TerminationByKubelet" and status.get("reason") != "Evicted"
        ):
            return Failure("NODE_FAILURE", rank, exit_code, detail, at)
        return Failure("PREEMPTED", rank, exit_code, detail, at)
    pod_reason = status.get("reason", "")
    if pod_reason in ("Evicted", "Preempting"):
        detail = f"{where}: {pod_reason}: {status.get('message', '')}"
        return Failure("PREEMPTED", rank, exit_code, detail, at)
    if pod_reason in NODE_POD_REASONS:
        detail = f"{where}: {pod_reason}: {status.get('message', '')}"
        return Failure("NODE_FAILURE", rank, exit_code, detail, at)
    if pod_reason == "DeadlineExceeded":
        return Failure("TIMEOUT", rank, exit_code, f"{where}: {status.get('message', '')}", at)
    waiting = _waiting(pod)
    if waiting.get("reason") in IMAGE_PULL_REASONS:
        detail = f"{where}: {waiting['reason']}: {waiting.get('message', '')}"
        return Failure("IMAGE_PULL", rank, None, detail, None)
    if not terminated or (exit_code == 0 and status.get("phase") != "Failed"):
        return None
    message = terminated.get("message", "")
    reason = terminated.get("reason", "")
    detail = f"{where}: {reason or 'exited'} (exit code {exit_code})"
    if message:
        detail += f": {message}"
    cause = classify_message(message)
    if cause is None:
        if reason == "OOMKilled":
            cause = "OOM_HOST"
        elif reason == "DeadlineExceeded":
            cause = "TIMEOUT"
        elif exit_code:
            cause = "USER_EXIT"
        else:
            cause = "UNKNOWN"
    return Failure(cause, rank, exit_code, detail, at)


def root_cause(failures: Iterable[Failure]) -> Failure | None:
    far_future = datetime.max.replace(tzinfo=None)
    ordered = sorted(
        failures,
        key=lambda f: (
            PRECEDENCE.index(f.reason),
            (f.at.replace(tzinfo=None) if f.at else far_future),
            f.rank,
        ),
    )
    return ordered[0] if ordered else None


def _policy_failure(condition: dict[str, Any]) -> Failure:
    """What the Job's own condition says when its pods are gone."""
    message = condition.get("message", "")
    at = parse_time(condition.get("lastTransitionTime"))
    if "DisruptionTarget" in message:
        return Failure("PREEMPTED", 0, None, message, at)
    match = _POLICY_EXIT.search(message)
    if match:
        return Failure("USER_EXIT", 0, int(match.group(1)), message, at)
    reason = condition.get("reason", "")
    return Failure("UNKNOWN", 0, None, f"{reason}: {message}".strip(": "), at)


def _latest_per_rank(pods: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    latest: dict[int, dict[str, Any]] = {}
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp", "")):
        latest[pod_rank(pod)] = pod
    return latest


def _node_list(pods: list[dict[str, Any]]) -> list[str]:
    nodes: list[str] = []
    for _, pod in sorted(_latest_per_rank(pods).items()):
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node not in nodes:
            nodes.append(node)
    return nodes


def _pending_message(job: dict[str, Any], pods: list[dict[str, Any]], ranks: int) -> str:
    spec = job.get("spec") or {}
    if spec.get("suspend"):
        if KUEUE_QUEUE_LABEL in ((job.get("metadata") or {}).get("labels") or {}):
            return "Suspended: waiting for Kueue to admit it"
        return "Suspended"
    latest = [pod for _, pod in sorted(_latest_per_rank(pods).items())]
    running = sum(1 for pod in latest if _started(pod) is not None)
    for pod in latest:
        scheduled = _conditions(pod).get("PodScheduled") or {}
        if scheduled.get("status") == "False":
            # The scheduler's own words ("0/4 nodes are available: 2 Insufficient
            # nvidia.com/gpu, …"): what holds the gang back, better said than we could.
            return _clip(scheduled.get("message") or scheduled.get("reason") or "Unschedulable")
    for pod in latest:
        waiting = _waiting(pod)
        if waiting.get("reason"):
            return _clip(
                f"{running} of {ranks} pods running; rank {pod_rank(pod)}: {waiting['reason']}"
            )
    return f"{running} of {ranks} pods running" if pods else "Waiting for its pods"


def job_status(job: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
    """The attempt's state from its Job and the Job's pods (any order, any number)."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    conditions = _conditions(job)
    job_id = backend_job_id(meta.get("namespace", ""), meta.get("name", ""))
    ranks = int(spec.get("completions") or 1)
    node_list = _node_list(pods)
    starts = [s for s in (_started(pod) for pod in _latest_per_rank(pods).values()) if s]
    started_at = max(starts) if len(starts) >= ranks else None
    complete = _true(conditions, "Complete")
    if complete:
        return JobStatus(
            state="SUCCEEDED",
            backend_job_id=job_id,
            started_at=started_at or (min(starts) if starts else None),
            finished_at=parse_time(status.get("completionTime"))
            or parse_time(complete.get("lastTransitionTime")),
            exit_code=0,
            message=f"{ranks} of {ranks} pods succeeded",
            node_list=node_list,
        )
    failed = _true(conditions, "Failed") or _true(conditions, "FailureTarget")
    failures = [f for f in (pod_failure(pod) for pod in pods) if f is not None]
    if failed and failed.get("reason") == "DeadlineExceeded":
        cause: Failure | None = Failure("TIMEOUT", 0, None, _clip(failed.get("message", "")), None)
    elif failed:
        cause = root_cause(failures) or _policy_failure(failed)
    else:
        # Kubernetes keeps retrying a pull that cannot succeed: that attempt has failed.
        cause = root_cause(f for f in failures if f.reason == "IMAGE_PULL")
    if cause is not None:
        finished_at = parse_time((failed or {}).get("lastTransitionTime")) or cause.at
        return JobStatus(
            state="PREEMPTED" if cause.reason == "PREEMPTED" else "FAILED",
            backend_job_id=job_id,
            started_at=min(starts) if starts else None,
            finished_at=finished_at,
            exit_code=cause.exit_code,
            failure_reason=cause.reason,
            message=_clip(cause.detail),
            node_list=node_list,
        )
    if meta.get("deletionTimestamp"):
        return JobStatus(
            state="CANCELLED",
            backend_job_id=job_id,
            started_at=min(starts) if starts else None,
            finished_at=parse_time(meta["deletionTimestamp"]),
            failure_reason="CANCELLED",
            message="Deleted from the cluster",
            node_list=node_list,
        )
    if started_at is not None and not spec.get("suspend"):
        return JobStatus(
            state="RUNNING",
            backend_job_id=job_id,
            started_at=started_at,
            message=f"{ranks} of {ranks} pods running",
            node_list=node_list,
        )
    return JobStatus(
        state="PENDING",
        backend_job_id=job_id,
        message=_pending_message(job, pods, ranks),
        node_list=node_list,
    )


def is_finished(job: dict[str, Any]) -> bool:
    conditions = _conditions(job)
    return bool(_true(conditions, "Complete") or _true(conditions, "Failed"))


def owner_job(pod: dict[str, Any]) -> str | None:
    refs: list[dict[str, Any]] = (pod.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if ref.get("kind") == "Job" and ref.get("controller"):
            name: str | None = ref.get("name")
            return name
    return None


# --- inventory -----------------------------------------------------------------------------

# Pods that hold a node's resources: bound to it and not finished (a Pending pod that is
# bound holds them too). What the inventory lists, cluster-wide.
LIVE_BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
_MAX_NAMED = 10


def _count(value: Any) -> int:
    """A count of an extended resource (GPUs are whole numbers); anything else is 0."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def _container_request(container: dict[str, Any], resource: str) -> int:
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    # An extended resource given only as a limit is requested at the limit.
    value = requests.get(resource, (resources.get("limits") or {}).get(resource))
    return _count(value) if value is not None else 0


def pod_request(pod: dict[str, Any], resource: str) -> int:
    """How much of ``resource`` a pod holds on its node, as the scheduler counts it: its
    containers together with its sidecars, or its largest init step if that is more."""
    spec = pod.get("spec") or {}
    sidecars = init_peak = 0
    for container in spec.get("initContainers") or []:
        amount = _container_request(container, resource)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs beside the others
            sidecars += amount
        else:
            init_peak = max(init_peak, sidecars + amount)
    regular = sum(_container_request(c, resource) for c in spec.get("containers") or [])
    return max(regular + sidecars, init_peak)


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether a pod with ``tolerations`` may run on a node with ``taint`` (Kubernetes'
    rules: an empty key with Exists tolerates everything, an empty effect every effect)."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _taint_words(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    key = f"{taint.get('key', '')}={value}" if value else str(taint.get("key", ""))
    return f"taint {key}:{taint.get('effect', '')}"


def _not_schedulable_reason(node: dict[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> str:
    """Why the node takes no new pod of Gantry's, in Kubernetes' words; empty if it does."""
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    if not _true(_conditions(node), "Ready"):
        return "NotReady"
    tolerations = list(tolerations)
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in _BLOCKING_EFFECTS and not _tolerates(tolerations, taint):
            return _taint_words(taint)
    return ""


def _flavor_of(node: dict[str, Any], settings: K8sSettings) -> tuple[str, int] | None:
    """The flavor whose GPUs the node has, and how many: it carries the flavor's
    ``nvidia.com/gpu.product`` (and node selector) and allocates its resource."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for slug, flavor in sorted(settings.flavors.items()):
        if labels.get(GPU_PRODUCT_LABEL) != flavor.product:
            continue
        if any(labels.get(k) != v for k, v in flavor.node_selector.items()):
            continue
        gpus = _count(allocatable.get(flavor.resource, "0"))
        if gpus > 0:
            return slug, gpus
    return None


def _named(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_NAMED])
    return shown + (f" and {len(names) - _MAX_NAMED} more" if len(names) > _MAX_NAMED else "")


def node_inventory(
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    settings: K8sSettings,
    *,
    now: float = 0.0,
) -> Inventory:
    """The GPU nodes of the cluster's flavors with what is used on them, whether they take
    Gantry's pods and where they sit in the topology.

    A node's used GPUs are the flavor's resource requested by the pods bound to it that
    have not finished, whoever runs them; those labelled ``gantry.io/attempt`` are
    Gantry's. Cordoned and NotReady nodes, and nodes with a NoSchedule or NoExecute taint
    that Gantry's pods (the cluster's and the flavor's tolerations) do not tolerate, take
    no work. Its conditions become health signals (``k8s_fence.node_signals``, ``now`` for
    those without a time). A node's path is the values of the cluster's ``topology_labels``, widest
    first, up to the first one it lacks; a label no GPU node carries, or that some lack
    while others carry it, is a problem for the operator."""
    used: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node_name and phase not in ("Succeeded", "Failed"):
            used.setdefault(node_name, []).append(pod)
    found: list[NodeInventory] = []
    labels_of: dict[str, Mapping[str, str]] = {}
    for node in nodes:
        flavor_gpus = _flavor_of(node, settings)
        if flavor_gpus is None:
            continue
        slug, gpus = flavor_gpus
        flavor = settings.flavors[slug]
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        labels = labels_of[name] = meta.get("labels") or {}
        gpus_used = gantry_used = 0
        for pod in used.get(name, ()):
            amount = pod_request(pod, flavor.resource)
            gpus_used += amount
            if ATTEMPT_LABEL in ((pod.get("metadata") or {}).get("labels") or {}):
                gantry_used += amount
        path: list[str] = []
        for level in settings.topology_labels:
            if level.label not in labels:
                break
            path.append(str(labels[level.label]))
        reason = _not_schedulable_reason(node, [*settings.tolerations, *flavor.tolerations])
        found.append(
            NodeInventory(
                name=name,
                flavor=slug,
                gpus=gpus,
                gpus_used=gpus_used,
                gpus_used_by_gantry=gantry_used,
                schedulable=not reason,
                reason=reason,
                path=tuple(path),
                signals=node_signals(node, now=now),
            )
        )
    problems = []
    if found:
        for level in settings.topology_labels:
            lacking = sorted(n.name for n in found if level.label not in labels_of[n.name])
            where = f"the topology label {level.label} (level {level.name})"
            if len(lacking) == len(found):
                problems.append(f"no GPU node carries {where}")
            elif lacking:
                problems.append(
                    f"{len(lacking)} of {len(found)} GPU nodes lack {where}, so their "
                    f"topology stops above it: {_named(lacking)}"
                )
    return Inventory(nodes=tuple(found), levels=settings.levels, problems=tuple(problems))
