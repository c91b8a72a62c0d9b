"""What-if reports: a platform admin's proposal (quotas, nodes, admission settings) replayed
over a past window of recorded submissions, side by side with what happened (issue 38).

A report is a row first and a background task second: the row is written, then the task is
enqueued on commit; the task claims the row with a conditional UPDATE, writes its progress
and, at the end, the result. Who may read a report and which of its rows: ``policy.access``.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q

from tenants.models import Tenant


class ReplayReport(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The last sign of life of the worker running it (each progress write): a running report
    # whose heartbeat stopped lost its worker and may be claimed again.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The claim of the task that runs it now: only that task writes progress and the result.
    run_token = models.UUIDField(null=True, blank=True)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    # The proposal as policy.proposals reads it (validated before the row is written).
    proposal = models.JSONField()
    # Recorded submissions in the window when it was asked for, and the replay time they
    # were estimated to take.
    submissions = models.PositiveIntegerField()
    estimate_s = models.FloatField()
    # The warnings the platform admin confirmed (an overcommitted flavor), as shown.
    confirmed_warnings = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.FloatField(default=0.0)
    cancel_requested = models.BooleanField(default=False)
    # Actual and proposed outcomes, the comparison and the fidelity notes (policy.results).
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Shared: finance reads it, and the tenant admins of ``tenants`` read their rows.
    shared = models.BooleanField(default=False)
    # The tenants it concerns: those the proposal names and those with submissions in the
    # window (each tenant's admins see only their own tenant's rows).
    tenants = models.ManyToManyField(Tenant, blank=True, related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status"], name="replay_report_status")]
        constraints = [
            models.CheckConstraint(
                condition=Q(progress__gte=0.0, progress__lte=1.0), name="replay_progress_range"
            ),
            models.CheckConstraint(
                condition=Q(window_end__gt=models.F("window_start")), name="replay_window_order"
            ),
        ]

    def __str__(self) -> str:
        return f"what-if report {self.pk} ({self.status})"

    @property
    def ended(self) -> bool:
        return self.status in (self.Status.DONE, self.Status.FAILED, self.Status.CANCELLED)
