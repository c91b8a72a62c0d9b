"""A small client for the OCI Distribution API: pin a tag to a digest, read the image config.

No Django here: plain values in, frozen dataclasses out (images/oci.py reads what the
registry sends and defines the errors). Nothing a registry sends is trusted before it is
hashed: every manifest and config blob must hash to the digest it was asked for (or that the
registry claimed), otherwise `RegistryError` is raised.

A client keeps a `requests.Session` and a token cache: use one per thread.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter

from images.oci import (
    CONFIG_MEDIA_TYPES,
    DIGEST_RE,
    IMAGE_MEDIA_TYPES,
    INDEX_MEDIA_TYPES,
    MANIFEST_ACCEPT,
    ImageConfig,
    RegistryAuthError,
    RegistryError,
    RegistryNotFound,
    RegistryUnavailable,
    ResolvedImage,
    descriptor,
    image_config,
    image_size,
    json_object,
    manifest_media_type,
    platform_manifest,
    sha256_digest,
    validate_digest,
    validate_repository,
    validate_tag,
)

log = logging.getLogger(__name__)

MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # distribution's own limit for a manifest
MAX_CONFIG_BYTES = 8 * 1024 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
DEFAULT_TOKEN_LIFETIME = 60  # seconds, when the token endpoint does not say (token spec)
TOKEN_EXPIRY_MARGIN = 5

NOT_FOUND_CODES = frozenset({"MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"})
DENIED_CODES = frozenset({"DENIED", "UNAUTHORIZED"})
_CHALLENGE_PARAM_RE = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')
_ERROR_CODE_RE = re.compile(r"[A-Z_]{1,64}")


@dataclass
class _Token:
    value: str
    expires_at: float  # time.monotonic()

    def fresh(self) -> bool:
        return time.monotonic() < self.expires_at


class RegistryClient:
    """Reads manifests and configs from one registry (`base_url`, e.g. https://registry.example)."""

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        ca_bundle: str | None = None,
        timeout: float = 10.0,
        transport: BaseAdapter | None = None,
    ) -> None:
        """``transport``, when given, answers every request to ``base_url`` in place of the
        network (the demo's in-process registry, images.demo_registry)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(
                f"base_url: must start with http:// or https://, not {parts.scheme or 'nothing'!r}"
            )
        if not parts.hostname:
            raise ValueError("base_url: has no host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("base_url: must not carry credentials; pass username and password")
        if parts.query or parts.fragment:
            raise ValueError("base_url: must not have a query or fragment")
        if (username is None) != (password is None):
            raise ValueError("username and password: give both or neither")
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ValueError(f"ca_bundle: no such file {ca_bundle!r}")
        if not timeout > 0:
            raise ValueError("timeout: must be a positive number of seconds")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._host = parts.netloc
        self._credentials = (
            (username, password) if username is not None and password is not None else None
        )
        self._session = requests.Session()
        # No proxies, CA bundles or .netrc credentials picked up from the environment: a .netrc
        # entry would even replace the Authorization header this client sets.
        self._session.trust_env = False
        self._session.verify = ca_bundle or True
        if transport is not None:
            self._session.mount(f"{self.base_url}/", transport)
        self._tokens: dict[tuple[str, str, str], _Token] = {}
        self._token_key_for: dict[str, tuple[str, str, str]] = {}  # repository -> last challenge
        self._basic_accepted = False

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def resolve(self, repository: str, tag: str) -> ResolvedImage:
        """Resolve `repository:tag` to the digest served now, verified and described."""
        validate_repository(repository)
        validate_tag(tag)
        what = f"{repository}:{tag}"
        head = self._request("HEAD", repository, f"manifests/{tag}", what, accept=MANIFEST_ACCEPT)
        head.close()
        claimed = head.headers.get("Docker-Content-Digest")
        if claimed:
            self._check_claimed_digest(claimed, what)
            body, content_type = self._get_manifest(repository, claimed, what)
            digest = claimed
        else:
            # Older registries omit the header: the digest is the hash of the exact bytes served.
            response = self._request(
                "GET", repository, f"manifests/{tag}", what, accept=MANIFEST_ACCEPT
            )
            content_type = _media_type(response)
            claimed_by_get = response.headers.get("Docker-Content-Digest")
            body = _read_limited(response, MAX_MANIFEST_BYTES, f"manifest of {what}", self._host)
            digest = sha256_digest(body)
            if claimed_by_get and claimed_by_get != digest:
                raise RegistryError(
                    f"manifest body does not match digest {claimed_by_get[:80]} (it hashes to "
                    f"{digest}): {what} on {self._host}"
                )
        return self._describe(repository, tag, digest, body, content_type)

    def inspect(self, repository: str, digest: str) -> ResolvedImage:
        """Describe `repository@digest`; the manifest must hash to `digest`."""
        validate_repository(repository)
        validate_digest(digest)
        what = f"{repository}@{digest}"
        body, content_type = self._get_manifest(repository, digest, what)
        return self._describe(repository, None, digest, body, content_type)

    def _describe(
        self, repository: str, tag: str | None, digest: str, body: bytes, content_type: str
    ) -> ResolvedImage:
        manifest = json_object(body, f"manifest {digest}")
        media_type = manifest_media_type(manifest, content_type, digest)
        if media_type in INDEX_MEDIA_TYPES:
            chosen = platform_manifest(manifest.get("manifests"), digest)
            if chosen is None:
                config, size = None, 0
            else:
                image_digest = descriptor(chosen, f"index {digest}")[0]
                image_body, image_type = self._get_manifest(
                    repository, image_digest, f"{repository}@{image_digest}"
                )
                image = json_object(image_body, f"manifest {image_digest}")
                if manifest_media_type(image, image_type, image_digest) not in IMAGE_MEDIA_TYPES:
                    raise RegistryError(f"index {digest} points at another index: not supported")
                config = self._read_config(repository, image, image_digest)
                size = image_size(image, image_digest)
        else:
            config = self._read_config(repository, manifest, digest)
            size = image_size(manifest, digest)
        return ResolvedImage(
            repository=repository,
            tag=tag,
            digest=digest,
            media_type=media_type,
            size=size,
            manifest=manifest,
            config=config,
        )

    def _get_manifest(self, repository: str, digest: str, what: str) -> tuple[bytes, str]:
        response = self._request(
            "GET", repository, f"manifests/{digest}", what, accept=MANIFEST_ACCEPT
        )
        content_type = _media_type(response)
        body = _read_limited(response, MAX_MANIFEST_BYTES, f"manifest of {what}", self._host)
        actual = sha256_digest(body)
        if actual != digest:
            raise RegistryError(
                f"manifest body does not match digest {digest} (it hashes to {actual}): "
                f"{what} on {self._host}"
            )
        return body, content_type

    def _read_config(
        self, repository: str, manifest: dict[str, Any], manifest_digest: str
    ) -> ImageConfig | None:
        digest, size, media_type = descriptor(manifest.get("config"), f"manifest {manifest_digest}")
        if media_type not in CONFIG_MEDIA_TYPES:
            return None
        what = f"config blob {digest}"
        if size > MAX_CONFIG_BYTES:
            raise RegistryError(f"{what} is larger than {MAX_CONFIG_BYTES} bytes")
        response = self._request("GET", repository, f"blobs/{digest}", f"{repository} {what}")
        body = _read_limited(response, MAX_CONFIG_BYTES, what, self._host)
        actual = sha256_digest(body)
        if actual != digest:
            raise RegistryError(
                f"config blob does not match digest {digest} (it hashes to {actual}): "
                f"{repository} on {self._host}"
            )
        if len(body) != size:
            raise RegistryError(f"{what} is {len(body)} bytes, its manifest says {size}")
        return image_config(json_object(body, what), digest, manifest_digest)

    def _check_claimed_digest(self, claimed: str, what: str) -> None:
        if not DIGEST_RE.fullmatch(claimed):
            raise RegistryError(
                f"{self._host} named {what} by an unsupported digest {claimed[:80]!r} "
                "(only sha256 is supported)"
            )

    def _request(
        self, method: str, repository: str, path: str, what: str, *, accept: str | None = None
    ) -> requests.Response:
        """Send with the best credentials known, answer one 401 challenge, map errors."""
        url = f"{self.base_url}/v2/{repository}/{path}"
        headers = {"Accept": accept} if accept else {}
        sent = self._known_authorization(repository)
        response = self._send(method, url, headers, sent)
        if response.status_code == 401:
            response.close()
            authorization = self._answer_challenge(repository, response, sent)
            response = self._send(method, url, headers, authorization)
            if response.status_code == 401:
                response.close()
                # Some registries (Docker Hub) also answer so for a repository that does not exist.
                raise RegistryAuthError(
                    f"{self._host} refused access to {repository} ({self._who()}, HTTP 401 after "
                    "authenticating): wrong credentials, no pull permission or no such repository"
                )
        self._raise_for_status(response, repository, what)
        return response

    def _send(
        self, method: str, url: str, headers: dict[str, str], authorization: str | None
    ) -> requests.Response:
        if authorization:
            headers = {**headers, "Authorization": authorization}
        try:
            return self._session.request(
                method, url, headers=headers, timeout=self.timeout, stream=True
            )
        except requests.RequestException as exc:
            raise _transport_error(exc, self._host, self.timeout) from exc

    def _known_authorization(self, repository: str) -> str | None:
        key = self._token_key_for.get(repository)
        token = self._tokens.get(key) if key else None
        if token is not None and token.fresh():
            return f"Bearer {token.value}"
        if self._basic_accepted:
            return self._basic_authorization()
        return None

    def _basic_authorization(self) -> str | None:
        if self._credentials is None:
            return None
        user_password = ":".join(self._credentials).encode()
        return "Basic " + base64.b64encode(user_password).decode("ascii")

    def _answer_challenge(
        self, repository: str, response: requests.Response, sent: str | None
    ) -> str:
        scheme, params = _parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if scheme == "basic":
            basic = self._basic_authorization()
            if basic is None:
                raise RegistryAuthError(
                    f"{self._host} requires credentials for {repository}; none are configured"
                )
            if sent == basic:
                raise RegistryAuthError(f"{self._host} refused the credentials for {repository}")
            self._basic_accepted = True
            return basic
        if scheme != "bearer":
            raise RegistryAuthError(
                f"{self._host} asked for an unsupported authentication scheme {scheme[:20]!r}"
            )
        realm = params.get("realm", "")
        if urlsplit(realm).scheme not in ("http", "https"):
            raise RegistryAuthError(
                f"{self._host} sent a Bearer challenge without an http(s) realm"
            )
        key = (realm, params.get("service", ""), params.get("scope", ""))
        self._token_key_for[repository] = key
        cached = self._tokens.get(key)
        if cached is None or not cached.fresh() or sent == f"Bearer {cached.value}":
            cached = self._fetch_token(*key)
            self._tokens[key] = cached
        return f"Bearer {cached.value}"

    def _fetch_token(self, realm: str, service: str, scope: str) -> _Token:
        realm_host = urlsplit(realm).netloc
        query = [("service", service)] if service else []
        query += [("scope", s) for s in scope.split(" ") if s]
        log.debug("registry token: realm=%s service=%s scope=%s", realm, service, scope)
        basic = self._basic_authorization()
        headers = {"Authorization": basic} if basic else {}
        try:
            response = self._session.get(
                realm, params=query, headers=headers, timeout=self.timeout, stream=True
            )
        except requests.RequestException as exc:
            raise _transport_error(exc, realm_host, self.timeout) from exc
        status = response.status_code
        if status in (401, 403):
            response.close()
            raise RegistryAuthError(
                f"token endpoint {realm_host} refused {self._who()} (HTTP {status})"
            )
        if status == 429 or status >= 500:
            response.close()
            raise RegistryUnavailable(
                "registry unreachable, try again: "
                f"token endpoint {realm_host} answered HTTP {status}"
            )
        if status != 200:
            response.close()
            raise RegistryError(f"token endpoint {realm_host} answered HTTP {status}")
        data = json_object(
            _read_limited(response, MAX_ERROR_BODY_BYTES, "token response", realm_host),
            f"token response from {realm_host}",
        )
        value = data.get("token") or data.get("access_token")
        if not isinstance(value, str) or not value:
            raise RegistryError(f"token endpoint {realm_host} sent no token")
        lifetime = data.get("expires_in")
        if not isinstance(lifetime, int) or lifetime <= 0:
            lifetime = DEFAULT_TOKEN_LIFETIME
        return _Token(value, time.monotonic() + max(lifetime - TOKEN_EXPIRY_MARGIN, 1))

    def _raise_for_status(self, response: requests.Response, repository: str, what: str) -> None:
        status = response.status_code
        if 200 <= status < 300:
            return
        codes = _error_codes(response) if response.request.method != "HEAD" else set()
        response.close()
        if "NAME_UNKNOWN" in codes:
            raise RegistryNotFound(f"repository {repository} not found on {self._host}")
        if status == 404 or codes & NOT_FOUND_CODES:
            raise RegistryNotFound(f"{what} not found on {self._host}")
        if status == 429 or status >= 500:
            raise RegistryUnavailable(
                f"registry unreachable, try again: {self._host} answered HTTP {status}"
            )
        if status == 403 or codes & DENIED_CODES:
            raise RegistryAuthError(f"{self._host} denied access to {what} (HTTP {status})")
        detail = f" ({', '.join(sorted(codes))})" if codes else ""
        raise RegistryError(f"{self._host} answered HTTP {status} for {what}{detail}")

    def _who(self) -> str:
        return "with the configured credentials" if self._credentials else "anonymous access"


def _transport_error(exc: requests.RequestException, host: str, timeout: float) -> RegistryError:
    # Checked first: an SSLError is a ConnectionError, but retrying will not fix a bad certificate.
    if isinstance(exc, requests.exceptions.SSLError):
        return RegistryError(f"TLS verification failed for {host}: check the CA bundle")
    if isinstance(exc, requests.Timeout):
        return RegistryUnavailable(
            f"registry unreachable, try again: {host} did not answer within {timeout:g} s"
        )
    if isinstance(exc, requests.ConnectionError):
        return RegistryUnavailable(f"registry unreachable, try again: cannot connect to {host}")
    return RegistryError(f"request to {host} failed ({type(exc).__name__})")


def _read_limited(response: requests.Response, limit: int, what: str, host: str) -> bytes:
    declared = response.headers.get("Content-Length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        response.close()
        raise RegistryError(f"{what} is larger than {limit} bytes")
    chunks: list[bytes] = []
    total = 0
    try:
        for chunk in response.iter_content(64 * 1024):
            total += len(chunk)
            if total > limit:
                raise RegistryError(f"{what} is larger than {limit} bytes")
            chunks.append(chunk)
    except requests.RequestException as exc:
        # iter_content reports a read timeout as a ConnectionError.
        raise RegistryUnavailable(
            f"registry unreachable, try again: {host} stopped sending {what}"
        ) from exc
    finally:
        response.close()
    return b"".join(chunks)


def _error_codes(response: requests.Response) -> set[str]:
    """The `errors[].code` values of a Distribution error body, if it is one."""
    try:
        body = response.raw.read(MAX_ERROR_BODY_BYTES, decode_content=True)
        errors = json.loads(body).get("errors")
    except (requests.RequestException, ValueError, AttributeError, OSError):
        return set()
    if not isinstance(errors, list):
        return set()
    return {
        e["code"]
        for e in errors
        if isinstance(e, dict)
        and isinstance(e.get("code"), str)
        and _ERROR_CODE_RE.fullmatch(e["code"])
    }


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
        for m in _CHALLENGE_PARAM_RE.finditer(rest)
    }
    return scheme.lower(), params


def _media_type(response: requests.Response) -> str:
    return response.headers.get("Content-Type", "").split(";")[0].strip()
