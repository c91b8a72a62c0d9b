"""Experiment templates: who manages them, and submissions checked against their locks and
ranges through the API and the browser form."""

import pytest
import yaml
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse

from jobs.models import Experiment, ExperimentTemplate, Run
from jobs.services.specs import experiment_spec
from jobs.services.submission import run_submit
from jobs.services.templates import template_save
from tenants.models import AuditEvent, Membership
from tests.conftest import DIGEST_A, experiment_input, make_user
from tests.jobs.test_spec import SPECS, client_for, counts
from tests.jobs.test_web import field_html, form_data

pytestmark = pytest.mark.django_db

IMAGE = "registry.example.org/ml/pytorch@" + DIGEST_A
VALUES = {
    "image": IMAGE,
    "command": "python train.py",
    "resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 1},
    "priority": 40,
}
LOCKED = ["image", "resources.flavor", "resources.nodes"]
RANGES = {"resources.gpus_per_node": {"min": 1, "max": 4}, "priority": {"min": 10, "max": 60}}
TEMPLATES = reverse("jobs:template_list")
SUBMIT = reverse("jobs:run_submit")


def make_template(world, *, tenant="vision", name="pytorch-1node", **overrides):
    values = {
        "actor": world.platform_admin,
        "tenant": world.vision if tenant == "vision" else world.nlp if tenant == "nlp" else None,
        "name": name,
        "description": "One node of PyTorch",
        "values": VALUES,
        "locked": LOCKED,
        "ranges": RANGES,
    } | overrides
    return template_save(**values)


def nlp_admin(world):
    user = make_user("nadia")
    Membership.objects.create(user=user, tenant=world.nlp, role="tenant_admin")
    return user


def template_spec(**changes) -> dict:
    return {
        "version": 1,
        "kind": "experiment",
        "tenant": "vision",
        "project": "detection",
        "template": "pytorch-1node",
    } | changes


# --- services -------------------------------------------------------------------------------


def test_tenant_admin_saves_a_template_of_their_tenant_with_an_audit_row(world):
    template = make_template(world, actor=world.tenant_admin_a)

    assert template.tenant == world.vision
    assert template.created_by == world.tenant_admin_a
    event = AuditEvent.objects.get()
    assert (event.action, event.target, event.tenant) == (
        "template.create",
        "template vision/pytorch-1node",
        world.vision,
    )
    assert event.after["locked"] == LOCKED


@pytest.mark.parametrize(
    ("persona", "tenant"),
    [("tenant_admin_a", "nlp"), ("tenant_admin_a", None), ("researcher_a", "vision")],
)
def test_others_may_not_save_templates(world, persona, tenant):
    with pytest.raises(PermissionDenied):
        make_template(world, actor=getattr(world, persona), tenant=tenant)

    assert ExperimentTemplate.objects.count() == 0
    assert AuditEvent.objects.count() == 0


def test_template_save_rejects_bad_values_locks_and_ranges(world):
    with pytest.raises(ValidationError) as caught:
        make_template(
            world,
            name="Bad Name",
            values={"resources": {"gpus": 1}, "tenant": "x"},
            locked=["image"],
            ranges={},
        )

    assert set(caught.value.message_dict) == {"name", "values"}
    assert caught.value.message_dict["values"] == [
        "tenant: Unknown field; known fields: version, kind, tenant, project, name, template, "
        "image, command, resources, code, dataset, params, env, priority, max_restarts, "
        "checkpoint_dir.",
        "resources.gpus: Unknown field; known fields: flavor, nodes, gpus_per_node, "
        "max_runtime_minutes, topology_level, topology_mode.",
    ]
    assert ExperimentTemplate.objects.count() == 0


def test_template_names_are_unique_per_tenant(world):
    make_template(world)
    make_template(world, tenant="nlp")

    with pytest.raises(ValidationError) as caught:
        make_template(world)

    assert caught.value.message_dict == {
        "name": ["A template with this name exists for this tenant."]
    }


