"""The researcher pages: login, run list, submit form, run and experiment pages, cancel."""

import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from jobs.models import Experiment, Run, RunEvent, RunState
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tests.conftest import COMMIT, PASSWORD, experiment_input

pytestmark = pytest.mark.django_db


def submit(world, user=None, **overrides) -> Run:
    """A run created the way every run is: through the service."""
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def submit_nlp(world, **overrides) -> Run:
    values = {"tenant": "nlp", "project": "llm", "name": "llm-pretrain"} | overrides
    return submit(world, user=world.researcher_b, **values)


def form_data(world, **overrides) -> dict:
    """A valid POST of the submit form for tenant vision."""
    data = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "name": "resnet-web",
        "command": "python train.py --epochs 3",
        "code_repository": "https://git.example.org/vision/detection.git",
        "code_commit": COMMIT,
        "dataset_uri": "s3://datasets/imagenet",
        "dataset_version": "2024-01",
        "params": '{"lr": 0.1, "batch_size": 256}',
        "env": '{"GANTRY_SIM_DURATION_S": "600"}',
        "flavor": "a100-80gb",
        "nodes": "1",
        "gpus_per_node": "2",
        "priority": "50",
        "max_runtime_minutes": "1440",
        "max_restarts": "0",
        "checkpoint_dir": "",
    }
    data.update(overrides)
    return data


def field_html(content: str, name: str) -> str:
    """The markup of one form field's wrapper: label, widget, errors, help."""
    start = content.index(f'data-field="{name}"')
    return content[start : content.index("</div>", start)]


def listed_run_ids(response) -> list[int]:
    return [run.pk for run in response.context["runs"]]


# --- login, logout, layout ---------------------------------------------------------------


def test_login_page_renders(client):
    response = client.get(reverse("login"))

    assert response.status_code == 200
    content = response.content.decode()
    assert '<input type="text" name="username"' in content
    assert '<input type="password" name="password"' in content
    assert 'action="/accounts/login/"' in content


def test_login_with_the_right_password_goes_to_the_home_page(client, world):
    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD})

    assert response.status_code == 302
    assert response.url == reverse("home") == "/"
    page = client.get(reverse("home"))
    assert page.status_code == 200
    assert page.context["user"] == world.researcher_a


def test_login_with_next_goes_there_instead(client, world):
    runs = reverse("jobs:run_list")
    response = client.post(
        f"{reverse('login')}?next={runs}", {"username": "alice", "password": PASSWORD}
    )

    assert (response.status_code, response.url) == (302, "/runs/")


def test_login_with_a_wrong_password_says_so(client, world):
    response = client.post(reverse("login"), {"username": "alice", "password": "nope"})

    assert response.status_code == 200
    assert "Please enter a correct username and password." in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_logout_is_a_post_and_ends_the_session(client, world):
    client.force_login(world.researcher_a)
    page = client.get(reverse("jobs:run_list")).content.decode()
    assert f'<form method="post" action="{reverse("logout")}">' in page

    response = client.post(reverse("logout"))

    assert response.status_code == 302
    assert response.url == reverse("login")
    assert client.get(reverse("jobs:run_list")).status_code == 302


def test_layout_shows_user_and_admin_link_only_to_platform_admins(client, world):
    client.force_login(world.researcher_a)
    researcher_page = client.get(reverse("jobs:run_list")).content.decode()
    client.force_login(world.platform_admin)
    admin_page = client.get(reverse("jobs:run_list")).content.decode()

    assert (
        '<a class="account-name" href="/accounts/" title="Your account: password and API tokens">'
        "alice</a>"
    ) in researcher_page
    assert 'href="/admin/"' not in researcher_page
    assert '<a href="/admin/">Admin</a>' in admin_page


