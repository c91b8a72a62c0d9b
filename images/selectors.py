from django.db.models import Q, QuerySet

from images.models import Image
from tenants.models import Tenant


def image_list_usable(*, tenant: Tenant) -> QuerySet[Image]:
    """Approved images the tenant may run: visible to all, or allow-listed for it."""
    return (
        Image.objects.filter(status=Image.Status.APPROVED)
        .filter(Q(visible_to_all=True) | Q(allowed_tenants=tenant))
        .distinct()
    )


def image_list_usable_by_tenants(*, tenants) -> QuerySet[Image]:
    return (
        Image.objects.filter(status=Image.Status.APPROVED)
        .filter(Q(visible_to_all=True) | Q(allowed_tenants__in=tenants))
        .distinct()
    )
