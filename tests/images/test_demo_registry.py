"""The demo's in-process registry answers like a registry: the real client resolves its tags,
verifies its digests and reads its configs; Gantry uses it only for its host and only when
GANTRY_DEMO_REGISTRY is on."""

import hashlib
import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from requests.adapters import HTTPAdapter

from images.demo_registry import (
    DEMO_REGISTRY_URL,
    DemoRegistryTransport,
    GiB,
    MiB,
    demo_image,
)
from images.models import Registry
from images.oci import OCI_MANIFEST, RegistryNotFound
from images.registry import RegistryClient
from images.services.registries import (
    CatalogRegistryClient,
    registry_client_for,
    registry_create,
    tag_resolve,
)
from tests import REPOSITORY

PYTORCH_DIGEST = "sha256:3c7c01d2195c3005ac24b2ccec80f994e8e2a850f7978a15be8b0e21bac9d87f"


def demo_client() -> CatalogRegistryClient:
    return CatalogRegistryClient(DEMO_REGISTRY_URL, transport=DemoRegistryTransport())


def test_a_demo_tag_resolves_to_the_hash_of_the_manifest_it_serves_with_its_metadata():
    with demo_client() as client:
        resolved = client.resolve("ml/pytorch", "2.4-cuda12.4")

    manifest = demo_image("ml/pytorch", "2.4-cuda12.4").manifest_bytes()
    assert resolved.digest == "sha256:" + hashlib.sha256(manifest).hexdigest() == PYTORCH_DIGEST
    assert resolved.media_type == OCI_MANIFEST
    config = resolved.config
    assert config is not None
    assert (config.architecture, config.os) == ("amd64", "linux")
    assert config.created == datetime(2024, 7, 25, 9, 14, 3, 512345, tzinfo=UTC)
    assert (config.cuda_version, config.nccl_version) == ("12.4.1", "2.21.5")
    assert config.frameworks == {"pytorch": "2.4.0"}
    assert config.oci_labels["org.opencontainers.image.version"] == "2.4.0"
    config_size = len(demo_image("ml/pytorch", "2.4-cuda12.4").config_bytes())
    assert resolved.size == config_size + 29 * MiB + 5 * GiB + 398 * MiB + 1 * GiB + 507 * MiB


def test_nccl_and_cuda_come_from_nvidia_labels_where_the_image_has_them():
    with demo_client() as client:
        config = client.resolve("nlp/megatron", "24.05").config

    assert config is not None
    assert (config.cuda_version, config.nccl_version) == ("12.4.1.003", "2.21.5")
    assert config.frameworks == {"pytorch": "2.4.0a0"}


def test_a_demo_image_is_inspected_by_digest_and_unknown_names_are_not_found():
    with demo_client() as client:
        assert client.inspect("ml/pytorch", PYTORCH_DIGEST).tag is None
        assert client.ping() == "registry/2.0"
        unknown_tag = r"^ml/pytorch:2\.5 not found on registry\.gantry\.example$"
        with pytest.raises(RegistryNotFound, match=unknown_tag):
            client.resolve("ml/pytorch", "2.5")
        with pytest.raises(RegistryNotFound, match=r"^ml/tensorflow:latest not found"):
            client.resolve("ml/tensorflow", "latest")
        with pytest.raises(RegistryNotFound):
            client.inspect("ml/jax", PYTORCH_DIGEST)  # a digest of another repository


def test_the_transport_answers_only_for_the_url_it_is_given():
    transport = DemoRegistryTransport()
    client = RegistryClient(DEMO_REGISTRY_URL, transport=transport)

    assert client._session.get_adapter(f"{DEMO_REGISTRY_URL}/v2/") is transport
    assert isinstance(client._session.get_adapter("https://registry.example.org/v2/"), HTTPAdapter)
    assert client._session.get_adapter("https://registry.example.org/v2/") is not transport


@pytest.fixture
def demo_registry(world) -> Registry:
    return registry_create(name="demo", url=DEMO_REGISTRY_URL, actor=world.platform_admin)


def test_with_the_demo_registry_on_its_host_is_answered_in_process(settings, demo_registry):
    settings.GANTRY_DEMO_REGISTRY = True

    assert tag_resolve(repository="registry.gantry.example/ml/jax", tag="0.4.30-cuda12") == (
        demo_image("ml/jax", "0.4.30-cuda12").digest
    )
    with registry_client_for(demo_registry) as client:
        assert isinstance(
            client._session.get_adapter(DEMO_REGISTRY_URL + "/v2/"), DemoRegistryTransport
        )


def test_with_the_demo_registry_off_its_host_goes_over_the_network(settings, demo_registry):
    settings.GANTRY_DEMO_REGISTRY = False

    with registry_client_for(demo_registry) as client:
        adapter = client._session.get_adapter(DEMO_REGISTRY_URL + "/v2/")
    assert type(adapter) is HTTPAdapter


def test_another_registry_never_gets_the_demo_transport(settings, world):
    settings.GANTRY_DEMO_REGISTRY = True
    other = registry_create(
        name="other", url="https://registry.example.org", actor=world.platform_admin
    )

    with registry_client_for(other) as client:
        adapter = client._session.get_adapter("https://registry.example.org/v2/")
    assert type(adapter) is HTTPAdapter


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GANTRY_EMBEDDED": "1"}, "True"),
        ({"GANTRY_EMBEDDED": "1", "GANTRY_DEMO_REGISTRY": "0"}, "False"),
        ({"GANTRY_EMBEDDED": "0", "DJANGO_SECRET_KEY": "s" * 50}, "False"),
    ],
)
def test_the_embedded_default_turns_the_demo_registry_on_and_production_leaves_it_off(
    tmp_path, env, expected
):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings; print(settings.GANTRY_DEMO_REGISTRY)",
        ],
        cwd=REPOSITORY,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "GANTRY_DATA_DIR": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert (result.returncode, result.stdout.strip()) == (0, expected), result.stderr