# --- API ------------------------------------------------------------------------------------


def test_templates_api_lists_own_tenant_and_global_templates(world):
    make_template(world, name="vision-only")
    make_template(world, tenant="nlp", name="nlp-only")
    make_template(world, tenant=None, name="everyone")

    response = client_for(world.researcher_b).get(reverse("api:template-list"))

    assert response.status_code == 200
    results = response.json()["results"]
    assert [(t["tenant"], t["name"]) for t in results] == [(None, "everyone"), ("nlp", "nlp-only")]
    assert results[1]["values"] == VALUES
    assert results[1]["locked"] == LOCKED
    assert results[1]["ranges"] == RANGES


def test_spec_from_template_merges_defaults_and_submission(world):
    make_template(world)

    response = client_for(world.researcher_a).post(
        SPECS, template_spec(resources={"gpus_per_node": 4}, name="from-template"), format="json"
    )

    assert response.status_code == 201, response.json()
    experiment = Experiment.objects.get()
    assert experiment_spec(experiment) == {
        "version": 1,
        "kind": "experiment",
        "tenant": "vision",
        "project": "detection",
        "name": "from-template",
        "image": IMAGE,
        "command": "python train.py",
        "resources": {
            "flavor": "a100-80gb",
            "nodes": 1,
            "gpus_per_node": 4,
            "max_runtime_minutes": 1440,
        },
        "priority": 40,
        "max_restarts": 0,
    }


def test_tenant_template_wins_over_a_global_one_of_the_same_name(world):
    make_template(world, tenant=None, values={**VALUES, "command": "global"}, locked=[])
    make_template(world, values={**VALUES, "command": "tenant"}, locked=[])

    response = client_for(world.researcher_a).post(SPECS, template_spec(), format="json")

    assert response.status_code == 201, response.json()
    assert Experiment.objects.get().command == "tenant"


def test_global_template_serves_every_tenant(world):
    make_template(world, tenant=None)

    response = client_for(world.researcher_b).post(
        SPECS, template_spec(tenant="nlp", project="llm"), format="json"
    )

    assert response.status_code == 201, response.json()
    assert Experiment.objects.get().tenant == world.nlp


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"resources": {"nodes": 2}},
            {"resources.nodes": ["Locked by template pytorch-1node: must be 1."]},
        ),
        (
            {"image": "registry.example.org/ml/other:1"},
            {"image": [f"Locked by template pytorch-1node: must be {IMAGE}."]},
        ),
        (
            {"resources": {"gpus_per_node": 8}},
            {"resources.gpus_per_node": ["Must be between 1 and 4 (template pytorch-1node)."]},
        ),
        ({"priority": 90}, {"priority": ["Must be between 10 and 60 (template pytorch-1node)."]}),
        (
            {"template": "missing"},
            {"template": ["No template missing for tenant vision, nor a global one."]},
        ),
    ],
)
def test_spec_breaking_the_template_is_400_and_creates_nothing(world, changes, expected):
    make_template(world)

    response = client_for(world.researcher_a).post(SPECS, template_spec(**changes), format="json")

    assert response.status_code == 400
    assert response.json() == expected
    assert counts() == (0, 0)


def test_another_tenants_template_is_unknown_to_a_spec(world):
    make_template(world, tenant="nlp")

    response = client_for(world.researcher_a).post(SPECS, template_spec(), format="json")

    assert response.status_code == 400
    assert response.json() == {
        "template": ["No template pytorch-1node for tenant vision, nor a global one."]
    }


# --- template pages -------------------------------------------------------------------------


def test_tenant_admin_lists_only_their_tenants_templates(client, world):
    make_template(world, name="vision-one")
    make_template(world, tenant="nlp", name="nlp-one")
    make_template(world, tenant=None, name="global-one")
    client.force_login(world.tenant_admin_a)

    page = client.get(TEMPLATES).content.decode()

    assert "vision-one" in page
    assert "nlp-one" not in page
    assert "global-one" not in page


