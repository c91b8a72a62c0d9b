"""The demo's registry: an in-process OCI registry that serves the demo's images.

``make run`` starts no registry, yet the demo's image tags must resolve as they do against a
real one. So the registry client is given this module's transport for the demo registry's
URL (``DEMO_REGISTRY_URL``, under the reserved ``.example`` domain, so no real registry can
be meant) when ``GANTRY_DEMO_REGISTRY`` is on (the default in embedded mode only). Every
other registry goes over the network as always. The client code path is the real one: it
sends the same HEAD and GET requests, checks the same digests and reads the same configs;
only the bytes come from here instead of a socket.

What it serves: the API root, each image's manifest by tag and by digest, and each image's
config blob. Layer blobs are only named in the manifests (with their sizes, which make the
image's size): the simulated cluster pulls nothing, so none is served.

No Django here: plain values in, HTTP answers out.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter
from urllib3 import HTTPResponse

from images.oci import OCI_MANIFEST

DEMO_REGISTRY_HOST = "registry.gantry.example"
DEMO_REGISTRY_URL = f"https://{DEMO_REGISTRY_HOST}"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
_PATH = re.compile(r"/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<reference>[^/]+)")


@dataclass(frozen=True)
class DemoImage:
    """One image of the demo registry: what its config declares, and its layers' sizes."""

    path: str  # inside the registry, e.g. ml/pytorch
    tag: str
    created: str  # RFC 3339, as a build writes it
    labels: Mapping[str, str] = field(default_factory=dict)
    env: tuple[str, ...] = ()
    layer_sizes: tuple[int, ...] = ()
    architecture: str = "amd64"
    os: str = "linux"

    def config_bytes(self) -> bytes:
        config = {
            "architecture": self.architecture,
            "os": self.os,
            "created": self.created,
            "config": {"Env": list(self.env), "Labels": dict(self.labels)},
            "rootfs": {
                "type": "layers",
                "diff_ids": [_layer_digest(self, n) for n in range(len(self.layer_sizes))],
            },
        }
        return _canonical(config)

    def manifest_bytes(self) -> bytes:
        config = self.config_bytes()
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": _sha256(config), "size": len(config)},
            "layers": [
                {"mediaType": OCI_LAYER, "digest": _layer_digest(self, n), "size": size}
                for n, size in enumerate(self.layer_sizes)
            ],
        }
        return _canonical(manifest)

    @property
    def digest(self) -> str:
        """The manifest's digest: what the tag resolves to."""
        return _sha256(self.manifest_bytes())


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _sha256(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _layer_digest(image: DemoImage, number: int) -> str:
    # Stands for layer content that is never served: a stable name, unique per image and layer.
    return _sha256(f"{image.path}:{image.tag} layer {number}".encode())


GiB = 1024**3
MiB = 1024**2

DEMO_IMAGES = (
    DemoImage(
        path="ml/pytorch",
        tag="2.4-cuda12.4",
        created="2024-07-25T09:14:03.512345678Z",
        labels={
            "org.opencontainers.image.title": "PyTorch",
            "org.opencontainers.image.version": "2.4.0",
            "org.opencontainers.image.source": "https://git.gantry.example/platform/images",
            "com.nvidia.cuda.version": "12.4.1",
        },
        env=("CUDA_VERSION=12.4.1", "NCCL_VERSION=2.21.5", "PYTORCH_VERSION=2.4.0"),
        layer_sizes=(29 * MiB, 2 * GiB + 310 * MiB, 3 * GiB + 88 * MiB, 1 * GiB + 507 * MiB),
    ),
    DemoImage(
        path="ml/jax",
        tag="0.4.30-cuda12",
        created="2024-06-19T16:40:51Z",
        labels={
            "org.opencontainers.image.title": "JAX",
            "org.opencontainers.image.version": "0.4.30",
        },
        env=("CUDA_VERSION=12.3.2", "NCCL_VERSION=2.19.3", "JAX_VERSION=0.4.30"),
        layer_sizes=(29 * MiB, 2 * GiB + 310 * MiB, 1 * GiB + 902 * MiB),
    ),
    DemoImage(
        path="nlp/megatron",
        tag="24.05",
        created="2024-05-28T22:03:17Z",
        labels={
            "org.opencontainers.image.title": "Megatron-LM",
            "org.opencontainers.image.version": "24.05",
            "com.nvidia.cuda.version": "12.4.1.003",
            "com.nvidia.nccl.version": "2.21.5",
        },
        env=("PYTORCH_VERSION=2.4.0a0",),
        layer_sizes=(29 * MiB, 4 * GiB + 640 * MiB, 5 * GiB + 12 * MiB, 731 * MiB),
    ),
    DemoImage(
        path="ml/pytorch-nightly",
        tag="nightly",
        created="2024-08-01T03:02:44Z",
        labels={"org.opencontainers.image.title": "PyTorch nightly"},
        env=("CUDA_VERSION=12.4.1", "NCCL_VERSION=2.22.3", "PYTORCH_VERSION=2.5.0.dev20240801"),
        layer_sizes=(29 * MiB, 2 * GiB + 310 * MiB, 3 * GiB + 402 * MiB),
    ),
)


def demo_image(path: str, tag: str) -> DemoImage:
    """The demo registry's image ``path:tag``; KeyError when it has none."""
    for image in DEMO_IMAGES:
        if (image.path, image.tag) == (path, tag):
            return image
    raise KeyError(f"{path}:{tag}")


class DemoRegistryTransport(HTTPAdapter):
    """Answers the registry API for ``images`` the way a Distribution registry does
    (status codes, error bodies, ``Docker-Content-Digest``), without a socket."""

    def __init__(self, images: tuple[DemoImage, ...] = DEMO_IMAGES) -> None:
        super().__init__()
        self._manifests: dict[tuple[str, str], bytes] = {}
        self._blobs: dict[tuple[str, str], bytes] = {}
        for image in images:
            manifest = image.manifest_bytes()
            self._manifests[(image.path, image.tag)] = manifest
            self._manifests[(image.path, _sha256(manifest))] = manifest
            config = image.config_bytes()
            self._blobs[(image.path, _sha256(config))] = config
        self._repositories = {image.path for image in images}

    def send(self, request: PreparedRequest, **kwargs: Any) -> Response:  # type: ignore[override]
        status, headers, body = self._answer(request.method or "GET", request.path_url)
        raw = HTTPResponse(
            body=io.BytesIO(b"" if request.method == "HEAD" else body),
            headers={**headers, "Content-Length": str(len(body))},
            status=status,
            preload_content=False,
            decode_content=False,
            request_method=request.method,
        )
        return self.build_response(request, raw)

    def _answer(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        path = path.partition("?")[0]
        if method not in ("GET", "HEAD"):
            return _error(405, "UNSUPPORTED", "the demo registry is read-only")
        if path in ("/v2/", "/v2"):
            return 200, {"Content-Type": "application/json", **_API_VERSION}, b"{}"
        match = _PATH.fullmatch(path)
        if match is None:
            return _error(404, "NOT_FOUND", "no such endpoint")
        name, kind, reference = match["name"], match["kind"], match["reference"]
        if name not in self._repositories:
            return _error(404, "NAME_UNKNOWN", "repository name not known to registry")
        if kind == "manifests":
            manifest = self._manifests.get((name, reference))
            if manifest is None:
                return _error(404, "MANIFEST_UNKNOWN", "manifest unknown")
            headers = {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": _sha256(manifest)}
            return 200, {**headers, **_API_VERSION}, manifest
        blob = self._blobs.get((name, reference))
        if blob is None:
            return _error(404, "BLOB_UNKNOWN", "blob unknown to registry")
        headers = {"Content-Type": "application/octet-stream", "Docker-Content-Digest": reference}
        return 200, {**headers, **_API_VERSION}, blob


_API_VERSION = {"Docker-Distribution-API-Version": "registry/2.0"}


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    body = _canonical({"errors": [{"code": code, "message": message}]})
    return status, {"Content-Type": "application/json", **_API_VERSION}, body
