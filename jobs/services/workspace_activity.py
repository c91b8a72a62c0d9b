"""The workspace proxy's evidence of use: the latest traffic it relayed to a workspace."""

from django.db.models import Q
from django.utils import timezone

from jobs.models import Workspace


def workspace_proxy_activity_record(*, run_id: int) -> None:
    """Workspace ``run_id`` had traffic through the proxy now. Never moves the time back
    (several proxy processes may record one workspace); one UPDATE, no read."""
    now = timezone.now()
    Workspace.objects.filter(
        Q(proxy_activity_at__isnull=True) | Q(proxy_activity_at__lt=now), run_id=run_id
    ).update(proxy_activity_at=now)
