"""In-app messages to one person."""

from datetime import datetime

from django.utils import timezone

from core.types import UserLike, signed_in
from tenants.models import Notification, Tenant


def notification_mark_all_read(*, user: UserLike) -> int:
    """Mark every unread notification of the user read; returns how many changed."""
    return Notification.objects.filter(user=signed_in(user), read_at__isnull=True).update(
        read_at=timezone.now()
    )


def notification_create(
    *, user: UserLike, tenant: Tenant | None, kind: Notification.Kind, message: str, now: datetime
) -> Notification:
    """An in-app message to one user, dated ``now``."""
    return Notification.objects.create(
        user=signed_in(user), tenant=tenant, kind=kind, message=message, created_at=now
    )
