"""The end states of an attempt, and the finished attempts whose accounting is still to
compute, or to compute again."""

from django.db.models import Exists, F, OuterRef, Q, QuerySet

from jobs.models import Attempt, AttemptState
from telemetry.models import GpuMinute, SdkEvent, StepWindow

FINISHED_STATES = (
    AttemptState.SUCCEEDED,
    AttemptState.FAILED,
    AttemptState.PREEMPTED,
    AttemptState.LOST,
    AttemptState.CANCELLED,
)


def attempts_pending_accounting(*, limit: int) -> QuerySet[Attempt]:
    """Finished attempts without accounting, or with data newer than their accounting:
    step windows, SDK events or GPU minutes received since, a next attempt created since
    (it decides which checkpoint was resumed, hence the lost time), or a cause class
    other than the one the credit was computed with (stored after the accounting). Oldest
    first."""
    computed_at = OuterRef("accounting__computed_at")
    newer = (
        Exists(StepWindow.objects.filter(attempt=OuterRef("pk"), received_at__gt=computed_at))
        | Exists(SdkEvent.objects.filter(attempt=OuterRef("pk"), received_at__gt=computed_at))
        | Exists(GpuMinute.objects.filter(attempt=OuterRef("pk"), updated_at__gt=computed_at))
        | Exists(
            Attempt.objects.filter(
                run=OuterRef("run"),
                number=OuterRef("number") + 1,
                created_at__gt=computed_at,
            )
        )
    )
    return (
        Attempt.objects.filter(state__in=FINISHED_STATES, finished_at__isnull=False)
        .filter(Q(accounting__isnull=True) | newer | ~Q(accounting__cause_class=F("cause_class")))
        .select_related("run")
        .order_by("finished_at", "pk")[:limit]
    )
