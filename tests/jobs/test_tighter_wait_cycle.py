"""What the admission cycle stores of a spread placement (issue 36, point 3): the attempt of
a gang admitted across two leaf switches keeps, in ``tighter_wait_s``, how long it would
have waited for one leaf, counted as backfill counts held runs (``HeldRun.latest_end``: a
run not started yet frees its GPUs at the latest at the end of the placement grace plus
its maximum runtime)."""

from datetime import UTC, datetime

import pytest
import time_machine
from django.conf import settings

from clusters.services import cluster_refresh_inventory
from jobs.models import Attempt
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
A100 = "sim-1-a100-80gb-"


def two_leaves(world, *, drained: dict[str, str]) -> None:
    """sim-1's four a100 nodes in one block of two leaves: 00 and 01, 02 and 03."""
    world.cluster.settings["pools"] = [
        {
            "flavor": "a100-80gb",
            "nodes": 4,
            "gpus_per_node": 8,
            "domains": [1, 2],
            "drained": drained,
        },
        {"flavor": "h100-80gb", "nodes": 2, "gpus_per_node": 8},
    ]
    world.cluster.save(update_fields=["settings"])
    cluster_refresh_inventory(cluster=world.cluster)


def admitted(world) -> tuple[Attempt, Attempt]:
    """A two-hour run of nlp, then vision's two-node gang, in one cycle at T0."""
    with time_machine.travel(T0, tick=False):
        holder = run_submit(
            user=world.researcher_b,
            data=experiment_input(
                world, tenant="nlp", project="llm", gpus_per_node=8, max_runtime_minutes=120
            ),
        )
        gang = run_submit(
            user=world.researcher_a, data=experiment_input(world, nodes=2, gpus_per_node=8)
        )
        admission_run_cycle(now=T0)
    return Attempt.objects.get(run=holder), Attempt.objects.get(run=gang)


def test_a_gang_across_two_leaves_keeps_what_one_leaf_would_have_waited(world):
    # 03 takes no work: the two-hour run takes 00, and the gang gets 01 and 02, one in each
    # leaf. Leaf 00-01 is whole again when the two-hour run ends at the latest: admitted at
    # T0, it starts within the placement grace, then runs two hours.
    two_leaves(world, drained={f"{A100}03": "bad DIMM"})

    holder, gang = admitted(world)

    assert holder.placement == [f"{A100}00"]
    assert gang.placement == [f"{A100}01", f"{A100}02"]
    assert settings.GANTRY_PLACEMENT_GRACE_S == 300
    assert gang.tighter_wait_s == 300 + 2 * 3600
    assert holder.tighter_wait_s is None  # one node


def test_a_gang_inside_one_leaf_keeps_none(world):
    two_leaves(world, drained={})

    _, gang = admitted(world)

    assert gang.placement == [f"{A100}02", f"{A100}03"]
    assert gang.tighter_wait_s is None