def test_pages_have_no_inline_scripts_styles_or_handlers(client, world):
    run = submit(world)
    client.force_login(world.researcher_a)
    urls = [
        reverse("jobs:run_list"),
        reverse("jobs:run_submit"),
        reverse("jobs:run_detail", args=[run.pk]),
        reverse("jobs:experiment_detail", args=[run.experiment_id]),
    ]
    scripts = [
        '<script src="/static/vendor/htmx/htmx-2.0.11.min.js" defer>',
        '<script src="/static/gantry/gantry.js" defer>',
    ]
    for url in urls:
        content = client.get(url).content.decode()
        editors = ['<script src="/static/gantry/editors.js" defer>']
        expected = scripts + editors if url == reverse("jobs:run_submit") else scripts
        assert re.findall(r"<script[^>]*>", content) == expected, url
        assert re.search(r"\shx-on|\sdata-hx-on", content) is None, url
        assert " style=" not in content, url
        assert re.search(r"\son[a-z]+=", content) is None, url
        assert '<link rel="stylesheet" href="/static/gantry/gantry.css">' in content, url


ANONYMOUS_REQUESTS = [
    ("get", "jobs:run_list", False),
    ("get", "jobs:run_submit", False),
    ("post", "jobs:run_submit", False),
    ("get", "jobs:run_detail", True),
    ("get", "jobs:run_live", True),
    ("post", "jobs:run_cancel", True),
    ("get", "jobs:experiment_detail", True),
]


@pytest.mark.parametrize(("method", "name", "needs_id"), ANONYMOUS_REQUESTS)
def test_anonymous_is_sent_to_login(client, world, method, name, needs_id):
    run = submit(world)
    object_id = run.experiment_id if name == "jobs:experiment_detail" else run.pk
    url = reverse(name, args=[object_id] if needs_id else [])

    response = getattr(client, method)(url)

    assert response.status_code == 302
    assert response.url == f"{reverse('login')}?next={url}"
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    assert Experiment.objects.count() == 1


# --- run list ------------------------------------------------------------------------------


def test_run_list_shows_only_runs_of_the_users_tenants(client, world):
    vision_runs = [submit(world, name=f"vision-{i}") for i in range(2)]
    nlp_run = submit_nlp(world)

    client.force_login(world.researcher_a)
    response = client.get(reverse("jobs:run_list"))

    assert response.status_code == 200
    assert listed_run_ids(response) == [vision_runs[1].pk, vision_runs[0].pk]
    content = response.content.decode()
    assert "vision-0" in content
    assert "llm-pretrain" not in content
    assert reverse("jobs:run_detail", args=[nlp_run.pk]) not in content

    client.force_login(world.researcher_b)
    assert listed_run_ids(client.get(reverse("jobs:run_list"))) == [nlp_run.pk]


def test_run_list_row_shows_the_run_at_a_glance(client, world):
    run = submit(world, nodes=2, gpus_per_node=4)
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:run_list")).content.decode()

    assert f'<a id="run-{run.pk}-link" href="/runs/{run.pk}/">#{run.pk}</a>' in content
    assert (
        f'<a id="run-{run.pk}-experiment" href="/experiments/{run.experiment_id}/">'
        "resnet-baseline</a>"
    ) in content
    assert "<td>vision / detection</td>" in content
    assert '<span class="badge badge-queued">Queued</span>' in content
    assert "2×4 a100-80gb" in content
    assert "Waiting for admission" in content
    assert '<div class="muted">by alice</div>' in content


def test_finance_sees_runs_of_every_tenant_and_filters_by_tenant(client, world):
    vision_run = submit(world)
    nlp_run = submit_nlp(world)
    client.force_login(world.finance)

    assert listed_run_ids(client.get(reverse("jobs:run_list"))) == [nlp_run.pk, vision_run.pk]
    response = client.get(reverse("jobs:run_list"), {"tenant": "nlp"})
    assert listed_run_ids(response) == [nlp_run.pk]


