"""The image catalog against real registries: registries, import by tag or digest, review,
visibility, re-check, the researchers' catalog, and submitting by tag (resolved to a digest)."""

import base64
import json
import logging
import secrets
from datetime import UTC, datetime

import pytest
import requests
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from images.models import Image, Registry
from images.services import catalog, registries
from jobs.models import Experiment, Run
from jobs.services.submission import run_submit
from tenants.models import AuditEvent
from tests.conftest import experiment_input
from tests.registry_support import (
    BOT_PASSWORD,
    BOT_USER,
    DOCKER_MANIFEST,
    OCI_MANIFEST,
    TRAINER_LABELS,
    BasicAuthProxy,
    HangingServer,
    RegistryProcess,
    Reply,
    SeededImages,
    StubRegistry,
    TokenRegistry,
    TokenServer,
    build_and_push,
    free_port,
)

pytest_plugins = ["tests.registry_support"]

pytestmark = pytest.mark.django_db

NON_ADMINS = ["researcher_a", "researcher_b", "tenant_admin_a", "finance"]
SECRET_VAR = "GANTRY_TEST_REGISTRY_PASSWORD"
DIGEST_X = "sha256:" + "e" * 64
BOT_BASIC = "Basic " + base64.b64encode(f"{BOT_USER}:{BOT_PASSWORD}".encode()).decode()


# --- helpers -------------------------------------------------------------------------------


@pytest.fixture
def registry(world, local_registry: RegistryProcess, seeded_images: SeededImages) -> Registry:
    return registries.registry_create(
        name="local", url=local_registry.url, actor=world.platform_admin
    )


@pytest.fixture
def down_registry(world) -> Registry:
    """A registry on a port nobody listens on."""
    return registries.registry_create(
        name="down", url=f"http://127.0.0.1:{free_port()}", actor=world.platform_admin
    )


def host_of(process) -> str:
    return process.url.removeprefix("http://")


def unique_repository(prefix: str) -> str:
    return f"catalog/{prefix}-{secrets.token_hex(4)}"


def import_image(world, registry: Registry, reference: str) -> Image:
    image, created = catalog.image_import(
        registry=registry, reference=reference, actor=world.platform_admin
    )
    assert created
    return image


def approve(world, image: Image) -> Image:
    return catalog.image_set_status(
        image=image, status=Image.Status.APPROVED, actor=world.platform_admin
    )


def reference_errors(raised: pytest.ExceptionInfo[ValidationError]) -> dict[str, list[str]]:
    return raised.value.message_dict


def audits(action: str) -> list[tuple]:
    return list(
        AuditEvent.objects.filter(action=action)
        .order_by("id")
        .values_list("actor__username", "target", "before", "after")
    )


def registry_form(**overrides) -> dict:
    values = {
        "name": "internal",
        "url": "https://registry.internal.example",
        "auth_kind": "anonymous",
        "username": "",
        "password_secret_ref": "",
        "ca_bundle_path": "",
        "timeout_s": "10",
        "enabled": "on",
    }
    return values | overrides


def stored_text() -> str:
    """Every value of the rows a registry secret could leak into, as one string."""
    rows = [
        *Registry.objects.values(),
        *Image.objects.values(),
        *AuditEvent.objects.values(),
    ]
    return json.dumps(rows, default=str)


# --- import --------------------------------------------------------------------------------


def test_import_by_tag_records_the_exact_digest_labels_versions_and_size(
    world, registry, local_registry, seeded_images
):
    pushed = seeded_images.trainer

    image, created = catalog.image_import(
        registry=registry, reference="team-a/trainer:v1", actor=world.platform_admin
    )

    assert created
    image.refresh_from_db()
    assert image.registry == registry
    assert image.repository == f"{host_of(local_registry)}/team-a/trainer"
    assert image.registry_path == "team-a/trainer"
    assert image.digest == pushed.digest == pushed.registry_digest
    assert image.reference == f"{host_of(local_registry)}/team-a/trainer@{pushed.digest}"
    assert image.tag == "v1"
    assert image.status == Image.Status.PENDING
    assert image.labels == TRAINER_LABELS
    assert image.oci_labels == {
        "org.opencontainers.image.version": "1.4.2",
        "org.opencontainers.image.source": "https://git.example.org/team-a/trainer",
        "org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
    }
    assert image.cuda_version == "12.4.1"
    assert image.nccl_version == "2.21.5"
    assert image.frameworks == {"pytorch": "2.3.1"}
    assert (image.architecture, image.os) == ("amd64", "linux")
    assert image.created == datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert image.size_bytes == pushed.image_size
    assert image.media_type == OCI_MANIFEST
    assert image.check_status == Image.CheckStatus.OK
    assert image.last_checked_at is not None
    assert audits("image.import") == [
        (
            "paul",
            image.reference,
            None,
            {"registry": "local", "tag": "v1", "description": "", "status": "pending"},
        )
    ]