def test_platform_admin_lists_every_template(client, world):
    for tenant, name in (("vision", "vision-one"), ("nlp", "nlp-one"), (None, "global-one")):
        make_template(world, tenant=tenant, name=name)
    client.force_login(world.platform_admin)

    page = client.get(TEMPLATES).content.decode()

    assert all(name in page for name in ("vision-one", "nlp-one", "global-one"))


@pytest.mark.parametrize("persona", ["researcher_a", "finance"])
def test_template_pages_are_404_for_non_admins(client, world, persona):
    template = make_template(world)
    client.force_login(getattr(world, persona))

    assert client.get(TEMPLATES).status_code == 404
    assert client.get(reverse("jobs:template_create")).status_code == 404
    assert client.get(reverse("jobs:template_edit", args=[template.pk])).status_code == 404


def test_tenant_admin_of_another_tenant_gets_404_and_changes_nothing(client, world):
    template = make_template(world)
    client.force_login(nlp_admin(world))

    edit = reverse("jobs:template_edit", args=[template.pk])
    assert client.get(edit).status_code == 404
    assert client.post(edit, {"name": "stolen", "values": "{}"}).status_code == 404
    delete = reverse("jobs:template_delete", args=[template.pk])
    assert client.post(delete).status_code == 404
    template.refresh_from_db()
    assert template.name == "pytorch-1node"
    assert AuditEvent.objects.filter(action__in=["template.update", "template.delete"]).count() == 0


def test_tenant_admin_creates_edits_and_deletes_a_template(client, world):
    client.force_login(world.tenant_admin_a)

    created = client.post(
        reverse("jobs:template_create"),
        {
            "tenant": "vision",
            "name": "small",
            "description": "",
            "values": '{"resources": {"flavor": "a100-80gb", "gpus_per_node": 1}}',
            "locked": "resources.flavor",
            "ranges": '{"resources.gpus_per_node": {"min": 1, "max": 2}}',
        },
    )
    assert created.status_code == 302
    template = ExperimentTemplate.objects.get()
    assert (template.tenant, template.locked) == (world.vision, ["resources.flavor"])

    edited = client.post(
        reverse("jobs:template_edit", args=[template.pk]),
        {"name": "small", "values": '{"command": "x"}', "locked": "", "ranges": "{}"},
    )
    assert edited.status_code == 302
    template.refresh_from_db()
    assert (template.values, template.locked, template.ranges) == ({"command": "x"}, [], {})

    deleted = client.post(reverse("jobs:template_delete", args=[template.pk]))
    assert deleted.status_code == 302
    assert ExperimentTemplate.objects.count() == 0
    assert list(AuditEvent.objects.order_by("id").values_list("action", flat=True)) == [
        "template.create",
        "template.update",
        "template.delete",
    ]


def test_tenant_admin_cannot_create_a_global_template(client, world):
    client.force_login(world.tenant_admin_a)

    response = client.post(
        reverse("jobs:template_create"),
        {"tenant": "", "name": "everyone", "values": "{}", "locked": "", "ranges": "{}"},
    )

    assert response.status_code == 400
    assert "tenant" in field_html(response.content.decode(), "tenant")
    assert ExperimentTemplate.objects.count() == 0


def test_template_form_shows_service_errors_next_to_fields(client, world):
    client.force_login(world.tenant_admin_a)

    response = client.post(
        reverse("jobs:template_create"),
        {"tenant": "vision", "name": "t", "values": "{}", "locked": "image", "ranges": "{}"},
    )

    assert response.status_code == 400
    assert "image: give the value it is locked to." in field_html(
        response.content.decode(), "locked"
    )
    assert ExperimentTemplate.objects.count() == 0


# --- the submit form ------------------------------------------------------------------------


