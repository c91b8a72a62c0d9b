"""Every change to registries and images goes through here, and every one is audited.

Registries are called outside any database transaction: an import or a re-check asks the
registry first and then writes in one short transaction, so a slow registry never holds row
locks and a failed call leaves nothing half-saved. The one exception is resolving a tag at
submit time (`tag_resolve`, called inside `jobs.services.run_submit`): it uses a short
timeout for that reason.

Credentials are held by reference: a registry names the environment variable that holds its
password (`password_secret_ref`); the value is read from `os.environ` only when a client is
built and is never stored, logged, audited or shown.
"""

import logging
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.types import UserLike
from images.demo_registry import DEMO_REGISTRY_HOST, DemoRegistryTransport
from images.models import (
    MAX_REGISTRY_TIMEOUT_S,
    REGISTRY_HOST_PATTERN,
    SECRET_REF_PATTERN,
    Image,
    Registry,
)
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
from images.registry import RegistryClient
from images.selectors import registry_for_repository
from tenants.models import Tenant, max_length_of, slug_validator
from tenants.services.audit import audit_record, audit_snapshot

logger = logging.getLogger(__name__)

# Submitting resolves a tag inside the submit transaction: each registry request gets at most
# this long (a resolve makes two to four requests).
SUBMIT_TIMEOUT_S = 5
UNREACHABLE = "registry unreachable, try again"
AUDIT_TARGET_LENGTH = 200
REGISTRY_AUDITED_FIELDS = (
    "url",
    "auth_kind",
    "username",
    "password_secret_ref",
    "ca_bundle_path",
    "timeout_s",
    "enabled",
)


class RegistryMisconfigured(RegistryError):
    """The registry's settings cannot make a client: an unset secret, a missing CA bundle."""


# --- registries ------------------------------------------------------------------------------


def registry_host(url: str) -> str:
    """The host[:port] image names start with; raises ValueError for an unusable URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("Must start with http:// or https://.")
    if parts.username is not None or parts.password is not None:
        raise ValueError("Must not contain credentials: use the username and secret fields.")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("Only the scheme, host and port, e.g. https://registry.example.org.")
    host = parts.netloc.lower()
    if not re.fullmatch(REGISTRY_HOST_PATTERN, host):
        raise ValueError(
            "Not a host image names can start with, e.g. registry.example.org or 127.0.0.1:5000."
        )
    return host


def _registry_errors(
    *,
    url: str,
    auth_kind: str,
    username: str,
    password_secret_ref: str,
    ca_bundle_path: str,
    timeout_s: int,
) -> tuple[dict[str, list[str]], str]:
    """Errors by field, and the URL's host ("" when the URL is bad)."""
    errors: dict[str, list[str]] = {}
    host = ""
    if not isinstance(url, str) or len(url) > max_length_of(Registry, "url"):
        errors["url"] = ["A URL of at most 255 characters."]
    else:
        try:
            host = registry_host(url.strip())
        except ValueError as exc:
            errors["url"] = [str(exc)]
    if auth_kind not in Registry.AuthKind.values:
        errors["auth_kind"] = [f"Choose one of: {', '.join(Registry.AuthKind.values)}."]
    if len(username) > max_length_of(Registry, "username") or "\x00" in username:
        errors["username"] = ["At most 150 characters."]
    if password_secret_ref and not re.fullmatch(SECRET_REF_PATTERN, password_secret_ref):
        errors["password_secret_ref"] = [
            "The name of an environment variable (capital letters, digits and '_', e.g. "
            "GANTRY_REGISTRY_PASSWORD), never the password itself."
        ]
    if auth_kind == Registry.AuthKind.ANONYMOUS:
        if username or password_secret_ref:
            errors.setdefault("auth_kind", []).append(
                "Anonymous access takes no username or password: choose basic or token."
            )
    elif auth_kind == Registry.AuthKind.BASIC:
        if not username:
            errors.setdefault("username", []).append("Required for basic authentication.")
        if not password_secret_ref:
            errors.setdefault("password_secret_ref", []).append(
                "Required for basic authentication."
            )
    elif bool(username) != bool(password_secret_ref):
        errors.setdefault("username" if not username else "password_secret_ref", []).append(
            "Give both the username and the password's variable, or neither."
        )
    if ca_bundle_path and (
        not os.path.isabs(ca_bundle_path)
        or len(ca_bundle_path) > max_length_of(Registry, "ca_bundle_path")
        or not os.path.isfile(ca_bundle_path)
    ):
        errors["ca_bundle_path"] = ["An absolute path to a PEM file that exists on this host."]
    if (
        not isinstance(timeout_s, int)
        or isinstance(timeout_s, bool)
        or not 1 <= timeout_s <= MAX_REGISTRY_TIMEOUT_S
    ):
        errors["timeout_s"] = [f"A whole number of seconds from 1 to {MAX_REGISTRY_TIMEOUT_S}."]
    return errors, host