def test_a_researcher_cannot_list_another_tenant_by_filtering(client, world):
    submit_nlp(world)
    client.force_login(world.researcher_a)

    response = client.get(reverse("jobs:run_list"), {"tenant": "nlp"})

    assert response.status_code == 200
    assert listed_run_ids(response) == []
    assert "No runs match these filters" in response.content.decode()


def test_run_list_filters_by_state(client, world):
    queued = submit(world, name="still-queued")
    cancelled = submit(world, name="cancelled-one")
    run_cancel(run=cancelled, actor=world.researcher_a)
    client.force_login(world.researcher_a)

    assert listed_run_ids(client.get(reverse("jobs:run_list"), {"state": "CANCELLED"})) == [
        cancelled.pk
    ]
    assert listed_run_ids(client.get(reverse("jobs:run_list"), {"state": "QUEUED"})) == [queued.pk]


def test_an_unknown_state_filter_is_ignored_with_a_notice(client, world):
    run = submit(world)
    client.force_login(world.researcher_a)

    response = client.get(reverse("jobs:run_list"), {"state": "<b>BOGUS</b>"})

    assert response.status_code == 200
    assert listed_run_ids(response) == [run.pk]
    notice = "There is no state “&lt;b&gt;BOGUS&lt;/b&gt;”; showing all states."
    assert notice in response.content.decode()


def test_empty_run_list_says_what_to_do_next(client, world):
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:run_list")).content.decode()

    assert "No runs yet" in content
    assert '<a href="/runs/new/">Submit an experiment</a> to start one.' in content


def test_run_list_pages_by_25_older_and_newer_keeping_the_filters(client, world):
    runs = [submit(world, name=f"sweep-{i}") for i in range(27)]
    newest_first = [run.pk for run in reversed(runs)]
    client.force_login(world.researcher_a)

    first = client.get(reverse("jobs:run_list"), {"state": "QUEUED"})
    second = client.get(reverse("jobs:run_list"), {"state": "QUEUED", "before": newest_first[24]})
    back = client.get(reverse("jobs:run_list"), {"state": "QUEUED", "after": newest_first[25]})

    assert listed_run_ids(first) == newest_first[:25]
    assert listed_run_ids(second) == newest_first[25:]
    assert listed_run_ids(back) == newest_first[:25]
    older = f'href="?state=QUEUED&amp;before={newest_first[24]}" rel="next">Older →</a>'
    assert older in first.content.decode()
    assert 'rel="prev"' not in first.content.decode()
    newer = f'href="?state=QUEUED&amp;after={newest_first[25]}" rel="prev">← Newer</a>'
    assert newer in second.content.decode()
    assert 'rel="next"' not in second.content.decode()
    assert "<span>27 runs</span>" in second.content.decode()


def test_run_list_uses_a_fixed_number_of_queries(client, world, django_assert_max_num_queries):
    submit(world)
    client.force_login(world.researcher_a)
    with CaptureQueriesContext(connection) as one_run:
        client.get(reverse("jobs:run_list"))
    for i in range(29):
        submit(world, name=f"many-{i}", user=world.researcher_a2)

    # (one of them places the page's queued runs in line, one reads their attempts' times
    # for the duration and GPU-hour columns)
    with django_assert_max_num_queries(11), CaptureQueriesContext(connection) as many_runs:
        response = client.get(reverse("jobs:run_list"))

    assert len(response.context["runs"]) == 25
    assert len(many_runs) == len(one_run)


# --- submit --------------------------------------------------------------------------------


