"""Registries: their settings, the client made from them, and a tag resolved at submit time.

Credentials are held by reference: a registry names the environment variable that holds its
password (`password_secret_ref`); the value is read from `os.environ` only when a client is
built and is never stored, logged, audited or shown.
"""

import logging
import os
import re
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from core.types import UserLike
from images.demo_registry import DEMO_REGISTRY_HOST, DemoRegistryTransport
from images.models import (
    MAX_REGISTRY_TIMEOUT_S,
    REGISTRY_HOST_PATTERN,
    SECRET_REF_PATTERN,
    Registry,
)
from images.oci import (
    RegistryAuthError,
    RegistryError,
    RegistryNotFound,
    RegistryUnavailable,
    validate_repository,
    validate_tag,
)
from images.registry import RegistryClient
from images.selectors import registry_for_repository
from tenants.models import max_length_of, slug_validator
from tenants.services.audit import audit_record, audit_snapshot

logger = logging.getLogger(__name__)

# Submitting resolves a tag inside the submit transaction: each registry request gets at most
# this long (a resolve makes two to four requests).
SUBMIT_TIMEOUT_S = 5
UNREACHABLE = "registry unreachable, try again"
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


def unreachable_message(exc: RegistryError) -> str:
    """What the submitter or the admin reads when the registry did not answer: it says to
    try again, once."""
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
        raise TagResolutionError(unreachable_message(exc)) from None
    except RegistryError as exc:
        logger.warning("resolving %s:%s failed: %s", repository, tag, exc)
        raise TagResolutionError(f"Cannot resolve {repository}:{tag}: {exc}") from None