def _normalized_url(url: str, host: str) -> str:
    return f"{urlsplit(url.strip()).scheme}://{host}"


@transaction.atomic
def registry_create(
    *,
    name: str,
    url: str,
    auth_kind: str = Registry.AuthKind.ANONYMOUS,
    username: str = "",
    password_secret_ref: str = "",
    ca_bundle_path: str = "",
    timeout_s: int = 10,
    enabled: bool = True,
    actor: UserLike,
) -> Registry:
    """Register a registry; audited as "registry.create". Raises ValidationError by field."""
    errors, host = _registry_errors(
        url=url,
        auth_kind=auth_kind,
        username=username,
        password_secret_ref=password_secret_ref,
        ca_bundle_path=ca_bundle_path,
        timeout_s=timeout_s,
    )
    try:
        slug_validator(name)
    except ValidationError as exc:
        errors["name"] = exc.messages
    else:
        if Registry.objects.filter(name=name).exists():
            errors["name"] = ["A registry with this name exists already."]
    if host:
        other = Registry.objects.filter(host=host).first()
        if other is not None:
            errors.setdefault("url", []).append(f"The registry {other.name} has this host already.")
    if errors:
        raise ValidationError(errors)
    try:
        with transaction.atomic():
            registry = Registry.objects.create(
                name=name,
                url=_normalized_url(url, host),
                host=host,
                auth_kind=auth_kind,
                username=username,
                password_secret_ref=password_secret_ref,
                ca_bundle_path=ca_bundle_path,
                timeout_s=timeout_s,
                enabled=enabled,
            )
    except IntegrityError:  # created concurrently since the checks above
        raise ValidationError(
            {"name": ["A registry with this name or host exists already."]}
        ) from None
    audit_record(
        actor=actor,
        action="registry.create",
        target=name,
        after={"name": name, **audit_snapshot(registry, only=REGISTRY_AUDITED_FIELDS)},
    )
    return registry


@transaction.atomic
def registry_update(
    *,
    registry: Registry,
    url: str,
    auth_kind: str,
    username: str = "",
    password_secret_ref: str = "",
    ca_bundle_path: str = "",
    timeout_s: int = 10,
    enabled: bool = True,
    actor: UserLike,
) -> Registry:
    """Change a registry's settings; audited as "registry.update".

    The name stays. The host may change only while no image was imported from the
    registry: image names start with it, and experiments record those names.
    """
    errors, host = _registry_errors(
        url=url,
        auth_kind=auth_kind,
        username=username,
        password_secret_ref=password_secret_ref,
        ca_bundle_path=ca_bundle_path,
        timeout_s=timeout_s,
    )
    registry = Registry.objects.select_for_update().get(pk=registry.pk)
    if host and host != registry.host:
        if registry.images.exists():
            errors.setdefault("url", []).append(
                f"Images from this registry are named {registry.host}/…: the host cannot change."
            )
        elif Registry.objects.filter(host=host).exclude(pk=registry.pk).exists():
            errors.setdefault("url", []).append("Another registry has this host already.")
    if errors:
        raise ValidationError(errors)
    before = audit_snapshot(registry, only=REGISTRY_AUDITED_FIELDS)
    registry.url = _normalized_url(url, host)
    registry.host = host
    registry.auth_kind = auth_kind
    registry.username = username
    registry.password_secret_ref = password_secret_ref
    registry.ca_bundle_path = ca_bundle_path
    registry.timeout_s = timeout_s
    registry.enabled = enabled
    after = audit_snapshot(registry, only=REGISTRY_AUDITED_FIELDS)
    if after != before:
        registry.save(update_fields=["host", *REGISTRY_AUDITED_FIELDS])
        audit_record(
            actor=actor, action="registry.update", target=registry.name, before=before, after=after
        )
    return registry


