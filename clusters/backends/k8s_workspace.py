"""A workspace on Kubernetes (docs/workspaces.md, "Backends"): its pod's server listens on
a port Gantry fixes, a Service of its own gives the proxy a stable address for it, and a
volume of its own keeps its files across its attempts.

A pod has an address of its own, so the port needs no picking; the Service's DNS name is
the address the proxy connects to, derived from the attempt's Job (namespace and name) by
Gantry, never reported by the job. The volume is a PersistentVolumeClaim of the run, not of
an attempt: named after the run, never owned by a Job, so a suspend (its Job deleted) keeps
it and the next attempt mounts it again; it goes when the workspace has ended for good
(``Backend.workspace_release``). Pure: plain data in and out.
"""

from typing import Any

from clusters.backends.base import JobSpec
from clusters.backends.k8s_settings import K8sSettings
from clusters.job_env import (
    REDACTED,
    WORKSPACE_BIND_ENV,
    WORKSPACE_HOME_ENV,
    WORKSPACE_PORT_ENV,
    WORKSPACE_TOKEN_ENV,
)

WORKSPACE_PORT = 8888
PORT_NAME = "workspace"
# In the pod's own network namespace: every address of the pod, which only the Service
# and the pod network reach.
BIND = "0.0.0.0"  # noqa: S104
CLAIM_KIND = "PersistentVolumeClaim"
VOLUME_NAME = "workspace"
# Where the volume is mounted in the container: the server's root directory
# (GANTRY_WORKSPACE_HOME), the same path on every attempt.
HOME = "/home/gantry/workspace"


def claim_name(run_id: int) -> str:
    """The workspace's PersistentVolumeClaim: named after its run (a number), so every
    attempt of the run, and a retried submit, finds the same one."""
    return f"gantry-ws-{int(run_id)}"


def workspace_secret_data(spec: JobSpec) -> dict[str, str]:
    """The workspace's secret beside the attempt token in the attempt's Secret; a
    placeholder in the spec the attempt stores."""
    if spec.workspace is None:
        return {}
    return {WORKSPACE_TOKEN_ENV: spec.workspace.token or REDACTED}


def workspace_env(spec: JobSpec, *, secret: str) -> list[dict[str, Any]]:
    """The container's workspace variables besides ``job_env``'s: where to listen, and the
    secret by reference to the Secret."""
    if spec.workspace is None:
        return []
    return [
        {"name": WORKSPACE_BIND_ENV, "value": BIND},
        {"name": WORKSPACE_HOME_ENV, "value": HOME},
        {"name": WORKSPACE_PORT_ENV, "value": str(WORKSPACE_PORT)},
        {
            "name": WORKSPACE_TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": secret, "key": WORKSPACE_TOKEN_ENV}},
        },
    ]


def workspace_ports(spec: JobSpec) -> list[dict[str, Any]]:
    if spec.workspace is None:
        return []
    return [{"name": PORT_NAME, "containerPort": WORKSPACE_PORT, "protocol": "TCP"}]


def workspace_service(metadata: dict[str, Any], attempt_label: str) -> dict[str, Any]:
    """The Service in front of the workspace's pod: named like its Job."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": {"gantry.io/attempt": attempt_label},
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": WORKSPACE_PORT,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def service_host(namespace: str, name: str) -> str:
    """The Service's DNS name inside the cluster, where the proxy connects."""
    return f"{name}.{namespace}.svc"


def workspace_claim(metadata: dict[str, Any], settings: K8sSettings) -> dict[str, Any]:
    """The workspace's volume: one node's (ReadWriteOnce), of the cluster's size and
    StorageClass (none named: the cluster's default)."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.workspace_volume_size}},
    }
    if settings.workspace_storage_class:
        spec["storageClassName"] = settings.workspace_storage_class
    return {"apiVersion": "v1", "kind": CLAIM_KIND, "metadata": metadata, "spec": spec}


def workspace_volumes(spec: JobSpec) -> list[dict[str, Any]]:
    """The pod's volume of the workspace's claim."""
    if spec.workspace is None:
        return []
    return [{"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim_name(spec.run_id)}}]


def workspace_mounts(spec: JobSpec) -> list[dict[str, Any]]:
    """The container's mount of it, at GANTRY_WORKSPACE_HOME."""
    if spec.workspace is None:
        return []
    return [{"name": VOLUME_NAME, "mountPath": HOME}]


def workspace_security_context(spec: JobSpec, settings: K8sSettings) -> dict[str, Any]:
    """The pod's fsGroup where the cluster names one: the kubelet gives the volume's files
    that group (only when its root's differs: a full volume is not walked at every start),
    so an image whose user is not root can write them."""
    if spec.workspace is None or settings.workspace_fs_group is None:
        return {}
    return {"fsGroup": settings.workspace_fs_group, "fsGroupChangePolicy": "OnRootMismatch"}
