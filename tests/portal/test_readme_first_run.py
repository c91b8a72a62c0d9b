"""The README's first scenario works as written on the demo of `make run`, whatever the day:
the run it suggests, submitted through the form exactly as the README says, is admitted by
the first admission cycle and starts on the simulated cluster.

The scenario is read from README.md, so the README and this test cannot drift apart: the
login, the template, the values the README says the template fills in, and the fields it
says the form needs without one."""

import re
from datetime import UTC, datetime

import pytest
import time_machine
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Attempt, ExperimentTemplate, Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from portal.demo import DEMO_PASSWORD, demo_seed
from tests import REPOSITORY
from tests.html_support import post_form

pytestmark = pytest.mark.django_db

# Any day: now, the first hour of a month (and of a year), the last minute of a month, and
# a Monday morning in the middle of one.
INSTANTS = {
    "now": None,
    "first-hour-of-a-month": datetime(2027, 1, 1, 0, 20, tzinfo=UTC),
    "last-minute-of-a-month": datetime(2027, 2, 28, 23, 59, 30, tzinfo=UTC),
    "mid-month-monday": datetime(2026, 6, 15, 9, 0, tzinfo=UTC),
}


def readme_scenario() -> str:
    """The README's "Try:" paragraph, on one line."""
    text = (REPOSITORY / "README.md").read_text()
    match = re.search(r"^Try: (.*?)(?:\n\n)", text, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, "README.md has no 'Try:' paragraph"
    return " ".join(match.group(1).split())


class Scenario:
    """What the README promises, parsed from its words."""

    def __init__(self, text: str):
        self.login = re.search(r"log in as `(\w+)`", text).group(1)
        self.template = re.search(r"pick the template \*\*([\w-]+)\*\*", text).group(1)
        self.project = re.search(r"project \*([\w-]+)\*", text).group(1)
        self.image = re.search(r"the \*(\w+)\* image", text).group(1)
        self.command = re.search(r"the command `([^`]+)`", text).group(1)
        nodes, gpus, flavor = re.search(r"(\d+) nodes? of (\d+) \*([\w.-]+)\* GPUs", text).groups()
        self.nodes, self.gpus_per_node, self.flavor = int(nodes), int(gpus), flavor
        needed = re.search(r"Without the template, choose (.*?) yourself", text).group(1)
        self.fields_without_template = set(re.findall(r"\*\*([^*]+)\*\*", needed))


def test_the_readme_names_a_template_every_field_and_the_values_it_fills_in():
    scenario = Scenario(readme_scenario())

    assert (scenario.login, scenario.template) == ("alice", "first-run")
    assert (scenario.project, scenario.image, scenario.command) == (
        "detection",
        "PyTorch",
        "python train.py --epochs 3",
    )
    assert (scenario.nodes, scenario.gpus_per_node, scenario.flavor) == (1, 8, "h100-80gb")
    assert scenario.fields_without_template == {
        "Project",
        "Image",
        "Command",
        "GPU flavor",
        "GPUs per node",
    }


@pytest.mark.parametrize("instant", list(INSTANTS))
def test_the_readme_first_run_starts_at_the_first_admission_cycle(client, instant):
    scenario = Scenario(readme_scenario())
    with time_machine.travel(INSTANTS[instant] or timezone.now(), tick=False):
        # Given the demo as `make run` seeds it, its admitted runs handed to the cluster
        # (what the worker does once the seed commits).
        demo_seed(speedup=30)
        cluster = Cluster.objects.get()
        for attempt in Attempt.objects.filter(state="ADMITTED"):
            attempt_submit(attempt_id=attempt.pk)
        cluster_sync(cluster=cluster)
        running_before = Run.objects.filter(state=RunState.RUNNING).count()
        client.login(username=scenario.login, password=DEMO_PASSWORD)
        submit_url = reverse("jobs:run_submit")

        # Without the template the README names every field the form needs (and the GPUs
        # per node, whose default of 1 is not the run it suggests).
        blank = post_form(client.get(submit_url).content.decode(), submit_url)
        assert blank.fields_without_value() == {"Project", "Image", "Command", "GPU flavor"}
        assert blank.fields_without_value() <= scenario.fields_without_template
        assert scenario.fields_without_template <= {blank.label(i) for i in blank.labels}

        # When the researcher picks the README's template and presses Submit.
        template = ExperimentTemplate.objects.get(name=scenario.template)
        page = client.get(submit_url, {"template": template.pk})
        assert page.status_code == 200
        assert f">{scenario.template}</strong>" in page.content.decode()
        form = post_form(page.content.decode(), submit_url)
        assert form.fields_without_value() == set()
        response = client.post(submit_url, form.values)

        # Then the run has what the README says, the first cycle admits it, and it starts.
        assert response.status_code == 302
        run = Run.objects.get(submission_key=form.values["submission_key"])
        assert response.url == reverse("jobs:run_detail", args=[run.pk])
        experiment = run.experiment
        assert (
            run.tenant.slug,
            run.state,
            experiment.project.slug,
            experiment.command,
            run.flavor.slug,
            experiment.nodes,
            experiment.gpus_per_node,
        ) == (
            "vision",
            RunState.QUEUED,
            scenario.project,
            scenario.command,
            scenario.flavor,
            scenario.nodes,
            scenario.gpus_per_node,
        )
        assert "/" + scenario.image.lower() + "@" in experiment.image_reference

        admission_run_cycle(now=timezone.now())
        run.refresh_from_db()
        assert (run.state, run.borrowed, run.wait_reason) == (RunState.ADMITTED, False, "")

        attempt_submit(attempt_id=run.attempts.get().pk)
        cluster_sync(cluster=cluster)
        run.refresh_from_db()
        assert run.state == RunState.RUNNING
        assert Run.objects.filter(state=RunState.RUNNING).count() == running_before + 1
        assert run.submitted_by == User.objects.get(username=scenario.login)
