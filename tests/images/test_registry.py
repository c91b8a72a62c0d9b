"""The registry client against Debian's docker-registry (plain, token auth, behind Basic auth)
and against small servers that misbehave on purpose: tampered bodies, 5xx, 429, silence."""

import base64
import hashlib
import json
import time
from datetime import UTC, datetime

import pytest

from images.oci import (
    MANIFEST_ACCEPT,
    RegistryAuthError,
    RegistryError,
    RegistryNotFound,
    RegistryUnavailable,
)
from images.registry import RegistryClient
from tests.registry_support import (
    BOT_PASSWORD,
    BOT_USER,
    NO_ACCESS_PASSWORD,
    NO_ACCESS_USER,
    OCI_INDEX,
    OCI_MANIFEST,
    TRAINER_LABELS,
    BasicAuthProxy,
    HangingServer,
    RegistryProcess,
    Reply,
    SeededImages,
    StubRegistry,
    TlsFiles,
    TokenRegistry,
    TokenServer,
    free_port,
    sha256_digest,
)

pytest_plugins = ["tests.registry_support"]

DIGEST_X = "sha256:" + "e" * 64
BOT_BASIC = "Basic " + base64.b64encode(f"{BOT_USER}:{BOT_PASSWORD}".encode()).decode()


def secrets_absent(error: BaseException, *secrets: str) -> bool:
    """No secret in the message of the error or of anything it was raised from."""
    chain: BaseException | None = error
    while chain is not None:
        text = f"{chain} {chain!r}"
        if any(secret in text for secret in secrets):
            return False
        chain = chain.__cause__ or chain.__context__
    return True


# --- a plain registry -------------------------------------------------------------------------