def test_submit_form_starts_from_the_template_with_locked_fields_read_only(client, world):
    template = make_template(world)
    client.force_login(world.researcher_a)

    page = client.get(f"{SUBMIT}?template={template.pk}").content.decode()

    nodes = field_html(page, "nodes")
    assert "disabled" in nodes
    assert 'value="1"' in nodes
    assert "Set by template pytorch-1node." in nodes
    assert "disabled" not in field_html(page, "gpus_per_node")
    assert 'value="40"' in field_html(page, "priority")
    assert f'name="template" value="{template.pk}"' in page
    assert f'href="{SUBMIT}?template={template.pk}"' not in page  # the current one is not a link


def test_submit_page_lists_usable_templates(client, world):
    mine = make_template(world, name="vision-one")
    theirs = make_template(world, tenant="nlp", name="nlp-one")
    shared = make_template(world, tenant=None, name="global-one")
    client.force_login(world.researcher_a)

    page = client.get(SUBMIT).content.decode()

    assert f"?template={mine.pk}" in page
    assert f"?template={shared.pk}" in page
    assert f"?template={theirs.pk}" not in page


def test_submit_form_with_another_tenants_template_is_404(client, world):
    template = make_template(world, tenant="nlp")
    client.force_login(world.researcher_a)

    assert client.get(f"{SUBMIT}?template={template.pk}").status_code == 404


def _template_post(world, template, **overrides) -> dict:
    """The submit form as a browser posts it: disabled (locked) inputs are not sent."""
    data = form_data(world, template=str(template.pk), gpus_per_node="2")
    for name in ("image", "flavor", "nodes"):
        data.pop(name)
    return data | overrides


def test_submit_form_with_template_submits_the_merged_values(client, world):
    template = make_template(world)
    client.force_login(world.researcher_a)

    response = client.post(SUBMIT, _template_post(world, template))

    assert response.status_code == 302
    experiment = Run.objects.get().experiment
    assert (experiment.image_reference, experiment.flavor.slug, experiment.nodes) == (
        IMAGE,
        "a100-80gb",
        1,
    )
    assert experiment.gpus_per_node == 2


def test_submit_form_with_a_tampered_locked_field_is_a_field_error(client, world):
    template = make_template(world)
    client.force_login(world.researcher_a)

    response = client.post(SUBMIT, _template_post(world, template, nodes="2"))

    assert response.status_code == 400
    assert "Locked by template pytorch-1node: must be 1." in field_html(
        response.content.decode(), "nodes"
    )
    assert counts() == (0, 0)


def test_submit_form_out_of_the_templates_range_is_a_field_error(client, world):
    template = make_template(world)
    client.force_login(world.researcher_a)

    response = client.post(SUBMIT, _template_post(world, template, priority="90"))

    assert response.status_code == 400
    assert "Must be between 10 and 60 (template pytorch-1node)." in field_html(
        response.content.decode(), "priority"
    )
    assert counts() == (0, 0)


# --- spec download --------------------------------------------------------------------------


def test_experiment_page_links_the_spec_download_which_is_the_yaml_spec(client, world):
    experiment = run_submit(user=world.researcher_a, data=experiment_input(world)).experiment
    client.force_login(world.researcher_a)
    url = reverse("jobs:experiment_spec", args=[experiment.pk])

    page = client.get(reverse("jobs:experiment_detail", args=[experiment.pk])).content.decode()
    response = client.get(url)

    assert f'href="{url}"' in page
    assert response.status_code == 200
    assert response["Content-Type"] == "application/yaml; charset=utf-8"
    assert yaml.safe_load(response.content) == experiment_spec(experiment)


def test_spec_download_of_another_tenants_experiment_is_404(client, world):
    experiment = run_submit(user=world.researcher_a, data=experiment_input(world)).experiment
    client.force_login(world.researcher_b)

    assert client.get(reverse("jobs:experiment_spec", args=[experiment.pk])).status_code == 404
