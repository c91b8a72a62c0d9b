"""What an OCI registry sends, read without trusting it: media types, repository, tag and
digest names, manifests and image configs. Pure: plain values in, frozen dataclasses out;
no Django and no network (the client that fetches them is images/registry.py).

Errors: `RegistryNotFound` (unknown repository, tag or digest), `RegistryAuthError` (refused
credentials or access), `RegistryUnavailable` (timeouts, connection errors, 5xx, 429: transient,
retry later), `RegistryError` for everything else (permanent). Messages never carry credentials.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_MEDIA_TYPES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})
IMAGE_MEDIA_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
CONFIG_MEDIA_TYPES = frozenset(
    {"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"}
)
# Registries answer 404 or 400 when the stored manifest's type is not accepted (distribution 2.8
# does for OCI manifests and Docker schema2 alike), so every request lists all four.
MANIFEST_ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST_LIST, DOCKER_MANIFEST))

# The path part of images.models.REPOSITORY_PATTERN: the host is the client's base_url.
REPOSITORY_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
REPOSITORY_MAX_LENGTH = 255

OCI_LABEL_PREFIX = "org.opencontainers.image."
# Where images declare the versions that matter on a GPU cluster, first match wins: labels
# (NGC images carry com.nvidia.*), then the environment (CUDA_VERSION and friends).
VERSION_SOURCES: dict[str, tuple[str, ...]] = {
    "cuda": ("com.nvidia.cuda.version", "CUDA_VERSION"),
    "nccl": ("com.nvidia.nccl.version", "NCCL_VERSION"),
    "pytorch": ("PYTORCH_VERSION", "TORCH_VERSION"),
    "tensorflow": ("TENSORFLOW_VERSION", "TF_VERSION"),
    "jax": ("JAX_VERSION",),
}
FRAMEWORKS = ("pytorch", "tensorflow", "jax")

_FRACTION_RE = re.compile(r"(\.\d{6})\d+")


class RegistryError(Exception):
    """The registry answered with something unusable. Permanent unless `transient` says so."""

    transient = False


class RegistryNotFound(RegistryError):
    """The repository, tag or digest does not exist on the registry."""


class RegistryAuthError(RegistryError):
    """The registry or its token endpoint refused the credentials, or access was denied."""


class RegistryUnavailable(RegistryError):
    """Timeout, connection error, 5xx or 429: try again later."""

    transient = True


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config blob declares."""

    digest: str  # of the config blob
    manifest_digest: str  # of the image manifest naming it: a platform's, for an index
    architecture: str
    os: str
    created: datetime | None
    labels: dict[str, str]
    cuda_version: str | None
    nccl_version: str | None
    frameworks: dict[str, str]  # e.g. {"pytorch": "2.3.1"}

    @property
    def oci_labels(self) -> dict[str, str]:
        """The `org.opencontainers.image.*` labels (version, source, revision, …)."""
        return {k: v for k, v in self.labels.items() if k.startswith(OCI_LABEL_PREFIX)}


@dataclass(frozen=True)
class ResolvedImage:
    """A manifest pinned by digest, with the config of the image it runs."""

    repository: str
    tag: str | None  # None when inspected by digest
    digest: str  # what to pin; for a multi-arch tag, the index
    media_type: str
    size: int  # config + layers, of the chosen platform's image for an index
    manifest: dict[str, Any]
    config: ImageConfig | None  # None for an empty index or a non-image artifact


