"""``gantry simulate`` against a live test server (real HTTP), in process through
``gantry_cli.main.main`` as tests/gantry_cli/test_cli.py runs the others, with its fixtures:
when the spec's run would start in other shapes, nothing submitted (issue 38.3)."""

# ruff: noqa: F811 (the imported fixtures are parameters of the tests)

from datetime import timedelta

import time_machine

from gantry_cli.output import when
from jobs.models import Experiment, Run
from jobs.services.estimates import estimates_refresh
from tests.gantry_cli.test_cli import (  # noqa: F401
    alice,
    cli,
    gantry_env,
    no_celery,
    server,
    spec_file,
)
from tests.jobs.test_start_estimates import T0, full_cluster  # noqa: F401

NOW = T0 + timedelta(minutes=1)


def test_simulate_prints_the_shapes_fastest_first_and_submits_nothing(
    cli, alice, world, full_cluster, tmp_path
):
    path = spec_file(tmp_path, world, env={})
    counts = (Run.objects.count(), Experiment.objects.count())
    with time_machine.travel(NOW, tick=False):
        estimates_refresh()
        code, out, err = cli("simulate", str(path), "--set", "resources.gpus_per_node=8")
        body = cli.json("simulate", str(path), "--set", "resources.gpus_per_node=8")

    assert code == 0, err
    # The CLI prints times in the local zone of the machine it runs on.
    at = {minute: when((T0 + timedelta(minutes=minute)).isoformat()) for minute in (42, 60, 120)}
    assert out == (
        "Would wait: tenant vision uses 16 of 16 guaranteed a100-80gb GPUs and may not borrow; "
        "this run needs 8 (position 1).\n"
        "Would start at about 12:42; about 14:00 if every run ahead uses its full time limit "
        "(estimates of 12:01).\n"
        "\n"
        "         SHAPE  FLAVOR     TOPOLOGY  EXPECTED START       AT FULL LIMITS\n"
        "fastest  1×8    h100-80gb  any       now                  now\n"
        f"asked    1×8    a100-80gb  any       {at[42]}  {at[120]}\n"
        f"-        2×4    a100-80gb  any       {at[42]}  {at[120]}\n"
        f"-        4×2    a100-80gb  any       {at[60]}  {at[120]}\n"
    )
    assert [(row["nodes"], row["gpus_per_node"], row["flavor"]) for row in body["shapes"]] == [
        (1, 8, "h100-80gb"),
        (1, 8, "a100-80gb"),
        (2, 4, "a100-80gb"),
        (4, 2, "a100-80gb"),
    ]
    assert body["verdict"] == "wait"
    assert (Run.objects.count(), Experiment.objects.count()) == counts


def test_simulate_of_another_tenant_is_exit_4_like_submit(cli, alice, world, tmp_path):
    path = spec_file(tmp_path, world, tenant="nlp", project="llm")

    answers = [cli(command, str(path)) for command in ("simulate", "submit")]

    assert [code for code, _, _ in answers] == [4, 4]
    for _, out, err in answers:
        assert out == ""
        assert "  tenant: Unknown tenant, or you are not a member.\n" in err
    assert Run.objects.count() == 0
