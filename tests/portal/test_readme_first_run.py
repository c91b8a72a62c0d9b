"""The README's first scenario works as written on the demo of `make run`, whatever the day:
the run it suggests, submitted through the form exactly as the README says, is admitted by
the first admission cycle and starts on the simulated cluster.

The scenario is read from README.md, so the README and this test cannot drift apart: the
login, the template, the values the README says the template fills in, and the fields it
says the form needs without one."""

import re
from datetime import UTC, datetime
from html.parser import HTMLParser

import pytest
import time_machine
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from jobs.models import Attempt, Cluster, ExperimentTemplate, Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from portal.demo import DEMO_PASSWORD, demo_seed
from tests import REPOSITORY

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


class PostForm(HTMLParser):
    """The values a browser sends for the page's POST form to ``action``: enabled inputs
    (checkboxes when checked), each select's selected option (else its first), textareas
    (without the one line break after the tag that browsers drop). Also the labels of the
    fields the browser requires that have no value yet."""

    def __init__(self, action: str):
        super().__init__(convert_charrefs=True)
        self.action = action
        self.values: dict[str, str] = {}
        self.labels: dict[str, str] = {}  # field id -> label text
        self.required_ids: dict[str, str] = {}  # field id -> name, of required fields
        self._in_form = False
        self._select: str | None = None
        self._first_option: str | None = None
        self._option: str | None = None
        self._textarea: str | None = None
        self._label_for: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self._in_form = attrs.get("method") == "post" and attrs.get("action") == self.action
        if tag == "label" and attrs.get("for"):
            self._label_for = attrs["for"]
            self.labels[self._label_for] = ""
        if not self._in_form or "disabled" in attrs:
            return
        name = attrs.get("name")
        if name and "required" in attrs and attrs.get("id"):
            self.required_ids[attrs["id"]] = name
        if tag == "input" and name:
            if attrs.get("type") in ("checkbox", "radio") and "checked" not in attrs:
                return
            if attrs.get("type") not in ("submit", "button"):
                self.values[name] = attrs.get("value", "")
        elif tag == "select" and name:
            self._select, self._first_option = name, None
        elif tag == "option" and self._select:
            value = attrs.get("value", "")
            if self._first_option is None:
                self._first_option = value
            if "selected" in attrs:
                self.values[self._select] = value
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag):
        if tag == "form":
            self._in_form = False
        elif tag == "label":
            self._label_for = None
        elif tag == "select" and self._select:
            self.values.setdefault(self._select, self._first_option or "")
            self._select = None
        elif tag == "textarea" and self._textarea:
            value = self.values[self._textarea]
            self.values[self._textarea] = value[1:] if value.startswith("\n") else value
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.values[self._textarea] += data
        if self._label_for:
            self.labels[self._label_for] += data

    def fields_without_value(self) -> set[str]:
        return {
            self.label(field_id)
            for field_id, name in self.required_ids.items()
            if not self.values.get(name, "").strip()
        }

    def label(self, field_id: str) -> str:
        return self.labels[field_id].strip().removesuffix("*").strip()


def post_form(html: str, action: str) -> PostForm:
    form = PostForm(action)
    form.feed(html)
    return form


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
