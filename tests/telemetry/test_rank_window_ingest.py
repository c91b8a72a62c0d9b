"""Ingesting per-rank step windows (issue 36, point 1): one batch of new, resent, refused and
capped windows stores exactly the rows it should and says so; a request of rank windows
makes the same few statements whatever its number of windows; the events endpoint checks a
token exactly as the runtime report does; the embedded mode (SQLite) stores the same."""

import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster, ClusterFlavor, SimulatedJob
from core.metrics import SDK_RANK_WINDOWS_REFUSED
from jobs.models import Attempt, AttemptState
from jobs.services.backend_submit import attempt_token_issue
from telemetry import rank_windows
from telemetry.models import RankStepWindow
from telemetry.rank_windows import HeldGpus
from telemetry.selectors.events_attempt import attempt_get_for_events
from telemetry.selectors.rank_windows import attempt_rank_windows
from telemetry.services import AttemptClosed, sdk_events_ingest
from tests import REPOSITORY
from tests.jobs.test_reproducibility import REPORT_URL, job_client
from tests.telemetry.test_telemetry_ingest import TS, admitted_attempt, batch, client_for, post
from tests.telemetry.test_telemetry_pages import submit

# TS is 2026-05-28 20:26:40 UTC: the clock hour [HOUR_START, HOUR_END) holds it.
HOUR_START = (TS // 3600) * 3600
HOUR_END = HOUR_START + 3600


def whole_node_attempt(world) -> Attempt:
    """A running attempt of 2 whole nodes of 8 GPUs on Kubernetes: its ranks may drive GPUs
    0-7 of gpu-01 and gpu-02, a world of 16."""
    run = submit(world, nodes=2, gpus_per_node=8)
    cluster = Cluster.objects.create(name="k8s-ranks", backend=Cluster.Backend.KUBERNETES)
    ClusterFlavor.objects.create(
        cluster=cluster, flavor=run.flavor, nodes=2, gpus_per_node=8, gpus=16
    )
    return Attempt.objects.create(
        run=run, number=1, cluster=cluster, state=AttemptState.RUNNING,
        node_list=["gpu-01.cluster.example", "gpu-02"],
    )  # fmt: skip


def window(rank, number, *, event, end=None, world_size=16, host=None, gpu=None, **fields):
    """Window ``number`` of ``rank`` as the SDK sends it, the ``event``-th event of its
    source; by default it ends ``number`` × 10 s after TS, on the rank's own GPU."""
    end = TS + 10 * number if end is None else end
    sent = {
        "type": "rank_window", "seq": event, "ts": end, "rank": rank, "local_rank": rank % 8,
        "world_size": world_size, "host": host or f"gpu-0{rank // 8 + 1}",
        "gpu": gpu or str(rank % 8), "window": number, "start": end - 10, "end": end,
        "steps": 25, "step_time_s": 0.4, "data_wait_s": 0.5, "comm_wait_s": 1.5,
    }  # fmt: skip
    sent.update(fields)
    return sent


def store(attempt, rank, numbers, *, end_of):
    """Windows of ``rank`` stored before the test's batch, ``end_of(number)`` their end."""
    RankStepWindow.objects.bulk_create(
        RankStepWindow(
            attempt=attempt,
            rank=rank,
            seq=number,
            world_size=16,
            local_rank=rank % 8,
            host=f"gpu-0{rank // 8 + 1}",
            gpu=str(rank % 8),
            start=datetime.fromtimestamp(end_of(number) - 10, tz=UTC),
            end=datetime.fromtimestamp(end_of(number), tz=UTC),
            steps=25,
            step_time_s=0.4,
        )
        for number in numbers
    )


def numbers_of(attempt, rank):
    return list(
        RankStepWindow.objects.filter(attempt=attempt, rank=rank)
        .order_by("seq")
        .values_list("seq", flat=True)
    )


def refused_counts():
    return {
        reason: SDK_RANK_WINDOWS_REFUSED.labels(reason=reason)._value.get()
        for reason in rank_windows.REFUSALS
    }


# --- one batch of everything ----------------------------------------------------------------


def test_a_batch_of_new_resent_refused_and_capped_windows_stores_exactly_the_new_ones(world):
    # Given rank 3 with 358 windows ending in this clock hour (2 short of the cap), and
    # rank 5 with its first window stored
    attempt = whole_node_attempt(world)
    store(attempt, 3, range(1, 359), end_of=lambda number: HOUR_START + number)
    store(attempt, 5, [1], end_of=lambda number: TS + 10 * number)
    before = refused_counts()
    events = [
        window(5, 1, event=1),  # resent
        window(5, 2, event=2),  # new
        window(5, 2, event=3),  # the same window twice in the batch
        window(3, 361, event=4, end=HOUR_START + 3000),  # arrives first, ends last: capped
        window(3, 359, event=5, end=HOUR_START + 2000),
        window(3, 360, event=6, end=HOUR_START + 2500),
        window(3, 362, event=7, end=HOUR_END),  # the next hour's first
        window(16, 1, event=8, host="gpu-02", gpu="7"),
        window(4, 1, event=9, world_size=8),
        window(4, 2, event=10, host="gpu-03"),
        {k: v for k, v in window(6, 1, event=11).items() if k != "gpu"},  # malformed
    ]

    # When a rank sends them in one request, and then again
    client = client_for(attempt)
    first = post(client, batch(*events, source="rank3"))
    again = post(client, batch(*events, source="rank3"))

    # Then the new windows are stored once, the cap keeps the ones that ended first, and
    # every other window is told apart with its reason
    cap_message = "rank 3 already sent 360 windows ending in this hour (one per 10 s at most)."
    assert first.status_code == 202
    assert first.json() == {
        "accepted": 4,
        "duplicates": 2,
        "rejected": 5,
        "refused": {
            "gpu_not_held": 1,
            "rank_out_of_range": 1,
            "window_cap": 1,
            "world_size_mismatch": 1,
        },
        "messages": [
            "rank 16 is not below the world size 16.",
            "world size 8 contradicts the attempt's 16 GPUs (one rank per GPU).",
            "rank 4 reports GPU 4 of gpu-03, which the attempt does not hold.",
            cap_message,
        ],
    }
    assert numbers_of(attempt, 3) == [*range(1, 361), 362]
    assert numbers_of(attempt, 5) == [1, 2]
    assert RankStepWindow.objects.filter(attempt=attempt).count() == 363
    assert again.json() == {
        "accepted": 0,
        "duplicates": 6,
        "rejected": 5,
        "refused": first.json()["refused"],
        "messages": first.json()["messages"],
    }
    assert RankStepWindow.objects.filter(attempt=attempt).count() == 363
    after = refused_counts()
    assert {reason: after[reason] - before[reason] for reason in after} == {
        "rank_out_of_range": 2, "world_size_mismatch": 2, "gpu_not_held": 2, "window_cap": 2,
    }  # fmt: skip


def test_the_detector_reads_back_exactly_what_was_sent(world):
    attempt = whole_node_attempt(world)
    end = TS + 10.123456
    sent = window(9, 1, event=1, end=end, step_time_s=0.1 + 0.2, data_wait_s=1e-05, steps=0)

    assert post(client_for(attempt), batch(sent)).json()["accepted"] == 1

    assert attempt_rank_windows(attempt_id=attempt.pk) == [
        {
            "rank": 9, "world_size": 16, "host": "gpu-02", "gpu": "1", "seq": 1,
            "start": end - 10, "end": end, "steps": 0, "step_time_s": 0.30000000000000004,
            "data_wait_s": 1e-05, "comm_wait_s": 1.5,
        }
    ]  # fmt: skip
    stored = RankStepWindow.objects.get(attempt=attempt)
    assert (stored.local_rank, stored.end) == (1, datetime(2026, 5, 28, 20, 26, 50, 123456, UTC))


# --- statements per request -------------------------------------------------------------------


@pytest.mark.parametrize("windows", [1, 12, 120])
def test_a_request_of_new_rank_windows_is_two_statements_whatever_its_windows(world, windows):
    # Given a rank of a whole-node attempt and its token
    attempt = whole_node_attempt(world)
    client = client_for(attempt)
    events = [window(2, number, event=number) for number in range(1, windows + 1)]

    # When it posts its windows
    with CaptureQueriesContext(connection) as queries:
        response = post(client, batch(*events, source="rank2"))

    # Then the token, the attempt and what it holds are one read, and the windows are one
    # statement that checks the attempt is live, skips stored ones, caps and inserts
    assert response.json()["accepted"] == windows
    assert [query["sql"].split()[0] for query in queries] == ["SELECT", "WITH"]
    assert numbers_of(attempt, 2) == list(range(1, windows + 1))


def test_a_resent_or_capped_request_takes_one_or_two_statements_more(world):
    attempt = whole_node_attempt(world)
    store(attempt, 3, range(1, 361), end_of=lambda number: HOUR_START + number)
    client = client_for(attempt)
    resent = [window(3, number, event=number, end=HOUR_START + number) for number in (1, 2)]
    post(client, batch(window(2, 1, event=1), source="rank2"))

    with CaptureQueriesContext(connection) as all_resent:
        assert post(client, batch(*resent, source="rank3")).json()["duplicates"] == 2
    with CaptureQueriesContext(connection) as some_stored:
        response = post(
            client,
            batch(
                window(3, 1, event=1, end=HOUR_START + 1),
                window(3, 361, event=2, end=HOUR_START + 361),
                window(3, 362, event=3, end=HOUR_END + 1),
                source="rank3-again",
            ),
        )

    # Nothing stored: is the attempt still live (the statement stores nothing otherwise),
    # and which were stored before; some stored: only which were stored before
    assert [query["sql"].split()[0] for query in all_resent] == [
        "SELECT", "WITH", "SELECT", "SELECT",
    ]  # fmt: skip
    assert [query["sql"].split()[0] for query in some_stored] == ["SELECT", "WITH", "SELECT"]
    assert {key: response.json()[key] for key in ("accepted", "duplicates", "refused")} == {
        "accepted": 1,
        "duplicates": 1,
        "refused": {"window_cap": 1},
    }
    assert numbers_of(attempt, 3) == [*range(1, 361), 362]


def test_a_simulator_attempt_reads_its_job_allocation_too(world):
    attempt = admitted_attempt(world)  # 2 GPUs on the simulator
    job = SimulatedJob.objects.create(
        cluster=attempt.cluster, name="held", flavor="a100-80gb", nodes=1, gpus_per_node=2,
        max_runtime_s=600, allocation={"sim-node-1": [2, 3]}, submitted_at=timezone.now(),
    )  # fmt: skip
    Attempt.objects.filter(pk=attempt.pk).update(backend_job_id=str(job.pk))
    client = client_for(attempt)
    events = [
        window(0, 1, event=1, world_size=2, host="sim-node-1", gpu="2"),
        window(1, 1, event=2, world_size=2, host="sim-node-1", gpu="1"),
    ]

    with CaptureQueriesContext(connection) as queries:
        response = post(client, batch(*events))

    assert [query["sql"].split()[0] for query in queries] == ["SELECT", "SELECT", "WITH"]
    assert (response.json()["accepted"], response.json()["refused"]) == (1, {"gpu_not_held": 1})


# --- an attempt that ends meanwhile -------------------------------------------------------------


@pytest.mark.parametrize("gpu", ["1", "GPU-not-held"], ids=["held", "refused"])
def test_rank_windows_that_race_the_end_of_their_attempt_are_refused_whole(world, gpu):
    # Given an attempt that ended after its token was checked (the service sees the end)
    attempt = admitted_attempt(world)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.PREEMPTED, finished_at=timezone.now()
    )
    held = HeldGpus(count=2, uuids=frozenset({"GPU-held"}))
    events = [window(1, 1, event=1, world_size=2, gpu=gpu)]

    # When its rank windows reach the service, then nothing is stored, whether the windows
    # would have been stored or refused
    with pytest.raises(AttemptClosed, match=r"^Attempt 1 of run \d+ has ended \(preempted\)"):
        sdk_events_ingest(attempt=attempt, source="rank1", events=events, held=held)
    assert not RankStepWindow.objects.exists()


