"""The Kubernetes backend: one Indexed batch/v1 Job per attempt, through the official client.

Connection (cluster settings, secrets only by reference): ``kubeconfig`` (+ ``context``),
or ``url`` + ``token_env`` (the NAME of an environment variable holding a bearer token) or
``token_file`` + ``ca_file``. Each cluster gets its own ``ApiClient``; nothing touches the
client library's global configuration (``k8s_connection``). Settings, rendering and status
mapping are pure modules (``k8s_settings``, ``k8s_manifest``, ``k8s_status``); this one only
talks to the API server.

Error policy: an API server that cannot be reached, times out, answers 5xx or 429, rejects
the credentials (401/403) or the TLS handshake is a TransientBackendError (fix the cluster
or its settings and everything converges); a manifest the server refuses (400/422), or a
missing namespace Gantry may not create, is a PermanentBackendError.
"""

import contextlib
import gc
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from django.conf import settings as django_settings
from django.utils import timezone
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.backends import register
from clusters.backends.base import (
    Inventory,
    JobRef,
    JobSpec,
    JobStatus,
    PermanentBackendError,
    TransientBackendError,
)
from clusters.backends.health_check import (
    HealthCheckSettingsError,
    health_check_name,
    parse_health_check,
    settings_for_check,
)
from clusters.backends.k8s_connection import status_message
from clusters.backends.k8s_fence import (
    CHECK_TOLERATIONS,
    FenceError,
    cordoned_by_someone_else,
    fence_patch,
    node_name,
    unfence_patch,
)
from clusters.backends.k8s_manifest import (
    ATTEMPT_LABEL,
    CONTAINER,
    GPU_PRODUCT_LABEL,
    MANAGED_BY,
    TENANT_LABEL,
    label_value,
    render,
    to_json,
    token_secret_name,
)
from clusters.backends.k8s_pending import PENDING_UNBOUND_PODS, pending_claims
from clusters.backends.k8s_settings import K8sSettings
from clusters.backends.k8s_status import (
    LIVE_BOUND_PODS,
    backend_job_id,
    is_finished,
    job_status,
    node_inventory,
    owner_job,
    pod_rank,
    split_backend_job_id,
)
from clusters.backends.k8s_workspace import CLAIM_KIND
from clusters.backends.k8s_workspace_calls import K8sWorkspaceCalls
from clusters.models import Cluster

PODGROUP = ("scheduling.volcano.sh", "v1beta1", "podgroups")
# Items per page of the lists of the sync and the inventory (what kubectl asks for).
LIST_PAGE = 500