def test_import_by_digest_records_the_digest_without_a_tag(
    world, registry, local_registry, seeded_images
):
    pushed = seeded_images.legacy

    image = import_image(world, registry, f"team-a/legacy@{pushed.digest}")

    image.refresh_from_db()
    assert image.repository == f"{host_of(local_registry)}/team-a/legacy"
    assert (image.digest, image.tag) == (pushed.digest, "")
    assert image.media_type == DOCKER_MANIFEST
    assert image.labels == {}
    assert (image.cuda_version, image.nccl_version) == ("12.3.0", "")
    assert image.frameworks == {"tensorflow": "2.16.1"}
    assert image.created == datetime(2023, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert image.size_bytes == pushed.image_size


def test_import_accepts_the_full_name_with_the_registry_host(
    world, registry, local_registry, seeded_images
):
    image = import_image(world, registry, f"{host_of(local_registry)}/team-a/trainer:v1")

    assert image.repository == f"{host_of(local_registry)}/team-a/trainer"
    assert image.digest == seeded_images.trainer.digest


def test_a_multi_arch_tag_pins_the_index_and_describes_amd64(world, registry, seeded_images):
    image = import_image(world, registry, "team-a/multi:v3")

    assert image.digest == seeded_images.multi.digest
    assert image.architecture == "amd64"
    assert image.size_bytes == seeded_images.multi_amd64.image_size


def test_importing_again_keeps_status_and_visibility_and_refreshes_the_tag(
    world, registry, seeded_images
):
    image = approve(
        world, import_image(world, registry, f"team-a/trainer@{seeded_images.trainer.digest}")
    )

    again, created = catalog.image_import(
        registry=registry, reference="team-a/trainer:v1", actor=world.platform_admin
    )

    assert not created
    assert again.pk == image.pk
    again.refresh_from_db()
    assert (again.tag, again.status) == ("v1", Image.Status.APPROVED)
    assert Image.objects.filter(digest=seeded_images.trainer.digest).count() == 1
    assert audits("image.import")[-1] == (
        "paul",
        image.reference,
        {"tag": "", "description": ""},
        {"registry": "local", "tag": "v1", "description": ""},
    )


def test_unknown_tag_is_a_reference_error_and_saves_nothing(
    world, registry, local_registry, seeded_images
):
    before = Image.objects.count()

    with pytest.raises(ValidationError) as raised:
        catalog.image_import(
            registry=registry, reference="team-a/trainer:nope", actor=world.platform_admin
        )

    assert reference_errors(raised) == {
        "reference": [f"team-a/trainer:nope does not exist on local ({host_of(local_registry)})."]
    }
    assert Image.objects.count() == before
    assert audits("image.import") == []


def test_unknown_digest_is_a_reference_error(world, registry, local_registry):
    with pytest.raises(ValidationError) as raised:
        catalog.image_import(
            registry=registry, reference=f"team-a/trainer@{DIGEST_X}", actor=world.platform_admin
        )

    assert reference_errors(raised) == {
        "reference": [
            f"team-a/trainer@{DIGEST_X} does not exist on local ({host_of(local_registry)})."
        ]
    }


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (
            "team-a/trainer",
            "Add a tag or a digest: team/pytorch:2.4 or team/pytorch@sha256:<64 hex>.",
        ),
        (
            "team-a/trainer@sha256:xyz",
            "digest: 'sha256:xyz' is not valid, e.g. sha256: followed by 64 lowercase hex "
            "characters",
        ),
        ("team-a/trainer:v1@" + DIGEST_X, "Give a tag or a digest, not both."),
        (
            "Team-A/Trainer:v1",
            "repository: 'Team-A/Trainer' is not valid, e.g. team/pytorch (without the "
            "registry host)",
        ),
        ("", "Add a tag or a digest: team/pytorch:2.4 or team/pytorch@sha256:<64 hex>."),
    ],
)
def test_bad_reference_syntax_is_a_field_error_without_asking_the_registry(
    world, down_registry, reference, message
):
    with pytest.raises(ValidationError) as raised:
        catalog.image_import(
            registry=down_registry, reference=reference, actor=world.platform_admin
        )

    assert reference_errors(raised) == {"reference": [message]}
    assert not Image.objects.filter(registry=down_registry).exists()


def test_registry_down_says_unreachable_and_saves_nothing(world, down_registry):
    before = (Image.objects.count(), AuditEvent.objects.count())

    with pytest.raises(ValidationError) as raised:
        catalog.image_import(
            registry=down_registry, reference="team-a/trainer:v1", actor=world.platform_admin
        )

    assert reference_errors(raised) == {
        "reference": [f"registry unreachable, try again: cannot connect to {down_registry.host}"]
    }
    assert (Image.objects.count(), AuditEvent.objects.count()) == before


def test_registry_answering_5xx_says_unreachable_and_saves_nothing(
    world, stub_registry: StubRegistry
):
    stub_registry.route("HEAD", "/v2/team/x/manifests/v1", Reply(503))
    stub = registries.registry_create(
        name="stub", url=stub_registry.url, actor=world.platform_admin
    )

    with pytest.raises(ValidationError) as raised:
        catalog.image_import(registry=stub, reference="team/x:v1", actor=world.platform_admin)

    host = stub_registry.url.removeprefix("http://")
    assert reference_errors(raised) == {
        "reference": [f"registry unreachable, try again: {host} answered HTTP 503"]
    }
    assert not Image.objects.filter(registry=stub).exists()