# --- the token ---------------------------------------------------------------------------------


def test_the_events_read_finds_the_attempt_and_what_it_holds_in_one_statement(
    world, django_assert_num_queries
):
    attempt = whole_node_attempt(world)
    first = attempt_token_issue(attempt=attempt)  # two submit tries: two tokens, both valid
    second = attempt_token_issue(attempt=attempt)

    with django_assert_num_queries(1):
        found = attempt_get_for_events(token=second)

    assert found is not None
    assert (found.pk, found.number, found.run_id, found.state) == (
        attempt.pk, 1, attempt.run_id, AttemptState.RUNNING,
    )  # fmt: skip
    assert found.node_list == ["gpu-01.cluster.example", "gpu-02"]
    assert found.superseded is False
    assert found.held_gpus == HeldGpus(
        count=16,
        pairs=frozenset((host, str(gpu)) for host in ("gpu-01", "gpu-02") for gpu in range(8)),
    )
    assert attempt_get_for_events(token=first) is not None
    assert attempt_get_for_events(token=first[:-1] + ("A" if first[-1] != "A" else "B")) is None


def test_the_events_endpoint_answers_every_token_as_the_runtime_report_does(world):
    attempt, other = admitted_attempt(world), admitted_attempt(world, name="other")
    token, other_token = attempt_token_issue(attempt=attempt), attempt_token_issue(attempt=other)
    random_part = token.split(".", 1)[1]
    cases = {
        "unknown attempt": f"gat_{other.pk + 100}.{random_part}",
        "another attempt's secret": f"gat_{attempt.pk}.{other_token.split('.', 1)[1]}",
        "truncated": token[:-1],
        "extended": token + "A",
        "leading zero": f"gat_0{attempt.pk}.{random_part}",
        "not a token": "hello",
    }
    events = batch(window(1, 1, event=1, world_size=2, host="sim-node-1", gpu="1"))

    def answers(value):
        report = job_client(value).post(REPORT_URL, {"cuda_version": "12.4"}, format="json")
        sent = post(job_client(value), events)
        return (sent.status_code, sent.json()), (report.status_code, report.json())

    for name, value in cases.items():
        sent, report = answers(value)
        assert sent == report == (401, {"detail": "Invalid attempt token."}), name
    for header in ("Attempt", "Attempt a b", "Attempt tökén"):
        sent = post(APIClient(), events, HTTP_AUTHORIZATION=header)
        report = APIClient().post(
            REPORT_URL, {"cuda_version": "12.4"}, format="json", HTTP_AUTHORIZATION=header
        )
        assert (sent.status_code, sent.json()) == (report.status_code, report.json()), header
        assert sent.status_code == 401, header
    # A later attempt replaced it; then it ended
    later = Attempt.objects.create(run=attempt.run, number=2, cluster=attempt.cluster)
    replaced = answers(token)
    later.delete()
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.LOST)
    ended = answers(token)

    prefix = f"Attempt 1 of run {attempt.run_id}"
    assert (
        replaced[0]
        == replaced[1]
        == (
            401,
            {"detail": f"{prefix} was replaced by a later attempt: its token is no longer valid."},
        )
    )
    assert (
        ended[0]
        == ended[1]
        == (
            401,
            {"detail": f"{prefix} has ended (lost): its token is no longer valid."},
        )
    )
    assert not RankStepWindow.objects.exists()


