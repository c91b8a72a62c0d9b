"""GPU flavors, and each tenant's quota of a flavor: its guarantee, borrow limit,
per-run limit, budget and fair-share weight."""

from collections.abc import Collection
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import IntegrityError, transaction

from core.types import UserLike
from tenants.models import GpuFlavor, Quota, Tenant, is_whole_number, max_length_of
from tenants.services.audit import audit_record, audit_snapshot

# Upper bound of the integer columns quotas and flavors are stored in (PostgreSQL integer).
MAX_STORED_INT = 2**31 - 1
QUOTA_FIELDS = (
    "guaranteed_gpus",
    "borrow_limit_gpus",
    "max_gpus_per_run",
    "monthly_gpu_hour_budget",
    "budget_mode",
    "fair_share_weight",
)


def _check_int(
    errors: dict[str, list[str]], name: str, value, *, minimum: int, optional: bool = False
) -> None:
    """A whole number in [minimum, MAX_STORED_INT]; None too when ``optional``."""
    if value is None and optional:
        return
    if not is_whole_number(value):
        errors.setdefault(name, []).append("Enter a whole number.")
    elif value < minimum:
        errors.setdefault(name, []).append(f"Must be at least {minimum}.")
    elif value > MAX_STORED_INT:
        errors.setdefault(name, []).append(f"At most {MAX_STORED_INT}.")


@transaction.atomic
def quota_update(
    *,
    tenant: Tenant,
    flavor: GpuFlavor,
    guaranteed_gpus: int,
    borrow_limit_gpus: int,
    max_gpus_per_run: int | None,
    monthly_gpu_hour_budget: int | None,
    budget_mode: str,
    fair_share_weight: int,
    offered_flavors: Collection[str] | None,
    actor: UserLike,
) -> Quota:
    """Create or replace the quota of ``tenant`` for ``flavor``; audited as "quota.update".

    ``max_gpus_per_run`` None means no per-run limit, ``monthly_gpu_hour_budget`` None no
    budget. ``offered_flavors`` are the slugs of flavors some enabled cluster offers: a
    borrow limit on any other flavor is refused. Pass None only where the borrow limit is
    not being changed. Lowering the guarantee below what running runs hold is allowed: they
    keep running, and the caller shows the difference. Raises ValidationError naming every
    bad field; nothing is written then.
    """
    values = {
        "guaranteed_gpus": guaranteed_gpus,
        "borrow_limit_gpus": borrow_limit_gpus,
        "max_gpus_per_run": max_gpus_per_run,
        "monthly_gpu_hour_budget": monthly_gpu_hour_budget,
        "budget_mode": budget_mode,
        "fair_share_weight": fair_share_weight,
    }
    errors: dict[str, list[str]] = {}
    _check_int(errors, "guaranteed_gpus", guaranteed_gpus, minimum=0)
    _check_int(errors, "borrow_limit_gpus", borrow_limit_gpus, minimum=0)
    _check_int(errors, "max_gpus_per_run", max_gpus_per_run, minimum=1, optional=True)
    _check_int(errors, "monthly_gpu_hour_budget", monthly_gpu_hour_budget, minimum=0, optional=True)
    _check_int(errors, "fair_share_weight", fair_share_weight, minimum=1)
    if budget_mode not in Quota.BudgetMode.values:
        errors.setdefault("budget_mode", []).append(
            f"Choose one of: {', '.join(Quota.BudgetMode.values)}."
        )
    if (
        "borrow_limit_gpus" not in errors
        and borrow_limit_gpus > 0
        and offered_flavors is not None
        and flavor.slug not in offered_flavors
    ):
        errors.setdefault("borrow_limit_gpus", []).append(
            f"No enabled cluster offers {flavor.slug}: there are no idle GPUs to borrow."
        )
    if errors:
        raise ValidationError(errors)

    quota = Quota.objects.select_for_update().filter(tenant=tenant, flavor=flavor).first()
    before = None if quota is None else audit_snapshot(quota, only=QUOTA_FIELDS)
    if quota is not None and before == values:
        return quota
    if quota is None:
        quota = Quota.objects.create(tenant=tenant, flavor=flavor, **values)
    else:
        for name, value in values.items():
            setattr(quota, name, value)
        quota.save(update_fields=list(QUOTA_FIELDS))
    audit_record(
        actor=actor,
        action="quota.update",
        target=f"{tenant.slug}:{flavor.slug}",
        tenant=tenant,
        before=before,
        after=values,
    )
    return quota


