"""Usage tallies the admission cycle and the budgets read: fair-share usage, GPU-hours per
tenant and month, budget alerts. Models of the ``jobs`` app (``jobs.models`` exports them),
apart so that module stays readable."""

from django.db import models

from tenants.models import GpuFlavor, Tenant


class FairShareUsage(models.Model):
    """GPU-seconds used by a tenant on a flavor, decayed with a half-life: fair-share input."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.CASCADE, related_name="+")
    decayed_gpu_seconds = models.FloatField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "flavor"], name="fair_share_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.flavor_id} {self.decayed_gpu_seconds:.0f} GPU-s"


class TenantMonthUsage(models.Model):
    """Allocated GPU-seconds of finished attempts per tenant, flavor and calendar month (UTC).

    Written in the same transaction that finishes an attempt, so budgets never double-count;
    running attempts are added live on top of it.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.CASCADE, related_name="+")
    month = models.DateField(help_text="First day of the month")
    gpu_seconds = models.FloatField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "flavor", "month"], name="tenant_month_usage_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.flavor_id} {self.month:%Y-%m} {self.gpu_seconds:.0f} GPU-s"


class BudgetAlert(models.Model):
    """A budget threshold crossed by a tenant on a flavor in one month: notified once.

    The unique constraint is the claim: of two checks racing on the same threshold, only
    the one whose insert succeeds notifies anyone.
    """

    class Threshold(models.IntegerChoices):
        WARNING = 80, "80 %"
        SPENT = 100, "100 %"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.CASCADE, related_name="+")
    month = models.DateField(help_text="First day of the month")
    threshold = models.PositiveSmallIntegerField(choices=Threshold.choices)
    budget_gpu_hours = models.PositiveIntegerField()
    used_gpu_hours = models.FloatField()
    sent_at = models.DateTimeField()

    class Meta:
        ordering = ["-month", "tenant", "flavor", "threshold"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "flavor", "month", "threshold"], name="budget_alert_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.flavor_id} {self.month:%Y-%m} {self.threshold} %"
