"""Every rank's NCCL, driver and CUDA versions (issue 36): a rank other than 0 reports its
own once (``POST /attempts/rank-report/``), rank 0's come with its runtime report, each rank
counts once, a rank the attempt cannot have is refused, and ``rank_versions`` counts the
ranks per version for any number of attempts in one query."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from jobs.models import Attempt, AttemptRankRuntime, AttemptState, RunEvent
from jobs.selectors.runtime import rank_versions
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit, attempt_token_issue
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

RANK_REPORT_URL = reverse("api:attempt-rank-report")
REPORT_URL = reverse("api:attempt-report")
VERSIONS = {"nccl_version": "2.21.5", "driver_version": "550.54.15", "cuda_version": "12.4"}


def submitted_attempt(world, *, gpus: int = 4) -> Attempt:
    """An attempt of ``gpus`` GPUs, admitted and handed to the simulator."""
    run = run_submit(user=world.researcher_a, data=experiment_input(world, gpus_per_node=gpus))
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    return attempt


def job(attempt: Attempt) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Attempt " + attempt_token_issue(attempt=attempt))
    return client


def rows(attempt: Attempt) -> list[tuple]:
    return list(
        AttemptRankRuntime.objects.filter(attempt=attempt)
        .order_by("rank")
        .values_list("rank", "hostname", "nccl_version", "driver_version", "cuda_version")
    )


def test_a_rank_reports_its_versions_and_host(world):
    attempt = submitted_attempt(world)
    events = RunEvent.objects.count()

    response = job(attempt).post(
        RANK_REPORT_URL, {"rank": 3, "hostname": "gpu-07", **VERSIONS}, format="json"
    )

    assert response.status_code == 200
    assert response.json() == {
        "attempt": attempt.pk,
        "run": attempt.run_id,
        "rank": 3,
        "changed": True,
    }
    assert rows(attempt) == [(3, "gpu-07", "2.21.5", "550.54.15", "12.4")]
    # Not rank 0's runtime report: the attempt's runtime and timeline are as they were.
    attempt.refresh_from_db()
    assert (attempt.runtime_env, attempt.runtime_reported_at) == ({}, None)
    assert RunEvent.objects.count() == events


def test_a_rank_reporting_twice_counts_once(world):
    attempt = submitted_attempt(world)
    client = job(attempt)
    body = {"rank": 1, "hostname": "gpu-07", **VERSIONS}
    client.post(RANK_REPORT_URL, body, format="json")
    [first_at] = AttemptRankRuntime.objects.values_list("reported_at", flat=True)

    again = client.post(RANK_REPORT_URL, body, format="json")

    assert (again.status_code, again.json()["changed"]) == (200, False)
    # Nothing written: the row still says when it was first reported.
    assert list(AttemptRankRuntime.objects.values_list("reported_at", flat=True)) == [first_at]

    changed = client.post(
        RANK_REPORT_URL, {**body, "nccl_version": "2.18.1", "hostname": "gpu-08"}, format="json"
    )

    assert changed.json()["changed"] is True
    assert rows(attempt) == [(1, "gpu-08", "2.18.1", "550.54.15", "12.4")]
    assert rank_versions(attempt_ids=[attempt.pk])[attempt.pk]["nccl_version"] == {"2.18.1": 1}


def test_a_rank_not_below_the_attempts_gpu_count_is_refused_and_nothing_stored(world):
    attempt = submitted_attempt(world, gpus=4)
    client = job(attempt)

    refused = client.post(RANK_REPORT_URL, {"rank": 4, **VERSIONS}, format="json")
    last = client.post(RANK_REPORT_URL, {"rank": 3, **VERSIONS}, format="json")

    assert refused.status_code == 400
    assert refused.json() == {
        "rank": [
            "Rank 4 is not one of the attempt's 4 GPUs (ranks 0 to 3): Gantry runs one rank "
            "per GPU."
        ]
    }
    assert last.status_code == 200
    assert [rank for rank, *_ in rows(attempt)] == [3]


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ({"nccl_version": "2.21.5"}, {"rank": ["This field is required."]}),
        ({"rank": "1", "nccl_version": "2.21.5"}, {"rank": ["A valid integer is required."]}),
        ({"rank": True, "nccl_version": "2.21.5"}, {"rank": ["A valid integer is required."]}),
        (
            {"rank": -1, "nccl_version": "2.21.5"},
            {"rank": ["Ensure this value is greater than or equal to 0."]},
        ),
        (
            {"rank": 1, "hostname": "gpu-07"},
            {
                "non_field_errors": [
                    "The report names no version (nccl_version, driver_version, cuda_version)."
                ]
            },
        ),
        ({"rank": 1, "nccl_version": 2.21}, {"nccl_version": ["Not a valid string."]}),
        (
            {"rank": 1, "nccl_version": "2.21.5", "node_list": ["gpu-07"]},
            {"node_list": ["Unknown field."]},
        ),
        (
            {"rank": 1, "cuda_version": "1" * 201},
            {"cuda_version": ["Ensure this field has no more than 200 characters."]},
        ),
    ],
    ids=["no-rank", "rank-text", "rank-bool", "negative", "no-version", "number", "extra", "long"],
)
def test_a_malformed_rank_report_is_refused_by_field_and_stores_nothing(world, body, errors):
    attempt = submitted_attempt(world)

    response = job(attempt).post(RANK_REPORT_URL, body, format="json")

    assert (response.status_code, response.json()) == (400, errors)
    assert AttemptRankRuntime.objects.count() == 0


def test_an_ended_attempts_token_reports_no_rank(world):
    attempt = submitted_attempt(world)
    client = job(attempt)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUCCEEDED)

    response = client.post(RANK_REPORT_URL, {"rank": 1, **VERSIONS}, format="json")

    assert response.status_code == 401
    assert AttemptRankRuntime.objects.count() == 0


def test_a_rank_report_locks_nothing_of_the_attempt_and_takes_three_statements(world):
    attempt = submitted_attempt(world)
    client = job(attempt)

    with CaptureQueriesContext(connection) as queries:
        response = client.post(RANK_REPORT_URL, {"rank": 2, **VERSIONS}, format="json")

    assert response.status_code == 200
    statements = [query["sql"] for query in queries.captured_queries]
    # The token's digests, the attempt with its run, the rank's row.
    assert len(statements) == 3
    assert not any("FOR UPDATE" in sql for sql in statements)


def test_rank_zeros_runtime_report_is_rank_zero_and_keeps_the_other_ranks(world):
    attempt = submitted_attempt(world)
    client = job(attempt)
    for rank in (1, 2, 3):
        client.post(
            RANK_REPORT_URL, {"rank": rank, "hostname": f"r{rank}", **VERSIONS}, format="json"
        )

    first = client.post(
        REPORT_URL, {"hostname": "r0", "python_version": "3.11.9", **VERSIONS}, format="json"
    )
    latest = client.post(
        REPORT_URL,
        {"hostname": "r0", "nccl_version": "2.21.6", "cudnn_version": "9.1.0"},
        format="json",
    )

    assert (first.status_code, latest.status_code) == (200, 200)
    attempt.refresh_from_db()
    # The latest full report replaced the runtime; the other ranks' versions stay.
    assert attempt.runtime_env == {
        "hostname": "r0",
        "nccl_version": "2.21.6",
        "cudnn_version": "9.1.0",
    }
    assert rows(attempt) == [
        (0, "r0", "2.21.6", "", ""),
        (1, "r1", "2.21.5", "550.54.15", "12.4"),
        (2, "r2", "2.21.5", "550.54.15", "12.4"),
        (3, "r3", "2.21.5", "550.54.15", "12.4"),
    ]
    assert rank_versions(attempt_ids=[attempt.pk]) == {
        attempt.pk: {
            "nccl_version": {"2.21.5": 3, "2.21.6": 1},
            "driver_version": {"550.54.15": 3},
            "cuda_version": {"12.4": 3},
        }
    }


def test_a_runtime_report_without_versions_leaves_rank_zeros_as_they_were(world):
    attempt = submitted_attempt(world)
    client = job(attempt)
    client.post(REPORT_URL, {"hostname": "r0", **VERSIONS}, format="json")

    response = client.post(REPORT_URL, {"node_list": ["gpu-07"]}, format="json")

    assert response.json()["changed"] is True  # the runtime, not rank 0's versions
    assert rows(attempt) == [(0, "r0", "2.21.5", "550.54.15", "12.4")]


def test_rank_versions_counts_ranks_per_version_for_many_attempts_in_one_query(
    world, django_assert_num_queries
):
    first = submitted_attempt(world, gpus=4)
    second = submitted_attempt(world, gpus=2)
    silent = submitted_attempt(world, gpus=2)
    current = {"nccl_version": "2.21.5", "driver_version": "550.54.15", "cuda_version": "12.4"}
    older = {"nccl_version": "2.18.1", "driver_version": "535.104.05", "cuda_version": "12.4"}
    reports = [
        (first, 0, current),
        (first, 1, current),
        (first, 2, older),
        # A rank without torch knows its driver only: it counts there and nowhere else.
        (first, 3, {"driver_version": "550.54.15"}),
        (second, 1, {"nccl_version": "2.21.5", "cuda_version": "12.1"}),
    ]
    for attempt, rank, versions in reports:
        job(attempt).post(RANK_REPORT_URL, {"rank": rank, **versions}, format="json")

    with django_assert_num_queries(1):
        counted = rank_versions(attempt_ids=[first.pk, second.pk, silent.pk])

    assert counted == {
        first.pk: {
            "nccl_version": {"2.21.5": 2, "2.18.1": 1},
            "driver_version": {"550.54.15": 3, "535.104.05": 1},
            "cuda_version": {"12.4": 3},
        },
        second.pk: {
            "nccl_version": {"2.21.5": 1},
            "driver_version": {},
            "cuda_version": {"12.1": 1},
        },
        silent.pk: {"nccl_version": {}, "driver_version": {}, "cuda_version": {}},
    }


def test_rank_versions_of_no_attempt_asks_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert rank_versions(attempt_ids=[]) == {}