def test_submit_form_offers_only_what_the_user_may_use(client, world):
    client.force_login(world.researcher_a)

    response = client.get(reverse("jobs:run_submit"))

    assert response.status_code == 200
    tenant_field = field_html(response.content.decode(), "tenant")
    assert '<option value="vision" selected>Vision Lab (vision)</option>' in tenant_field
    assert 'value="nlp"' not in tenant_field
    image_field = field_html(response.content.decode(), "image")
    assert (
        f'<option value="{world.image.reference}">'
        "registry.example.org/ml/pytorch:2.4-cuda12 (sha256:aaaaaaaaaaaa…)</option>"
    ) in image_field
    assert world.nlp_only_image.reference not in image_field
    assert world.blocked_image.reference not in image_field
    assert '<optgroup label="vision">' in field_html(response.content.decode(), "project")
    for name in ("tenant", "project", "image", "command", "flavor", "nodes", "params"):
        assert f'<label for="id_{name}">' in field_html(response.content.decode(), name)
    assert response.context["form"]["params"].value() == "{}"
    assert response.context["form"]["priority"].value() == 50


def test_submit_creates_one_experiment_and_one_run_and_redirects(client, world):
    client.force_login(world.researcher_a)

    response = client.post(reverse("jobs:run_submit"), form_data(world))

    run = Run.objects.get()
    experiment = Experiment.objects.get()
    assert response.status_code == 302
    assert response.url == reverse("jobs:run_detail", args=[run.pk])
    assert run.experiment == experiment
    assert run.state == RunState.QUEUED
    assert run.submitted_by == world.researcher_a
    assert run.gpus == 2
    assert experiment.tenant == world.vision
    assert experiment.project == world.vision_project
    assert experiment.image_reference == world.image.reference
    assert experiment.name == "resnet-web"
    assert experiment.command == "python train.py --epochs 3"
    assert experiment.params == {"lr": 0.1, "batch_size": 256}
    assert experiment.env == {"GANTRY_SIM_DURATION_S": "600"}
    assert experiment.code_commit == COMMIT
    detail = client.get(response.url)
    assert [str(m) for m in detail.context["messages"]] == [f"Run {run.pk} submitted."]


def test_submit_normalizes_textarea_line_breaks(client, world):
    client.force_login(world.researcher_a)

    client.post(reverse("jobs:run_submit"), form_data(world, command="cd /work\r\npython t.py"))

    assert Experiment.objects.get().command == "cd /work\npython t.py"


BAD_INPUTS = [
    pytest.param(
        lambda w: {"image": "registry.example.org/ml/pytorch@sha256:xyz"},
        "image",
        "Invalid digest: expected sha256: and 64 lowercase hex.",
        id="invalid-digest",
    ),
    pytest.param(
        lambda w: {"image": w.nlp_only_image.reference},
        "image",
        "This image is not approved for this tenant.",
        id="image-of-another-tenant",
    ),
    pytest.param(
        lambda w: {"image": w.blocked_image.reference},
        "image",
        "This image is not approved for this tenant.",
        id="blocked-image",
    ),
    pytest.param(lambda w: {"nodes": "0"}, "nodes", "Must be at least 1.", id="zero-nodes"),
    pytest.param(
        lambda w: {"gpus_per_node": "9"},
        "gpus_per_node",
        "A a100-80gb node has at most 8 GPUs. The largest a100-80gb run that"
        " could ever start for tenant vision: "
        "16 GPUs (2 nodes × 8).",
        id="too-many-gpus-per-node",
    ),
    pytest.param(
        lambda w: {"params": "[1, 2]"}, "params", "Must be a JSON object.", id="params-list"
    ),
    pytest.param(
        lambda w: {"params": json.dumps({"blob": "x" * 64 * 1024})},
        "params",
        "At most 64 KiB as JSON.",
        id="params-too-large",
    ),
    pytest.param(
        lambda w: {"params": '{"lr": 0.1'},
        "params",
        "Not valid JSON: Expecting ',' delimiter: line 1 column 11 (char 10)",
        id="params-not-json",
    ),
    pytest.param(
        lambda w: {"params": '{"lr": NaN}'},
        "params",
        "Not valid JSON: NaN is not valid JSON",
        id="params-nan",
    ),
    pytest.param(
        lambda w: {"env": '{"PATH": 1}'},
        "env",
        "The value of PATH must be a string.",
        id="env-not-string",
    ),
    pytest.param(
        lambda w: {"command": "x" * (16 * 1024 + 1)},
        "command",
        "At most 16 KiB.",
        id="command-too-long",
    ),
    pytest.param(lambda w: {"command": ""}, "command", "A command is required.", id="no-command"),
    pytest.param(
        lambda w: {"project": "nope"},
        "project",
        "Unknown project for this tenant.",
        id="unknown-project",
    ),
    pytest.param(
        lambda w: {"tenant": "nlp", "project": "llm"},
        "tenant",
        "Unknown tenant, or you are not a member.",
        id="tenant-not-a-member",
    ),
    pytest.param(
        lambda w: {"code_commit": "main"},
        "code_commit",
        "A commit is 40 lowercase hex characters.",
        id="commit-not-a-sha",
    ),
    pytest.param(
        lambda w: {"priority": "101"}, "priority", "Between 0 and 100.", id="priority-too-high"
    ),
    pytest.param(
        lambda w: {"nodes": "two"}, "nodes", "Enter a whole number.", id="nodes-not-a-number"
    ),
]