def test_registry_that_times_out_says_unreachable_and_saves_nothing(
    world, hanging_server: HangingServer
):
    silent = registries.registry_create(
        name="silent", url=hanging_server.url, timeout_s=1, actor=world.platform_admin
    )

    with pytest.raises(ValidationError) as raised:
        catalog.image_import(registry=silent, reference="team/x:v1", actor=world.platform_admin)

    assert reference_errors(raised) == {
        "reference": [f"registry unreachable, try again: {silent.host} did not answer within 1 s"]
    }
    assert not Image.objects.filter(registry=silent).exists()


def test_a_disabled_registry_imports_nothing(world, registry):
    registry = registries.registry_update(
        registry=registry,
        url=registry.url,
        auth_kind="anonymous",
        enabled=False,
        actor=world.platform_admin,
    )

    with pytest.raises(ValidationError) as raised:
        catalog.image_import(
            registry=registry, reference="team-a/trainer:v1", actor=world.platform_admin
        )

    assert reference_errors(raised) == {"registry": ["This registry is disabled."]}


def test_import_page_imports_and_shows_the_image(client, world, registry, seeded_images):
    client.force_login(world.platform_admin)

    response = client.post(
        reverse("images:image_import"),
        {"registry": "local", "reference": "team-a/trainer:v1", "description": "Trainer"},
    )

    image = Image.objects.get(digest=seeded_images.trainer.digest)
    assert response.status_code == 302
    assert response.url == reverse("images:image_detail", args=[image.pk])
    assert image.description == "Trainer"
    page = client.get(response.url)
    content = page.content.decode()
    assert [str(m) for m in page.context["messages"]] == [f"Imported {image}: pending review."]
    assert image.reference in content
    assert "org.opencontainers.image.source" in content
    assert "pytorch 2.3.1" in content
    assert "12.4.1" in content


def test_import_page_shows_unreachable_and_saves_nothing(client, world, down_registry):
    client.force_login(world.platform_admin)

    response = client.post(
        reverse("images:image_import"), {"registry": "down", "reference": "team/x:v1"}
    )

    assert response.status_code == 400
    assert response.context["form"].errors == {
        "reference": [f"registry unreachable, try again: cannot connect to {down_registry.host}"]
    }
    assert not Image.objects.filter(registry=down_registry).exists()


# --- registries ----------------------------------------------------------------------------


