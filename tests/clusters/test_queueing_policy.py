"""The queueing policy of a cluster and a tenant's override (issue 35): stored with a
default, migrated onto existing rows, checked by the database, edited in the Django admin
(a bad value is refused and changes nothing) and audited as the other admin edits are."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from clusters.models import Cluster
from jobs.admission_types import Queueing as AdmissionQueueing
from tenants.models import AuditEvent, Tenant
from tenants.queueing import QUEUEING_DEFAULT, QUEUEING_MAX_LENGTH, Queueing
from tests.tenants.test_audit_log import admin_form_data, superuser_client  # noqa: F401

pytestmark = pytest.mark.django_db

BEFORE = [("clusters", "0004_i34_health_checks"), ("tenants", "0008_i31_invitation")]


def migrate(targets) -> None:
    MigrationExecutor(connection).migrate(targets)


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def test_the_vocabulary_is_admissions_and_backfill_is_the_default():
    assert [policy.value for policy in Queueing] == ["strict", "backfill", "best-effort"]
    assert AdmissionQueueing is Queueing
    assert QUEUEING_DEFAULT == "backfill"
    assert QUEUEING_MAX_LENGTH == 11  # len("best-effort")


def test_a_new_cluster_backfills_and_a_new_tenant_follows_its_clusters(world):
    cluster = Cluster.objects.create(name="sim-9", backend=Cluster.Backend.SIMULATOR)
    tenant = Tenant.objects.create(slug="audio", name="Audio")

    assert Cluster.objects.get(pk=cluster.pk).queueing == "backfill"
    assert Tenant.objects.get(pk=tenant.pk).queueing == ""


def test_existing_clusters_and_tenants_migrate_to_backfill_and_no_override(world):
    # Given a database before the policy existed, with a cluster and tenants in it
    migrate(BEFORE)
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM jobs_cluster")
        assert cursor.fetchall() == [("sim-1",)]

    # When it is migrated forwards
    migrate(latest())

    # Then the cluster backfills and no tenant overrides it
    assert list(Cluster.objects.values_list("name", "queueing")) == [("sim-1", "backfill")]
    assert list(Tenant.objects.order_by("slug").values_list("slug", "queueing")) == [
        ("nlp", ""),
        ("vision", ""),
    ]


@pytest.mark.parametrize(
    ("model", "value"),
    [(Cluster, "fifo"), (Cluster, ""), (Tenant, "fifo"), (Tenant, "Strict")],
)
def test_the_database_refuses_a_policy_that_is_none(world, model, value):
    with pytest.raises(IntegrityError), transaction.atomic():
        model.objects.update(queueing=value)

    assert set(model.objects.values_list("queueing", flat=True)) == {
        "backfill" if model is Cluster else ""
    }


def test_a_platform_admin_sets_a_clusters_policy_in_the_admin_audited(world, superuser_client):  # noqa: F811
    url = reverse("admin:clusters_cluster_change", args=[world.cluster.pk])
    data = admin_form_data(superuser_client.get(url)) | {"queueing": "strict"}

    response = superuser_client.post(url, data)

    assert response.status_code == 302
    assert Cluster.objects.get(pk=world.cluster.pk).queueing == "strict"
    (event,) = AuditEvent.objects.filter(action="cluster.update")
    assert (event.actor, event.target, event.before["queueing"], event.after["queueing"]) == (
        superuser_client.root,
        "cluster sim-1",
        "backfill",
        "strict",
    )
    assert {k for k in event.after if event.after[k] != event.before[k]} == {"queueing"}


def test_a_policy_that_is_none_is_refused_on_the_field_and_changes_nothing(
    world,
    superuser_client,  # noqa: F811
):
    url = reverse("admin:clusters_cluster_change", args=[world.cluster.pk])
    data = admin_form_data(superuser_client.get(url)) | {"queueing": "fifo", "enabled": ""}

    response = superuser_client.post(url, data)

    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "queueing": ["Select a valid choice. fifo is not one of the available choices."]
    }
    cluster = Cluster.objects.get(pk=world.cluster.pk)
    assert (cluster.queueing, cluster.enabled) == ("backfill", True)
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(("posted", "stored"), [("best-effort", "best-effort"), ("", "")])
def test_a_platform_admin_sets_or_clears_a_tenants_override_audited(
    world,
    superuser_client,  # noqa: F811
    posted,
    stored,
):
    Tenant.objects.filter(pk=world.vision.pk).update(queueing="strict")
    url = reverse("admin:tenants_tenant_change", args=[world.vision.pk])
    data = admin_form_data(superuser_client.get(url)) | {"queueing": posted}

    response = superuser_client.post(url, data)

    assert response.status_code == 302
    assert Tenant.objects.get(pk=world.vision.pk).queueing == stored
    (event,) = AuditEvent.objects.filter(action="tenant.update")
    assert (event.tenant, event.before["queueing"], event.after["queueing"]) == (
        world.vision,
        "strict",
        stored,
    )
    assert {k for k in event.after if event.after[k] != event.before[k]} == {"queueing"}


def test_a_tenant_override_that_is_none_is_refused_and_changes_nothing(
    world,
    superuser_client,  # noqa: F811
):
    url = reverse("admin:tenants_tenant_change", args=[world.vision.pk])
    data = admin_form_data(superuser_client.get(url)) | {"queueing": "fifo", "name": "Renamed"}

    response = superuser_client.post(url, data)

    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {
        "queueing": ["Select a valid choice. fifo is not one of the available choices."]
    }
    tenant = Tenant.objects.get(pk=world.vision.pk)
    assert (tenant.queueing, tenant.name) == ("", "Vision Lab")
    assert not AuditEvent.objects.exists()


def test_the_clusters_page_shows_each_clusters_policy(client, world):
    Cluster.objects.filter(pk=world.cluster.pk).update(queueing="best-effort")
    client.force_login(world.platform_admin)

    response = client.get(reverse("jobs:cluster_list"))

    assert response.status_code == 200
    assert (
        '<span class="tag" title="Queueing policy (set in the admin)" data-queueing>'
        "best-effort</span>"
    ) in response.content.decode()
