"""The image catalog: images imported from a registry, reviewed (approved or blocked),
shown to every tenant or to some, and re-checked against their registry."""

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core.types import UserLike
from images.models import Image, Registry
from images.oci import (
    RegistryAuthError,
    RegistryError,
    RegistryNotFound,
    RegistryUnavailable,
    ResolvedImage,
    validate_digest,
    validate_repository,
    validate_tag,
)
from images.selectors import registry_for_repository
from images.services.registries import (
    CatalogRegistryClient,
    RegistryMisconfigured,
    registry_client_for,
    unreachable_message,
)
from tenants.models import Tenant, max_length_of
from tenants.services.audit import audit_record

logger = logging.getLogger(__name__)

AUDIT_TARGET_LENGTH = 200


@dataclass(frozen=True)
class ImageReference:
    """What an admin typed to import, parsed: the path inside the registry and a tag or digest."""

    path: str
    tag: str = ""
    digest: str = ""


def parse_reference(reference: str, *, host: str) -> ImageReference:
    """`team/pytorch:2.4` or `team/pytorch@sha256:…` (the registry host may lead it).

    Raises ValueError with a message for the form.
    """
    reference = (reference or "").strip()
    if reference.startswith(f"{host}/"):
        reference = reference[len(host) + 1 :]
    name, at, digest = reference.partition("@")
    if at:
        if ":" in name.rpartition("/")[2]:
            raise ValueError("Give a tag or a digest, not both.")
        validate_repository(name)
        validate_digest(digest)
        return ImageReference(path=name, digest=digest)
    name, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        raise ValueError("Add a tag or a digest: team/pytorch:2.4 or team/pytorch@sha256:<64 hex>.")
    validate_repository(name)
    validate_tag(tag)
    return ImageReference(path=name, tag=tag)


def _ask(registry: Registry, call: Callable[[CatalogRegistryClient], ResolvedImage], *, what: str):
    """Run one registry call; every failure becomes a ValidationError by field."""
    try:
        with registry_client_for(registry) as client:
            return call(client)
    except RegistryNotFound:
        raise ValidationError(
            {"reference": [f"{what} does not exist on {registry.name} ({registry.host})."]}
        ) from None
    except RegistryUnavailable as exc:
        raise ValidationError({"reference": [unreachable_message(exc)]}) from None
    except RegistryAuthError as exc:
        raise ValidationError(
            {
                "registry": [
                    f"{exc}. Check the username and the password variable of {registry.name}."
                ]
            }
        ) from None
    except RegistryMisconfigured as exc:
        raise ValidationError({"registry": [f"{exc}."]}) from None
    except RegistryError as exc:
        raise ValidationError({"reference": [str(exc)]}) from None


def _audit_target(image: Image) -> str:
    reference = image.reference
    return reference if len(reference) <= AUDIT_TARGET_LENGTH else "…" + reference[-199:]


def _described(resolved: ResolvedImage) -> dict:
    config = resolved.config
    assert config is not None
    return {
        "media_type": resolved.media_type[:100],
        "architecture": config.architecture[:32],
        "os": config.os[:32],
        "created": config.created,
        "size_bytes": resolved.size,
        "labels": config.labels,
        "cuda_version": (config.cuda_version or "")[:64],
        "nccl_version": (config.nccl_version or "")[:64],
        "frameworks": config.frameworks,
    }


def image_import(
    *, registry: Registry, reference: str, actor: UserLike, description: str = ""
) -> tuple[Image, bool]:
    """Import `path:tag` or `path@sha256:…` from the registry, pending review.

    Asks the registry first, outside any transaction, then writes. An image already in the
    catalog keeps its status and visibility; its description and tag last seen are updated.
    Returns the image and whether it is new; audited as "image.import". Raises
    ValidationError naming "reference" or "registry"; nothing is saved then.
    """
    if not registry.enabled:
        raise ValidationError({"registry": ["This registry is disabled."]})
    limit = max_length_of(Image, "description")
    if len(description) > limit or "\x00" in description:
        raise ValidationError({"description": [f"At most {limit} characters."]})
    try:
        parsed = parse_reference(reference, host=registry.host)
    except ValueError as exc:
        raise ValidationError({"reference": [str(exc)]}) from None
    repository = f"{registry.host}/{parsed.path}"
    if len(repository) > max_length_of(Image, "repository"):
        raise ValidationError({"reference": ["The full image name is longer than 255 characters."]})
    if parsed.tag:
        what = f"{parsed.path}:{parsed.tag}"
        resolved = _ask(registry, lambda client: client.resolve(parsed.path, parsed.tag), what=what)
    else:
        what = f"{parsed.path}@{parsed.digest}"
        resolved = _ask(
            registry, lambda client: client.inspect(parsed.path, parsed.digest), what=what
        )
    if resolved.config is None:
        raise ValidationError(
            {"reference": [f"{what} is not a container image: it has no image config."]}
        )
    described = _described(resolved)
    now = timezone.now()
    checked = {
        "last_checked_at": now,
        "check_status": Image.CheckStatus.OK,
        "check_message": f"Imported {what}.",
    }
    with transaction.atomic():
        image, created = Image.objects.select_for_update().get_or_create(
            repository=repository,
            digest=resolved.digest,
            defaults={
                "registry": registry,
                "tag": parsed.tag,
                "description": description,
                **described,
                **checked,
            },
        )
        before = None
        if not created:
            before = {"tag": image.tag, "description": image.description}
            image.registry = registry
            image.tag = parsed.tag or image.tag
            image.description = description or image.description
            for name, value in {**described, **checked}.items():
                setattr(image, name, value)
            image.save(update_fields=["registry", "tag", "description", *described, *checked])
        audit_record(
            actor=actor,
            action="image.import",
            target=_audit_target(image),
            before=before,
            after={
                "registry": registry.name,
                "tag": image.tag,
                "description": image.description,
                **({"status": image.status} if created else {}),
            },
        )
    logger.info("imported %s (new: %s)", image.reference, created)
    return image, created