# --- the embedded mode ---------------------------------------------------------------------------

SQLITE_SCRIPT = """
import json

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client

from clusters.models import Cluster, ClusterFlavor
from images.models import Image
from jobs.models import Attempt, AttemptState, Experiment, Run
from jobs.services.backend_submit import attempt_token_issue
from telemetry.selectors.events_attempt import attempt_get_for_events
from telemetry.selectors.rank_windows import attempt_rank_windows
from tenants.models import GpuFlavor, Project, Tenant

call_command("migrate", verbosity=0)
user = get_user_model().objects.create(username="ranks")
tenant = Tenant.objects.create(slug="t", name="T")
project = Project.objects.create(tenant=tenant, slug="p", name="P")
flavor = GpuFlavor.objects.create(slug="h100-80gb", name="H100", memory_gb=80)
cluster = Cluster.objects.create(name="k8s", backend=Cluster.Backend.KUBERNETES)
ClusterFlavor.objects.create(cluster=cluster, flavor=flavor, nodes=2, gpus_per_node=2, gpus=4)
image = Image.objects.create(
    repository="r.example.org/train", digest="sha256:" + "0" * 64, status=Image.Status.APPROVED
)
experiment = Experiment.objects.create(
    tenant=tenant, project=project, owner=user, name="e", image=image,
    image_reference=image.reference, command="python train.py", flavor=flavor, nodes=2,
    gpus_per_node=2, gantry_version="test",
)
run = Run.objects.create(
    experiment=experiment, tenant=tenant, flavor=flavor, gpus=4, submitted_by=user
)
attempt = Attempt.objects.create(
    run=run, number=1, cluster=cluster, state=AttemptState.RUNNING, node_list=["n1", "n2.x"]
)
token = attempt_token_issue(attempt=attempt)
client = Client(HTTP_AUTHORIZATION="Attempt " + token, HTTP_HOST="localhost")
T0 = 1_780_000_000.0
HOUR_END = (T0 // 3600 + 1) * 3600
events = iter(range(1, 10_000))


def window(rank, number, *, end=None, gpu=None, world_size=4):
    end = T0 + 10 * number if end is None else end
    return {
        "type": "rank_window", "seq": next(events), "ts": end, "rank": rank,
        "local_rank": rank % 2, "world_size": world_size, "host": f"n{rank // 2 + 1}",
        "gpu": gpu or str(rank % 2), "window": number, "start": end - 10, "end": end,
        "steps": 25, "step_time_s": 0.1 + 0.2, "data_wait_s": 0.5, "comm_wait_s": 1.5,
    }


def post(*sent):
    body = json.dumps({"source": "r", "events": list(sent)})
    response = client.post("/api/v1/attempts/events/", body, content_type="application/json")
    print(response.status_code, json.dumps(response.json(), sort_keys=True))


print(connection.vendor, attempt_get_for_events(token=token).held_gpus.pairs == {
    ("n1", "0"), ("n1", "1"), ("n2", "0"), ("n2", "1"),
})
post(window(0, 1), window(3, 1), window(3, 1), window(1, 2, gpu="7"), window(2, 1, world_size=8))
post(window(0, 1), window(3, 2))
post(*(window(1, n, end=HOUR_END - 400 + n) for n in range(1, 301)))
post(*(window(1, n, end=HOUR_END - 400 + n) for n in (363, 362, *range(300, 362))))
post(window(1, 400, end=HOUR_END))
rows = attempt_rank_windows(attempt_id=attempt.pk)
print(len(rows), json.dumps(rows[0], sort_keys=True))
print([row["seq"] for row in rows if row["rank"] == 1][-4:])
Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUCCEEDED)
post(window(0, 2))
"""