@pytest.mark.parametrize(("overrides", "field", "message"), BAD_INPUTS)
def test_bad_input_is_shown_next_to_its_field_and_saves_nothing(
    client, world, overrides, field, message
):
    client.force_login(world.researcher_a)

    response = client.post(reverse("jobs:run_submit"), form_data(world, **overrides(world)))

    assert response.status_code == 400
    assert response.context["form"].errors[field] == [message]
    assert f"<li>{escape(message)}</li>" in field_html(response.content.decode(), field)
    assert Experiment.objects.count() == 0
    assert Run.objects.count() == 0


def test_several_service_errors_are_all_shown(client, world):
    client.force_login(world.researcher_a)

    response = client.post(
        reverse("jobs:run_submit"), form_data(world, nodes="0", project="nope", params="[]")
    )

    assert response.status_code == 400
    assert response.context["form"].errors == {
        "project": ["Unknown project for this tenant."],
        "nodes": ["Must be at least 1."],
        "params": ["Must be a JSON object."],
    }
    assert Experiment.objects.count() == 0


def test_a_user_without_membership_is_told_how_to_get_one(client, world):
    client.force_login(world.finance)

    response = client.get(reverse("jobs:run_submit"))

    assert response.status_code == 200
    assert "You are not a member of any tenant" in response.content.decode()
    assert 'name="command"' not in response.content.decode()


def test_run_again_prefills_the_form_from_a_viewable_experiment(client, world):
    run = submit(world, params={"lr": 0.5})
    client.force_login(world.researcher_a2)

    response = client.get(reverse("jobs:run_submit"), {"from": run.experiment_id})

    assert response.status_code == 200
    form = response.context["form"]
    assert form["image"].value() == world.image.reference
    assert form["command"].value() == "python train.py --epochs 3"
    assert json.loads(form["params"].value()) == {"lr": 0.5}
    client.force_login(world.researcher_b)
    assert client.get(reverse("jobs:run_submit"), {"from": run.experiment_id}).status_code == 404


# --- run detail and its live sections -------------------------------------------------------


@pytest.mark.parametrize(
    "persona", ["researcher_a", "researcher_a2", "tenant_admin_a", "finance", "platform_admin"]
)
def test_run_detail_is_shown_to_readers_of_the_tenant(client, world, persona):
    run = submit(world)
    client.force_login(getattr(world, persona))

    response = client.get(reverse("jobs:run_detail", args=[run.pk]))

    assert response.status_code == 200
    content = response.content.decode()
    assert (
        f'<div class="live" id="run-live" hx-get="/runs/{run.pk}/live/" hx-trigger="every 3000ms" '
        'hx-swap="none" hx-sync="this:drop" hx-include="[data-live-version]" '
        'data-live-poll-ms="3000">'
    ) in content
    assert '<span class="badge badge-queued">Queued</span>' in content
    assert "Waiting for the next admission cycle" in content
    assert '<span class="tag">SUBMITTED</span>' in content
    assert f'<a href="/experiments/{run.experiment_id}/">resnet-baseline</a>' in content
    assert world.image.reference in content
    assert "No attempt yet" in content


