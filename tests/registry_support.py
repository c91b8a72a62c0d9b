"""Real registries for the registry client's tests, and the small servers around them.

- Debian's `docker-registry` (CNCF distribution 2.8) on a free 127.0.0.1 port, plain or behind
  token auth, started once per session. `make test` installs the package
  (scripts/test-services.sh); without it the tests fail, they are never skipped.
- Images pushed with plain HTTP (monolithic blob upload, manifest PUT): no Docker engine.
- A token server signing ES256 JWTs with an `x5c` header, a Basic-auth proxy, a stub registry
  with canned replies and a server that never answers. All on 127.0.0.1, all stopped by their
  fixtures.

The test module loads this file with `pytest_plugins`, which makes its fixtures available. It
also imports the helpers before pytest registers the plugin, too late for assertion rewriting:
PYTEST_DONT_REWRITE says that is intended (its asserts carry their own messages).
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import http.client
import io
import ipaddress
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REGISTRY_BINARY = "/usr/bin/docker-registry"
TOKEN_SERVICE = "gantry-test"
TOKEN_ISSUER = "gantry-test-issuer"
# Users of the token server: the bot may pull and push, `no-access` gets a token granting nothing.
BOT_USER, BOT_PASSWORD = "gantry-bot", "s3cret-pass-7Qx"
NO_ACCESS_USER, NO_ACCESS_PASSWORD = "no-access", "n0-access-pass-3Kd"

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"

TRAINER_LABELS = {
    "org.opencontainers.image.version": "1.4.2",
    "org.opencontainers.image.source": "https://git.example.org/team-a/trainer",
    "org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
    "maintainer": "team-a@example.org",
}
TRAINER_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "CUDA_VERSION=12.4.1",
    "NCCL_VERSION=2.21.5",
    "PYTORCH_VERSION=2.3.1",
]
TRAINER_CREATED = "2024-05-06T07:08:09.123456789Z"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- images ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    data: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return sha256_digest(self.data)

    @property
    def size(self) -> int:
        return len(self.data)

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size, **extra}


@dataclass(frozen=True)
class PushedManifest:
    repository: str
    reference: str
    body: bytes  # the exact bytes sent
    media_type: str
    registry_digest: str  # Docker-Content-Digest of the PUT

    @property
    def digest(self) -> str:
        return sha256_digest(self.body)


@dataclass(frozen=True)
class PushedImage(PushedManifest):
    config: Blob
    layers: tuple[Blob, ...]

    @property
    def image_size(self) -> int:
        return self.config.size + sum(layer.size for layer in self.layers)


def gzip_layer(files: dict[str, bytes], *, media_type: str = OCI_LAYER) -> tuple[Blob, str]:
    """A reproducible gzip tar layer and its diff_id (sha256 of the uncompressed tar)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mtime = 1577836800  # 2020-01-01
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    raw = buffer.getvalue()
    return Blob(gzip.compress(raw, mtime=0), media_type), sha256_digest(raw)


def image_config(
    *,
    architecture: str,
    diff_ids: list[str],
    labels: dict[str, str] | None = None,
    env: list[str] | None = None,
    created: str | None = None,
    media_type: str = OCI_CONFIG,
) -> Blob:
    config: dict[str, Any] = {"architecture": architecture, "os": "linux"}
    if created is not None:
        config["created"] = created
    config["config"] = {"Cmd": ["/bin/sh"], "Env": env or [], "Labels": labels or {}}
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return Blob(json.dumps(config, separators=(",", ":")).encode(), media_type)


