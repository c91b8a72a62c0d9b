"""Issue 21.6: quotas that mean what they say. Guarantees beyond a flavor's capacity need an
explicit confirmation and are shown; wait messages stay truthful; the submit preview and the
submit validation never disagree."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from jobs.models import Run, RunState
from jobs.selectors.preview import admission_preview
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.capacity import quota_update_checked
from jobs.services.submission import experiment_validate, run_submit
from tenants.models import AuditEvent, Quota
from tests.conftest import experiment_input, reserved_ending

# The world's cluster: 4 nodes of 8 A100 (32 GPUs); vision and nlp are guaranteed 16 each.
OVERCOMMIT_1000 = (
    "The a100-80gb guarantees of all tenants add up to 1,016 GPUs, 984 more than the 32 the "
    "enabled clusters have: they cannot all be kept at once, and a tenant within its "
    "guarantee may wait."
)


def quota_fields(**overrides) -> dict:
    return {
        "guaranteed_gpus": 1000,
        "borrow_limit_gpus": 0,
        "max_gpus_per_run": None,
        "monthly_gpu_hour_budget": None,
        "budget_mode": "hard",
        "fair_share_weight": 1,
    } | overrides


def vision_a100(world) -> Quota:
    return Quota.objects.get(tenant=world.vision, flavor=world.a100)


# --- saving needs a confirmation -----------------------------------------------------------


def test_an_overcommitting_guarantee_is_refused_without_confirmation_and_changes_nothing(world):
    with pytest.raises(ValidationError) as refused:
        quota_update_checked(
            tenant=world.vision, flavor=world.a100, actor=world.platform_admin, **quota_fields()
        )

    assert refused.value.message_dict == {
        "confirm_overcommit": [
            f"{OVERCOMMIT_1000} Confirm to save the guarantee of 1,000 anyway, or lower it."
        ]
    }
    assert vision_a100(world).guaranteed_gpus == 16
    assert AuditEvent.objects.count() == 0


def test_a_confirmed_overcommit_is_saved_and_audited(world):
    change = quota_update_checked(
        tenant=world.vision,
        flavor=world.a100,
        actor=world.platform_admin,
        confirm_overcommit=True,
        **quota_fields(),
    )

    assert vision_a100(world).guaranteed_gpus == 1000
    assert change.overcommit is not None and change.overcommit.message == OVERCOMMIT_1000
    assert list(AuditEvent.objects.order_by("id").values_list("action", "after")) == [
        ("quota.update", quota_fields()),
        ("quota.overcommit", {"guaranteed": 1016, "capacity": 32}),
    ]


def test_other_changes_to_an_overcommitted_flavor_need_no_confirmation(world):
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(guaranteed_gpus=1000)

    lowered = quota_update_checked(
        tenant=world.vision,
        flavor=world.a100,
        actor=world.platform_admin,
        **quota_fields(guaranteed_gpus=500, monthly_gpu_hour_budget=10),
    )

    assert (lowered.quota.guaranteed_gpus, lowered.quota.monthly_gpu_hour_budget) == (500, 10)
    assert lowered.overcommit is not None and lowered.overcommit.guaranteed == 516
    assert not AuditEvent.objects.filter(action="quota.overcommit").exists()


def test_the_form_asks_for_the_confirmation_then_saves(client, world):
    client.force_login(world.platform_admin)
    url = f"{reverse('jobs:quota_edit')}?tenant=vision&flavor=a100-80gb"
    form = {
        "guaranteed_gpus": "1000",
        "borrow_limit_gpus": "0",
        "max_gpus_per_run": "",
        "monthly_gpu_hour_budget": "",
        "budget_mode": "hard",
        "fair_share_weight": "1",
    }

    refused = client.post(url, form)

    assert refused.status_code == 400
    assert refused.context["form"].errors == {
        "confirm_overcommit": [
            f"{OVERCOMMIT_1000} Confirm to save the guarantee of 1,000 anyway, or lower it."
        ]
    }
    assert 'name="confirm_overcommit"' in refused.content.decode()
    assert vision_a100(world).guaranteed_gpus == 16
    assert AuditEvent.objects.count() == 0

    saved = client.post(url, form | {"confirm_overcommit": "on"}, follow=True)

    assert saved.status_code == 200
    assert vision_a100(world).guaranteed_gpus == 1000
    assert [str(m) for m in saved.context["messages"]] == [
        "Saved the a100-80gb quota of vision.",
        OVERCOMMIT_1000,
    ]


# --- shown where quotas and capacity are read ----------------------------------------------


@pytest.fixture
def overcommitted(world):
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(guaranteed_gpus=1000)
    return world


def test_the_quota_page_shows_admins_the_figures_and_members_the_fact(client, overcommitted):
    client.force_login(overcommitted.platform_admin)
    admin_page = client.get(reverse("jobs:quota_list")).content.decode()
    client.force_login(overcommitted.researcher_b)
    member_page = client.get(reverse("jobs:quota_list")).content.decode()

    assert OVERCOMMIT_1000 in admin_page
    assert (
        "The a100-80gb guarantees of all tenants add up to more than the 32 GPUs the enabled "
        "clusters have: a run within its tenant&#x27;s guarantee may wait."
    ) in member_page
    assert "1,016" not in member_page  # other tenants' guarantees stay theirs


def test_the_cluster_page_shows_the_overcommit(client, overcommitted):
    client.force_login(overcommitted.platform_admin)
    page = client.get(reverse("jobs:cluster_list")).content.decode()
    assert f'data-overcommit="a100-80gb">{OVERCOMMIT_1000}</p>' in page
    assert 'data-overcommit="h100-80gb"' not in page


# --- wait messages stay truthful -----------------------------------------------------------


def test_a_run_within_an_overcommitted_guarantee_says_why_it_waits(overcommitted):
    world = overcommitted
    # nlp holds its 16 guaranteed GPUs, vision 16 of its 1,000: nothing borrowed to reclaim.
    nlp = run_submit(
        user=world.researcher_b,
        data=experiment_input(world, tenant="nlp", project="llm", nodes=2, gpus_per_node=8),
    )
    vision = run_submit(
        user=world.researcher_a, data=experiment_input(world, nodes=2, gpus_per_node=8)
    )
    waiting = run_submit(user=world.researcher_a, data=experiment_input(world, gpus_per_node=8))

    admission_run_cycle()

    waiting.refresh_from_db()
    assert (waiting.state, waiting.wait_reason) == (RunState.QUEUED, "CAPACITY")
    assert waiting.wait_message == (
        "needs 8 a100-80gb GPUs on one node; 0 a100-80gb GPUs are free, at most 0 on any node "
        "(sim-1-a100-80gb-00: 0, sim-1-a100-80gb-01: 0, sim-1-a100-80gb-02: 0, "
        "sim-1-a100-80gb-03: 0); the a100-80gb guarantees of all "
        "tenants add up to more than the 32 GPUs the clusters have, so not all can be kept at "
        "once" + reserved_ending([nlp, vision], ["sim-1-a100-80gb-00"])
    )


def test_use_beyond_a_lowered_guarantee_reads_as_such(world):
    held = [run_submit(user=world.researcher_a, data=experiment_input(world, gpus_per_node=8))
            for _ in range(3)]  # fmt: skip
    admission_run_cycle()
    assert Run.objects.filter(pk__in=[r.pk for r in held], state=RunState.ADMITTED).count() == 2
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(guaranteed_gpus=12)

    admission_run_cycle()

    third = Run.objects.get(pk=held[2].pk)
    assert (third.wait_reason, third.wait_message) == (
        "QUOTA",
        "tenant vision uses 16 a100-80gb GPUs, 4 beyond its guarantee of 12 and may not borrow; "
        "this run needs 8",
    )


# --- the preview and the validation never disagree -----------------------------------------

SHAPES = [
    pytest.param({"gpus_per_node": 16}, id="more-gpus-than-a-node"),
    pytest.param({"nodes": 5, "gpus_per_node": 8}, id="more-nodes-than-the-cluster"),
    pytest.param({"nodes": 3, "gpus_per_node": 8}, id="beyond-guarantee-and-borrow-limit"),
    pytest.param({"flavor": "h100-80gb", "nodes": 2, "gpus_per_node": 8}, id="h100-beyond"),
    pytest.param({"nodes": 2, "gpus_per_node": 8}, id="fits"),
    pytest.param({"gpus_per_node": 4}, id="small"),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_preview_says_cannot_run_exactly_when_the_submit_is_refused(world, shape):
    data = experiment_input(world, **shape)
    try:
        experiment_validate(user=world.researcher_a, data=data)
    except ValidationError as exc:
        refusal = " ".join(m for messages in exc.message_dict.values() for m in messages)
    else:
        refusal = None

    preview = admission_preview(
        user=world.researcher_a,
        tenant=data.tenant,
        flavor=data.flavor,
        nodes=data.nodes,
        gpus_per_node=data.gpus_per_node,
    )

    if refusal is None:
        assert preview.verdict in ("start", "borrow", "wait")
    else:
        assert (preview.verdict, preview.message) == ("cannot", f"Cannot run: {refusal}")


def test_the_preview_of_a_run_too_large_for_any_node_quotes_the_validation(world):
    preview = admission_preview(
        user=world.researcher_a, tenant="vision", flavor="a100-80gb", nodes=1, gpus_per_node=16
    )
    assert (preview.verdict, preview.message) == (
        "cannot",
        "Cannot run: A a100-80gb node has at most 8 GPUs. The largest a100-80gb run that"
        " could ever start for tenant vision: "
        "16 GPUs (2 nodes × 8).",
    )
    assert Run.objects.count() == 0
