"""The Kubernetes backend's calls for workspaces (docs/workspaces.md, "Backends"): where the
proxy reaches a workspace's server, and its volume, created with its first attempt's Job,
adopted by every later one and deleted once the workspace has ended for good. The objects
themselves are rendered by ``k8s_workspace``."""

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.backends.base import JobRef, PermanentBackendError, TransientBackendError
from clusters.backends.k8s_connection import K8sConnection, status_message
from clusters.backends.k8s_manifest import MANAGED_BY, RUN_LABEL, namespace_for
from clusters.backends.k8s_status import split_backend_job_id
from clusters.backends.k8s_workspace import WORKSPACE_PORT, claim_name, service_host


class K8sWorkspaceCalls(K8sConnection):
    def workspace_address(self, ref: JobRef, *, port: int) -> tuple[str, int]:
        """The DNS name of the workspace's Service, from the Job's namespace and name."""
        where = split_backend_job_id(ref.backend_job_id)
        if where is None:
            raise PermanentBackendError(f"no Kubernetes job {ref.backend_job_id!r}")
        if port != WORKSPACE_PORT:
            raise PermanentBackendError(f"its Service routes port {WORKSPACE_PORT}, not {port}")
        return service_host(*where), WORKSPACE_PORT

    def workspace_release(self, *, run_id: int, tenant: str) -> None:
        """Delete the workspace's volume, and its files with it; already gone is fine.
        Gantry calls this only once the workspace has ended for good, never on a suspend."""
        namespace = namespace_for(tenant, prefix=self.settings.namespace_prefix)
        name = claim_name(run_id)
        core = client.CoreV1Api(self.api())
        self._call(
            f"delete persistentvolumeclaim {namespace}/{name}",
            core.delete_namespaced_persistent_volume_claim,
            name,
            namespace,
            tolerate=(404,),
        )

    def _claim_ensure(self, claim: dict[str, Any]) -> None:
        """Create the workspace's volume, or adopt the one an earlier attempt (or an earlier
        try of this submit) created: the same run's, by its labels. Never owned by the Job,
        so the Job's deletion (a suspend, its TTL) leaves it."""
        meta = claim["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        core = client.CoreV1Api(self.api())
        response = self._call(
            f"create persistentvolumeclaim {namespace}/{name}",
            core.create_namespaced_persistent_volume_claim,
            namespace,
            claim,
            tolerate=(404, 409),
        )
        if not isinstance(response, ApiException):
            return
        if response.status == 404:
            raise PermanentBackendError(
                f"namespace {namespace} does not exist on {self.cluster.name}, and Gantry is "
                f"not set (or not allowed) to create it ({status_message(response)})"
            )
        found = self._call(
            f"read persistentvolumeclaim {namespace}/{name}",
            core.read_namespaced_persistent_volume_claim,
            name,
            namespace,
            tolerate=(404,),
        )
        if isinstance(found, ApiException):
            raise TransientBackendError(
                f"persistentvolumeclaim {namespace}/{name} vanished while adopting it"
            )
        labels = json.loads(found.data)["metadata"].get("labels") or {}
        wanted = {RUN_LABEL: meta["labels"][RUN_LABEL], **MANAGED_BY}
        if any(labels.get(key) != value for key, value in wanted.items()):
            raise PermanentBackendError(
                f"persistentvolumeclaim {namespace}/{name} exists but is not this workspace's"
            )
