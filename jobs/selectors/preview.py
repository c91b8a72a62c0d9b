"""The submit form's preview: admission run on the current snapshot plus the run being
written, changing nothing."""

from dataclasses import dataclass, replace

from django.core.exceptions import ValidationError
from django.utils import timezone

from core.types import UserLike
from jobs import admission, admission_types, estimates
from jobs.models import TopologyMode
from jobs.selectors.estimates import start_preview
from jobs.selectors.queue import admission_snapshot
from jobs.selectors.refusals import resource_refusals
from tenants.access import tenant_list_submittable
from tenants.models import GpuFlavor


@dataclass(frozen=True)
class AdmissionPreview:
    """What the submit form shows before submitting: the quota picture and the verdict."""

    tenant: str
    flavor: str
    gpus: int
    guaranteed: int
    borrow_limit: int
    in_use: int
    idle: int  # idle GPUs of the flavor across enabled clusters
    budget_gpu_hours: float | None
    budget_used_gpu_hours: float
    budget_mode: str
    verdict: str  # "start", "borrow", "wait" or "cannot" (the submit would be refused)
    message: str
    start: str = ""  # when it would start, from the last start forecast, if it would wait

    @property
    def borrowable(self) -> int:
        """GPUs the tenant could borrow right now beyond its guarantee."""
        room = self.guaranteed + self.borrow_limit - max(self.in_use, self.guaranteed)
        return max(0, min(room, self.idle))

    @property
    def budget_left_gpu_hours(self) -> float | None:
        if self.budget_gpu_hours is None:
            return None
        return max(0.0, self.budget_gpu_hours - self.budget_used_gpu_hours)


def admission_preview(
    *,
    user: UserLike,
    tenant: str,
    flavor: str,
    nodes: int,
    gpus_per_node: int,
    priority: int = 50,
    topology_level: str = "",
    topology_required: bool = False,
) -> AdmissionPreview:
    """Run admission on the current snapshot plus this hypothetical run, changing nothing."""
    tenant_obj = tenant_list_submittable(user=user).filter(slug=tenant).first()
    if tenant_obj is None:
        raise ValidationError({"tenant": "Unknown tenant, or you are not a member."})
    if not GpuFlavor.objects.filter(slug=flavor).exists():
        raise ValidationError({"flavor": "Unknown GPU flavor."})
    refusals = resource_refusals(
        tenant=tenant_obj,
        flavor=flavor,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        topology_level=topology_level,
        topology_mode=TopologyMode.REQUIRED if topology_required else "",
    )
    now = timezone.now()
    snapshot, _ = admission_snapshot(now=now)
    probe = admission_types.QueuedRun(
        id=-1,
        tenant=tenant,
        flavor=flavor,
        nodes=max(1, nodes),
        gpus_per_node=max(1, gpus_per_node),
        priority=priority,
        submitted=now.timestamp(),
        topology_level=topology_level,
        topology_required=topology_required,
    )
    decisions = admission.decide(replace(snapshot, queued=(*snapshot.queued, probe)))
    key = (tenant, flavor)
    quota = snapshot.quotas.get(key) or admission_types.Quota(guaranteed=0)
    in_use = sum(r.gpus for r in snapshot.held if (r.tenant, r.flavor) == key)
    idle = admission.free_gpus(snapshot).get(flavor, 0)
    admit = next((a for a in decisions.admitted if a.run_id == -1), None)
    start = ""
    if refusals:
        verdict = "cannot"
        message = "Cannot run: " + " ".join(m for messages in refusals.values() for m in messages)
    elif admit is not None:
        verdict = "borrow" if admit.borrowed else "start"
        where = f"{admit.cluster} ({', '.join(admit.nodes)})"
        message = (
            f"Would start now on {where}, borrowing idle GPUs (preemptible)"
            if admit.borrowed
            else f"Would start now on {where}, within the tenant's guarantee"
        )
        if admit.over_budget:
            message += "; past the soft monthly budget, so it will be flagged"
    else:
        wait = next(w for w in decisions.waiting if w.run_id == -1)
        verdict = "wait"
        message = f"Would wait: {wait.message} (position {wait.position})"
        if wait.reason in estimates.STUCK:
            # Decided now, not by the stored forecast, which may predate it (a hard budget
            # spent since the last refresh would otherwise read as a start already past).
            start = f"no start estimate: {estimates.STUCK[wait.reason]}"
        else:
            preview = start_preview(probe=probe, snapshot=snapshot)
            if preview is not None:
                start = preview.summary(now=now)
    return AdmissionPreview(
        tenant=tenant,
        flavor=flavor,
        gpus=probe.gpus,
        guaranteed=quota.guaranteed,
        borrow_limit=quota.borrow_limit,
        in_use=in_use,
        idle=max(0, idle),
        budget_gpu_hours=quota.budget_gpu_hours,
        budget_used_gpu_hours=snapshot.budget_used.get(key, 0.0),
        budget_mode="hard" if quota.budget_hard else "soft",
        verdict=verdict,
        message=message,
        start=start,
    )