def test_registry_create_and_update_are_audited_with_exact_values(world, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")

    registry = registries.registry_create(
        name="internal",
        url="https://Registry.Internal.Example/",
        auth_kind="basic",
        username="robot",
        password_secret_ref="INTERNAL_REGISTRY_PASSWORD",
        actor=world.platform_admin,
    )
    registries.registry_update(
        registry=registry,
        url="https://registry.internal.example",
        auth_kind="basic",
        username="robot2",
        password_secret_ref="INTERNAL_REGISTRY_PASSWORD",
        ca_bundle_path=str(ca),
        timeout_s=20,
        actor=world.platform_admin,
    )

    registry.refresh_from_db()
    assert (registry.url, registry.host) == (
        "https://registry.internal.example",
        "registry.internal.example",
    )
    created = {
        "url": "https://registry.internal.example",
        "auth_kind": "basic",
        "username": "robot",
        "password_secret_ref": "INTERNAL_REGISTRY_PASSWORD",
        "ca_bundle_path": "",
        "timeout_s": 10,
        "enabled": True,
    }
    assert audits("registry.create") == [
        ("paul", "internal", None, {"name": "internal", **created})
    ]
    assert audits("registry.update") == [
        (
            "paul",
            "internal",
            created,
            created | {"username": "robot2", "ca_bundle_path": str(ca), "timeout_s": 20},
        )
    ]


@pytest.mark.parametrize(
    ("overrides", "errors"),
    [
        ({"url": "ftp://registry.example.org"}, {"url": ["Must start with http:// or https://."]}),
        ({"url": "registry.example.org"}, {"url": ["Must start with http:// or https://."]}),
        (
            {"url": "https://user:pw@registry.example.org"},
            {"url": ["Must not contain credentials: use the username and secret fields."]},
        ),
        (
            {"url": "https://registry.example.org/v2/"},
            {"url": ["Only the scheme, host and port, e.g. https://registry.example.org."]},
        ),
        (
            {"auth_kind": "basic", "username": "robot", "password_secret_ref": "hunter2-pass!"},
            {
                "password_secret_ref": [
                    "The name of an environment variable (capital letters, digits and '_', "
                    "e.g. GANTRY_REGISTRY_PASSWORD), never the password itself."
                ]
            },
        ),
        (
            {"auth_kind": "basic", "password_secret_ref": "PASSWORD_VAR"},
            {"username": ["Required for basic authentication."]},
        ),
        (
            {"username": "robot"},
            {
                "auth_kind": [
                    "Anonymous access takes no username or password: choose basic or token."
                ]
            },
        ),
        (
            {"auth_kind": "token", "username": "robot"},
            {
                "password_secret_ref": [
                    "Give both the username and the password's variable, or neither."
                ]
            },
        ),
        (
            {"ca_bundle_path": "/no/such/ca.pem"},
            {"ca_bundle_path": ["An absolute path to a PEM file that exists on this host."]},
        ),
        (
            {"timeout_s": 0},
            {"timeout_s": ["A whole number of seconds from 1 to 120."]},
        ),
        (
            {"name": "Not A Slug"},
            {
                "name": [
                    "Use 1-63 lowercase letters, digits and dashes, starting and ending with a "
                    "letter or digit."
                ]
            },
        ),
    ],
)
def test_bad_registry_settings_are_field_errors_and_save_nothing(world, overrides, errors):
    values = {
        "name": "internal",
        "url": "https://registry.example.org",
        "auth_kind": "anonymous",
    } | overrides

    with pytest.raises(ValidationError) as raised:
        registries.registry_create(actor=world.platform_admin, **values)

    assert raised.value.message_dict == errors
    assert not Registry.objects.exists()
    assert audits("registry.create") == []


def test_a_second_registry_for_the_same_host_is_refused(world, registry, local_registry):
    with pytest.raises(ValidationError) as raised:
        registries.registry_create(name="again", url=local_registry.url, actor=world.platform_admin)

    assert raised.value.message_dict == {"url": ["The registry local has this host already."]}


def test_the_host_cannot_change_once_images_were_imported(world, registry, seeded_images):
    import_image(world, registry, "team-a/trainer:v1")

    with pytest.raises(ValidationError) as raised:
        registries.registry_update(
            registry=registry,
            url="http://127.0.0.1:1",
            auth_kind="anonymous",
            actor=world.platform_admin,
        )

    assert raised.value.message_dict == {
        "url": [f"Images from this registry are named {registry.host}/…: the host cannot change."]
    }
    registry.refresh_from_db()
    assert registry.url == f"http://{registry.host}"


def test_the_database_refuses_a_non_http_url_and_a_secret_that_is_not_a_name(db):
    with pytest.raises(IntegrityError), transaction.atomic():
        Registry.objects.create(name="bad", url="ftp://x", host="x")
    with pytest.raises(IntegrityError), transaction.atomic():
        Registry.objects.create(
            name="bad", url="https://x", host="x", password_secret_ref="p@ssw0rd!"
        )


def test_registry_form_shows_a_non_http_url_as_a_field_error(client, world):
    client.force_login(world.platform_admin)

    response = client.post(reverse("images:registry_create"), registry_form(url="ftp://r.example"))

    assert response.status_code == 400
    assert response.context["form"].errors == {"url": ["Must start with http:// or https://."]}
    assert not Registry.objects.exists()


def test_registry_pages_create_edit_and_list(client, world):
    client.force_login(world.platform_admin)

    created = client.post(reverse("images:registry_create"), registry_form())
    edited = client.post(
        reverse("images:registry_edit", args=["internal"]),
        registry_form(timeout_s="30", enabled=""),
    )
    listing = client.get(reverse("images:registry_list"))

    assert created.status_code == edited.status_code == 302
    registry = Registry.objects.get()
    assert (registry.timeout_s, registry.enabled) == (30, False)
    assert "https://registry.internal.example" in listing.content.decode()


def test_test_connection_reports_success_and_failure(client, world, registry, down_registry):
    client.force_login(world.platform_admin)

    ok = client.post(reverse("images:registry_test", args=["local"]), follow=True)
    failed = client.post(reverse("images:registry_test", args=["down"]), follow=True)

    assert [str(m) for m in ok.context["messages"]] == [
        f"Connected to local: {registry.host} answered the registry API (registry/2.0)."
    ]
    assert [str(m) for m in failed.context["messages"]] == [
        "Connection to down failed: registry unreachable, try again: cannot connect to "
        f"{down_registry.host}"
    ]


# --- token auth and secrets ----------------------------------------------------------------


def test_token_registry_with_a_secret_reference_imports_and_never_leaks_the_secret(
    client,
    world,
    monkeypatch,
    caplog,
    token_registry: TokenRegistry,
    fresh_token_server: TokenServer,
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(SECRET_VAR, BOT_PASSWORD)
    client.force_login(world.platform_admin)
    pages = []

    pages.append(
        client.post(
            reverse("images:registry_create"),
            registry_form(
                name="private",
                url=token_registry.url,
                auth_kind="token",
                username=BOT_USER,
                password_secret_ref=SECRET_VAR,
            ),
            follow=True,
        )
    )
    pages.append(client.post(reverse("images:registry_test", args=["private"]), follow=True))
    pages.append(
        client.post(
            reverse("images:image_import"),
            {"registry": "private", "reference": "team-b/private:v1"},
            follow=True,
        )
    )
    pages.append(client.get(reverse("images:registry_list")))
    pages.append(client.get(reverse("images:registry_edit", args=["private"])))
    pages.append(client.get(reverse("images:image_list")))
    pages.append(client.get(reverse("tenants:audit_list")))

    image = Image.objects.get(registry__name="private")
    assert image.digest == token_registry.private.digest
    assert image.labels == {"org.opencontainers.image.version": "0.9.0"}
    assert [str(m) for m in pages[1].context["messages"]] == [
        f"Connected to private: {image.registry.host} answered the registry API (registry/2.0)."
    ]
    assert {r.authorization for r in fresh_token_server.requests} == {BOT_BASIC}
    for page in pages:
        assert page.status_code == 200
        assert BOT_PASSWORD not in page.content.decode()
    assert SECRET_VAR in pages[4].content.decode()
    assert BOT_PASSWORD not in stored_text()
    assert BOT_PASSWORD not in caplog.text
    assert BOT_BASIC.split()[1] not in caplog.text


def test_wrong_password_in_the_variable_is_a_registry_error(
    world, monkeypatch, token_registry: TokenRegistry, fresh_token_server: TokenServer
):
    monkeypatch.setenv(SECRET_VAR, "not-the-password")
    registry = registries.registry_create(
        name="private",
        url=token_registry.url,
        auth_kind="token",
        username=BOT_USER,
        password_secret_ref=SECRET_VAR,
        actor=world.platform_admin,
    )

    with pytest.raises(ValidationError) as raised:
        catalog.image_import(
            registry=registry, reference="team-b/private:v1", actor=world.platform_admin
        )

    token_host = fresh_token_server.url.removeprefix("http://")
    assert reference_errors(raised) == {
        "registry": [
            f"token endpoint {token_host} refused with the configured credentials (HTTP 401). "
            "Check the username and the password variable of private."
        ]
    }
    assert "not-the-password" not in str(raised.value)
    assert not Image.objects.filter(registry=registry).exists()


def test_unset_secret_variable_is_named_and_nothing_is_saved(
    world, monkeypatch, token_registry: TokenRegistry
):
    monkeypatch.delenv(SECRET_VAR, raising=False)
    registry = registries.registry_create(
        name="private",
        url=token_registry.url,
        auth_kind="token",
        username=BOT_USER,
        password_secret_ref=SECRET_VAR,
        actor=world.platform_admin,
    )

    with pytest.raises(ValidationError) as raised:
        catalog.image_import(
            registry=registry, reference="team-b/private:v1", actor=world.platform_admin
        )

    assert reference_errors(raised) == {
        "registry": [
            f"the environment variable {SECRET_VAR} that holds the password for private is "
            "not set on this host."
        ]
    }
    assert not Image.objects.filter(registry=registry).exists()


def test_basic_auth_registry_imports_with_the_password_from_the_variable(
    world, monkeypatch, basic_auth_proxy: BasicAuthProxy, seeded_images
):
    monkeypatch.setenv(SECRET_VAR, BOT_PASSWORD)
    registry = registries.registry_create(
        name="basic",
        url=basic_auth_proxy.url,
        auth_kind="basic",
        username=BOT_USER,
        password_secret_ref=SECRET_VAR,
        actor=world.platform_admin,
    )

    image = import_image(world, registry, "team-a/trainer:v1")

    assert image.repository == f"{host_of(basic_auth_proxy)}/team-a/trainer"
    assert image.digest == seeded_images.trainer.digest
    assert BOT_BASIC in basic_auth_proxy.authorizations
    assert BOT_PASSWORD not in stored_text()


def test_anonymous_access_to_a_token_registry_gets_a_token_and_imports(
    world, token_registry: TokenRegistry, fresh_token_server: TokenServer
):
    registry = registries.registry_create(
        name="private", url=token_registry.url, auth_kind="token", actor=world.platform_admin
    )

    image = import_image(world, registry, "team-b/private:v1")

    assert image.digest == token_registry.private.digest
    assert {r.authorization for r in fresh_token_server.requests} == {None}


# --- review and visibility -----------------------------------------------------------------


def test_approve_and_block_are_audited_with_exact_before_and_after(
    client, world, registry, seeded_images
):
    image = import_image(world, registry, "team-a/trainer:v1")
    client.force_login(world.platform_admin)
    url = reverse("images:image_status", args=[image.pk])

    approved = client.post(url, {"status": "approved"})
    again = client.post(url, {"status": "approved"})
    blocked = client.post(url, {"status": "blocked"})
    bad = client.post(url, {"status": "pending"}, follow=True)

    assert approved.status_code == again.status_code == blocked.status_code == 302
    image.refresh_from_db()
    assert image.status == Image.Status.BLOCKED
    assert audits("image.status") == [
        ("paul", image.reference, {"status": "pending"}, {"status": "approved"}),
        ("paul", image.reference, {"status": "approved"}, {"status": "blocked"}),
    ]
    assert [str(m) for m in bad.context["messages"]][-1] == "Choose approved or blocked."


def test_visibility_allow_list_is_audited_and_decides_who_sees_the_image(
    client, world, registry, seeded_images
):
    image = approve(world, import_image(world, registry, "team-a/trainer:v1"))
    client.force_login(world.platform_admin)

    response = client.post(
        reverse("images:image_visibility", args=[image.pk]), {"allowed_tenants": ["nlp"]}
    )

    assert response.status_code == 302
    image.refresh_from_db()
    assert image.visible_to_all is False
    assert [t.slug for t in image.allowed_tenants.all()] == ["nlp"]
    assert audits("image.visibility") == [
        (
            "paul",
            image.reference,
            {"visible_to_all": True, "allowed_tenants": []},
            {"visible_to_all": False, "allowed_tenants": ["nlp"]},
        )
    ]
    detail = reverse("images:image_detail", args=[image.pk])
    client.force_login(world.researcher_b)
    assert client.get(detail).status_code == 200
    client.force_login(world.researcher_a)
    assert client.get(detail).status_code == 404


def test_hiding_an_image_from_every_tenant_is_refused(client, world, registry, seeded_images):
    image = approve(world, import_image(world, registry, "team-a/trainer:v1"))
    client.force_login(world.platform_admin)

    response = client.post(reverse("images:image_visibility", args=[image.pk]), {})

    assert response.status_code == 400
    assert response.context["visibility_form"].errors == {
        "allowed_tenants": ["Choose at least one tenant, or make it visible to all."]
    }
    image.refresh_from_db()
    assert image.visible_to_all is True
    assert audits("image.visibility") == []


# --- re-check ------------------------------------------------------------------------------


def test_recheck_of_an_unchanged_tag_is_ok(world, registry, seeded_images):
    image = import_image(world, registry, "team-a/trainer:v1")

    image = catalog.image_recheck(image=image, actor=world.platform_admin)

    assert image.check_status == Image.CheckStatus.OK
    assert image.check_message == f"tag v1 still points to {seeded_images.trainer.digest}"


def test_recheck_finds_a_tag_that_moved_and_keeps_the_digest(
    client, world, registry, local_registry
):
    repository = unique_repository("moving")
    first = build_and_push(local_registry.url, repository, "2.4", labels={"build": "1"})
    image = approve(world, import_image(world, registry, f"{repository}:2.4"))
    second = build_and_push(local_registry.url, repository, "2.4", labels={"build": "2"})
    assert second.digest != first.digest
    client.force_login(world.platform_admin)

    response = client.post(reverse("images:image_recheck", args=[image.pk]), follow=True)

    image.refresh_from_db()
    message = f"tag 2.4 now points to {second.digest}; this image stays pinned to {first.digest}"
    assert image.check_status == Image.CheckStatus.MOVED
    assert image.check_message == message
    assert (image.digest, image.tag, image.status) == (first.digest, "2.4", "approved")
    assert image.labels == {"build": "1"}
    assert [str(m) for m in response.context["messages"]] == [f"Re-checked: Tag moved. {message}"]
    assert audits("image.recheck") == [
        (
            "paul",
            image.reference,
            {"check_status": "ok", "check_message": f"Imported {repository}:2.4."},
            {"check_status": "moved", "check_message": message},
        )
    ]


def test_recheck_finds_a_deleted_digest_missing(world, registry, local_registry):
    repository = unique_repository("gone")
    pushed = build_and_push(local_registry.url, repository, "1.0")
    image = approve(world, import_image(world, registry, f"{repository}:1.0"))
    deleted = requests.delete(
        f"{local_registry.url}/v2/{repository}/manifests/{pushed.digest}", timeout=10
    )
    assert deleted.status_code == 202, deleted.text

    image = catalog.image_recheck(image=image, actor=world.platform_admin)

    assert image.check_status == Image.CheckStatus.MISSING
    assert image.check_message == (
        f"{pushed.digest} no longer exists on local; runs of this image cannot pull it."
    )
    assert image.digest == pushed.digest
    with pytest.raises(ValidationError) as raised:
        catalog.image_set_status(image=image, status="approved", actor=world.platform_admin)
    assert raised.value.message_dict == {
        "status": ["Its digest no longer exists on the registry: it cannot be approved."]
    }


def test_recheck_when_the_registry_is_down_records_an_error_and_nothing_else(world, down_registry):
    image = Image.objects.create(
        registry=down_registry,
        repository=f"{down_registry.host}/team/x",
        digest=DIGEST_X,
        tag="v1",
        status=Image.Status.APPROVED,
        check_status=Image.CheckStatus.OK,
        check_message="Imported team/x:v1.",
    )

    image = catalog.image_recheck(image=image, actor=world.platform_admin)

    image.refresh_from_db()
    assert image.check_status == Image.CheckStatus.ERROR
    assert image.check_message == (
        f"registry unreachable, try again: cannot connect to {down_registry.host}"
    )
    assert (image.digest, image.tag, image.status) == (DIGEST_X, "v1", "approved")


def test_recheck_of_an_image_no_registry_serves_is_refused(client, world):
    client.force_login(world.platform_admin)

    response = client.post(reverse("images:image_recheck", args=[world.image.pk]), follow=True)

    assert [str(m) for m in response.context["messages"]] == [
        "No enabled registry serves this image's host: register one to re-check it."
    ]
    world.image.refresh_from_db()
    assert world.image.check_status == ""
    assert audits("image.recheck") == []


# --- who sees what -------------------------------------------------------------------------


def listed(response) -> set[int]:
    return {image.pk for image in response.context["images"]}


def test_researchers_see_only_approved_images_visible_to_their_tenants(client, world):
    pending = Image.objects.create(repository="registry.example.org/ml/new", digest=DIGEST_X)
    url = reverse("images:image_list")

    client.force_login(world.researcher_a)
    vision = client.get(url)
    client.force_login(world.researcher_b)
    nlp = client.get(url)
    client.force_login(world.finance)
    finance = client.get(url)
    client.force_login(world.platform_admin)
    admin = client.get(url)

    assert listed(vision) == {world.image.pk}
    assert listed(nlp) == {world.image.pk, world.nlp_only_image.pk}
    assert listed(finance) == {world.image.pk}
    assert listed(admin) == {
        world.image.pk,
        world.nlp_only_image.pk,
        world.blocked_image.pk,
        pending.pk,
    }
    assert "registry.example.org/ml/old" not in vision.content.decode()


@pytest.mark.parametrize("which", ["nlp_only_image", "blocked_image", "pending", "missing"])
def test_image_detail_is_404_for_images_a_researcher_may_not_use(client, world, which):
    pending = Image.objects.create(repository="registry.example.org/ml/new", digest=DIGEST_X)
    image_id = {
        "nlp_only_image": world.nlp_only_image.pk,
        "blocked_image": world.blocked_image.pk,
        "pending": pending.pk,
        "missing": 999999,
    }[which]
    client.force_login(world.researcher_a)

    assert client.get(reverse("images:image_detail", args=[image_id])).status_code == 404


def test_researchers_see_labels_and_versions_but_no_admin_controls(client, world):
    Image.objects.filter(pk=world.image.pk).update(
        labels={"org.opencontainers.image.version": "2.4.0"},
        cuda_version="12.4",
        nccl_version="2.21.5",
        frameworks={"pytorch": "2.4.0"},
        architecture="amd64",
        os="linux",
        size_bytes=5 * 1024**3,
    )
    client.force_login(world.researcher_a)

    content = client.get(reverse("images:image_detail", args=[world.image.pk])).content.decode()

    assert "org.opencontainers.image.version" in content
    assert "pytorch 2.4.0" in content
    assert "2.21.5" in content
    assert "linux/amd64" in content
    assert "5.0\xa0GB" in content
    assert reverse("images:image_status", args=[world.image.pk]) not in content
    assert reverse("images:image_recheck", args=[world.image.pk]) not in content


def test_admin_catalog_filters_by_status_and_registry(client, world, registry, seeded_images):
    imported = import_image(world, registry, "team-a/trainer:v1")
    client.force_login(world.platform_admin)
    url = reverse("images:image_list")

    assert listed(client.get(url, {"status": "blocked"})) == {world.blocked_image.pk}
    assert listed(client.get(url, {"status": "pending"})) == {imported.pk}
    assert listed(client.get(url, {"registry": "local"})) == {imported.pk}
    assert listed(client.get(url, {"q": "megatron"})) == {world.nlp_only_image.pk}


def test_researchers_cannot_filter_their_way_to_hidden_images(client, world):
    client.force_login(world.researcher_a)

    response = client.get(reverse("images:image_list"), {"status": "blocked"})

    assert listed(response) == {world.image.pk}


def _add_images(world, count: int, start: int) -> None:
    for n in range(start, start + count):
        image = Image.objects.create(
            repository=f"registry.example.org/bulk/image-{n}",
            digest="sha256:" + f"{n:064x}",
            status=Image.Status.APPROVED,
            visible_to_all=n % 2 == 0,
            frameworks={"pytorch": "2.4.0"},
        )
        if n % 2:
            image.allowed_tenants.add(world.vision)


@pytest.mark.parametrize("persona", ["researcher_a", "platform_admin"])
def test_catalog_list_uses_the_same_number_of_queries_for_3_or_30_images(client, world, persona):
    client.force_login(getattr(world, persona))
    url = reverse("images:image_list")
    _add_images(world, 3, 1)
    client.get(url)  # warm caches (sessions, content types)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    _add_images(world, 27, 100)
    with CaptureQueriesContext(connection) as many:
        response = client.get(url)

    assert len(response.context["images"]) == 25
    assert len(many) == len(few) <= 8


@pytest.mark.parametrize("persona", NON_ADMINS)
def test_admin_pages_are_404_for_everyone_else_and_their_posts_change_nothing(
    client, world, registry, seeded_images, persona
):
    image = import_image(world, registry, "team-a/trainer:v1")
    before = (stored_text(), Image.objects.count(), Registry.objects.count())
    client.force_login(getattr(world, persona))

    pages = [
        client.get(reverse("images:registry_list")),
        client.get(reverse("images:registry_create")),
        client.post(reverse("images:registry_create"), registry_form()),
        client.get(reverse("images:registry_edit", args=["local"])),
        client.post(reverse("images:registry_edit", args=["local"]), registry_form(timeout_s=5)),
        client.post(reverse("images:registry_test", args=["local"])),
        client.get(reverse("images:image_import")),
        client.post(
            reverse("images:image_import"), {"registry": "local", "reference": "team-a/legacy:v2"}
        ),
        client.post(reverse("images:image_status", args=[image.pk]), {"status": "approved"}),
        client.post(reverse("images:image_visibility", args=[image.pk]), {"visible_to_all": "on"}),
        client.post(reverse("images:image_recheck", args=[image.pk])),
        client.get(reverse("images:image_detail", args=[image.pk])),  # pending
    ]

    assert [page.status_code for page in pages] == [404] * len(pages)
    assert (stored_text(), Image.objects.count(), Registry.objects.count()) == before


def test_anonymous_users_are_sent_to_log_in(client, world):
    for url in (reverse("images:image_list"), reverse("images:registry_list")):
        response = client.get(url)
        assert response.status_code == 302
        assert response.url.startswith(reverse("login"))


def test_navigation_links_the_catalog_for_everyone_and_registries_for_admins(client, world):
    client.force_login(world.researcher_a)
    researcher = client.get(reverse("jobs:run_list")).content.decode()
    client.force_login(world.platform_admin)
    admin = client.get(reverse("jobs:run_list")).content.decode()

    assert f'href="{reverse("images:image_list")}"' in researcher
    assert f'href="{reverse("images:registry_list")}"' not in researcher
    assert f'href="{reverse("images:registry_list")}"' in admin


# --- submitting by tag ---------------------------------------------------------------------


def test_submit_by_tag_resolves_to_the_approved_digest(world, registry, seeded_images):
    image = approve(world, import_image(world, registry, "team-a/trainer:v1"))

    run = run_submit(
        user=world.researcher_a,
        data=experiment_input(world, image=f"{registry.host}/team-a/trainer:v1"),
    )

    experiment = run.experiment
    assert experiment.image == image
    assert experiment.image_reference == (
        f"{registry.host}/team-a/trainer@{seeded_images.trainer.digest}"
    )


def test_submit_by_tag_of_a_pending_digest_is_refused_and_saves_nothing(
    world, registry, seeded_images
):
    import_image(world, registry, "team-a/trainer:v1")

    with pytest.raises(ValidationError) as raised:
        run_submit(
            user=world.researcher_a,
            data=experiment_input(world, image=f"{registry.host}/team-a/trainer:v1"),
        )

    assert raised.value.message_dict == {
        "image": [
            f"This tag resolves to {seeded_images.trainer.digest}, which is not approved for "
            "this tenant."
        ]
    }
    assert (Experiment.objects.count(), Run.objects.count()) == (0, 0)


def test_submit_by_tag_of_an_image_not_visible_to_the_tenant_is_refused(
    world, registry, seeded_images
):
    image = approve(world, import_image(world, registry, "team-a/trainer:v1"))
    catalog.image_set_visibility(
        image=image, visible_to_all=False, allowed_tenants=[world.nlp], actor=world.platform_admin
    )

    with pytest.raises(ValidationError) as raised:
        run_submit(
            user=world.researcher_a,
            data=experiment_input(world, image=f"{registry.host}/team-a/trainer:v1"),
        )

    assert list(raised.value.message_dict) == ["image"]
    assert "which is not approved for this tenant" in raised.value.message_dict["image"][0]
    assert Experiment.objects.count() == 0


def test_submit_by_tag_that_moved_to_an_unapproved_digest_is_refused(
    world, registry, local_registry
):
    repository = unique_repository("submit-moved")
    build_and_push(local_registry.url, repository, "latest", labels={"build": "1"})
    approve(world, import_image(world, registry, f"{repository}:latest"))
    moved = build_and_push(local_registry.url, repository, "latest", labels={"build": "2"})

    with pytest.raises(ValidationError) as raised:
        run_submit(
            user=world.researcher_a,
            data=experiment_input(world, image=f"{registry.host}/{repository}:latest"),
        )

    assert raised.value.message_dict == {
        "image": [f"This tag resolves to {moved.digest}, which is not approved for this tenant."]
    }


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (
            "registry.example.org/ml/pytorch:2.4-cuda12",
            "No registry is registered for registry.example.org: pin the image by digest "
            "(repository@sha256:<64 hex>).",
        ),
        (
            "registry.example.org/ml/pytorch",
            "Pin the image by digest (repository@sha256:<64 hex>) or name a tag to resolve "
            "(repository:tag).",
        ),
        (
            "registry.example.org/ml/pytorch@sha256:xyz",
            "Invalid digest: expected sha256: and 64 lowercase hex.",
        ),
    ],
)
def test_submit_refuses_references_it_cannot_pin(world, reference, message):
    with pytest.raises(ValidationError) as raised:
        run_submit(user=world.researcher_a, data=experiment_input(world, image=reference))

    assert raised.value.message_dict == {"image": [message]}
    assert Experiment.objects.count() == 0


