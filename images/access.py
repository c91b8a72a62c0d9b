"""Which images and registries a user or tenant may see and use: images' one access module.

Built on ``tenants.access``; lookups outside these querysets raise DoesNotExist (404 at the
edge, ``core.http.or_404``).
"""

from django.db.models import Q, QuerySet

from core.types import UserLike
from images.models import Image, Registry
from tenants.access import is_platform_admin, require_platform_admin, tenant_list_submittable
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


def image_list_browsable(*, user: UserLike) -> QuerySet[Image]:
    """The catalog as the user may read it: everything for platform admins; for everyone
    else the approved images visible to all or allow-listed for one of their tenants."""
    images = Image.objects.select_related("registry")
    if is_platform_admin(user):
        return images
    allowed = Image.allowed_tenants.through.objects.filter(
        tenant__in=tenant_list_submittable(user=user)
    ).values("image_id")
    return images.filter(status=Image.Status.APPROVED).filter(
        Q(visible_to_all=True) | Q(pk__in=allowed)
    )


def registry_list_manageable(*, user: UserLike) -> QuerySet[Registry]:
    require_platform_admin(user)
    return Registry.objects.all()
