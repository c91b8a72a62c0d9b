"""The submit form's preview: admission run on the current snapshot plus the run being
written, changing nothing."""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from django.core.exceptions import ValidationError
from django.utils import timezone

from core.types import UserLike
from jobs import admission, admission_types, estimates, shapes, spec
from jobs.models import StartForecast, TopologyMode
from jobs.selectors.estimates import forecast_of, start_preview, when
from jobs.selectors.queue import admission_snapshot
from jobs.selectors.refusals import resource_refusals
from jobs.selectors.templates import template_of_spec
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
    shapes: tuple["ShapeRow", ...] = ()  # the same run in other shapes, fastest first

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
        shapes=shape_rows(snapshot=snapshot, probe=probe, now=now),
    )


@dataclass(frozen=True)
class ShapeRow:
    """One shape of the run being written, as the preview's "Other shapes" table and the
    simulate API give it: when it would start if submitted now (``jobs.shapes``)."""

    shape: shapes.Shape
    asked: bool
    fastest: bool  # starts first of them all (ties included)
    expected: datetime | None  # None: no estimate, ``note`` says why
    full_limits: datetime | None  # if every run ahead uses its whole max runtime
    note: str
    now: bool  # admission would start it at once
    never: bool  # no quota or no cluster could ever hold it
    start: str  # as the table says it: "now", "about 14:00", "never: ..."


def shape_rows(
    *, snapshot: admission_types.Snapshot, probe: admission_types.QueuedRun, now: datetime
) -> tuple[ShapeRow, ...]:
    """``probe`` and a few other shapes of it (``jobs.shapes``), fastest first, from the
    stored start forecasts of the flavors the tenant may use: one query, no simulation."""
    flavors = {probe.flavor} | {
        flavor for tenant, flavor in snapshot.quotas if tenant == probe.tenant
    }
    forecasts = {
        stored.flavor.slug: (forecast_of(stored.expected), forecast_of(stored.latest))
        for stored in StartForecast.objects.filter(flavor__slug__in=flavors).select_related(
            "flavor"
        )
    }
    judged = shapes.shape_starts(snapshot, probe=probe, forecasts=forecasts)
    rows = []
    for each in judged:
        # As the preview's estimate reads: never before now, the expected never after the
        # start at full limits.
        full = _moment(each.full_limits.at, now=now)
        expected = _moment(each.expected.at, now=now)
        if expected is not None and full is not None:
            expected = min(expected, full)
        rows.append((each, expected, full))
    first = rows[0][1] if rows else None
    return tuple(
        ShapeRow(
            shape=each.shape,
            asked=each.asked,
            fastest=first is not None and expected == first,
            expected=expected,
            full_limits=full,
            note=each.expected.why,
            now=each.now,
            never=each.never,
            start=_start_text(each, expected=expected, full=full, now=now),
        )
        for each, expected, full in rows
    )


def _start_text(
    each: shapes.ShapeStart, *, expected: datetime | None, full: datetime | None, now: datetime
) -> str:
    if expected is None:
        return f"{'never' if each.never else 'no estimate'}: {each.expected.why}"
    text = "now" if expected <= now else f"about {when(expected, now=now)}"
    if full is not None and full > expected:
        text += f"; {when(full, now=now)} at full time limits"
    return text


def _moment(epoch: float | None, *, now: datetime) -> datetime | None:
    return None if epoch is None else max(datetime.fromtimestamp(epoch, tz=UTC), now)


def spec_preview(*, user: UserLike, document: object) -> AdmissionPreview:
    """The submit preview of a spec document (what ``POST /specs/`` would submit), its other
    shapes included, changing nothing. ValidationError names dotted spec fields: the spec's
    keys and types, its template, and the fields that decide where and when it starts (the
    tenant, flavor, shape and topology), judged as the submit judges them. The rest (image,
    command, ...) is checked by the submit only."""
    values, errors = spec.spec_parse(document)
    if values is None:
        raise ValidationError(errors)
    assert isinstance(document, Mapping)  # spec_parse refuses anything else
    name = spec.spec_template_name(document)
    if name is not None:
        template = template_of_spec(user=user, tenant=values.get("tenant", ""), name=name)
        if template is None:
            raise ValidationError(
                {"template": [f"No template {name} for tenant {values.get('tenant', '')}, "
                              "nor a global one."]}
            )  # fmt: skip
        defaults, _ = spec.template_values_parse(template.values)  # checked when saved
        values, errors = spec.template_apply(
            defaults or {}, template.locked, template.ranges, values, template_name=template.name
        )
        if errors:
            raise ValidationError(spec.errors_to_spec(errors))
    try:
        return admission_preview(
            user=user,
            tenant=values.get("tenant", ""),
            flavor=values.get("flavor", ""),
            nodes=values.get("nodes", 1),
            gpus_per_node=values.get("gpus_per_node", 1),
            priority=values.get("priority", 50),
            topology_level=values.get("topology_level", ""),
            topology_required=values.get("topology_mode", "") == TopologyMode.REQUIRED,
        )
    except ValidationError as exc:
        raise ValidationError(spec.errors_to_spec(exc.message_dict)) from None
