"""What the admission cycle writes of backfill (issue 35), given decisions made by hand (the
decisions themselves are jobs.admission's): a backfilled run's timeline says which run of
its tenant it started ahead of and why; the waiting head's message ends with the nodes and
time reserved for it, kept whole when the message is cut, and its run page shows them to
its tenant only."""

from datetime import UTC, datetime

import pytest
import time_machine
from django.urls import reverse

from jobs import admission
from jobs.admission_types import Admit, Decisions, Shadow, Wait, Waiting
from jobs.models import Run, RunEvent, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.lifecycle import WAIT_MESSAGE_MAX_LENGTH
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
# 2026-12-06 14:00:30 UTC: a reserved start within a minute, shown as the minute after it.
RESERVED_AT = datetime(2026, 12, 6, 14, 0, 30, tzinfo=UTC).timestamp()
NODES = ("sim-1-a100-80gb-00", "sim-1-a100-80gb-01")


def two_runs(world) -> tuple[Run, Run]:
    """Vision's head (a two-node gang) and a small run behind it."""
    with time_machine.travel(T0, tick=False):
        head = run_submit(
            user=world.researcher_a, data=experiment_input(world, nodes=2, gpus_per_node=8)
        )
        small = run_submit(user=world.researcher_a, data=experiment_input(world))
    return head, small


def decided(monkeypatch, decisions: Decisions) -> None:
    """The next cycles decide ``decisions``, whatever the snapshot."""
    monkeypatch.setattr(admission, "decide", lambda snapshot: decisions)


def cycle() -> None:
    with time_machine.travel(T0, tick=False):
        admission_run_cycle(now=T0)


def head_waiting(head: Run, message: str = "no placement on the free GPUs now") -> Waiting:
    return Waiting(head.pk, Wait.CAPACITY, message, position=1)


def test_a_backfilled_runs_timeline_says_whose_start_it_went_ahead_of_and_why(world, monkeypatch):
    head, small = two_runs(world)
    because = f"it ends before run {head.pk}'s reserved start at 2026-12-06 14:01 UTC"
    decided(
        monkeypatch,
        Decisions(
            admitted=(
                Admit(
                    small.pk,
                    "sim-1",
                    nodes=("sim-1-a100-80gb-03",),
                    ahead_of=head.pk,
                    ahead_because=because,
                ),
            ),
            preempted=(),
            waiting=(head_waiting(head),),
            shadows=(Shadow(head.pk, "sim-1", "a100-80gb", NODES, RESERVED_AT),),
        ),
    )

    cycle()

    event = RunEvent.objects.get(run=small, reason="ADMITTED")
    assert event.message == (
        "Admitted to sim-1 on sim-1-a100-80gb-03: 2 a100-80gb GPUs within its guarantee; "
        f"started ahead of run {head.pk}: {because}"
    )
    assert Run.objects.get(pk=small.pk).state == RunState.ADMITTED


def test_a_run_admitted_in_its_turn_says_nothing_of_backfill(world, monkeypatch):
    head, small = two_runs(world)
    decided(
        monkeypatch,
        Decisions(
            admitted=(Admit(head.pk, "sim-1", nodes=NODES),),
            preempted=(),
            waiting=(Waiting(small.pk, Wait.BEHIND_HEAD, "behind", position=1),),
        ),
    )

    cycle()

    assert RunEvent.objects.get(run=head, reason="ADMITTED").message == (
        "Admitted to sim-1 on sim-1-a100-80gb-00, sim-1-a100-80gb-01: 16 a100-80gb GPUs "
        "within its guarantee"
    )


@pytest.mark.parametrize(
    ("at", "ending"),
    [
        (
            RESERVED_AT,
            "; reserved: sim-1-a100-80gb-00, sim-1-a100-80gb-01 on sim-1 from 2026-12-06 14:01 UTC",
        ),
        (
            datetime(2026, 12, 6, 14, 0, tzinfo=UTC).timestamp(),
            "; reserved: sim-1-a100-80gb-00, sim-1-a100-80gb-01 on sim-1 from 2026-12-06 14:00 UTC",
        ),
        (
            None,
            "; reserved: sim-1-a100-80gb-00, sim-1-a100-80gb-01 on sim-1, from when the runs "
            "there end (one has no maximum runtime)",
        ),
    ],
)
def test_the_heads_wait_message_names_the_nodes_and_time_reserved_for_it(
    world, monkeypatch, at, ending
):
    head, small = two_runs(world)
    decided(
        monkeypatch,
        Decisions(
            admitted=(),
            preempted=(),
            waiting=(
                head_waiting(head),
                Waiting(small.pk, Wait.BEHIND_HEAD, "it would end after", position=2),
            ),
            shadows=(Shadow(head.pk, "sim-1", "a100-80gb", NODES, at),),
        ),
    )

    cycle()

    assert Run.objects.get(pk=head.pk).wait_message == "no placement on the free GPUs now" + ending
    # Only the head holds a reservation: the run behind it keeps the core's words.
    assert Run.objects.get(pk=small.pk).wait_message == "it would end after"


def test_a_long_message_is_cut_before_the_reservation_not_through_it(world, monkeypatch):
    head, _ = two_runs(world)
    decided(
        monkeypatch,
        Decisions(
            admitted=(),
            preempted=(),
            waiting=(head_waiting(head, "x" * 2000),),
            shadows=(Shadow(head.pk, "sim-1", "a100-80gb", NODES, RESERVED_AT),),
        ),
    )

    cycle()

    message = Run.objects.get(pk=head.pk).wait_message
    ending = "; reserved: sim-1-a100-80gb-00, sim-1-a100-80gb-01 on sim-1 from 2026-12-06 14:01 UTC"
    assert len(message) == WAIT_MESSAGE_MAX_LENGTH
    assert message == "x" * (WAIT_MESSAGE_MAX_LENGTH - len(ending)) + ending


def test_the_heads_page_shows_its_reservation_to_its_tenant_only(client, world, monkeypatch):
    head, _ = two_runs(world)
    decided(
        monkeypatch,
        Decisions(
            admitted=(),
            preempted=(),
            waiting=(head_waiting(head),),
            shadows=(Shadow(head.pk, "sim-1", "a100-80gb", NODES, RESERVED_AT),),
        ),
    )
    cycle()
    url = reverse("jobs:run_detail", args=[head.pk])

    client.force_login(world.researcher_a)
    page = client.get(url)
    client.force_login(world.researcher_b)
    outsider = client.get(url)

    assert page.status_code == 200
    assert (
        "no placement on the free GPUs now; reserved: sim-1-a100-80gb-00, sim-1-a100-80gb-01 "
        "on sim-1 from 2026-12-06 14:01 UTC"
    ) in page.content.decode()
    assert outsider.status_code == 404