def test_submit_by_unknown_tag_says_it_does_not_exist(world, registry, seeded_images):
    with pytest.raises(ValidationError) as raised:
        run_submit(
            user=world.researcher_a,
            data=experiment_input(world, image=f"{registry.host}/team-a/trainer:nope"),
        )

    assert raised.value.message_dict == {
        "image": [f"{registry.host}/team-a/trainer:nope does not exist."]
    }


def test_submit_by_tag_when_the_registry_is_down_says_unreachable_and_saves_nothing(
    world, down_registry
):
    with pytest.raises(ValidationError) as raised:
        run_submit(
            user=world.researcher_a,
            data=experiment_input(world, image=f"{down_registry.host}/team/x:v1"),
        )

    assert raised.value.message_dict == {
        "image": [f"registry unreachable, try again: cannot connect to {down_registry.host}"]
    }
    assert (Experiment.objects.count(), Run.objects.count()) == (0, 0)


def test_submit_form_accepts_a_tag_and_records_the_digest(client, world, registry, seeded_images):
    image = approve(world, import_image(world, registry, "team-a/trainer:v1"))
    client.force_login(world.researcher_a)

    response = client.post(
        reverse("jobs:run_submit"),
        {
            "tenant": "vision",
            "project": "detection",
            "image": f"{registry.host}/team-a/trainer:v1",
            "command": "python train.py",
            "flavor": "a100-80gb",
            "nodes": "1",
            "gpus_per_node": "1",
            "priority": "50",
            "max_runtime_minutes": "60",
            "max_restarts": "0",
            "params": "{}",
            "env": "{}",
        },
    )

    assert response.status_code == 302, response.context["form"].errors
    assert Experiment.objects.get().image_reference == image.reference
