"""A workspace on Kubernetes (docs/workspaces.md, "Backends"): its pod's server listens on
a port Gantry fixes, and a Service of its own gives the proxy a stable address for it.

A pod has an address of its own, so the port needs no picking; the Service's DNS name is
the address the proxy connects to, derived from the attempt's Job (namespace and name) by
Gantry, never reported by the job. Pure: plain data in and out.
"""

from typing import Any

from clusters.backends.base import JobSpec
from clusters.job_env import (
    REDACTED,
    WORKSPACE_BIND_ENV,
    WORKSPACE_PORT_ENV,
    WORKSPACE_TOKEN_ENV,
)

WORKSPACE_PORT = 8888
PORT_NAME = "workspace"
# In the pod's own network namespace: every address of the pod, which only the Service
# and the pod network reach.
BIND = "0.0.0.0"  # noqa: S104


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
