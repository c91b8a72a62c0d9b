from core.types import UserLike
from images.access import image_list_browsable, registry_list_manageable
from images.models import Image, Registry
from tenants.access import require_platform_admin


def image_get_viewable(*, user: UserLike, image_id: int) -> Image:
    """An image of the catalog the user may read; DoesNotExist alike for missing and hidden ones."""
    return image_list_browsable(user=user).get(pk=image_id)


def image_get_manageable(*, user: UserLike, image_id: int) -> Image:
    """An image a platform admin may change; NotVisible for everyone else."""
    require_platform_admin(user)
    return image_get_viewable(user=user, image_id=image_id)


def registry_get_manageable(*, user: UserLike, name: str) -> Registry:
    return registry_list_manageable(user=user).get(name=name)


def registry_for_repository(repository: str) -> tuple[Registry | None, str]:
    """The enabled registry whose host starts `repository`, and the path inside it."""
    host, slash, path = repository.partition("/")
    if not slash:
        return None, ""
    registry = Registry.objects.filter(host=host.lower(), enabled=True).first()
    return registry, path if registry else ""