def test_run_detail_shows_why_and_where_a_run_waits(client, world):
    # Two runs of the flavor ahead of it in line (one of higher priority, one earlier): it is
    # third. The position is counted when the page is read, not stored.
    submit(world)
    submit(world)
    run = submit(world)
    Run.objects.filter(pk=run.pk).update(
        wait_reason="CAPACITY", wait_message="needs 16 a100 GPUs", priority=40
    )
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:run_live", args=[run.pk])).content.decode()

    assert (
        "<strong>Not enough GPUs, even by reclaiming</strong>: "
        "needs 16 a100 GPUs · position 3 in the queue"
    ) in content


@pytest.mark.parametrize("name", ["jobs:run_detail", "jobs:run_live"])
def test_run_pages_are_404_for_other_tenants_and_missing_runs(client, world, name):
    run = submit(world)
    client.force_login(world.researcher_b)

    assert client.get(reverse(name, args=[run.pk])).status_code == 404
    assert client.get(reverse(name, args=[run.pk + 1000])).status_code == 404


def test_cancel_button_only_for_who_may_cancel(client, world):
    run = submit(world)
    url = reverse("jobs:run_detail", args=[run.pk])
    form = f'<form method="post" action="/runs/{run.pk}/cancel/"'

    client.force_login(world.researcher_a)
    assert form in client.get(url).content.decode()
    client.force_login(world.tenant_admin_a)
    assert form in client.get(url).content.decode()
    client.force_login(world.researcher_a2)
    assert form not in client.get(url).content.decode()


# --- experiment detail -----------------------------------------------------------------------


def test_experiment_detail_shows_the_reproducibility_record(client, world):
    run = submit(world)
    client.force_login(world.researcher_a2)

    response = client.get(reverse("jobs:experiment_detail", args=[run.experiment_id]))

    assert response.status_code == 200
    content = response.content.decode()
    # The whole reference, selectable, with a button that copies it.
    assert f'<code class="copyable-text" data-copy-source>{world.image.reference}</code>' in content
    assert f"https://git.example.org/vision/detection.git @ {COMMIT}" in content
    assert "s3://datasets/imagenet (version 2024-01)" in content
    pretty_params = "{\n  &quot;batch_size&quot;: 256,\n  &quot;lr&quot;: 0.1\n}"
    assert f'<pre class="code">{pretty_params}</pre>' in content
    env_row = '<th scope="row" class="mono">GANTRY_SIM_DURATION_S</th><td class="mono">600</td>'
    assert env_row in content
    assert "<dd>1 node × 2 a100-80gb = 2 GPUs</dd>" in content
    assert "<dd>1440 minutes</dd>" in content
    assert f'<a href="/runs/{run.pk}/">#{run.pk}</a>' in content
    assert "<dd>alice</dd>" in content


def test_experiment_detail_is_404_for_other_tenants_and_missing(client, world):
    run = submit(world)
    client.force_login(world.researcher_b)

    other_tenant = reverse("jobs:experiment_detail", args=[run.experiment_id])
    assert client.get(other_tenant).status_code == 404
    missing = reverse("jobs:experiment_detail", args=[run.experiment_id + 1000])
    assert client.get(missing).status_code == 404