@transaction.atomic
def quota_set(*, tenant: Tenant, flavor: GpuFlavor, guaranteed_gpus: int, actor: UserLike) -> Quota:
    """Change only the guarantee, keeping the rest of the quota (defaults for a new one)."""
    quota = Quota.objects.select_for_update().filter(tenant=tenant, flavor=flavor).first()
    current = {name: getattr(quota or Quota(), name) for name in QUOTA_FIELDS}
    current["guaranteed_gpus"] = guaranteed_gpus
    return quota_update(tenant=tenant, flavor=flavor, offered_flavors=None, actor=actor, **current)


FLAVOR_FIELDS = ("name", "memory_gb", "gpu_fraction")
# Like tenant slugs, plus dots: MIG slices are named like a100-1g.10gb.
flavor_slug_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$",
    "Use 1-63 lowercase letters, digits, dots and dashes, starting and ending with a letter "
    "or digit.",
)
_FRACTION_QUANTUM = Decimal("0.0001")


def _flavor_errors(*, name: str, memory_gb: int, gpu_fraction) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    limit = max_length_of(GpuFlavor, "name")
    if not isinstance(name, str) or not name.strip():
        errors["name"] = ["A name is required."]
    elif len(name) > limit or "\x00" in name:
        errors["name"] = [f"At most {limit} characters, no NUL characters."]
    _check_int(errors, "memory_gb", memory_gb, minimum=1)
    if (
        not isinstance(gpu_fraction, Decimal)
        or not gpu_fraction.is_finite()
        or not Decimal(0) < gpu_fraction <= Decimal(1)
    ):
        errors["gpu_fraction"] = ["A fraction of a full GPU: more than 0 and at most 1."]
    elif gpu_fraction != gpu_fraction.quantize(_FRACTION_QUANTUM):
        errors["gpu_fraction"] = ["At most 4 decimal places."]
    return errors


@transaction.atomic
def flavor_create(
    *, slug: str, name: str, memory_gb: int, gpu_fraction: Decimal, actor: UserLike
) -> GpuFlavor:
    """A new GPU flavor (a full device or a MIG slice); audited as "flavor.create"."""
    errors = _flavor_errors(name=name, memory_gb=memory_gb, gpu_fraction=gpu_fraction)
    try:
        flavor_slug_validator(slug)
    except ValidationError as exc:
        errors["slug"] = exc.messages
    else:
        if GpuFlavor.objects.filter(slug=slug).exists():
            errors["slug"] = ["A flavor with this slug exists already."]
    if errors:
        raise ValidationError(errors)
    try:
        with transaction.atomic():
            flavor = GpuFlavor.objects.create(
                slug=slug, name=name.strip(), memory_gb=memory_gb, gpu_fraction=gpu_fraction
            )
    except IntegrityError:  # created concurrently since the check above
        raise ValidationError({"slug": ["A flavor with this slug exists already."]}) from None
    audit_record(
        actor=actor,
        action="flavor.create",
        target=slug,
        after={"slug": slug, **audit_snapshot(flavor, only=FLAVOR_FIELDS)},
    )
    return flavor


@transaction.atomic
def flavor_update(
    *, flavor: GpuFlavor, name: str, memory_gb: int, gpu_fraction: Decimal, actor: UserLike
) -> GpuFlavor:
    """Change a flavor's name, memory and GPU fraction; audited as "flavor.update".

    The slug stays: cluster settings, inventories, quotas and reports refer to it.
    """
    errors = _flavor_errors(name=name, memory_gb=memory_gb, gpu_fraction=gpu_fraction)
    if errors:
        raise ValidationError(errors)
    flavor = GpuFlavor.objects.select_for_update().get(pk=flavor.pk)
    before = audit_snapshot(flavor, only=FLAVOR_FIELDS)
    flavor.name, flavor.memory_gb, flavor.gpu_fraction = name.strip(), memory_gb, gpu_fraction
    after = audit_snapshot(flavor, only=FLAVOR_FIELDS)
    if after != before:
        flavor.save(update_fields=list(FLAVOR_FIELDS))
        audit_record(
            actor=actor, action="flavor.update", target=flavor.slug, before=before, after=after
        )
    return flavor
