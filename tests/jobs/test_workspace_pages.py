"""The workspace pages: the list, the launch form, the card, Extend and Stop, by persona."""

import re
import uuid
from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse

from jobs.models import Attempt, Run, RunEvent, RunKind, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.templates import template_save
from jobs.services.workspaces import WorkspaceInput, workspace_launch
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

HOSTILE_NAME = '<script>alert("ws")</script>'
PROXY = "https://ws.gantry.example.org"


def launch(world, user=None, **overrides) -> Run:
    values = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "flavor": "a100-80gb",
        "gpus": 1,
        "name": "debug-loader",
        "hours": 4,
    }
    values.update(overrides)
    return workspace_launch(user=user or world.researcher_a, data=WorkspaceInput(**values))


def ready(world, run: Run) -> Run:
    """Running on the simulator, its server answering (as the launcher reports it)."""
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    Workspace.objects.filter(run=run).update(
        attempt=attempt, host="127.0.0.1", port=8888, ready_at=run.started_at
    )
    return run


@pytest.fixture(autouse=True)
def proxy_url(settings):
    settings.GANTRY_WORKSPACE_URL = PROXY


def without_csrf(response) -> str:
    return re.sub(r'name="csrfmiddlewaretoken" value="\w+"', "", response.content.decode())


def as_user(client, user):
    client.force_login(user)
    return client


# --- the list ---------------------------------------------------------------------------------


def test_the_owner_sees_hers_with_open_once_ready(client, world):
    run = ready(world, launch(world))
    queued = launch(world, name="second")

    page = as_user(client, world.researcher_a).get(reverse("jobs:workspace_list"))

    html = page.content.decode()
    assert page.status_code == 200
    assert [card.run.pk for card in page.context["page"].cards] == [queued.pk, run.pk]
    assert f'href="{PROXY}/w/{run.pk}/lab"' in html
    assert f"{PROXY}/w/{queued.pk}/" not in html
    assert f'data-workspace="{queued.pk}" data-phase="queued"' in html
    assert f'data-workspace="{run.pk}" data-phase="running"' in html


def test_a_tenant_admin_sees_the_tenants_workspaces_without_open(client, world):
    run = ready(world, launch(world))

    page = as_user(client, world.tenant_admin_a).get(reverse("jobs:workspace_list"))

    html = page.content.decode()
    assert [card.run.pk for card in page.context["page"].cards] == [run.pk]
    assert "/w/" not in html
    assert ">alice</td>" in html


def test_another_member_and_another_tenant_see_none_of_hers(client, world):
    launch(world)
    for user in (world.researcher_a2, world.researcher_b):
        page = as_user(client, user).get(reverse("jobs:workspace_list"))
        assert page.context["page"].cards == []
        assert "No workspaces" in page.content.decode()


def test_the_list_uses_a_fixed_number_of_queries(client, world, django_assert_max_num_queries):
    for number in range(6):
        launch(world, name=f"ws-{number}")
    as_user(client, world.researcher_a)
    with django_assert_max_num_queries(12):
        page = client.get(reverse("jobs:workspace_list"))
    assert len(page.context["page"].cards) == 6