def _auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def push_blob(registry_url: str, repository: str, blob: Blob, *, token: str | None = None) -> None:
    """Monolithic upload: POST for an upload URL, PUT the bytes with ?digest=."""
    headers = _auth_headers(token)
    started = requests.post(
        f"{registry_url}/v2/{repository}/blobs/uploads/", headers=headers, timeout=10
    )
    assert started.status_code == 202, (started.status_code, started.text)
    location = started.headers["Location"]
    if not location.startswith("http"):
        location = registry_url + location
    separator = "&" if "?" in location else "?"
    finished = requests.put(
        f"{location}{separator}digest={blob.digest}",
        data=blob.data,
        headers={**headers, "Content-Type": "application/octet-stream"},
        timeout=10,
    )
    assert finished.status_code == 201, (finished.status_code, finished.text)
    assert finished.headers["Docker-Content-Digest"] == blob.digest


def push_manifest(
    registry_url: str,
    repository: str,
    reference: str,
    body: bytes,
    media_type: str,
    *,
    token: str | None = None,
) -> str:
    response = requests.put(
        f"{registry_url}/v2/{repository}/manifests/{reference}",
        data=body,
        headers={**_auth_headers(token), "Content-Type": media_type},
        timeout=10,
    )
    assert response.status_code == 201, (response.status_code, response.text)
    return response.headers["Docker-Content-Digest"]


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    # Deliberately not compact JSON: the digest must be of these bytes, not of a re-encoding.
    return json.dumps(manifest, indent=3).encode() + b"\n"


def push_image(
    registry_url: str,
    repository: str,
    reference: str,
    *,
    config: Blob,
    layers: list[Blob],
    media_type: str = OCI_MANIFEST,
    token: str | None = None,
) -> PushedImage:
    for blob in (config, *layers):
        push_blob(registry_url, repository, blob, token=token)
    body = manifest_bytes(
        {
            "schemaVersion": 2,
            "mediaType": media_type,
            "config": config.descriptor(),
            "layers": [layer.descriptor() for layer in layers],
        }
    )
    digest = push_manifest(registry_url, repository, reference, body, media_type, token=token)
    return PushedImage(repository, reference, body, media_type, digest, config, tuple(layers))