@register(Cluster.Backend.KUBERNETES)
class KubernetesBackend(K8sWorkspaceCalls):
    # The scheduler binds pending pods as GPUs free, and Gantry can neither hold a node for
    # a pod nor put its pod first without a PriorityClass over other tenants' workloads:
    # admission does not preempt for GPUs a pending outside pod would take (docs/kubernetes.md).
    reclaim_first = False

    @property
    def honours_placement(self) -> bool:
        """Node affinity pins the pods, except under Kueue, which places them itself."""
        return self.settings.queueing != "kueue"

    @property
    def inventory_max_age_s(self) -> float:
        """Its nodes change without Gantry (other jobs, drains): trusted only this long."""
        return float(django_settings.GANTRY_INVENTORY_MAX_AGE_S)

    # --- the interface ----------------------------------------------------------------------

    def render(self, spec: JobSpec) -> str:
        return to_json(render(spec, self.settings))

    def submit(self, spec: JobSpec, *, may_exist: bool = True) -> str:
        """Create the attempt's objects, or adopt the Job already named after the attempt
        (looked up first only if an earlier try may have created it; creating a Job that
        exists answers 409 and adopts it all the same). A workspace's volume is created
        first, or adopted (``K8sWorkspaceCalls``)."""
        return self._submit(spec, self.settings, may_exist=may_exist)

    def _submit(self, spec: JobSpec, settings: K8sSettings, *, may_exist: bool) -> str:
        objects = render(spec, settings, token=spec.attempt_token)
        job = objects[-1]
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        existing = self._read_job(namespace, name) if may_exist else None
        if existing is not None:
            return self._adopt(existing, spec)
        self._ensure_namespace(namespace, spec)
        for obj in objects[:-1]:
            if obj["kind"] == CLAIM_KIND:  # the run's: adopted when there, never the Job's
                self._claim_ensure(obj)
            else:
                self._create(obj, tolerate_existing=True)
        try:
            created = self._create(job, tolerate_existing=False)
        except _AlreadyExists:
            # Another delivery of this submit won the race: its Job is the attempt's.
            existing = self._read_job(namespace, name)
            if existing is None:
                raise TransientBackendError(
                    f"job {namespace}/{name} vanished while adopting it"
                ) from None
            return self._adopt(existing, spec)
        self._own([obj for obj in objects[:-1] if obj["kind"] != CLAIM_KIND], created)
        return backend_job_id(namespace, name)

    def sync(self, refs: list[JobRef]) -> dict[str, JobStatus]:
        """Two lists whatever the number of attempts and namespaces: the Jobs and the pods
        labelled ``gantry.io/attempt`` in all namespaces, in pages of ``LIST_PAGE``; one
        list of each per namespace with live attempts where Gantry may not list across
        namespaces (403: a Role per namespace)."""
        wanted: dict[tuple[str, str], str] = {}  # (namespace, job) -> ref name
        for ref in refs:
            where = split_backend_job_id(ref.backend_job_id)
            if where is not None:
                wanted[where] = ref.name
        api = self.api()  # wrong settings say so even when there is nothing to follow
        if not wanted:
            return {}
        with _gc_paused():
            return self._sync(api, wanted)

    def _sync(
        self, api: client.ApiClient, wanted: dict[tuple[str, str], str]
    ) -> dict[str, JobStatus]:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        namespaces = sorted({namespace for namespace, _ in wanted})
        jobs = self._list_attempt_objects(
            "list jobs",
            batch.list_job_for_all_namespaces,
            batch.list_namespaced_job,
            namespaces,
            keep=lambda job: _namespaced_name(job) in wanted,
        )
        pods_by_job: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for pod in self._list_attempt_objects(
            "list pods",
            core.list_pod_for_all_namespaces,
            core.list_namespaced_pod,
            namespaces,
            keep=lambda pod: _owner_key(pod) in wanted,
        ):
            pods_by_job[_owner_key(pod)].append(pod)
        statuses: dict[str, JobStatus] = {}
        for job in jobs:
            key = _namespaced_name(job)
            status = job_status(job, pods_by_job[key])
            if status.state in ("FAILED", "PREEMPTED") and not is_finished(job):
                # Kubernetes would keep the pod (and its GPUs) retrying the pull forever.
                self._delete_job(*key, "Background")
            statuses[wanted[key]] = status
        return statuses

    def cancel(self, ref: JobRef) -> None:
        """Delete the Job with foreground propagation (its pods go first), and the objects
        created beside it but a workspace's volume (its run's: ``workspace_release``);
        already gone is fine."""
        where = split_backend_job_id(ref.backend_job_id)
        if where is None:
            return
        namespace, name = where
        self._delete_job(namespace, name, "Foreground")
        core = client.CoreV1Api(self.api())
        self._delete(core.delete_namespaced_service, name, namespace)
        self._delete(core.delete_namespaced_secret, token_secret_name(name), namespace)
        if self.settings.queueing == "volcano":
            custom = client.CustomObjectsApi(self.api())
            self._delete(
                custom.delete_namespaced_custom_object, *PODGROUP[:2], namespace, PODGROUP[2], name
            )

    def logs(self, ref: JobRef, *, tail: int, rank: int = 0) -> str:
        """The log of one rank's pod (the latest, if it was replaced); rank 0 by default."""
        where = split_backend_job_id(ref.backend_job_id)
        if where is None:
            return ""
        namespace, name = where
        core = client.CoreV1Api(self.api())
        pods = [
            pod
            for pod in self._list(
                core.list_namespaced_pod,
                namespace,
                label_selector=f"batch.kubernetes.io/job-name={name}",
            )
            if pod_rank(pod) == rank and owner_job(pod) == name
        ]
        if not pods:
            return f"(no pod of rank {rank})"
        pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        response = self._call(
            "read log",
            core.read_namespaced_pod_log,
            pod["metadata"]["name"],
            namespace,
            container=CONTAINER,
            tail_lines=tail,
            tolerate=(400, 404),  # not started yet, or just replaced
        )
        if isinstance(response, ApiException):
            return f"(no log yet: {status_message(response)})"
        return response.data.decode("utf-8", "replace")

    def inventory(self) -> Inventory:
        """The GPU nodes (labelled ``nvidia.com/gpu.product``), every pod bound to a node
        and not finished, in all namespaces (what uses the GPUs is not only Gantry's), and
        the pods waiting for a node: three lists, each in pages of ``LIST_PAGE``."""
        core = client.CoreV1Api(self.api())
        nodes = self._list_all("list nodes", core.list_node, label_selector=GPU_PRODUCT_LABEL)
        gpu_nodes = {node["metadata"]["name"] for node in nodes}
        pods = (
            self._list_all(
                "list pods",
                core.list_pod_for_all_namespaces,
                field_selector=LIVE_BOUND_PODS,
                # Most pods of a big cluster run on CPU nodes: drop them page by page.
                keep=lambda pod: (pod.get("spec") or {}).get("nodeName") in gpu_nodes,
            )
            if nodes
            else []
        )
        # Pods waiting for a node, of every namespace: those asking for GPUs from outside
        # Gantry are what a preemption's GPUs would go to first (``reclaim_first``).
        waiting = (
            self._list_all(
                "list pending pods",
                core.list_pod_for_all_namespaces,
                field_selector=PENDING_UNBOUND_PODS,
            )
            if nodes
            else []
        )
        found = node_inventory(nodes, pods, self.settings, now=timezone.now().timestamp())
        return replace(found, claims=tuple(pending_claims(waiting, self.settings)))

    # --- fencing: cordon and Gantry's taint (docs/node-health.md) -----------------------------

    def fence(self, node: str, reason: str) -> None:
        """Cordon ``node`` and taint it ``gantry.io/node-health=quarantined:NoSchedule``,
        keeping its other taints; idempotent. Running pods stay (NoSchedule evicts none)."""
        self._patch_node(node, lambda current: fence_patch(current, reason), "fence")

    def unfence(self, node: str) -> None:
        """Take Gantry's taint off ``node`` and uncordon it if Gantry cordoned it. A node
        that someone else cordoned stays cordoned: BackendError says so."""
        current = self._patch_node(node, unfence_patch, "unfence")
        if cordoned_by_someone_else(current):
            raise PermanentBackendError(
                f"node {node} was cordoned by someone else, not by Gantry: Gantry took its own "
                "taint off but leaves the cordon to whoever set it (kubectl uncordon "
                f"{node})"
            )

    def _patch_node(self, node: str, patch_for: Callable[[dict], dict | None], what: str) -> dict:
        """Read the node, patch it with its resourceVersion; a 409 (it changed in between)
        reads it again and retries once. Returns the node as last read or patched."""
        try:
            name = node_name(node)
        except FenceError as exc:
            raise PermanentBackendError(str(exc)) from None
        core = client.CoreV1Api(self.api())
        for _ in range(2):
            current = self._node_call(f"{what} node {name}: read", core.read_node, name)
            patch = patch_for(current)
            if patch is None:
                return current
            try:
                # A merge patch (RFC 7386): lists replaced whole, null deletes a key.
                return self._node_call(
                    f"{what} node {name}",
                    core.patch_node,
                    name,
                    patch,
                    _content_type="application/merge-patch+json",
                )
            except _Conflict:
                continue
        raise TransientBackendError(
            f"{what} node {name}: the node changed twice while Gantry patched it (409 "
            "Conflict); the next sync tries again"
        )

    def _node_call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict:
        response = self._call(what, fn, *args, tolerate=(403, 404, 409), **kwargs)
        if not isinstance(response, ApiException):
            return json.loads(response.data)
        if response.status == 409:
            raise _Conflict
        if response.status == 403:
            raise PermanentBackendError(
                f"{what}: forbidden (403): Gantry's Kubernetes identity may not read and patch "
                "nodes; grant it get and patch on nodes (a ClusterRole; docs/kubernetes.md) "
                f"({status_message(response)})"
            )
        raise PermanentBackendError(f"{what}: {self.cluster.name} has no such node (404)")

    # --- the health check on demand (clusters.backends.health_check) ---------------------------

    def health_check(self, node: str, *, check_id: int, flavor: str, gpus: int) -> JobRef:
        """Submit the cluster's health check (its command in its image) to ``node``, holding
        its ``gpus`` GPUs of ``flavor``, in namespace ``<namespace_prefix>health-check``;
        ``sync`` then reads its end (``health_check_result``). Its pod tolerates the cordon
        and Gantry's taint: it reaches a node Gantry fenced, and no other pod does."""
        try:
            check = parse_health_check(settings_for_check(self.cluster), needs_image=True)
            name = node_name(node)
        except (HealthCheckSettingsError, FenceError) as exc:
            raise PermanentBackendError(f"{self.cluster.name}: {exc}") from None
        if check is None:
            raise PermanentBackendError(
                f"{self.cluster.name} has no health_check setting (its command and image)"
            )
        spec = JobSpec(
            name=health_check_name(check_id),
            attempt_id=0,
            run_id=0,
            tenant="health-check",
            project="health-check",
            image=check.image,
            command=check.command,
            env={},
            flavor=flavor,
            nodes=1,
            gpus_per_node=gpus,
            max_runtime_s=check.max_runtime_s,
            placement=(name,),
        )
        settings = self.settings
        tolerating = replace(settings, tolerations=(*settings.tolerations, *CHECK_TOLERATIONS))
        return JobRef(spec.name, self._submit(spec, tolerating, may_exist=True))

    def test_connection(self) -> str:
        """One sentence saying the settings work; raises a BackendError saying what does not
        (unreachable URL, TLS/CA, token)."""
        version = self._call("test connection", client.VersionApi(self.api()).get_code)
        git_version = json.loads(version.data).get("gitVersion", "?")
        review = self._call(
            "test connection",
            client.AuthenticationV1Api(self.api()).create_self_subject_review,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        user = json.loads(review.data).get("status", {}).get("userInfo", {}).get("username")
        who = f" as {user}" if user else ""
        return f"Connected to {self.cluster.name}: Kubernetes {git_version} at {self.where}{who}."

    # --- helpers ------------------------------------------------------------------------------

    def _list(self, fn: Callable[..., Any], namespace: str | None, **kwargs) -> list[dict]:
        kwargs.setdefault("label_selector", ATTEMPT_LABEL)
        args = (namespace,) if namespace is not None else ()
        response = self._call("list", fn, *args, **kwargs)
        return json.loads(response.data).get("items") or []

    def _list_attempt_objects(
        self,
        what: str,
        everywhere: Callable[..., Any],
        per_namespace: Callable[..., Any],
        namespaces: list[str],
        *,
        keep: Callable[[dict], bool],
    ) -> list[dict]:
        """Gantry's objects of one kind that ``keep`` wants: one paged list across all
        namespaces or, where that is forbidden (403), one paged list per namespace."""
        try:
            return self._list_all(
                what, everywhere, keep=keep, label_selector=ATTEMPT_LABEL, forbidden=_Forbidden
            )
        except _Forbidden:
            return [
                item
                for namespace in namespaces
                for item in self._list_all(
                    f"{what} in {namespace}",
                    per_namespace,
                    namespace,
                    keep=keep,
                    label_selector=ATTEMPT_LABEL,
                )
            ]

    def _list_all(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        keep: Callable[[dict], bool] = lambda item: True,
        forbidden: type[Exception] | None = None,
        **kwargs: Any,
    ) -> list[dict]:
        """The items of a list that ``keep`` wants, page by page. A continue token that
        expired between two pages (410: etcd compacted past it) restarts the list once, so
        the items come from one consistent snapshot. A 403 raises ``forbidden`` if given
        (the caller has another way), else it is the usual transient error."""
        tolerate = (410, 403) if forbidden is not None else (410,)
        for _ in range(2):
            items: list[dict] = []
            token = None
            while True:
                response = self._call(
                    what, fn, *args, limit=LIST_PAGE, _continue=token, tolerate=tolerate, **kwargs
                )
                if isinstance(response, ApiException):
                    if response.status == 403 and forbidden is not None:
                        raise forbidden
                    break
                body = json.loads(response.data)
                items.extend(item for item in body.get("items") or [] if keep(item))
                token = (body.get("metadata") or {}).get("continue")
                if not token:
                    return items
        raise TransientBackendError(
            f"{what}: the list expired twice while it was paged through ({LIST_PAGE} a page)"
        )

    def _read_job(self, namespace: str, name: str) -> dict | None:
        batch = client.BatchV1Api(self.api())
        response = self._call(
            f"read job {namespace}/{name}",
            batch.read_namespaced_job,
            name,
            namespace,
            tolerate=(404,),
        )
        return None if isinstance(response, ApiException) else json.loads(response.data)

    def _adopt(self, job: dict, spec: JobSpec) -> str:
        meta = job["metadata"]
        if (meta.get("labels") or {}).get(ATTEMPT_LABEL) != label_value(str(spec.attempt_id)):
            raise PermanentBackendError(
                f"job {meta['namespace']}/{meta['name']} exists but belongs to something else"
            )
        return backend_job_id(meta["namespace"], meta["name"])

    def _ensure_namespace(self, namespace: str, spec: JobSpec) -> None:
        core = client.CoreV1Api(self.api())
        if not self.settings.create_namespaces:
            return  # a missing namespace shows up as a 404 on the first create
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {TENANT_LABEL: label_value(spec.tenant), **MANAGED_BY},
                "annotations": {TENANT_LABEL: spec.tenant},
            },
        }
        # 409: it exists. 403: Gantry may work in namespaces but not create them, which is
        # fine if this one exists (if not, the first create says so).
        self._call(
            f"create namespace {namespace}", core.create_namespace, body, tolerate=(403, 409)
        )

    def _create(self, obj: dict, *, tolerate_existing: bool) -> dict:
        kind = obj["kind"]
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        api = self.api()
        fn: Callable[..., Any]
        args: tuple[Any, ...]
        if kind == "Job":
            fn, args = client.BatchV1Api(api).create_namespaced_job, (namespace, obj)
        elif kind == "Service":
            fn, args = client.CoreV1Api(api).create_namespaced_service, (namespace, obj)
        elif kind == "Secret":
            fn, args = client.CoreV1Api(api).create_namespaced_secret, (namespace, obj)
        else:
            fn = client.CustomObjectsApi(api).create_namespaced_custom_object
            args = (*PODGROUP[:2], namespace, PODGROUP[2], obj)
        response = self._call(
            f"create {kind.lower()} {namespace}/{name}", fn, *args, tolerate=(404, 409)
        )
        if not isinstance(response, ApiException):
            return json.loads(response.data)
        if response.status == 404:
            raise PermanentBackendError(
                f"namespace {namespace} does not exist on {self.cluster.name}, and Gantry is "
                f"not set (or not allowed) to create it ({status_message(response)})"
            )
        if tolerate_existing:
            return {}
        raise _AlreadyExists

    def _own(self, objects: list[dict], job: dict) -> None:
        """Make the Job the owner of the objects created beside it: they go when it goes
        (also when its TTL runs out)."""
        owner = {
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job["metadata"]["name"],
                    "uid": job["metadata"]["uid"],
                    "blockOwnerDeletion": False,
                }
            ]
        }
        api = self.api()
        for obj in objects:
            namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            kind = obj["kind"]
            fn: Callable[..., Any]
            args: tuple[Any, ...]
            if kind == "Service":
                fn, args = client.CoreV1Api(api).patch_namespaced_service, (name, namespace)
            elif kind == "Secret":
                fn, args = client.CoreV1Api(api).patch_namespaced_secret, (name, namespace)
            else:
                fn = client.CustomObjectsApi(api).patch_namespaced_custom_object
                args = (*PODGROUP[:2], namespace, PODGROUP[2], name)
            self._call(
                f"own {kind.lower()} {namespace}/{name}",
                fn,
                *args,
                {"metadata": owner},
            )

    def _delete_job(self, namespace: str, name: str, policy: str) -> None:
        batch = client.BatchV1Api(self.api())
        self._delete(batch.delete_namespaced_job, name, namespace, propagation_policy=policy)

    def _delete(self, fn: Callable[..., Any], *args, **kwargs) -> None:
        self._call("delete", fn, *args, tolerate=(404,), **kwargs)  # already gone is fine


class _AlreadyExists(Exception):
    pass


class _Conflict(Exception):
    """409: the object changed since it was read."""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a sync reads and maps its lists: 5,000
    attempts are ~23 MB of JSON parsed into millions of containers, none in a cycle and all
    gone when the sync returns, and the collections their allocation triggers cost as much
    as the parse (measured: 954 ms vs 458 ms). Leaves the collector as it found it: a
    thread that found it on turns it back on, so with threads overlapping it is never left
    off; meanwhile only the freeing of cycles waits (reference counting frees the rest)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Forbidden(Exception):
    pass


def _namespaced_name(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _owner_key(pod: dict) -> tuple[str, str]:
    """The (namespace, name) of the Job that controls the pod; no name if none does."""
    return pod["metadata"].get("namespace", ""), owner_job(pod) or ""