class CatalogRegistryClient(RegistryClient):
    """The registry client plus the API-root check that "test connection" needs."""

    def ping(self) -> str:
        """GET /v2/ (answering one auth challenge, as the client does); the API version."""
        url = f"{self.base_url}/v2/"
        response = self._send("GET", url, {}, None)
        if response.status_code == 401:
            response.close()
            authorization = self._answer_challenge("/v2/", response, None)
            response = self._send("GET", url, {}, authorization)
            if response.status_code == 401:
                response.close()
                raise RegistryAuthError(f"{self._host} refused the credentials (HTTP 401)")
        self._raise_for_status(response, "/v2/", "the API root /v2/")
        response.close()
        return response.headers.get("Docker-Distribution-API-Version", "")


def registry_client_for(
    registry: Registry, *, timeout: float | None = None
) -> CatalogRegistryClient:
    """A client for the registry, with the password read from the environment now.

    Raises RegistryMisconfigured when the secret's variable is unset or the CA bundle is
    missing; the message names the variable, never its value. With ``GANTRY_DEMO_REGISTRY``
    on, the demo registry's host is answered in process (images.demo_registry).
    """
    username = password = None
    if registry.password_secret_ref:
        password = os.environ.get(registry.password_secret_ref)
        if not password:
            raise RegistryMisconfigured(
                f"the environment variable {registry.password_secret_ref} that holds the "
                f"password for {registry.name} is not set on this host"
            )
        username = registry.username
    try:
        return CatalogRegistryClient(
            registry.url,
            username=username,
            password=password,
            ca_bundle=registry.ca_bundle_path or None,
            timeout=min(timeout, registry.timeout_s) if timeout else registry.timeout_s,
            transport=_demo_transport(registry),
        )
    except ValueError as exc:
        raise RegistryMisconfigured(f"{registry.name}: {exc}") from None


def _demo_transport(registry: Registry) -> DemoRegistryTransport | None:
    if settings.GANTRY_DEMO_REGISTRY and registry.host == DEMO_REGISTRY_HOST:
        return DemoRegistryTransport()
    return None


def registry_secret_is_set(registry: Registry) -> bool | None:
    """Whether the password's variable is set on this host; None when there is none to set."""
    if not registry.password_secret_ref:
        return None
    return bool(os.environ.get(registry.password_secret_ref))


def registry_test_connection(*, registry: Registry) -> str:
    """Call the registry's API root with its credentials; a sentence saying it worked.

    Raises RegistryError (RegistryUnavailable when it may work later).
    """
    with registry_client_for(registry) as client:
        version = client.ping()
    shown = f" ({version})" if version else ""
    return f"Connected to {registry.name}: {registry.host} answered the registry API{shown}."


def _unreachable(exc: RegistryError) -> str:
    message = str(exc)
    return message if message.startswith(UNREACHABLE) else f"{UNREACHABLE}: {message}"


# --- submit: a tag is accepted only to be resolved -------------------------------------------


class TagResolutionError(Exception):
    """Why `repository:tag` could not be pinned; the message is meant for the submitter."""


def tag_resolve(*, repository: str, tag: str) -> str:
    """The digest `repository:tag` points to now, asked of the registry of its host.

    Called inside the submit transaction, so every request gets at most SUBMIT_TIMEOUT_S.
    """
    registry, path = registry_for_repository(repository)
    if registry is None:
        host = repository.partition("/")[0]
        raise TagResolutionError(
            f"No registry is registered for {host}: pin the image by digest "
            "(repository@sha256:<64 hex>)."
        )
    try:
        validate_tag(tag)
        validate_repository(path)
    except ValueError as exc:
        raise TagResolutionError(f"Not a valid image reference: {exc}") from None
    try:
        with registry_client_for(registry, timeout=SUBMIT_TIMEOUT_S) as client:
            return client.resolve(path, tag).digest
    except RegistryNotFound:
        raise TagResolutionError(f"{repository}:{tag} does not exist.") from None
    except RegistryUnavailable as exc:
        raise TagResolutionError(_unreachable(exc)) from None
    except RegistryError as exc:
        logger.warning("resolving %s:%s failed: %s", repository, tag, exc)
        raise TagResolutionError(f"Cannot resolve {repository}:{tag}: {exc}") from None


# --- images ----------------------------------------------------------------------------------


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
        raise ValidationError({"reference": [_unreachable(exc)]}) from None
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