def _require(field: str, value: object, pattern: re.Pattern[str], example: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        shown = value[:80] if isinstance(value, str) else value
        raise ValueError(f"{field}: {shown!r} is not valid, e.g. {example}")


def validate_repository(repository: str) -> None:
    _require("repository", repository, REPOSITORY_RE, "team/pytorch (without the registry host)")
    if len(repository) > REPOSITORY_MAX_LENGTH:
        raise ValueError(f"repository: longer than {REPOSITORY_MAX_LENGTH} characters")


def validate_tag(tag: str) -> None:
    _require("tag", tag, TAG_RE, "v1.2 (letters, digits, '_', '.', '-'; at most 128)")


def validate_digest(digest: str) -> None:
    _require("digest", digest, DIGEST_RE, "sha256: followed by 64 lowercase hex characters")


def sha256_digest(body: bytes) -> str:
    """The digest a registry names ``body`` by."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """``body`` as a JSON object; RegistryError naming ``what`` when it is not one."""
    try:
        data = json.loads(body)
    except ValueError:
        raise RegistryError(f"{what} is not valid JSON") from None
    if not isinstance(data, dict):
        raise RegistryError(f"{what} is not a JSON object")
    return data


def manifest_media_type(manifest: dict[str, Any], content_type: str, digest: str) -> str:
    """Whether ``manifest`` is an index or an image manifest, as one of their media types;
    RegistryError for anything else."""
    if manifest.get("schemaVersion") != 2:
        raise RegistryError(f"manifest {digest} is not schema version 2: not supported")
    # The body's own mediaType is covered by the digest; the header is only a fallback.
    declared = manifest.get("mediaType")
    media_type = declared if isinstance(declared, str) and declared else content_type
    if media_type in INDEX_MEDIA_TYPES or media_type in IMAGE_MEDIA_TYPES:
        return media_type
    if "manifests" in manifest and "config" not in manifest:
        return OCI_INDEX
    if "config" in manifest and "layers" in manifest:
        return OCI_MANIFEST
    raise RegistryError(f"manifest {digest} has an unsupported media type {media_type[:100]!r}")


def descriptor(value: object, where: str) -> tuple[str, int, str]:
    """(digest, size, mediaType) of a content descriptor, checked."""
    if not isinstance(value, dict):
        raise RegistryError(f"{where}: a descriptor is missing or not an object")
    digest, size, media_type = value.get("digest"), value.get("size"), value.get("mediaType", "")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise RegistryError(f"{where}: descriptor digest is not sha256:<64 hex>")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise RegistryError(f"{where}: descriptor {digest} has no valid size")
    return digest, size, media_type if isinstance(media_type, str) else ""


def platform_manifest(manifests: object, index_digest: str) -> dict[str, Any] | None:
    """linux/amd64 if the index has it, else the first real platform, else the first entry."""
    if not isinstance(manifests, list):
        raise RegistryError(f"index {index_digest} has no manifests list")
    entries = [m for m in manifests if isinstance(m, dict)]

    def platform(entry: dict[str, Any]) -> tuple[str, str]:
        p = entry.get("platform")
        return (p.get("os", ""), p.get("architecture", "")) if isinstance(p, dict) else ("", "")

    for entry in entries:
        if platform(entry) == ("linux", "amd64"):
            return entry
    # BuildKit stores attestations as "unknown/unknown" entries: they are not images.
    for entry in entries:
        if platform(entry)[0] not in ("", "unknown"):
            return entry
    return entries[0] if entries else None


def image_size(manifest: dict[str, Any], digest: str) -> int:
    """The bytes of an image: its config and layers."""
    where = f"manifest {digest}"
    layers = manifest.get("layers") or []
    if not isinstance(layers, list):
        raise RegistryError(f"{where}: layers is not a list")
    descriptors = [manifest.get("config"), *layers]
    return sum(descriptor(d, where)[1] for d in descriptors)


def image_config(data: dict[str, Any], digest: str, manifest_digest: str) -> ImageConfig:
    """What a config blob declares, with the versions ``VERSION_SOURCES`` finds in it."""
    runtime = data.get("config")
    runtime = runtime if isinstance(runtime, dict) else {}
    raw_labels = runtime.get("Labels")
    labels = (
        {k: v for k, v in raw_labels.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(raw_labels, dict)
        else {}
    )
    raw_env = runtime.get("Env")
    env = dict(
        item.split("=", 1)
        for item in (raw_env if isinstance(raw_env, list) else [])
        if isinstance(item, str) and "=" in item
    )
    versions: dict[str, str] = {}
    for name, sources in VERSION_SOURCES.items():
        for source in sources:
            value = labels.get(source) or env.get(source)
            if value and value.strip():
                versions[name] = value.strip()
                break
    return ImageConfig(
        digest=digest,
        manifest_digest=manifest_digest,
        architecture=_string(data.get("architecture")),
        os=_string(data.get("os")),
        created=_parse_created(data.get("created")),
        labels=labels,
        cuda_version=versions.get("cuda"),
        nccl_version=versions.get("nccl"),
        frameworks={name: versions[name] for name in FRAMEWORKS if name in versions},
    )


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def _parse_created(value: object) -> datetime | None:
    """RFC 3339 with an offset; Go writes nanoseconds, Python keeps microseconds."""
    if not isinstance(value, str):
        return None
    try:
        created = datetime.fromisoformat(_FRACTION_RE.sub(r"\1", value.strip()))
    except ValueError:
        return None
    return created if created.tzinfo is not None else None
