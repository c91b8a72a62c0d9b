"""The "test connection" button on the cluster page, per backend and per persona."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from clusters.models import Cluster
from tests.clusters.backends.test_k8s_backend import TOKEN, TOKEN_ENV, settings_for
from tests.k8s_fake import FakeKubernetes


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


def test_simulator_cluster_reports_its_inventory(client, world):
    client.force_login(world.platform_admin)
    response = client.post(reverse("jobs:cluster_test", args=["sim-1"]))
    assert response.status_code == 302
    assert messages_of(response) == [
        ("success", "Connected to sim-1: it reports 4×8 a100-80gb, 2×8 h100-80gb.")
    ]


def last_message(client, name: str) -> tuple[str, str]:
    return messages_of(client.post(reverse("jobs:cluster_test", args=[name])))[-1]


def test_kubernetes_cluster_right_and_wrong_token(client, world, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv("GANTRY_TEST_WRONG_TOKEN", "wrong-token")
    client.force_login(world.platform_admin)
    with FakeKubernetes(token=TOKEN) as fake:
        Cluster.objects.create(
            name="k8s-east", backend=Cluster.Backend.KUBERNETES, settings=settings_for(fake)
        )
        Cluster.objects.create(
            name="k8s-bad",
            backend=Cluster.Backend.KUBERNETES,
            settings=settings_for(fake) | {"token_env": "GANTRY_TEST_WRONG_TOKEN"},
        )
        level, message = last_message(client, "k8s-east")
        assert level == "success"
        assert message.startswith("Connected to k8s-east: Kubernetes ")
        level, message = last_message(client, "k8s-bad")
    assert (level, message) == (
        "error",
        "k8s-bad: test connection: the API server rejected the credentials (401 "
        "Unauthorized): check the token in GANTRY_TEST_WRONG_TOKEN",
    )


@pytest.mark.parametrize("persona", ["researcher_a", "tenant_admin_a", "finance"])
def test_only_platform_admins_can_test_connections(client, world, persona):
    client.force_login(getattr(world, persona))
    assert client.post(reverse("jobs:cluster_test", args=["sim-1"])).status_code == 404


def test_test_connection_is_post_only(client, world):
    client.force_login(world.platform_admin)
    assert client.get(reverse("jobs:cluster_test", args=["sim-1"])).status_code == 405
