"""Pods from outside Gantry that wait for GPUs: what the scheduler binds as GPUs come free.
Pure: the pods of one list (unbound and Pending, every namespace) in, ``PendingClaim`` rows
out.

The scheduler takes pods from its queue by priority, then by when they were created, and
binds each to any node it fits on; Gantry's pod, created after a preemption, comes after
those waiting already (docs/kubernetes.md, "Reclaiming"). Each pod is a claim of one node:
a gang of another team's pods is as many claims, since every pod can take a node alone.
"""

from typing import Any

from clusters.backends.base import PendingClaim
from clusters.backends.k8s_manifest import ATTEMPT_LABEL, GPU_PRODUCT_LABEL, HOSTNAME_LABEL
from clusters.backends.k8s_settings import K8sSettings
from clusters.backends.k8s_status import pod_request

# The list that finds them: not bound to a node, not started.
PENDING_UNBOUND_PODS = "spec.nodeName=,status.phase=Pending"


def pending_claims(pods: list[dict[str, Any]], settings: K8sSettings) -> list[PendingClaim]:
    """The claims of the pods that wait for GPUs of the cluster's flavors, in the
    scheduler's order (priority, then oldest first). Gantry's own pods (labelled with an
    attempt) and pods held back by a scheduling gate (not in the scheduler's queue) are
    none. A pod that names no GPU product may land on any flavor with its resource; one
    pinned to a host (``kubernetes.io/hostname``) only there."""
    ordered = sorted(
        pods,
        key=lambda pod: (
            -int((pod.get("spec") or {}).get("priority") or 0),
            str((pod.get("metadata") or {}).get("creationTimestamp") or ""),
        ),
    )
    claims: list[PendingClaim] = []
    for pod in ordered:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if ATTEMPT_LABEL in (meta.get("labels") or {}) or spec.get("schedulingGates"):
            continue
        if spec.get("nodeName") or (pod.get("status") or {}).get("phase") != "Pending":
            continue
        selector = spec.get("nodeSelector") or {}
        host = selector.get(HOSTNAME_LABEL)
        for slug, flavor in sorted(settings.flavors.items()):
            product = selector.get(GPU_PRODUCT_LABEL)
            if product not in (None, flavor.product):
                continue
            gpus = pod_request(pod, flavor.resource)
            if gpus <= 0:
                continue
            claims.append(
                PendingClaim(
                    job=f"pod {meta.get('namespace', '')}/{meta.get('name', '')}",
                    flavor=slug,
                    nodes=1,
                    gpus_per_node=gpus,
                    priority=int(spec.get("priority") or 0),
                    eligible=(str(host),) if host else (),
                )
            )
    return claims
