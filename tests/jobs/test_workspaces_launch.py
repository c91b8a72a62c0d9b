"""Launching a workspace: a run of kind interactive, validated like every run."""

import pytest
from django.core.exceptions import ValidationError

from jobs.models import Experiment, Run, RunKind, RunState, Workspace
from jobs.services.workspaces import (
    WorkspaceInput,
    workspace_base_path,
    workspace_launch,
    workspace_server_token,
)

pytestmark = pytest.mark.django_db


def launch_input(world, **overrides) -> WorkspaceInput:
    values = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "flavor": "a100-80gb",
        "gpus": 1,
        "name": "debug-loader",
    }
    values.update(overrides)
    return WorkspaceInput(**values)


def test_a_workspace_is_a_queued_run_of_kind_interactive(world):
    run = workspace_launch(user=world.researcher_a, data=launch_input(world, hours=3))
    experiment = run.experiment
    assert (run.kind, run.state, run.gpus, run.tenant.slug) == (
        RunKind.INTERACTIVE,
        RunState.QUEUED,
        1,
        "vision",
    )
    assert (experiment.command, experiment.nodes, experiment.max_runtime_minutes) == (
        "gantry-workspace jupyter",
        1,
        180,
    )
    assert experiment.image_reference == world.image.reference
    workspace = Workspace.objects.get(run=run)
    assert (workspace.server, workspace.address, workspace.attempt) == ("jupyter", None, None)
    assert workspace_base_path(run.pk) == f"/w/{run.pk}/"


def test_hours_past_the_tenant_maximum_are_refused_and_nothing_is_recorded(world):
    world.vision.workspace_max_hours = 8
    world.vision.save(update_fields=["workspace_max_hours"])
    with pytest.raises(ValidationError) as refused:
        workspace_launch(user=world.researcher_a, data=launch_input(world, hours=9))
    assert refused.value.message_dict == {
        "hours": ["Tenant vision allows a workspace at most 8 hours (extensions included)."]
    }
    with pytest.raises(ValidationError) as refused:
        workspace_launch(user=world.researcher_a, data=launch_input(world, server="emacs", hours=0))
    assert refused.value.message_dict == {
        "server": ["Choose one of: jupyter."],
        "hours": ["Ask for at least 1 hour."],
    }
    assert (Run.objects.count(), Experiment.objects.count(), Workspace.objects.count()) == (0, 0, 0)


def test_vs_code_is_refused_at_launch_with_its_reason_and_nothing_is_recorded(world):
    with pytest.raises(ValidationError) as refused:
        workspace_launch(user=world.researcher_a, data=launch_input(world, server="vscode"))
    assert refused.value.message_dict == {
        "server": [
            "VS Code (code-server) is not offered yet: it needs Node 24 on the nodes and a "
            "proxy that strips the path (docs/workspaces.md, VS Code). Choose jupyter."
        ]
    }
    assert (Run.objects.count(), Experiment.objects.count(), Workspace.objects.count()) == (0, 0, 0)


def test_an_outsider_cannot_launch_in_another_tenant(world):
    with pytest.raises(ValidationError) as refused:
        workspace_launch(user=world.researcher_b, data=launch_input(world))
    assert "tenant" in refused.value.message_dict
    assert Run.objects.count() == 0


def test_each_attempt_has_its_own_server_secret(settings):
    settings.SECRET_KEY = "k" * 50
    first, second = workspace_server_token(1), workspace_server_token(2)
    assert (len(first), first == second, first == workspace_server_token(1)) == (64, False, True)
