"""A tiny job controller, scheduler and kubelet for the fake API server.

Each ``step()`` moves every object one stage on the store's clock: an unsuspended Indexed
Job gets one pod per completion index; a pod is scheduled (to the first registered node
that passes the scheduler's filters: cordon, taints and tolerations, node selector and
required node affinity, free GPUs counting every bound pod of every namespace, required
pod anti-affinity; or to a virtual node when none are registered), or stays Pending with
PodScheduled=False, Unschedulable and the scheduler's message ("0/3 nodes are available:
…"; a PersistentVolumeClaim it mounts that is missing or being deleted); then runs, then
succeeds once ``runtime_s`` has passed since it started. Pods of others (``add_pod``) only
hold their node's resources. Failures are injected per job and rank and take effect on the
next step. The Job's ``podFailurePolicy``, ``backoffLimit``, ``activeDeadlineSeconds`` and
``ttlSecondsAfterFinished`` are honoured as the real job controller does, and deletions
(foreground included, and claims no pod mounts any more) finish here.
"""

import copy
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from tests.k8s_fake.store import PVC_PROTECTION, Store, claims_of

INDEX = "batch.kubernetes.io/job-completion-index"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_OOM_LOG = (
    "Traceback (most recent call last):",
    '  File "/workspace/train.py", line 212, in <module>',
    "    loss.backward()",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
    "total capacity of 79.15 GiB of which 3.12 GiB is free.",
)


@dataclass
class Injection:
    kind: str
    rank: int
    message: str
    exit_code: int | None


