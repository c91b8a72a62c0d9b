from django.db.models import Q, QuerySet
from django.http import Http404

from images.models import Image, Registry
from tenants.models import Tenant
from tenants.roles import is_platform_admin
from tenants.selectors import require_platform_admin, tenant_list_submittable


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


def image_list_browsable(*, user) -> QuerySet[Image]:
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


def image_get_viewable(*, user, image_id: int) -> Image:
    """An image of the catalog the user may read; 404 alike for missing and hidden ones."""
    image = image_list_browsable(user=user).filter(pk=image_id).first()
    if image is None:
        raise Http404("No such image")
    return image


def image_get_manageable(*, user, image_id: int) -> Image:
    """An image a platform admin may change; 404 for everyone else."""
    require_platform_admin(user)
    return image_get_viewable(user=user, image_id=image_id)


def registry_list_manageable(*, user) -> QuerySet[Registry]:
    require_platform_admin(user)
    return Registry.objects.all()


def registry_get_manageable(*, user, name: str) -> Registry:
    registry = registry_list_manageable(user=user).filter(name=name).first()
    if registry is None:
        raise Http404("No such registry")
    return registry