@pytest.mark.parametrize(
    ("name", "args", "method"),
    [
        ("jobs:workspace_list", [], "get"),
        ("jobs:workspace_launch", [], "get"),
        ("jobs:workspace_detail", [1], "get"),
        ("jobs:workspace_extend", [1], "post"),
        ("jobs:workspace_stop", [1], "post"),
    ],
)
def test_anonymous_is_sent_to_login(client, world, name, args, method):
    url = reverse(name, args=args)
    response = getattr(client, method)(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


# --- the card ---------------------------------------------------------------------------------


def test_the_card_of_a_queued_workspace_shows_its_steps_and_no_open(client, world):
    run = launch(world)
    page = as_user(client, world.researcher_a).get(reverse("jobs:workspace_detail", args=[run.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    assert 'data-phase="queued"' in html
    assert '<li data-step="queued" class="step-done">Queued <time' in html
    assert '<li data-step="server_ready">Server ready <span class="muted">—</span></li>' in html
    assert 'id="workspace-open"' not in html
    assert f'action="/workspaces/{run.pk}/extend/"' in html
    assert f'action="/workspaces/{run.pk}/stop/"' in html
    assert 'name="csrfmiddlewaretoken"' in html


def test_the_card_of_a_ready_workspace_opens_for_its_owner_only(client, world):
    run = ready(world, launch(world))
    url = reverse("jobs:workspace_detail", args=[run.pk])

    with time_machine.travel(run.started_at + timedelta(minutes=75), tick=False):
        owner = as_user(client, world.researcher_a).get(url).content.decode()
        admin = as_user(client, world.tenant_admin_a).get(url).content.decode()
        platform = as_user(client, world.platform_admin).get(url).content.decode()

    opens = f'id="workspace-open" href="{PROXY}/w/{run.pk}/lab"'
    assert opens in owner
    assert "Time left: <strong>2 h 45 min</strong>" in owner
    assert "workspace-open" not in admin and "workspace-open" not in platform
    assert 'id="workspace-stop-button"' in admin and 'id="workspace-stop-button"' in platform
    # A platform admin may stop it, not spend the tenant's hours on it.
    assert "/extend/" in admin and "/extend/" not in platform


def test_the_card_alone_for_its_poll(client, world):
    run = launch(world)
    url = reverse("jobs:workspace_detail", args=[run.pk]) + "?partial=card"
    html = as_user(client, world.researcher_a).get(url).content.decode()
    assert html.lstrip().startswith('<section class="card workspace-card" id="workspace-card"')
    assert "<html" not in html
    assert f'hx-get="/workspaces/{run.pk}/?partial=card" hx-trigger="every 5s"' in html


@pytest.mark.parametrize("persona", ["researcher_a2", "researcher_b", "finance"])
def test_outsiders_get_the_same_404_as_for_a_missing_workspace(client, world, persona):
    run = launch(world)
    as_user(client, getattr(world, persona))
    hidden = client.get(reverse("jobs:workspace_detail", args=[run.pk]))
    missing = client.get(reverse("jobs:workspace_detail", args=[run.pk + 1000]))
    assert (hidden.status_code, missing.status_code) == (404, 404)
    # The same page, but for the one-time CSRF token of its logout form.
    assert without_csrf(hidden) == without_csrf(missing)
    assert "you are not a member of.</p>" in without_csrf(hidden)
    for action in ("jobs:workspace_extend", "jobs:workspace_stop"):
        assert client.post(reverse(action, args=[run.pk]), {"hours": "1"}).status_code == 404
    assert Run.objects.get(pk=run.pk).state == RunState.QUEUED
    assert Workspace.objects.get(run=run).extended_minutes == 0


def test_a_batch_run_has_no_workspace_card(client, world):
    from jobs.services.submission import run_submit
    from tests.conftest import experiment_input

    batch = run_submit(user=world.researcher_a, data=experiment_input(world))
    page = as_user(client, world.researcher_a).get(
        reverse("jobs:workspace_detail", args=[batch.pk])
    )
    assert page.status_code == 404


def test_a_workspace_name_with_html_is_escaped(client, world):
    run = launch(world, name=HOSTILE_NAME)
    as_user(client, world.researcher_a)
    for url in (reverse("jobs:workspace_list"), reverse("jobs:workspace_detail", args=[run.pk])):
        html = client.get(url).content.decode()
        assert HOSTILE_NAME not in html
        assert "&lt;script&gt;alert(&quot;ws&quot;)&lt;/script&gt;" in html


# --- Extend and Stop ---------------------------------------------------------------------------


def test_extend_by_the_owner_adds_hours_and_says_so(client, world):
    run = launch(world)
    url = reverse("jobs:workspace_extend", args=[run.pk])
    response = as_user(client, world.researcher_a).post(url, {"hours": "2"}, follow=True)
    assert Workspace.objects.get(run=run).extended_minutes == 120
    assert f"Workspace {run.pk} has 2 more hours." in response.content.decode()


def test_extend_past_the_maximum_says_why_and_changes_nothing(client, world):
    run = launch(world)
    url = reverse("jobs:workspace_extend", args=[run.pk])
    response = as_user(client, world.researcher_a).post(url, {"hours": "9"}, follow=True)
    assert Workspace.objects.get(run=run).extended_minutes == 0
    assert (
        "Not extended: Tenant vision allows a workspace at most 12 hours (extensions included): "
        "it has 4 h already, it may get 8 more hours."
    ) in response.content.decode()


def test_extend_with_no_number_says_so(client, world):
    run = launch(world)
    url = reverse("jobs:workspace_extend", args=[run.pk])
    response = as_user(client, world.researcher_a).post(url, {"hours": "lots"}, follow=True)
    assert "Not extended: Enter a whole number." in response.content.decode()
    assert Workspace.objects.get(run=run).extended_minutes == 0


def test_a_platform_admin_may_not_extend_and_gets_403(client, world):
    run = launch(world)
    url = reverse("jobs:workspace_extend", args=[run.pk])
    assert as_user(client, world.platform_admin).post(url, {"hours": "1"}).status_code == 403
    assert Workspace.objects.get(run=run).extended_minutes == 0
    assert not AuditEvent.objects.exists()


def test_stop_by_a_tenant_admin_ends_a_queued_workspace(client, world):
    run = launch(world)
    url = reverse("jobs:workspace_stop", args=[run.pk])
    response = as_user(client, world.tenant_admin_a).post(url, follow=True)
    assert Run.objects.get(pk=run.pk).state == RunState.CANCELLED
    assert f"Workspace {run.pk} is stopped." in response.content.decode()


# --- launching ----------------------------------------------------------------------------------


def launch_form(world, **overrides) -> dict:
    values = {
        "tenant": "vision",
        "project": "detection",
        "name": "from-the-form",
        "image": world.image.reference,
        "flavor": "a100-80gb",
        "gpus": "2",
        "server": "jupyter",
        "hours": "3",
        "submission_key": str(uuid.uuid4()),
    }
    values.update(overrides)
    return values


def test_launching_queues_one_workspace_however_often_the_form_is_sent(client, world):
    as_user(client, world.researcher_a)
    form = launch_form(world)

    first = client.post(reverse("jobs:workspace_launch"), form)
    again = client.post(reverse("jobs:workspace_launch"), form, follow=True)

    run = Run.objects.get(kind=RunKind.INTERACTIVE)
    assert first["Location"] == reverse("jobs:workspace_detail", args=[run.pk])
    assert (run.gpus, run.experiment.name, run.experiment.max_runtime_minutes) == (
        2,
        "from-the-form",
        180,
    )
    assert Workspace.objects.get(run=run).server == "jupyter"
    assert f"This form already launched workspace {run.pk}: nothing new was queued." in (
        again.content.decode()
    )


def test_a_launch_past_the_tenants_hours_shows_the_error_and_records_nothing(client, world):
    as_user(client, world.researcher_a)
    page = client.post(reverse("jobs:workspace_launch"), launch_form(world, hours="13"))
    assert page.status_code == 400
    assert "Tenant vision allows a workspace at most 12 hours (extensions included)." in (
        page.content.decode()
    )
    assert not Run.objects.exists()


def test_a_launch_for_a_tenant_one_is_not_a_member_of_is_refused(client, world):
    as_user(client, world.researcher_a)
    page = client.post(
        reverse("jobs:workspace_launch"), launch_form(world, tenant="nlp", project="llm")
    )
    assert page.status_code == 400
    assert not Run.objects.exists()


def test_the_launch_form_is_404_for_who_is_member_of_no_tenant(client, world):
    assert as_user(client, world.finance).get(reverse("jobs:workspace_launch")).status_code == 404


def test_a_template_prefills_the_image_flavor_and_gpus(client, world):
    template = template_save(
        actor=world.tenant_admin_a,
        tenant=world.vision,
        name="h100-notebook",
        description="",
        values={
            "image": world.image.reference,
            "resources": {"flavor": "h100-80gb", "gpus_per_node": 4},
        },
        locked=[],
        ranges={},
    )
    page = as_user(client, world.researcher_a).get(
        reverse("jobs:workspace_launch") + f"?template={template.pk}"
    )
    form = page.context["form"]
    assert (form["flavor"].value(), form["gpus"].value(), form["image"].value()) == (
        "h100-80gb",
        4,
        world.image.reference,
    )


# --- among runs --------------------------------------------------------------------------------


def test_the_run_list_tags_a_workspace_and_its_run_page_links_its_card(client, world):
    run = launch(world)
    as_user(client, world.researcher_a)
    listing = client.get(reverse("jobs:run_list")).content.decode()
    detail = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()
    assert 'data-kind="interactive"' in listing
    assert f'<a href="/workspaces/{run.pk}/">its card</a>' in detail
    assert "Re-run exactly" not in detail


def test_a_workspaces_experiment_page_offers_no_re_run(client, world):
    run = launch(world)
    page = as_user(client, world.researcher_a).get(
        reverse("jobs:experiment_detail", args=[run.experiment_id])
    )
    assert page.status_code == 200
    assert "Re-run exactly" not in page.content.decode()
    assert page.context["can_rerun"] is False


def test_the_owner_suspends_and_resumes_from_the_card(client, world):
    from clusters.backends import JobStatus
    from jobs.services.backend_sync import attempt_apply_status

    run = ready(world, launch(world))
    url = reverse("jobs:workspace_detail", args=[run.pk])
    admin = as_user(client, world.tenant_admin_a).get(url).content.decode()
    assert "workspace-suspend-button" not in admin  # hers to suspend, not the admin's
    owner = as_user(client, world.researcher_a)
    assert 'id="workspace-suspend-button"' in owner.get(url).content.decode()

    answer = owner.post(reverse("jobs:workspace_suspend", args=[run.pk]), follow=True)
    assert (
        f"Workspace {run.pk} is being suspended: its GPUs are released, its files kept."
        in answer.content.decode()
    )
    attempt_apply_status(
        attempt=run.attempts.get(),
        status=JobStatus(state="CANCELLED", failure_reason="CANCELLED"),
        now=run.started_at + timedelta(minutes=5),
    )
    card = owner.get(url).content.decode()
    assert 'id="workspace-resume-button"' in card and "workspace-suspend-button" not in card
    assert "Suspended: its GPUs were released and its files kept." in card
    assert "Time left" not in card  # a resumed session gets its whole time again

    answer = owner.post(reverse("jobs:workspace_resume", args=[run.pk]), follow=True)
    assert f"Workspace {run.pk} is back in the queue." in answer.content.decode()
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    # Resuming what is not suspended says why and changes nothing.
    answer = owner.post(reverse("jobs:workspace_resume", args=[run.pk]), follow=True)
    assert "Not resumed: The workspace is queued, not suspended." in answer.content.decode()


def test_the_card_of_a_warned_workspace_shows_its_warning_escaped(client, world):
    run = ready(world, launch(world))
    RunEvent.objects.create(
        run=run, from_state="RUNNING", to_state="RUNNING", reason="IDLE_WARNING",
        message="Workspace idle since 10:05 UTC <b>(no kernel ran)</b>.",
    )  # fmt: skip
    Workspace.objects.filter(run=run).update(warned_at=run.started_at)
    url = reverse("jobs:workspace_detail", args=[run.pk]) + "?partial=card"
    html = as_user(client, world.researcher_a).get(url).content.decode()
    assert 'data-phase="idle warning"' in html
    assert (
        '<p class="message message-warning" role="status" data-idle-warning>Workspace idle '
        "since 10:05 UTC &lt;b&gt;(no kernel ran)&lt;/b&gt;.</p>"
    ) in html