class Controller:
    def __init__(self, store: Store, *, runtime_s: float = 60.0):
        self.store = store
        self.runtime_s = runtime_s
        self.runtimes: dict[str, float] = {}
        self.injections: dict[str, list[Injection]] = defaultdict(list)
        self.logs: dict[tuple[str, str], list[str]] = defaultdict(list)
        self._judged: dict[str, set[str]] = defaultdict(set)  # failed pods already counted
        self._failures: dict[str, int] = defaultdict(int)

    @property
    def clock(self):
        return self.store.clock

    # --- what tests say --------------------------------------------------------------------

    def set_runtime(self, job: str, seconds: float) -> None:
        self.runtimes[job] = seconds

    def inject(
        self,
        job: str,
        kind: str,
        *,
        rank: int = 0,
        message: str = "",
        exit_code: int | None = None,
    ) -> None:
        """``kind``: oom (OOMKilled, message as given), oom_gpu (CUDA OOM in the log, exit
        1), exit (exit_code), image_pull, preempt, evict, node_loss, deadline."""
        known = {
            "oom",
            "oom_gpu",
            "exit",
            "image_pull",
            "preempt",
            "evict",
            "node_loss",
            "deadline",
        }
        if kind not in known:
            raise ValueError(f"unknown injection {kind}")
        self.injections[job].append(Injection(kind, rank, message, exit_code))

    def admit(self, namespace: str, job: str) -> None:
        """What Kueue does on admission: unsuspend the Job."""
        self.store.patch("jobs", namespace, job, {"spec": {"suspend": False}}, "merge")

    def add_node(
        self,
        name: str,
        *,
        product: str,
        gpus: int,
        resource: str = "nvidia.com/gpu",
        labels: dict | None = None,
        ready: bool = True,
        unschedulable: bool = False,
        taints: list[dict] | None = None,
        extra_allocatable: dict | None = None,
    ) -> None:
        """A node; one that is not ready carries the taints the node lifecycle controller
        gives an unreachable node, as on a real cluster."""
        allocatable = {"cpu": "96", "memory": "1024Gi", "pods": "110", resource: str(gpus)}
        allocatable.update(extra_allocatable or {})
        taints = list(taints or [])
        if not ready:
            taints += [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            ]
        spec: dict = {}
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = taints
        node = {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    GPU_PRODUCT: product,
                    "nvidia.com/gpu.count": str(gpus),
                    **(labels or {}),
                },
            },
            "spec": spec,
            "status": {
                "capacity": dict(allocatable),
                "allocatable": allocatable,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "Unknown",
                        "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                    }
                ],
            },
        }
        self.store.create("nodes", "", node)

    def cordon(self, name: str, *, unschedulable: bool = True) -> None:
        """What ``kubectl cordon`` (or ``uncordon``) does."""
        self.store.patch("nodes", "", name, {"spec": {"unschedulable": unschedulable}}, "merge")

    def set_condition(
        self, node: str, kind: str, status: str, *, reason: str = "", message: str = ""
    ) -> None:
        """Set (or replace) one condition of a node, as the kubelet or a health agent such
        as node-problem-detector or NVSentinel does, stamped with the cluster's time."""
        with self.store.lock:
            current = self.store.find("nodes", "", node)
            if current is None:
                raise KeyError(node)
            conditions = [
                c for c in current["status"].get("conditions") or [] if c.get("type") != kind
            ]
            conditions.append(
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": self.clock.stamp(),
                }
            )
            current["status"]["conditions"] = conditions
            self.store.touch("nodes", current)

    def add_pod(
        self,
        name: str,
        *,
        node: str | None,
        gpus: int = 0,
        resource: str = "nvidia.com/gpu",
        namespace: str = "default",
        labels: dict | None = None,
        phase: str = "Running",
    ) -> dict:
        """A pod of someone else's (no Job of ours owns it, the controller leaves it alone):
        bound to ``node`` (None: not scheduled yet) and holding ``gpus`` of ``resource``."""
        if self.store.find("namespaces", "", namespace) is None:
            self.store.create("namespaces", "", {"metadata": {"name": namespace}})
        container: dict = {"name": "main", "image": "registry.example.org/other/etl:1"}
        if gpus:
            container["resources"] = {
                "requests": {resource: str(gpus)},
                "limits": {resource: str(gpus)},
            }
        spec: dict = {"containers": [container], "restartPolicy": "Never"}
        status: dict = {"phase": phase}
        if node:
            spec["nodeName"] = node
            status["conditions"] = [_cond("PodScheduled", "True", "", "", self.clock)]
        meta = {"name": name, "labels": dict(labels or {})}
        return self.store.create(
            "pods", namespace, {"metadata": meta, "spec": spec, "status": status}
        )

    def finish_pod(self, namespace: str, name: str) -> None:
        """Someone else's pod ends: its node's resources are free again."""
        self.store.patch("pods", namespace, name, {"status": {"phase": "Succeeded"}}, "merge")

    def pod_logs(self, namespace: str, name: str) -> list[str]:
        return self.logs.get((namespace, name), [])

    def pods_of(self, namespace: str, job: str) -> list[dict]:
        items, _ = self.store.list(
            "pods", namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
        )
        return sorted(items, key=lambda p: int(p["metadata"]["annotations"][INDEX]))

    # --- the loop --------------------------------------------------------------------------

    def advance(self, seconds: float = 0.0, *, steps: int = 1) -> None:
        """Move the clock, then take ``steps`` steps."""
        self.clock.advance(seconds)
        for _ in range(steps):
            self.step()

    def step(self) -> None:
        with self.store.lock:
            self._finish_deletions()
            for job in sorted(self.store.iter("jobs"), key=lambda j: j["metadata"]["name"]):
                self._sync_job(job)
            self._expire_finished()
            self.store.collect_garbage()
            # Every change of the step was recorded (touch): clients read only recorded ones.
            unrecorded = self.store.unrecorded()
            if unrecorded:
                raise AssertionError(f"changed in place, never recorded: {unrecorded}")

    def _finish_deletions(self) -> None:
        for pod in list(self.store.iter("pods")):
            if pod["metadata"].get("deletionTimestamp"):
                self.store.remove("pods", pod)
        self.store.collect_garbage()
        # The pvc-protection controller: a Terminating claim no pod mounts any more goes.
        for claim in list(self.store.iter("persistentvolumeclaims")):
            meta = claim["metadata"]
            if meta.get("deletionTimestamp") and not self.store.claim_in_use(
                meta["namespace"], meta["name"]
            ):
                meta["finalizers"] = [f for f in meta.get("finalizers", []) if f != PVC_PROTECTION]
                self.store.remove("persistentvolumeclaims", claim)

    def _expire_finished(self) -> None:
        now = self.clock.now
        for job in list(self.store.iter("jobs")):
            ttl = job["spec"].get("ttlSecondsAfterFinished")
            finished = _condition(job, "Complete") or _condition(job, "Failed")
            if ttl is None or not finished:
                continue
            at = _parse(finished["lastTransitionTime"])
            if (now - at).total_seconds() >= ttl:
                meta = job["metadata"]
                self.store.delete("jobs", meta["namespace"], meta["name"], "Background")

    # --- one job ---------------------------------------------------------------------------

    def _sync_job(self, job: dict) -> None:
        meta, spec = job["metadata"], job["spec"]
        status = job.setdefault("status", {})
        if (
            meta.get("deletionTimestamp")
            or _condition(job, "Complete")
            or _condition(job, "Failed")
        ):
            return
        pods = self._pods(job)
        if spec.get("suspend"):
            changed = False
            for pod in pods:
                if not _terminal(pod):
                    self.store.mark_deleted("pods", pod)
            if not _condition(job, "Suspended"):
                self._set_condition(job, "Suspended", "JobSuspended", "Job suspended")
                status.pop("startTime", None)
                changed = True
            if changed:
                self.store.touch("jobs", job)
            return
        if _condition(job, "Suspended"):
            self._set_condition(job, "Suspended", "JobResumed", "Job resumed", status="False")
        status.setdefault("startTime", self.clock.stamp())
        self._apply_job_injections(job)
        deadline = spec.get("activeDeadlineSeconds")
        started = _parse(status["startTime"])
        if deadline and (self.clock.now - started).total_seconds() >= deadline:
            self._fail(
                job, pods, "DeadlineExceeded", "Job was active longer than specified deadline"
            )
            return
        for pod in pods:
            self._step_pod(job, pod)
        pods = self._pods(job)
        if self._apply_failure_policy(job, pods):
            return
        completions = spec.get("completions") or 1
        by_index = defaultdict(list)
        for pod in pods:
            by_index[int(pod["metadata"]["annotations"][INDEX])].append(pod)
        succeeded = sorted(
            i for i, ps in by_index.items() if any(_phase(p) == "Succeeded" for p in ps)
        )
        for index in range(completions):
            if index in succeeded:
                continue
            live = [p for p in by_index.get(index, []) if not _terminal(p)]
            if not live:
                self._create_pod(job, index)
        pods = self._pods(job)
        active = [p for p in pods if not _terminal(p)]
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if _phase(p) == "Running")
        status["succeeded"] = len(succeeded)
        status["failed"] = sum(1 for p in pods if _phase(p) == "Failed")
        status["terminating"] = 0
        if succeeded:
            status["completedIndexes"] = _ranges(succeeded)
        if len(succeeded) >= completions:
            now = self.clock.stamp()
            self._set_condition(
                job,
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
            self._set_condition(
                job, "Complete", "CompletionsReached", "Reached expected number of succeeded pods"
            )
            status["completionTime"] = now
            status["active"] = 0
            self._event(job, "Normal", "Completed", "Job completed")
        self.store.touch("jobs", job)

    def _pods(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        return [
            pod
            for pod in self.store.iter("pods", job["metadata"]["namespace"])
            if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])
        ]

    def _create_pod(self, job: dict, index: int) -> None:
        meta, template = job["metadata"], job["spec"]["template"]
        name = meta["name"]
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            "batch.kubernetes.io/controller-uid": meta["uid"],
            "batch.kubernetes.io/job-name": name,
            "controller-uid": meta["uid"],
            "job-name": name,
            INDEX: str(index),
        }
        annotations = {**(template.get("metadata") or {}).get("annotations", {}), INDEX: str(index)}
        pod_spec = _copy(template["spec"])
        if pod_spec.get("subdomain"):
            pod_spec["hostname"] = f"{name}-{index}"
        pod = {
            "metadata": {
                "name": f"{name}-{index}-{self.store.next_name():05x}",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": pod_spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        created = self.store.create("pods", meta["namespace"], pod)
        self._event(
            job, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}"
        )

    # --- one pod ---------------------------------------------------------------------------

    def _step_pod(self, job: dict, pod: dict) -> None:
        if _terminal(pod) or pod["metadata"].get("deletionTimestamp"):
            return
        status = pod["status"]
        rank = int(pod["metadata"]["annotations"][INDEX])
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if self._apply_pod_injection(job, pod, rank):
            self.store.touch("pods", pod)
            return
        if not pod["spec"].get("nodeName"):
            node, why = self._place(pod)
            if node is None:
                status["conditions"] = [
                    _cond("PodScheduled", "False", "Unschedulable", why, self.clock)
                ]
                self.store.touch("pods", pod)
                return
            pod["spec"]["nodeName"] = node
            status["conditions"] = [_cond("PodScheduled", "True", "", "", self.clock)]
            status["hostIP"] = "10.0.0.1"
            status["startTime"] = self.clock.stamp()
            status["containerStatuses"] = [
                _container(pod, {"waiting": {"reason": "ContainerCreating"}})
            ]
            self._event(
                pod, "Normal", "Scheduled", f"Successfully assigned {key[0]}/{key[1]} to {node}"
            )
            self.store.touch("pods", pod)
            return
        state = status["containerStatuses"][0]["state"]
        if "waiting" in state:
            if state["waiting"]["reason"] in ("ErrImagePull", "ImagePullBackOff"):
                image = pod["spec"]["containers"][0]["image"]
                state["waiting"] = {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{image}"',
                }
                self.store.touch("pods", pod)
                return
            status["phase"] = "Running"
            status["podIP"] = f"10.1.0.{rank + 2}"
            status["containerStatuses"][0] = _container(
                pod, {"running": {"startedAt": self.clock.stamp()}}, ready=True
            )
            status["conditions"].append(_cond("Ready", "True", "", "", self.clock))
            ranks, node = job["spec"].get("completions", 1), pod["spec"]["nodeName"]
            self.logs[key].append(f"rank {rank} of {ranks} starting on {node}")
            self._event(pod, "Normal", "Started", "Started container trainer")
            self.store.touch("pods", pod)
            return
        started = _parse(state["running"]["startedAt"])
        runtime = self.runtimes.get(job["metadata"]["name"], self.runtime_s)
        elapsed = (self.clock.now - started).total_seconds()
        self.logs[key].append(f"step {int(elapsed)}")
        if elapsed >= runtime:
            self.logs[key].append("done")
            self._terminate(pod, 0, "Completed", "")
            self.store.touch("pods", pod)

    def _place(self, pod: dict) -> tuple[str | None, str]:
        """The first node (by name) that passes the scheduler's filters, in its order:
        cordon, taints, node selector and required node affinity, free GPUs, pod
        anti-affinity. None and the scheduler's message when no node does."""
        spec = pod["spec"]
        if spec.get("schedulerName") == "volcano":
            group = pod["metadata"]["annotations"].get("scheduling.k8s.io/group-name")
            if (
                not group
                or self.store.find("podgroups", pod["metadata"]["namespace"], group) is None
            ):
                return None, f"pod group {group!r} not found"
        for name in claims_of(pod):
            claim = self.store.find("persistentvolumeclaims", pod["metadata"]["namespace"], name)
            if claim is None:
                return None, f'persistentvolumeclaim "{name}" not found'
            if claim["metadata"].get("deletionTimestamp"):
                return None, f'persistentvolumeclaim "{name}" is being deleted'
        limits = spec["containers"][0].get("resources", {}).get("limits", {})
        gpu_resource = next((r for r in limits if r.startswith("nvidia.com/")), None)
        wanted = int(limits.get(gpu_resource, 0)) if gpu_resource else 0
        nodes = sorted(self.store.iter("nodes"), key=lambda n: n["metadata"]["name"])
        if not nodes:
            return f"fake-node-{int(pod['metadata']['annotations'][INDEX])}", ""
        bound = [
            other
            for other in self.store.iter("pods")
            if other["spec"].get("nodeName") and not _terminal(other)
        ]
        used: dict[str, int] = defaultdict(int)
        for other in bound:
            if gpu_resource:
                used[other["spec"]["nodeName"]] += _requested(other, gpu_resource)
        reasons: Counter[str] = Counter()
        for node in nodes:
            why = self._unfit(pod, node, bound, used, gpu_resource, wanted)
            if why is None:
                return node["metadata"]["name"], ""
            reasons[why] += 1
        summary = ", ".join(sorted(f"{count} {why}" for why, count in reasons.items()))
        return None, f"0/{len(nodes)} nodes are available: {summary}."

    def _unfit(
        self,
        pod: dict,
        node: dict,
        bound: list[dict],
        used: dict[str, int],
        gpu_resource: str | None,
        wanted: int,
    ) -> str | None:
        """Why the scheduler would not put ``pod`` on ``node``, in its words; None if fine."""
        spec, name = pod["spec"], node["metadata"]["name"]
        labels = node["metadata"].get("labels", {})
        # The scheduler's NodeUnschedulable filter: a cordoned node takes only the pods that
        # tolerate the taint the cordon is mirrored as (DaemonSets do).
        cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        if node["spec"].get("unschedulable") and not _tolerated(
            spec.get("tolerations") or [], cordon
        ):
            return "node(s) were unschedulable"
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
                spec.get("tolerations") or [], taint
            ):
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        selector = spec.get("nodeSelector") or {}
        required = (
            ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
            or {}
        ).get("nodeSelectorTerms")
        if any(labels.get(k) != v for k, v in selector.items()) or (
            required and not any(_term_matches(term, node) for term in required)
        ):
            return "node(s) didn't match Pod's node affinity/selector"
        if gpu_resource:
            free = int(node["status"]["allocatable"].get(gpu_resource, 0)) - used[name]
            if free < wanted:
                return f"Insufficient {gpu_resource}"
        if _anti_affinity_conflict(pod, node, bound, self.store):
            return "node(s) didn't match pod anti-affinity rules"
        return None

    def _terminate(self, pod: dict, exit_code: int, reason: str, message: str) -> None:
        status = pod["status"]
        previous = status.get("containerStatuses", [{}])[0].get("state", {})
        started = (previous.get("running") or {}).get("startedAt") or self.clock.stamp()
        terminated = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": self.clock.stamp(),
        }
        if message:
            terminated["message"] = message
        status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        status["containerStatuses"] = [_container(pod, {"terminated": terminated})]
        status["conditions"] = [c for c in status.get("conditions", []) if c["type"] != "Ready"]

    # --- injections ------------------------------------------------------------------------

    def _take(self, job: dict, kinds: set[str], rank: int | None = None) -> Injection | None:
        queue = self.injections.get(job["metadata"]["name"], [])
        for injection in queue:
            if injection.kind in kinds and (rank is None or injection.rank == rank):
                queue.remove(injection)
                return injection
        return None

    def _apply_job_injections(self, job: dict) -> None:
        if self._take(job, {"deadline"}):
            deadline = job["spec"].get("activeDeadlineSeconds") or 0
            job["status"]["startTime"] = self.clock.stamp(
                self.clock.now - timedelta(seconds=deadline)
            )

    def _apply_pod_injection(self, job: dict, pod: dict, rank: int) -> bool:
        status = pod["status"]
        state = (status.get("containerStatuses") or [{}])[0].get("state", {})
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if "waiting" in state and state["waiting"].get("reason") == "ContainerCreating":
            injection = self._take(job, {"image_pull"}, rank)
            if injection:
                image = pod["spec"]["containers"][0]["image"]
                state["waiting"] = {
                    "reason": "ErrImagePull",
                    "message": injection.message
                    or f'failed to pull and unpack image "{image}": not found',
                }
                self._event(pod, "Warning", "Failed", state["waiting"]["message"])
                return True
        if not pod["spec"].get("nodeName"):
            return False
        injection = self._take(job, {"preempt", "evict", "node_loss"}, rank)
        if injection:
            if injection.kind == "node_loss":
                self._mark_node_lost(pod["spec"]["nodeName"])
                reason, message = (
                    "DeletionByTaintManager",
                    "Taint manager: deleting due to NoExecute taint",
                )
                self._terminate(
                    pod,
                    137,
                    "ContainerStatusUnknown",
                    "The container could not be located when the pod was terminated",
                )
            else:
                reason, message = (
                    (
                        "PreemptionByScheduler",
                        "default-scheduler: preempting to accommodate a higher priority pod",
                    )
                    if injection.kind == "preempt"
                    else ("EvictionByEvictionAPI", "Eviction API: evicting")
                )
                self._terminate(pod, 143, "Error", "")
            status["conditions"].append(
                _cond("DisruptionTarget", "True", reason, message, self.clock)
            )
            self._event(pod, "Warning", reason, message)
            return True
        if "running" not in state:
            return False
        injection = self._take(job, {"oom", "oom_gpu", "exit"}, rank)
        if injection is None:
            return False
        if injection.kind == "oom":
            self.logs[key].append("Killed")
            self._terminate(pod, 137, "OOMKilled", injection.message)
        elif injection.kind == "oom_gpu":
            self.logs[key].extend(GPU_OOM_LOG)
            self._terminate(pod, 1, "Error", "\n".join(GPU_OOM_LOG))
        else:
            self.logs[key].append(injection.message or f"exiting with {injection.exit_code}")
            self._terminate(pod, injection.exit_code or 1, "Error", injection.message)
        return True

    def _mark_node_lost(self, name: str) -> None:
        node = self.store.find("nodes", "", name)
        if node is None:
            return
        node["status"]["conditions"] = [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
        ]
        node["spec"]["taints"] = [
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        ]
        self.store.touch("nodes", node)

    # --- failure policy --------------------------------------------------------------------

    def _apply_failure_policy(self, job: dict, pods: list[dict]) -> bool:
        """Judge newly failed pods as the job controller does; True if the Job failed."""
        spec = job["spec"]
        uid = job["metadata"]["uid"]
        judged = self._judged[uid]
        for pod in pods:
            name = pod["metadata"]["name"]
            if _phase(pod) != "Failed" or name in judged:
                continue
            judged.add(name)
            action, index, why = self._match_rule(spec.get("podFailurePolicy") or {}, pod)
            if action == "Ignore":
                continue
            if action == "FailJob":
                self._fail(
                    job,
                    pods,
                    "PodFailurePolicy",
                    f"{why} matching FailJob rule at index {index}",
                )
                return True
            self._failures[uid] += 1
            limit = spec.get("backoffLimit")
            if self._failures[uid] > (6 if limit is None else limit):
                self._fail(
                    job, pods, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )
                return True
        return False

    def _match_rule(self, policy: dict, pod: dict) -> tuple[str | None, int, str]:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
        terminated = pod["status"]["containerStatuses"][0]["state"].get("terminated", {})
        container = pod["status"]["containerStatuses"][0]["name"]
        for index, rule in enumerate(policy.get("rules") or []):
            for wanted in rule.get("onPodConditions") or []:
                condition = conditions.get(wanted["type"])
                if condition and condition["status"] == wanted.get("status", "True"):
                    return (
                        rule["action"],
                        index,
                        f"Pod {namespace}/{name} has condition {wanted['type']}",
                    )
            on_exit = rule.get("onExitCodes")
            if on_exit and terminated and on_exit.get("containerName") in (None, container):
                code = terminated.get("exitCode", 0)
                inside = code in on_exit["values"]
                if code != 0 and inside == (on_exit["operator"] == "In"):
                    return (
                        rule["action"],
                        index,
                        f"Container {container} for pod {namespace}/{name} failed with "
                        f"exit code {code}",
                    )
        return None, -1, ""

    def _fail(self, job: dict, pods: list[dict], reason: str, message: str) -> None:
        # The job controller deletes the pods still running; they are gone after their
        # grace period (the next step), so they never look like failures of their own.
        for pod in pods:
            if not _terminal(pod):
                self.store.mark_deleted("pods", pod)
        status = job["status"]
        self._set_condition(job, "FailureTarget", reason, message)
        self._set_condition(job, "Failed", reason, message)
        status["active"] = 0
        status["failed"] = sum(1 for p in pods if _phase(p) == "Failed")
        self._event(job, "Warning", reason, message)
        self.store.touch("jobs", job)

    # --- helpers ---------------------------------------------------------------------------

    def _set_condition(
        self, job: dict, kind: str, reason: str, message: str, status: str = "True"
    ) -> None:
        conditions = job["status"].setdefault("conditions", [])
        now = self.clock.stamp()
        for condition in conditions:
            if condition["type"] == kind:
                condition.update(
                    status=status,
                    reason=reason,
                    message=message,
                    lastTransitionTime=now,
                    lastProbeTime=now,
                )
                return
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastProbeTime": now,
                "lastTransitionTime": now,
            }
        )

    def _event(self, obj: dict, kind: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        now = self.clock.stamp()
        self.store.create(
            "events",
            meta["namespace"],
            {
                "metadata": {"name": f"{meta['name']}.{self.store.next_name():x}"},
                "involvedObject": {
                    "kind": obj.get("kind", ""),
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta.get("uid", ""),
                    "apiVersion": obj.get("apiVersion", ""),
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": "gantry-fake-controller"},
            },
        )


def _copy(value):
    return copy.deepcopy(value)


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _phase(pod: dict) -> str:
    return pod.get("status", {}).get("phase", "Pending")


def _terminal(pod: dict) -> bool:
    return _phase(pod) in ("Succeeded", "Failed")


def _condition(job: dict, kind: str) -> dict | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition["type"] == kind and condition["status"] == "True":
            return condition
    return None


def _cond(kind: str, status: str, reason: str, message: str, clock) -> dict:
    condition = {"type": kind, "status": status, "lastTransitionTime": clock.stamp()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _container(pod: dict, state: dict, ready: bool = False) -> dict:
    container = pod["spec"]["containers"][0]
    return {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": "running" in state,
        "state": state,
    }


def _ranges(indexes: list[int]) -> str:
    parts, start = [], None
    for i, index in enumerate(indexes):
        if start is None:
            start = index
        if i + 1 == len(indexes) or indexes[i + 1] != index + 1:
            parts.append(str(start) if start == index else f"{start}-{index}")
            start = None
    return ",".join(parts)


def _requested(pod: dict, resource: str) -> int:
    """What a pod's containers request of ``resource`` (an extended resource given only
    as a limit is requested at the limit)."""
    total = 0
    for container in pod["spec"].get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(
            resource, (resources.get("limits") or {}).get(resource, 0)
        )
        total += int(value)
    return total


def _tolerated(tolerations: list[dict], taint: dict) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


def _requirement_matches(requirement: dict, value: str | None) -> bool:
    op, values = requirement["operator"], requirement.get("values") or []
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and value.isdigit():
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    return False


def _term_matches(term: dict, node: dict) -> bool:
    """A node selector term: all its label expressions and fields (only metadata.name)."""
    labels = node["metadata"].get("labels", {})
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_requirement_matches(r, labels.get(r["key"])) for r in expressions) and all(
        r["key"] == "metadata.name" and _requirement_matches(r, node["metadata"]["name"])
        for r in fields
    )


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(
        _requirement_matches(r, labels.get(r["key"]))
        for r in selector.get("matchExpressions") or []
    )


def _anti_terms(pod: dict) -> list[dict]:
    affinity = pod["spec"].get("affinity") or {}
    anti = affinity.get("podAntiAffinity") or {}
    return anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []


def _anti_affinity_conflict(pod: dict, node: dict, bound: list[dict], store: Store) -> bool:
    """Whether a bound pod in the same topology domain as ``node`` is one ``pod`` must
    avoid, or one that must avoid ``pod`` (required anti-affinity works both ways)."""
    node_labels = node["metadata"].get("labels", {})

    def domain(other: dict, key: str) -> str | None:
        other_node = store.find("nodes", "", other["spec"]["nodeName"])
        return None if other_node is None else other_node["metadata"]["labels"].get(key)

    def conflicts(holder: dict, target: dict, key: str, term: dict) -> bool:
        namespaces = term.get("namespaces") or [holder["metadata"]["namespace"]]
        return (
            target["metadata"]["namespace"] in namespaces
            and _selects(term.get("labelSelector") or {}, target["metadata"].get("labels", {}))
            and node_labels.get(key) is not None
        )

    for other in bound:
        if other is pod:
            continue
        for term in _anti_terms(pod):
            key = term["topologyKey"]
            if conflicts(pod, other, key, term) and domain(other, key) == node_labels.get(key):
                return True
        for term in _anti_terms(other):
            key = term["topologyKey"]
            if conflicts(other, pod, key, term) and domain(other, key) == node_labels.get(key):
                return True
    return False