def push_index(
    registry_url: str,
    repository: str,
    reference: str,
    platforms: list[tuple[PushedImage, dict[str, str]]],
    *,
    token: str | None = None,
) -> PushedManifest:
    entries = [
        {
            "mediaType": image.media_type,
            "digest": image.digest,
            "size": len(image.body),
            "platform": platform,
        }
        for image, platform in platforms
    ]
    body = manifest_bytes({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
    digest = push_manifest(registry_url, repository, reference, body, OCI_INDEX, token=token)
    return PushedManifest(repository, reference, body, OCI_INDEX, digest)


def build_and_push(
    registry_url: str,
    repository: str,
    reference: str,
    *,
    architecture: str = "amd64",
    labels: dict[str, str] | None = None,
    env: list[str] | None = None,
    created: str | None = None,
    docker: bool = False,
    token: str | None = None,
) -> PushedImage:
    layer, diff_id = gzip_layer(
        {f"{repository}/{architecture}.txt": f"{repository} on {architecture}\n".encode()},
        media_type=DOCKER_LAYER if docker else OCI_LAYER,
    )
    config = image_config(
        architecture=architecture,
        diff_ids=[diff_id],
        labels=labels,
        env=env,
        created=created,
        media_type=DOCKER_CONFIG if docker else OCI_CONFIG,
    )
    return push_image(
        registry_url,
        repository,
        reference,
        config=config,
        layers=[layer],
        media_type=DOCKER_MANIFEST if docker else OCI_MANIFEST,
        token=token,
    )


# --- docker-registry ------------------------------------------------------------------------


@dataclass
class RegistryProcess:
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _registry_log(workdir: Path) -> str:
    try:
        return (workdir / "registry.log").read_text(errors="replace")[-2000:]
    except OSError:
        return ""


def start_registry(auth: dict[str, Any] | None = None) -> RegistryProcess:
    """`docker-registry serve` on a free 127.0.0.1 port with its storage in a temp dir."""
    if not os.access(REGISTRY_BINARY, os.X_OK):
        pytest.fail(
            f"{REGISTRY_BINARY} is missing: install Debian's docker-registry "
            "(apt-get install docker-registry; `make test` does it through "
            "scripts/test-services.sh)",
            pytrace=False,
        )
    workdir = Path(tempfile.mkdtemp(prefix="gantry-registry-"))
    for _ in range(3):  # the free port may be taken by someone else before the registry binds it
        port = free_port()
        config: dict[str, Any] = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(workdir / "data")},
                "delete": {"enabled": True},
            },
            "http": {"addr": f"127.0.0.1:{port}"},
        }
        if auth is not None:
            config["auth"] = auth
        # JSON is YAML: no YAML writer needed.
        (workdir / "config.yml").write_text(json.dumps(config, indent=2))
        with open(workdir / "registry.log", "wb") as log:
            process = subprocess.Popen(
                [REGISTRY_BINARY, "serve", str(workdir / "config.yml")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        registry = RegistryProcess(f"http://127.0.0.1:{port}", process, workdir)
        started = False
        try:
            started = _wait_for_registry(registry)
        finally:
            if not started:
                process.kill()
                process.wait(timeout=10)
        if started:
            return registry
    log_tail = _registry_log(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    pytest.fail(f"docker-registry did not start:\n{log_tail}", pytrace=False)


def _wait_for_registry(registry: RegistryProcess) -> bool:
    """True once GET /v2/ answers (200, or 401 behind token auth); False if the process died."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if registry.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{registry.url}/v2/", timeout=1):
                return True
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


# --- TLS ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: str  # PEM of the private CA: what a client passes as ca_bundle
    certificate: str  # server certificate for 127.0.0.1, signed by the CA
    key: str


def make_tls_files(workdir: Path) -> TlsFiles:
    """A private CA and a 127.0.0.1 server certificate, as strict verifiers expect them."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gantry-test-ca")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(
        str(workdir / "ca.pem"), str(workdir / "server.pem"), str(workdir / "server-key.pem")
    )
    Path(files.ca).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    Path(files.certificate).write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    Path(files.key).write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


# --- small servers --------------------------------------------------------------------------


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(
        self, status: int, headers: dict[str, str], body: bytes, *, length: int | None = None
    ) -> None:
        """Send a reply; a HEAD gets the headers only, with `length` or the body's length."""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class BackgroundServer:
    """A ThreadingHTTPServer on 127.0.0.1 serving in a daemon thread, HTTPS with `tls`."""

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], *, tls: TlsFiles | None = None
    ) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.certificate, tls.key)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.url = f"https://127.0.0.1:{self.port}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class StubRegistry(BackgroundServer):
    """Canned replies by (method, path); anything else gets 404. Records every request."""

    def __init__(self, *, tls: TlsFiles | None = None) -> None:
        super().__init__(_StubHandler, tls=tls)
        self.routes: dict[tuple[str, str], Reply] = {}
        self.requests: list[SeenRequest] = []

    def route(self, method: str, path: str, reply: Reply) -> None:
        self.routes[(method, path)] = reply


class _StubHandler(QuietHandler):
    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        stub: StubRegistry = self.server.owner  # type: ignore[attr-defined]
        stub.requests.append(SeenRequest(self.command, self.path, dict(self.headers.items())))
        reply = stub.routes.get((self.command, self.path), Reply(404))
        self.reply(reply.status, reply.headers, reply.body)