def test_the_embedded_mode_on_sqlite_stores_and_refuses_rank_windows_the_same(tmp_path):
    """SQLite has no arrays and other JSON functions: the statements read the batch through
    ``json_each`` there. Run as ``make run`` runs Gantry, in a process of its own."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env |= {"GANTRY_EMBEDDED": "1", "GANTRY_DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", SQLITE_SCRIPT],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    cap = "rank 1 already sent 360 windows ending in this hour (one per 10 s at most)."
    assert result.stdout.splitlines() == [
        "sqlite True",
        '202 {"accepted": 2, "duplicates": 1, "messages": ["rank 1 reports GPU 7 of n1, which '
        'the attempt does not hold.", "world size 8 contradicts the attempt\'s 4 GPUs (one '
        'rank per GPU)."], "refused": {"gpu_not_held": 1, "world_size_mismatch": 1}, '
        '"rejected": 2}',
        '202 {"accepted": 1, "duplicates": 1, "messages": [], "refused": {}, "rejected": 0}',
        '202 {"accepted": 300, "duplicates": 0, "messages": [], "refused": {}, "rejected": 0}',
        '202 {"accepted": 60, "duplicates": 1, "messages": ["' + cap + '"], "refused": '
        '{"window_cap": 3}, "rejected": 3}',
        '202 {"accepted": 1, "duplicates": 0, "messages": [], "refused": {}, "rejected": 0}',
        '364 {"comm_wait_s": 1.5, "data_wait_s": 0.5, "end": 1780000010.0, "gpu": "0", '
        '"host": "n1", "rank": 0, "seq": 1, "start": 1780000000.0, "step_time_s": '
        '0.30000000000000004, "steps": 25, "world_size": 4}',
        "[358, 359, 360, 400]",  # the capped are the three that end last
        "401 "
        + json.dumps(
            {"detail": "Attempt 1 of run 1 has ended (succeeded): its token is no longer valid."}
        ),
    ]