def test_user_data_is_escaped_on_the_detail_pages(client, world):
    run = submit(
        world,
        name="<script>alert('name')</script>",
        command='echo "<img src=x onerror=alert(1)>"',
        params={"note": "</pre><script>alert(2)</script>"},
        env={"GREETING": "<b>hi</b>"},
    )
    client.force_login(world.researcher_a)

    for url in (
        reverse("jobs:run_detail", args=[run.pk]),
        reverse("jobs:experiment_detail", args=[run.experiment_id]),
        reverse("jobs:run_list"),
    ):
        content = client.get(url).content.decode()
        assert "<script>alert" not in content, url
        assert "<img src=x" not in content, url
        assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;" in content, url
    experiment_page = client.get(
        reverse("jobs:experiment_detail", args=[run.experiment_id])
    ).content.decode()
    assert "echo &quot;&lt;img src=x onerror=alert(1)&gt;&quot;" in experiment_page
    assert "&lt;/pre&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in experiment_page
    assert "&lt;b&gt;hi&lt;/b&gt;" in experiment_page


# --- cancel ----------------------------------------------------------------------------------


def events_of(run) -> list[str]:
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("reason", flat=True))


@pytest.mark.parametrize("persona", ["researcher_a", "tenant_admin_a"])
def test_owner_and_tenant_admin_cancel_a_queued_run(client, world, persona):
    run = submit(world)
    client.force_login(getattr(world, persona))

    response = client.post(reverse("jobs:run_cancel", args=[run.pk]))

    assert response.status_code == 302
    assert response.url == reverse("jobs:run_detail", args=[run.pk])
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert events_of(run) == ["SUBMITTED", "CANCELLED"]
    detail = client.get(response.url)
    assert [str(m) for m in detail.context["messages"]] == [f"Run {run.pk} is cancelled."]


def test_another_tenant_cannot_cancel_and_learns_nothing(client, world):
    run = submit(world)
    client.force_login(world.researcher_b)

    response = client.post(reverse("jobs:run_cancel", args=[run.pk]))

    assert response.status_code == 404
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    assert events_of(run) == ["SUBMITTED"]


def test_a_colleague_who_is_not_the_owner_gets_403(client, world):
    run = submit(world)
    client.force_login(world.researcher_a2)

    response = client.post(reverse("jobs:run_cancel", args=[run.pk]))

    assert response.status_code == 403
    reason = "Only the submitter, a tenant admin or a platform admin can cancel."
    assert reason in response.content.decode()
    run.refresh_from_db()
    assert run.state == RunState.QUEUED
    assert events_of(run) == ["SUBMITTED"]


def test_cancelling_a_finished_run_explains_and_changes_nothing(client, world):
    run = submit(world)
    run_cancel(run=run, actor=world.researcher_a)
    client.force_login(world.researcher_a)

    response = client.post(reverse("jobs:run_cancel", args=[run.pk]), follow=True)

    assert response.redirect_chain == [(reverse("jobs:run_detail", args=[run.pk]), 302)]
    assert [str(m) for m in response.context["messages"]] == ["The run is already cancelled."]
    assert events_of(run) == ["SUBMITTED", "CANCELLED"]


def test_cancel_is_post_only(client, world):
    run = submit(world)
    client.force_login(world.researcher_a)

    response = client.get(reverse("jobs:run_cancel", args=[run.pk]))

    assert response.status_code == 405
    run.refresh_from_db()
    assert run.state == RunState.QUEUED


@pytest.mark.parametrize(
    ("next_user", "restored"), [("researcher_a", True), ("researcher_a2", False)]
)
def test_a_form_kept_through_a_login_is_shown_only_to_the_user_who_wrote_it(
    client, world, next_user, restored
):
    client.force_login(world.researcher_a)
    page = client.get(reverse("jobs:run_submit"))
    owner = re.search(r'name="draft_owner" value="([^"]+)"', page.content.decode()).group(1)
    client.logout()  # the session ends while the form is open

    sent = client.post(reverse("jobs:run_submit"), form_data(world) | {"draft_owner": owner})
    client.force_login(getattr(world, next_user))
    shown = client.get(reverse("jobs:run_submit"))

    assert sent.status_code == 302
    assert sent.url.startswith(reverse("login"))
    assert shown.context["restored"] is restored
    assert ('value="resnet-web"' in shown.content.decode()) is restored
    assert Run.objects.count() == 0