class HangingServer:
    """Accepts connections and never answers."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections.append(connection)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        for connection in self.connections:
            connection.close()
        self.listener.close()


class BasicAuthProxy(BackgroundServer):
    """Demands HTTP Basic credentials, then forwards HEAD/GET to an upstream registry."""

    def __init__(self, upstream: str, username: str, password: str) -> None:
        super().__init__(_BasicAuthProxyHandler)
        self.upstream = urlsplit(upstream).netloc  # host:port
        self.expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.authorizations: list[str | None] = []


class _BasicAuthProxyHandler(QuietHandler):
    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def _forward(self) -> None:
        proxy: BasicAuthProxy = self.server.owner  # type: ignore[attr-defined]
        authorization = self.headers.get("Authorization")
        proxy.authorizations.append(authorization)
        if authorization != proxy.expected:
            self.reply(401, {"WWW-Authenticate": 'Basic realm="gantry-test"'}, b"")
            return
        upstream = http.client.HTTPConnection(proxy.upstream, timeout=10)
        try:
            headers = {"Accept": self.headers["Accept"]} if self.headers["Accept"] else {}
            upstream.request(self.command, self.path, headers=headers)
            response = upstream.getresponse()
            body = response.read()
            passed = ("Content-Type", "Docker-Content-Digest")
            headers = {h: response.headers[h] for h in passed if response.headers[h]}
            length = int(response.headers.get("Content-Length") or len(body))
            self.reply(response.status, headers, body, length=length)
        finally:
            upstream.close()


@dataclass(frozen=True)
class TokenRequest:
    service: str | None
    scopes: list[str]
    authorization: str | None


class TokenServer(BackgroundServer):
    """Issues ES256 JWTs the registry trusts through `rootcertbundle` (the cert goes in `x5c`).

    Anonymous requests get a token for what they ask; known users with the right password too,
    except `no-access`, whose token grants nothing; wrong credentials get 401.
    """

    def __init__(self, workdir: Path) -> None:
        super().__init__(_TokenHandler)
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gantry-test-token-signer")])
        now = dt.datetime.now(dt.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(self.key, hashes.SHA256())
        )
        self.certificate_der = certificate.public_bytes(serialization.Encoding.DER)
        self.root_bundle = workdir / "token-root.pem"
        self.root_bundle.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        self.users = {BOT_USER: BOT_PASSWORD, NO_ACCESS_USER: NO_ACCESS_PASSWORD}
        self.token_field = "token"
        self.requests: list[TokenRequest] = []

    def reset(self) -> None:
        self.token_field = "token"
        self.requests.clear()

    def issue(self, subject: str, scopes: list[str]) -> str:
        access = []
        if subject != NO_ACCESS_USER:
            for scope in scopes:
                kind, _, rest = scope.partition(":")
                name, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {
            "alg": "ES256",
            "typ": "JWT",
            "x5c": [base64.b64encode(self.certificate_der).decode()],
        }
        claims = {
            "iss": TOKEN_ISSUER,
            "sub": subject,
            "aud": TOKEN_SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = f"{_b64url(json.dumps(header))}.{_b64url(json.dumps(claims))}".encode()
        r, s = decode_dss_signature(self.key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        return f"{signing_input.decode()}.{_b64url(signature)}"


def _b64url(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class _TokenHandler(QuietHandler):
    def do_GET(self) -> None:
        server: TokenServer = self.server.owner  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        query = parse_qsl(url.query)
        authorization = self.headers.get("Authorization")
        server.requests.append(
            TokenRequest(
                service=next((v for k, v in query if k == "service"), None),
                scopes=[v for k, v in query if k == "scope"],
                authorization=authorization,
            )
        )
        if url.path != "/token":
            self.reply(404, {}, b"")
            return
        subject = "anonymous"
        if authorization is not None:
            scheme, _, encoded = authorization.partition(" ")
            try:
                username, _, password = base64.b64decode(encoded).decode().partition(":")
            except ValueError:
                username, password = "", ""
            if scheme != "Basic" or server.users.get(username) != password:
                self.reply(401, {"Content-Type": "application/json"}, b'{"details":"bad creds"}')
                return
            subject = username
        token = server.issue(subject, [v for k, v in query if k == "scope"])
        body = json.dumps({server.token_field: token, "expires_in": 300}).encode()
        self.reply(200, {"Content-Type": "application/json"}, body)


# --- fixtures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeededImages:
    trainer: PushedImage  # OCI image with labels, env versions and a created time
    legacy: PushedImage  # Docker v2 schema2
    multi: PushedManifest  # OCI index: arm64 listed first, then amd64
    multi_arm64: PushedImage
    multi_amd64: PushedImage
    no_amd64: PushedManifest  # OCI index: arm64 then ppc64le


@pytest.fixture(scope="session")
def local_registry() -> Iterator[RegistryProcess]:
    process = start_registry()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def seeded_images(local_registry: RegistryProcess) -> SeededImages:
    url = local_registry.url
    trainer = build_and_push(
        url,
        "team-a/trainer",
        "v1",
        labels=TRAINER_LABELS,
        env=TRAINER_ENV,
        created=TRAINER_CREATED,
    )
    legacy = build_and_push(
        url,
        "team-a/legacy",
        "v2",
        docker=True,
        env=["TF_VERSION=2.16.1", "CUDA_VERSION=12.3.0"],
        created="2023-01-02T03:04:05Z",
    )
    arm64 = build_and_push(url, "team-a/multi", "arm64-only", architecture="arm64")
    amd64 = build_and_push(url, "team-a/multi", "amd64-only", architecture="amd64")
    multi = push_index(
        url,
        "team-a/multi",
        "v3",
        [
            (arm64, {"os": "linux", "architecture": "arm64", "variant": "v8"}),
            (amd64, {"os": "linux", "architecture": "amd64"}),
        ],
    )
    ppc = build_and_push(url, "team-a/multi", "ppc64le-only", architecture="ppc64le")
    no_amd64 = push_index(
        url,
        "team-a/multi",
        "no-amd64",
        [
            (arm64, {"os": "linux", "architecture": "arm64", "variant": "v8"}),
            (ppc, {"os": "linux", "architecture": "ppc64le"}),
        ],
    )
    return SeededImages(trainer, legacy, multi, arm64, amd64, no_amd64)


@pytest.fixture(scope="session")
def token_server() -> Iterator[TokenServer]:
    workdir = Path(tempfile.mkdtemp(prefix="gantry-token-"))
    server = TokenServer(workdir)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class TokenRegistry:
    url: str
    private: PushedImage  # team-b/private:v1


@pytest.fixture(scope="session")
def token_registry(token_server: TokenServer) -> Iterator[TokenRegistry]:
    process = start_registry(
        auth={
            "token": {
                "realm": f"{token_server.url}/token",
                "service": TOKEN_SERVICE,
                "issuer": TOKEN_ISSUER,
                "rootcertbundle": str(token_server.root_bundle),
            }
        }
    )
    try:
        push_token = token_server.issue("pusher", ["repository:team-b/private:pull,push"])
        private = build_and_push(
            process.url,
            "team-b/private",
            "v1",
            labels={"org.opencontainers.image.version": "0.9.0"},
            token=push_token,
        )
        yield TokenRegistry(process.url, private)
    finally:
        process.stop()


@pytest.fixture
def fresh_token_server(token_server: TokenServer, token_registry: TokenRegistry) -> TokenServer:
    """The token server with its request log emptied, for counting."""
    token_server.reset()
    return token_server


@pytest.fixture
def basic_auth_proxy(
    local_registry: RegistryProcess, seeded_images: SeededImages
) -> Iterator[BasicAuthProxy]:
    proxy = BasicAuthProxy(local_registry.url, BOT_USER, BOT_PASSWORD)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def stub_registry() -> Iterator[StubRegistry]:
    stub = StubRegistry()
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path)


@pytest.fixture
def tls_stub_registry(tls_files: TlsFiles) -> Iterator[StubRegistry]:
    """A stub registry on https://127.0.0.1 with a certificate from a private CA."""
    stub = StubRegistry(tls=tls_files)
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def hanging_server() -> Iterator[HangingServer]:
    server = HangingServer()
    yield server
    server.stop()
