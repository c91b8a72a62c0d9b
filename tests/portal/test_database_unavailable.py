"""A request the database cannot serve is answered 503 with Retry-After, not 500
(portal/database_unavailable.py): its client sends it again, and nothing was half-written.

Found by the chaos test (tests/portal/test_chaos.py): while PostgreSQL restarted, 40 submits
were answered 500. Here the web process's connection goes to a port where nothing listens,
as it does while PostgreSQL restarts: the driver's own "connection refused".
"""

import contextlib
import uuid

import pytest
from django.db import connection
from django.urls import reverse

from jobs.models import Experiment, Run
from portal.database_unavailable import API_DETAIL
from tests.crash_support import free_port
from tests.jobs.test_api import body, client_for

RUNS = reverse("api:run-list")


@contextlib.contextmanager
def database_down():
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = str(free_port())
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = port


@pytest.mark.django_db(transaction=True)
def test_a_submit_while_the_database_is_down_is_a_503_and_its_retry_queues_it_once(world):
    client = client_for(world.researcher_a)
    key = str(uuid.uuid4())

    with database_down():
        refused = client.post(RUNS, body(world), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert (refused.status_code, refused["Retry-After"]) == (503, "5")
    assert refused.json() == {"detail": API_DETAIL}
    assert (Run.objects.count(), Experiment.objects.count()) == (0, 0)

    again = client.post(RUNS, body(world), format="json", HTTP_IDEMPOTENCY_KEY=key)
    replayed = client.post(RUNS, body(world), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert (again.status_code, replayed.status_code) == (201, 201)
    assert again.json()["id"] == replayed.json()["id"] == Run.objects.get().pk


@pytest.mark.django_db(transaction=True)
def test_a_page_while_the_database_is_down_is_a_503_page(client, world):
    client.force_login(world.researcher_a)

    with database_down():
        response = client.get(reverse("jobs:run_list"))

    assert (response.status_code, response["Retry-After"]) == (503, "5")
    assert "<h1>Unavailable for a moment</h1>" in response.content.decode()
