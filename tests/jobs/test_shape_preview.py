"""Other shapes of a run on PostgreSQL (issue 38.3): the submit preview's table and
``POST /api/v1/runs/simulate/``, from the stored start forecasts; the shape asked for gets
exactly the preview's start estimate, and nothing is created."""

# ruff: noqa: F811 (the fixture imported from test_start_estimates is a parameter of the tests)

from datetime import timedelta

import pytest
import time_machine
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from jobs import shapes
from jobs.admission_types import QueuedRun
from jobs.models import Experiment, Run, StartForecast
from jobs.selectors.estimates import forecast_of, start_preview
from jobs.selectors.preview import admission_preview
from jobs.selectors.queue import admission_snapshot
from jobs.services.estimates import estimates_refresh
from tests.conftest import COMMIT
from tests.jobs.test_start_estimates import T0, full_cluster  # noqa: F401

NOW = T0 + timedelta(minutes=1)


def spec(world, **resources) -> dict:
    return {
        "version": 1,
        "kind": "experiment",
        "tenant": "vision",
        "project": "detection",
        "name": "resnet-shapes",
        "image": world.image.reference,
        "command": "python train.py",
        "resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 8, **resources},
        "code": {"repository": "https://git.example.org/vision/detection.git", "commit": COMMIT},
    }


def rows(preview) -> list[tuple]:
    return [
        (row.shape.size, row.shape.flavor, row.shape.topology, row.start, row.asked, row.fastest)
        for row in preview.shapes
    ]


@pytest.mark.django_db
def test_the_preview_names_the_shapes_fastest_first(world, full_cluster):
    # sim-1's four A100 nodes are full (vision's two runs expected to end at 12:42, nlp's
    # at 13:00, at full limits 14:00 and 13:00); its two H100 nodes are free.
    with time_machine.travel(NOW, tick=False):
        estimates_refresh()
        preview = admission_preview(
            user=world.researcher_a, tenant="vision", flavor="a100-80gb", nodes=1, gpus_per_node=8
        )
    assert preview.verdict == "wait"
    # 8x1 is not named: no cluster has eight A100 nodes.
    assert rows(preview) == [
        ("1×8", "h100-80gb", "any", "now", False, True),
        ("1×8", "a100-80gb", "any", "about 12:42; 14:00 at full time limits", True, False),
        ("2×4", "a100-80gb", "any", "about 12:42; 14:00 at full time limits", False, False),
        # Four nodes with two GPUs free each: when nlp's runs end too.
        ("4×2", "a100-80gb", "any", "about 13:00; 14:00 at full time limits", False, False),
    ]
    assert preview.shapes[1].expected == T0 + timedelta(minutes=42)
    assert preview.shapes[1].full_limits == T0 + timedelta(minutes=120)


@pytest.mark.django_db
def test_the_shape_asked_for_gets_exactly_the_previews_estimate(world, full_cluster):
    with time_machine.travel(NOW, tick=False):
        estimates_refresh()
        snapshot, _ = admission_snapshot(now=NOW)
        probe = QueuedRun(
            -1, "vision", "a100-80gb", nodes=2, gpus_per_node=4, priority=50,
            submitted=NOW.timestamp(),
        )  # fmt: skip
        stored = {
            row.flavor.slug: (forecast_of(row.expected), forecast_of(row.latest))
            for row in StartForecast.objects.select_related("flavor")
        }
        [asked] = [
            row for row in shapes.shape_starts(snapshot, probe=probe, forecasts=stored) if row.asked
        ]
        preview = start_preview(probe=probe, snapshot=snapshot)
    assert preview is not None
    assert (asked.expected, asked.full_limits) == (preview.expected, preview.full_limits)
    assert asked.expected.at == (T0 + timedelta(minutes=42)).timestamp()


@pytest.mark.django_db
def test_the_preview_panel_shows_the_table_escaped(world, full_cluster):
    client = Client()
    client.force_login(world.researcher_a)
    with time_machine.travel(NOW, tick=False):
        estimates_refresh()
        panel = client.get(
            reverse("jobs:run_preview"),
            {
                "tenant": "vision", "project": "detection", "image": world.image.reference,
                "command": "python train.py", "flavor": "a100-80gb", "nodes": 1,
                "gpus_per_node": 8, "priority": 50, "max_runtime_minutes": 60,
                "max_restarts": 0, "topology_level": "<b>leaf</b>",
            },
        ).content.decode()  # fmt: skip
    assert '<tr class="shape-fastest" data-shape="1×8 h100-80gb">' in panel
    assert "<td>now</td>" not in panel  # the fastest is in bold, with its badge
    assert '<strong>now</strong> <span class="badge">fastest</span>' in panel
    assert '<td>1×8 <span class="muted">(asked)</span></td>' in panel
    assert "<td>about 13:00; 14:00 at full time limits</td>" in panel
    # A level no cluster has, as typed: escaped, never markup.
    assert "one &lt;b&gt;leaf&lt;/b&gt;, preferred" in panel
    assert "<b>leaf</b>" not in panel


@pytest.mark.django_db
def test_the_simulate_api_answers_the_preview_and_creates_nothing(world, full_cluster):
    client = APIClient()
    client.force_authenticate(world.researcher_a)
    runs, experiments = Run.objects.count(), Experiment.objects.count()
    with time_machine.travel(NOW, tick=False):
        estimates_refresh()
        response = client.post(
            reverse("api:run-simulate"), spec(world, nodes=2, gpus_per_node=4), format="json"
        )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["verdict"], body["gpus"], body["start"]) == (
        "wait",
        8,
        "would start at about 12:42; about 14:00 if every run ahead uses its full time limit "
        "(estimates of 12:01)",
    )
    assert [
        (row["nodes"], row["gpus_per_node"], row["flavor"], row["expected_start"],
         row["full_limits_start"], row["asked"], row["fastest"], row["starts_now"])
        for row in body["shapes"]
    ] == [
        (1, 8, "h100-80gb", "2026-03-10T12:01:00Z", "2026-03-10T12:01:00Z", False, True, True),
        (2, 4, "a100-80gb", "2026-03-10T12:42:00Z", "2026-03-10T14:00:00Z", True, False, False),
        (1, 8, "a100-80gb", "2026-03-10T12:42:00Z", "2026-03-10T14:00:00Z", False, False, False),
        (4, 2, "a100-80gb", "2026-03-10T13:00:00Z", "2026-03-10T14:00:00Z", False, False, False),
    ]  # fmt: skip
    assert body["shapes"][0]["topology_mode"] == ""
    assert (Run.objects.count(), Experiment.objects.count()) == (runs, experiments)


@pytest.mark.django_db
def test_simulate_refuses_what_submit_refuses_alike(world):
    outsider = APIClient()
    outsider.force_authenticate(world.researcher_b)  # of nlp, not vision
    answers = [
        outsider.post(reverse(name), spec(world), format="json")
        for name in ("api:run-simulate", "api:spec-submit")
    ]
    assert [answer.status_code for answer in answers] == [400, 400]
    assert [answer.json()["tenant"] for answer in answers] == [
        ["Unknown tenant, or you are not a member."]
    ] * 2
    bad = APIClient()
    bad.force_authenticate(world.researcher_a)
    typed = bad.post(reverse("api:run-simulate"), spec(world, nodes="two"), format="json")
    assert typed.status_code == 400
    assert typed.json() == {"resources.nodes": ["Expected an integer, got a string."]}
    anonymous = APIClient().post(reverse("api:run-simulate"), spec(world), format="json")
    assert anonymous.status_code == 401
    assert Run.objects.count() == 0 and Experiment.objects.count() == 0
