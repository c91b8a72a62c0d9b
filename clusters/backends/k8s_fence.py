"""Gantry's fence of a Kubernetes node, and what a node's conditions say about its health.
Plain dicts in (the node as the API server sends it), plain data out: no client, no I/O.

The fence is what ``kubectl cordon`` does (``spec.unschedulable: true``) plus a taint of
Gantry's, ``gantry.io/node-health=quarantined:NoSchedule``, so that pods which tolerate the
cordon (DaemonSets, a health check) still need to tolerate Gantry's decision by name.
``spec.taints`` is an atomic list (``+listType=atomic`` in core/v1 types.go): a patch
replaces it whole, so the patch carries every other taint as read, and the node's
``metadata.resourceVersion``, so that a change made in between fails with 409 instead of
being overwritten. An annotation records whether Gantry cordoned the node itself: an
unfence never uncordons a node someone else cordoned.
"""

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from clusters.health import Signal, SignalClass, Source

FENCE_TAINT = {"key": "gantry.io/node-health", "value": "quarantined", "effect": "NoSchedule"}
# What a health-check pod tolerates to reach a fenced node: the cordon (the taint the node
# lifecycle controller mirrors it as, which DaemonSets tolerate) and Gantry's taint.
CHECK_TOLERATIONS = (
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
    {"key": FENCE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"},
)
# The reason Gantry fenced the node for, and whether it set spec.unschedulable itself
# ("true") or found the node cordoned already ("false").
REASON_ANNOTATION = "gantry.io/node-health-reason"
CORDONED_ANNOTATION = "gantry.io/cordoned"
MAX_REASON = 256
# A node's name: a DNS subdomain (what the API server allows), at most 253 characters.
NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Conditions that health agents set on a node when a GPU, its driver or its fabric fails
# (status True), as NVIDIA NVSentinel names them (docs/INTEGRATIONS.md): DCGM's health
# watches, XIDs and a GPU fallen off the bus in the kernel log, the NVSwitch fabric.
# Not CSPMaintenance (planned maintenance, no fault) nor the non-fatal ones (NVSentinel
# reports non-fatal events as Events, not conditions).
GPU_CONDITIONS = frozenset(
    {
        "GpuMemWatch",
        "GpuThermalWatch",
        "GpuPcieWatch",
        "GpuPowerWatch",
        "GpuInforomWatch",
        "GpuSmWatch",
        "GpuNvlinkWatch",
        "GpuMcuWatch",
        "GpuPmuWatch",
        "GpuDriverWatch",
        "GpuCpusetWatch",
        "SysLogsXIDError",
        "SysLogsSXIDError",
        "SysLogsGPUFallenOff",
        "NVSwitchFatalError",
        "NVSwitchDown",
        "DCGMError",
    }
)


class FenceError(ValueError):
    """A node name Gantry will not send to the API server."""


def node_name(node: str) -> str:
    if not isinstance(node, str) or len(node) > 253 or not NODE_NAME.match(node):
        raise FenceError(f"{node!r} is not a Kubernetes node name")
    return node


def _reason(reason: str) -> str:
    text = " ".join(re.sub(r"[\x00-\x1f\x7f]+", " ", str(reason or "")).split())
    return text[:MAX_REASON] or "node health"


def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == FENCE_TAINT["key"] and taint.get("effect") == FENCE_TAINT["effect"]


def _meta(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return node.get("metadata") or {}


def is_fenced(node: Mapping[str, Any]) -> bool:
    """Cordoned and carrying Gantry's taint."""
    spec = node.get("spec") or {}
    return bool(spec.get("unschedulable")) and any(_is_ours(t) for t in spec.get("taints") or [])


def fence_patch(node: Mapping[str, Any], reason: str) -> dict[str, Any] | None:
    """The merge patch that fences ``node`` as read; None when it is fenced already."""
    if is_fenced(node):
        return None
    spec = node.get("spec") or {}
    annotations = _meta(node).get("annotations") or {}
    taints = [dict(t) for t in spec.get("taints") or [] if not _is_ours(t)]
    # Cordoned by someone else before Gantry came: theirs to undo, whatever Gantry does.
    cordoned_by_us = annotations.get(CORDONED_ANNOTATION) == "true" or not spec.get("unschedulable")
    return {
        "metadata": {
            "resourceVersion": _meta(node).get("resourceVersion"),
            "annotations": {
                REASON_ANNOTATION: _reason(reason),
                CORDONED_ANNOTATION: "true" if cordoned_by_us else "false",
            },
        },
        "spec": {"unschedulable": True, "taints": [*taints, dict(FENCE_TAINT)]},
    }


def unfence_patch(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that takes Gantry's fence off ``node``: its taint and annotations,
    and the cordon only if Gantry set it. None when nothing of Gantry's is there."""
    spec = node.get("spec") or {}
    annotations = _meta(node).get("annotations") or {}
    taints = spec.get("taints") or []
    if not any(_is_ours(t) for t in taints) and not (
        annotations.keys() & {REASON_ANNOTATION, CORDONED_ANNOTATION}
    ):
        return None
    patch: dict[str, Any] = {
        "metadata": {
            "resourceVersion": _meta(node).get("resourceVersion"),
            "annotations": {REASON_ANNOTATION: None, CORDONED_ANNOTATION: None},
        },
        "spec": {"taints": [dict(t) for t in taints if not _is_ours(t)]},
    }
    if annotations.get(CORDONED_ANNOTATION) == "true":
        patch["spec"]["unschedulable"] = False
    return patch


def cordoned_by_someone_else(node: Mapping[str, Any]) -> bool:
    """Cordoned, with no sign that Gantry did it."""
    spec = node.get("spec") or {}
    annotations = _meta(node).get("annotations") or {}
    return bool(spec.get("unschedulable")) and annotations.get(CORDONED_ANNOTATION) != "true"


def _at(condition: Mapping[str, Any], now: float) -> float:
    stamp = condition.get("lastTransitionTime") or condition.get("lastHeartbeatTime")
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return now


def node_signals(node: Mapping[str, Any], *, now: float) -> tuple[Signal, ...]:
    """What a node's conditions say: ``Ready`` not True is NODE_DOWN (code ``Ready=False``
    or ``Ready=Unknown``); a GPU condition (``GPU_CONDITIONS``) with status True is
    NODE_CONDITION, its type the code and its message the detail. Each is stamped with the
    condition's lastTransitionTime (``now`` where it has none).

    Taints are no signal: a NoSchedule or NoExecute taint is someone's placement decision
    (dedicated nodes, maintenance, NVSentinel's quarantine), which the inventory already
    honours (the node takes no work, with the taint as its reason); the fault behind a
    health agent's taint arrives as its condition, and the kubelet's own not-ready and
    unreachable taints as ``Ready``."""
    name = str(_meta(node).get("name") or "")
    found: list[Signal] = []
    for condition in (node.get("status") or {}).get("conditions") or []:
        kind, status = condition.get("type"), condition.get("status")
        words = str(condition.get("message") or condition.get("reason") or "")
        if kind == "Ready" and status != "True":
            code = f"Ready={status or 'Unknown'}"
            found.append(
                Signal(
                    node=name,
                    signal=SignalClass.NODE_DOWN,
                    source=Source.BACKEND,
                    at=_at(condition, now),
                    code=code,
                    detail=words or f"the node is not Ready ({code})",
                )
            )
        elif kind in GPU_CONDITIONS and status == "True":
            found.append(
                Signal(
                    node=name,
                    signal=SignalClass.NODE_CONDITION,
                    source=Source.BACKEND,
                    at=_at(condition, now),
                    code=str(kind),
                    detail=words or f"condition {kind} is True",
                )
            )
    return tuple(found)