@transaction.atomic
def image_set_status(*, image: Image, status: str, actor: UserLike) -> Image:
    """Approve or block an image; audited as "image.status" when it changes.

    An image whose digest the last re-check found missing cannot be approved.
    """
    if status not in (Image.Status.APPROVED, Image.Status.BLOCKED):
        raise ValidationError({"status": ["Choose approved or blocked."]})
    image = Image.objects.select_for_update().get(pk=image.pk)
    if status == Image.Status.APPROVED and image.check_status == Image.CheckStatus.MISSING:
        raise ValidationError(
            {"status": ["Its digest no longer exists on the registry: it cannot be approved."]}
        )
    if image.status == status:
        return image
    before = {"status": image.status}
    image.status = status
    image.save(update_fields=["status"])
    audit_record(
        actor=actor,
        action="image.status",
        target=_audit_target(image),
        before=before,
        after={"status": status},
    )
    return image


def _visibility(image: Image) -> dict:
    return {
        "visible_to_all": image.visible_to_all,
        "allowed_tenants": sorted(t.slug for t in image.allowed_tenants.all()),
    }


@transaction.atomic
def image_set_visibility(
    *, image: Image, visible_to_all: bool, allowed_tenants: Collection[Tenant], actor: UserLike
) -> Image:
    """Show the image to every tenant, or to the allow-listed ones only.

    The allow-list is kept either way (it applies again once the image is no longer visible
    to all). Audited as "image.visibility" when anything changes.
    """
    if not visible_to_all and not allowed_tenants:
        raise ValidationError(
            {"allowed_tenants": ["Choose at least one tenant, or make it visible to all."]}
        )
    image = Image.objects.select_for_update().get(pk=image.pk)
    before = _visibility(image)
    after = {
        "visible_to_all": visible_to_all,
        "allowed_tenants": sorted(t.slug for t in allowed_tenants),
    }
    if after == before:
        return image
    if image.visible_to_all != visible_to_all:
        image.visible_to_all = visible_to_all
        image.save(update_fields=["visible_to_all"])
    image.allowed_tenants.set(allowed_tenants)
    audit_record(
        actor=actor,
        action="image.visibility",
        target=_audit_target(image),
        before=before,
        after=after,
    )
    return image


def _check_against_registry(image: Image, registry: Registry, path: str) -> tuple[str, str]:
    """(check status, message) of the image as the registry serves it now."""
    try:
        with registry_client_for(registry) as client:
            try:
                client.inspect(path, image.digest)
            except RegistryNotFound:
                return (
                    Image.CheckStatus.MISSING,
                    f"{image.digest} no longer exists on {registry.name}; "
                    "runs of this image cannot pull it.",
                )
            if not image.tag:
                return Image.CheckStatus.OK, f"{image.digest} is still on {registry.name}."
            try:
                current = client.resolve(path, image.tag).digest
            except RegistryNotFound:
                return (
                    Image.CheckStatus.MOVED,
                    f"tag {image.tag} no longer exists; this image stays pinned to {image.digest}",
                )
    except RegistryError as exc:
        return Image.CheckStatus.ERROR, str(exc)
    if current != image.digest:
        return (
            Image.CheckStatus.MOVED,
            f"tag {image.tag} now points to {current}; this image stays pinned to {image.digest}",
        )
    return Image.CheckStatus.OK, f"tag {image.tag} still points to {image.digest}"


def image_recheck(*, image: Image, actor: UserLike) -> Image:
    """Ask the registry again whether the digest exists and where the tag points now.

    The stored digest never changes; the outcome goes to `check_status` (ok, moved, missing,
    or error when the registry could not answer) and `check_message`. Audited as
    "image.recheck". Raises ValidationError for an image no registry serves.
    """
    registry = image.registry
    path = image.registry_path
    if registry is None:
        registry, path = registry_for_repository(image.repository)
    if registry is None or not path:
        raise ValidationError(
            "No enabled registry serves this image's host: register one to re-check it."
        )
    if not registry.enabled:
        raise ValidationError(f"The registry {registry.name} is disabled: enable it to re-check.")
    status, message = _check_against_registry(image, registry, path)
    with transaction.atomic():
        image = Image.objects.select_for_update().get(pk=image.pk)
        before = {"check_status": image.check_status, "check_message": image.check_message}
        image.check_status, image.check_message = status, message
        image.last_checked_at = timezone.now()
        image.save(update_fields=["check_status", "check_message", "last_checked_at"])
        audit_record(
            actor=actor,
            action="image.recheck",
            target=_audit_target(image),
            before=before,
            after={"check_status": status, "check_message": message},
        )
    return image