def test_tag_resolves_to_the_digest_of_the_exact_manifest_bytes_pushed(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    pushed = seeded_images.trainer

    with RegistryClient(local_registry.url) as client:
        resolved = client.resolve("team-a/trainer", "v1")

    assert resolved.digest == "sha256:" + hashlib.sha256(pushed.body).hexdigest()
    assert resolved.digest == pushed.registry_digest
    assert resolved.repository == "team-a/trainer"
    assert resolved.tag == "v1"
    assert resolved.media_type == OCI_MANIFEST
    assert resolved.manifest == json.loads(pushed.body)
    assert resolved.size == pushed.config.size + pushed.layers[0].size == pushed.image_size


def test_config_labels_versions_architecture_and_created_are_read_back(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    with RegistryClient(local_registry.url) as client:
        config = client.resolve("team-a/trainer", "v1").config

    assert config is not None
    assert config.digest == seeded_images.trainer.config.digest
    assert config.manifest_digest == seeded_images.trainer.digest
    assert config.architecture == "amd64"
    assert config.os == "linux"
    assert config.created == datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert config.labels == TRAINER_LABELS
    assert config.oci_labels == {
        "org.opencontainers.image.version": "1.4.2",
        "org.opencontainers.image.source": "https://git.example.org/team-a/trainer",
        "org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
    }
    assert config.cuda_version == "12.4.1"
    assert config.nccl_version == "2.21.5"
    assert config.frameworks == {"pytorch": "2.3.1"}


def test_docker_v2_manifest_resolves(local_registry: RegistryProcess, seeded_images: SeededImages):
    with RegistryClient(local_registry.url) as client:
        resolved = client.resolve("team-a/legacy", "v2")

    assert resolved.digest == seeded_images.legacy.digest
    assert resolved.media_type == "application/vnd.docker.distribution.manifest.v2+json"
    assert resolved.size == seeded_images.legacy.image_size
    assert resolved.config is not None
    assert resolved.config.created == datetime(2023, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert resolved.config.labels == {}
    assert resolved.config.cuda_version == "12.3.0"
    assert resolved.config.nccl_version is None
    assert resolved.config.frameworks == {"tensorflow": "2.16.1"}


def test_index_pins_the_index_digest_and_reads_the_amd64_config(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    with RegistryClient(local_registry.url) as client:
        resolved = client.resolve("team-a/multi", "v3")

    assert resolved.digest == seeded_images.multi.digest
    assert resolved.media_type == OCI_INDEX
    assert [m["digest"] for m in resolved.manifest["manifests"]] == [
        seeded_images.multi_arm64.digest,
        seeded_images.multi_amd64.digest,
    ]
    assert resolved.config is not None
    assert resolved.config.architecture == "amd64"
    assert resolved.config.manifest_digest == seeded_images.multi_amd64.digest
    assert resolved.config.digest == seeded_images.multi_amd64.config.digest
    assert resolved.size == seeded_images.multi_amd64.image_size


def test_index_without_amd64_reads_the_first_platform(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    with RegistryClient(local_registry.url) as client:
        resolved = client.resolve("team-a/multi", "no-amd64")

    assert resolved.digest == seeded_images.no_amd64.digest
    assert resolved.config is not None
    assert resolved.config.architecture == "arm64"
    assert resolved.config.manifest_digest == seeded_images.multi_arm64.digest


def test_inspect_by_digest_describes_the_same_image(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    with RegistryClient(local_registry.url) as client:
        by_tag = client.resolve("team-a/trainer", "v1")
        by_digest = client.inspect("team-a/trainer", seeded_images.trainer.digest)

    assert by_digest.tag is None
    assert by_digest.digest == seeded_images.trainer.digest
    assert (by_digest.media_type, by_digest.size) == (by_tag.media_type, by_tag.size)
    assert by_digest.manifest == by_tag.manifest
    assert by_digest.config == by_tag.config


def test_inspect_of_an_index_digest_reads_the_amd64_config(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    with RegistryClient(local_registry.url) as client:
        resolved = client.inspect("team-a/multi", seeded_images.multi.digest)

    assert resolved.digest == seeded_images.multi.digest
    assert resolved.config is not None
    assert resolved.config.architecture == "amd64"


def test_unknown_tag_is_not_found(local_registry: RegistryProcess, seeded_images: SeededImages):
    with RegistryClient(local_registry.url) as client, pytest.raises(RegistryNotFound) as raised:
        client.resolve("team-a/trainer", "does-not-exist")

    assert "team-a/trainer:does-not-exist not found" in str(raised.value)


def test_unknown_repository_is_not_found(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    with RegistryClient(local_registry.url) as client, pytest.raises(RegistryNotFound):
        client.resolve("team-z/nothing-here", "v1")


def test_unknown_digest_is_not_found(local_registry: RegistryProcess, seeded_images: SeededImages):
    with RegistryClient(local_registry.url) as client, pytest.raises(RegistryNotFound) as raised:
        client.inspect("team-a/trainer", DIGEST_X)

    assert DIGEST_X in str(raised.value)


# --- token auth -------------------------------------------------------------------------------


def test_token_flow_fetches_one_token_and_reuses_it(
    token_registry: TokenRegistry, fresh_token_server: TokenServer
):
    with RegistryClient(token_registry.url) as client:
        first = client.resolve("team-b/private", "v1")
        second = client.resolve("team-b/private", "v1")

    assert first.digest == second.digest == token_registry.private.digest
    assert first.config is not None
    assert first.config.oci_labels == {"org.opencontainers.image.version": "0.9.0"}
    assert len(fresh_token_server.requests) == 1
    assert fresh_token_server.requests[0].service == "gantry-test"
    assert fresh_token_server.requests[0].scopes == ["repository:team-b/private:pull"]
    assert fresh_token_server.requests[0].authorization is None


def test_token_in_access_token_field_is_accepted(
    token_registry: TokenRegistry, fresh_token_server: TokenServer
):
    fresh_token_server.token_field = "access_token"

    with RegistryClient(token_registry.url) as client:
        resolved = client.resolve("team-b/private", "v1")

    assert resolved.digest == token_registry.private.digest
    assert len(fresh_token_server.requests) == 1


def test_basic_credentials_reach_the_token_endpoint(
    token_registry: TokenRegistry, fresh_token_server: TokenServer
):
    with RegistryClient(token_registry.url, username=BOT_USER, password=BOT_PASSWORD) as client:
        resolved = client.inspect("team-b/private", token_registry.private.digest)

    assert resolved.digest == token_registry.private.digest
    assert [r.authorization for r in fresh_token_server.requests] == [BOT_BASIC]


def test_wrong_credentials_at_the_token_endpoint_are_an_auth_error(
    token_registry: TokenRegistry, fresh_token_server: TokenServer
):
    with (
        RegistryClient(token_registry.url, username=BOT_USER, password="wrong-pass-9Zq") as client,
        pytest.raises(RegistryAuthError) as raised,
    ):
        client.resolve("team-b/private", "v1")

    assert "refused" in str(raised.value)
    assert secrets_absent(raised.value, "wrong-pass-9Zq")


def test_a_token_without_access_is_an_auth_error(
    token_registry: TokenRegistry, fresh_token_server: TokenServer
):
    with (
        RegistryClient(
            token_registry.url, username=NO_ACCESS_USER, password=NO_ACCESS_PASSWORD
        ) as client,
        pytest.raises(RegistryAuthError) as raised,
    ):
        client.resolve("team-b/private", "v1")

    assert "HTTP 401 after authenticating" in str(raised.value)
    assert len(fresh_token_server.requests) == 1
    assert secrets_absent(raised.value, NO_ACCESS_PASSWORD)


# --- basic auth (a proxy in front of the real registry) ---------------------------------------


def test_basic_auth_answers_the_challenge_then_sends_credentials_up_front(
    basic_auth_proxy: BasicAuthProxy, seeded_images: SeededImages
):
    with RegistryClient(basic_auth_proxy.url, username=BOT_USER, password=BOT_PASSWORD) as client:
        first = client.resolve("team-a/trainer", "v1")
        second = client.resolve("team-a/trainer", "v1")

    assert first.digest == second.digest == seeded_images.trainer.digest
    # One 401 challenge, then HEAD, GET manifest, GET config for each resolve.
    assert basic_auth_proxy.authorizations == [None] + [BOT_BASIC] * 6


def test_basic_auth_without_credentials_is_an_auth_error(basic_auth_proxy: BasicAuthProxy):
    with RegistryClient(basic_auth_proxy.url) as client, pytest.raises(RegistryAuthError) as raised:
        client.resolve("team-a/trainer", "v1")

    assert "requires credentials" in str(raised.value)


def test_wrong_basic_credentials_are_an_auth_error(basic_auth_proxy: BasicAuthProxy):
    with (
        RegistryClient(
            basic_auth_proxy.url, username=BOT_USER, password="wrong-pass-9Zq"
        ) as client,
        pytest.raises(RegistryAuthError) as raised,
    ):
        client.resolve("team-a/trainer", "v1")

    wrong_basic = base64.b64encode(f"{BOT_USER}:wrong-pass-9Zq".encode()).decode()
    assert secrets_absent(raised.value, "wrong-pass-9Zq", wrong_basic)
    assert len(basic_auth_proxy.authorizations) == 2


# --- misbehaving registries -------------------------------------------------------------------

MANIFEST_BODY = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256_digest(b'{"architecture":"amd64","os":"linux"}'),
            "size": 37,
        },
        "layers": [],
    }
).encode()
CONFIG_BODY = b'{"architecture":"amd64","os":"linux"}'


def serve_image(stub: StubRegistry, *, manifest: bytes, claimed: str, config: bytes) -> None:
    headers = {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": claimed}
    stub.route("HEAD", "/v2/team/app/manifests/v1", Reply(200, headers, manifest))
    stub.route("GET", f"/v2/team/app/manifests/{claimed}", Reply(200, headers, manifest))
    stub.route(
        "GET",
        f"/v2/team/app/blobs/{sha256_digest(CONFIG_BODY)}",
        Reply(200, {"Content-Type": "application/octet-stream"}, config),
    )


def test_the_stub_serves_a_well_formed_image(stub_registry: StubRegistry):
    serve_image(
        stub_registry,
        manifest=MANIFEST_BODY,
        claimed=sha256_digest(MANIFEST_BODY),
        config=CONFIG_BODY,
    )

    resolved = RegistryClient(stub_registry.url).resolve("team/app", "v1")

    assert resolved.digest == sha256_digest(MANIFEST_BODY)
    assert resolved.size == 37
    assert resolved.config is not None
    assert resolved.config.architecture == "amd64"
    assert [(r.method, r.path) for r in stub_registry.requests] == [
        ("HEAD", "/v2/team/app/manifests/v1"),
        ("GET", f"/v2/team/app/manifests/{resolved.digest}"),
        ("GET", f"/v2/team/app/blobs/{sha256_digest(CONFIG_BODY)}"),
    ]
    assert stub_registry.requests[0].headers["Accept"] == MANIFEST_ACCEPT
    assert MANIFEST_ACCEPT == (
        "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
        "application/vnd.docker.distribution.manifest.list.v2+json, "
        "application/vnd.docker.distribution.manifest.v2+json"
    )


def test_a_tampered_manifest_is_rejected(stub_registry: StubRegistry):
    tampered = MANIFEST_BODY.replace(b'"layers": []', b'"layers": [] ')
    claimed = sha256_digest(MANIFEST_BODY)
    serve_image(stub_registry, manifest=tampered, claimed=claimed, config=CONFIG_BODY)

    with pytest.raises(RegistryError) as raised:
        RegistryClient(stub_registry.url).resolve("team/app", "v1")

    assert type(raised.value) is RegistryError
    assert f"manifest body does not match digest {claimed}" in str(raised.value)
    assert sha256_digest(tampered) in str(raised.value)


def test_a_tampered_manifest_is_rejected_by_inspect(stub_registry: StubRegistry):
    tampered = MANIFEST_BODY + b" "
    claimed = sha256_digest(MANIFEST_BODY)
    serve_image(stub_registry, manifest=tampered, claimed=claimed, config=CONFIG_BODY)

    with pytest.raises(RegistryError, match=f"manifest body does not match digest {claimed}"):
        RegistryClient(stub_registry.url).inspect("team/app", claimed)


def test_a_tampered_config_blob_is_rejected(stub_registry: StubRegistry):
    serve_image(
        stub_registry,
        manifest=MANIFEST_BODY,
        claimed=sha256_digest(MANIFEST_BODY),
        config=CONFIG_BODY.replace(b"amd64", b"arm64"),
    )

    with pytest.raises(RegistryError, match="config blob does not match digest"):
        RegistryClient(stub_registry.url).resolve("team/app", "v1")


def test_a_private_ca_is_trusted_through_ca_bundle(
    tls_stub_registry: StubRegistry, tls_files: TlsFiles
):
    claimed = sha256_digest(MANIFEST_BODY)
    serve_image(tls_stub_registry, manifest=MANIFEST_BODY, claimed=claimed, config=CONFIG_BODY)

    with RegistryClient(tls_stub_registry.url, ca_bundle=tls_files.ca) as client:
        resolved = client.resolve("team/app", "v1")

    assert tls_stub_registry.url.startswith("https://")
    assert resolved.digest == claimed


def test_an_untrusted_certificate_is_a_permanent_error(tls_stub_registry: StubRegistry):
    serve_image(
        tls_stub_registry,
        manifest=MANIFEST_BODY,
        claimed=sha256_digest(MANIFEST_BODY),
        config=CONFIG_BODY,
    )

    with pytest.raises(RegistryError) as raised:
        RegistryClient(tls_stub_registry.url).resolve("team/app", "v1")

    assert type(raised.value) is RegistryError
    assert "TLS verification failed" in str(raised.value)
    assert tls_stub_registry.requests == []


def test_name_unknown_says_the_repository_is_missing(stub_registry: StubRegistry):
    body = b'{"errors":[{"code":"NAME_UNKNOWN","message":"repository name not known"}]}'
    stub_registry.route(
        "GET",
        f"/v2/team/app/manifests/{DIGEST_X}",
        Reply(404, {"Content-Type": "application/json"}, body),
    )

    with pytest.raises(RegistryNotFound) as raised:
        RegistryClient(stub_registry.url).inspect("team/app", DIGEST_X)

    assert str(raised.value) == f"repository team/app not found on 127.0.0.1:{stub_registry.port}"


def test_without_a_digest_header_the_digest_is_the_hash_of_the_tag_body(
    stub_registry: StubRegistry,
):
    headers = {"Content-Type": OCI_MANIFEST}
    stub_registry.route("HEAD", "/v2/team/app/manifests/v1", Reply(200, headers, MANIFEST_BODY))
    stub_registry.route("GET", "/v2/team/app/manifests/v1", Reply(200, headers, MANIFEST_BODY))
    stub_registry.route(
        "GET", f"/v2/team/app/blobs/{sha256_digest(CONFIG_BODY)}", Reply(200, {}, CONFIG_BODY)
    )

    resolved = RegistryClient(stub_registry.url).resolve("team/app", "v1")

    assert resolved.digest == sha256_digest(MANIFEST_BODY)
    assert [r.method for r in stub_registry.requests] == ["HEAD", "GET", "GET"]


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_5xx_and_429_are_transient(stub_registry: StubRegistry, status: int):
    stub_registry.route("HEAD", "/v2/team/app/manifests/v1", Reply(status))

    with pytest.raises(RegistryUnavailable) as raised:
        RegistryClient(stub_registry.url).resolve("team/app", "v1")

    assert "registry unreachable, try again" in str(raised.value)
    assert f"HTTP {status}" in str(raised.value)
    assert raised.value.transient is True


def test_a_registry_that_never_answers_times_out(hanging_server: HangingServer):
    client = RegistryClient(hanging_server.url, timeout=0.5)
    started = time.monotonic()

    with pytest.raises(RegistryUnavailable) as raised:
        client.resolve("team/app", "v1")

    assert time.monotonic() - started < 1.5
    assert "registry unreachable, try again" in str(raised.value)
    assert "did not answer within 0.5 s" in str(raised.value)


def test_a_closed_port_is_transient():
    with pytest.raises(RegistryUnavailable, match="registry unreachable, try again"):
        RegistryClient(f"http://127.0.0.1:{free_port()}", timeout=2).resolve("team/app", "v1")


def test_a_token_endpoint_that_fails_is_transient(stub_registry: StubRegistry):
    challenge = (
        f'Bearer realm="{stub_registry.url}/token",service="s",scope="repository:team/app:pull"'
    )
    stub_registry.route(
        "HEAD", "/v2/team/app/manifests/v1", Reply(401, {"WWW-Authenticate": challenge})
    )
    stub_registry.route("GET", "/token?service=s&scope=repository%3Ateam%2Fapp%3Apull", Reply(503))

    with pytest.raises(RegistryUnavailable, match=r"token endpoint .* answered HTTP 503"):
        RegistryClient(stub_registry.url).resolve("team/app", "v1")


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base_url",
    ["ftp://x", "registry.example.org", "file:///etc/passwd", "http://", "https://u:p@host"],
)
def test_base_url_must_be_http_or_https_without_credentials(base_url: str):
    with pytest.raises(ValueError, match="base_url"):
        RegistryClient(base_url)


def test_ftp_base_url_message():
    with pytest.raises(ValueError) as raised:
        RegistryClient("ftp://x")

    assert str(raised.value) == "base_url: must start with http:// or https://, not 'ftp'"


def test_credentials_in_base_url_are_not_echoed():
    with pytest.raises(ValueError) as raised:
        RegistryClient("https://bot:hunter2-secret@registry.example.org")

    assert "hunter2-secret" not in str(raised.value)


def test_missing_ca_bundle_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ca_bundle"):
        RegistryClient("https://registry.example.org", ca_bundle=str(tmp_path / "none.pem"))


@pytest.mark.parametrize(
    ("repository", "tag"),
    [
        ("Team/App", "v1"),
        ("team//app", "v1"),
        ("registry.example.org:5000/team/app", "v1"),
        ("team/app-", "v1"),
        ("", "v1"),
    ],
)
def test_bad_repository_is_refused_before_any_request(
    stub_registry: StubRegistry, repository: str, tag: str
):
    with pytest.raises(ValueError, match=r"^repository: "):
        RegistryClient(stub_registry.url).resolve(repository, tag)

    assert stub_registry.requests == []


@pytest.mark.parametrize("tag", ["", "-v1", ".v1", "v1/x", "v 1", "a" * 129, "v1\n"])
def test_bad_tag_is_refused_before_any_request(stub_registry: StubRegistry, tag: str):
    with pytest.raises(ValueError, match=r"^tag: "):
        RegistryClient(stub_registry.url).resolve("team/app", tag)

    assert stub_registry.requests == []


@pytest.mark.parametrize(
    "digest",
    ["sha256:" + "a" * 63, "sha256:" + "A" * 64, "sha512:" + "a" * 128, "a" * 64, "latest"],
)
def test_bad_digest_is_refused_before_any_request(stub_registry: StubRegistry, digest: str):
    with pytest.raises(ValueError, match=r"^digest: "):
        RegistryClient(stub_registry.url).inspect("team/app", digest)

    assert stub_registry.requests == []


def test_longest_valid_tag_is_accepted(
    local_registry: RegistryProcess, seeded_images: SeededImages
):
    with pytest.raises(RegistryNotFound):
        RegistryClient(local_registry.url).resolve("team-a/trainer", "v" + "1" * 127)


def test_credentials_never_appear_in_errors(
    stub_registry: StubRegistry, hanging_server: HangingServer
):
    password = "pw-never-shown-4Tz"
    basic = base64.b64encode(f"{BOT_USER}:{password}".encode()).decode()
    stub_registry.route(
        "HEAD",
        "/v2/team/app/manifests/v1",
        Reply(401, {"WWW-Authenticate": 'Basic realm="stub"'}),
    )
    stub_registry.route("HEAD", "/v2/team/app/manifests/v2", Reply(503))
    failures: list[RegistryError] = []
    for url, tag in [
        (stub_registry.url, "v1"),
        (stub_registry.url, "v2"),
        (stub_registry.url, "v3"),
        (hanging_server.url, "v1"),
    ]:
        client = RegistryClient(url, username=BOT_USER, password=password, timeout=0.5)
        with pytest.raises(RegistryError) as raised:
            client.resolve("team/app", tag)
        failures.append(raised.value)

    assert [type(f) for f in failures] == [
        RegistryAuthError,
        RegistryUnavailable,
        RegistryNotFound,
        RegistryUnavailable,
    ]
    assert all(secrets_absent(f, password, basic) for f in failures)
    assert stub_registry.requests[1].headers["Authorization"] == f"Basic {basic}"
