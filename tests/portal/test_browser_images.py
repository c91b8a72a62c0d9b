"""In the demo world, in Chromium: a digest's Copy button puts the whole digest on the
clipboard, and an image picked by its tag on the submit page runs pinned to the digest the
demo registry resolves that tag to."""

import re

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from images.demo_registry import DEMO_REGISTRY_HOST, demo_image
from jobs.models import Run
from portal.demo import DEMO_PASSWORD, demo_seed

pytest_plugins = ["tests.browser_support"]

RUN_PAGE = re.compile(r"/runs/([0-9]+)/$")


@pytest.mark.django_db(transaction=True)
def test_copy_a_digest_and_submit_an_image_picked_by_its_tag(persona_page, live_server):
    demo_seed(speedup=30)
    pytorch = demo_image("ml/pytorch", "2.4-cuda12.4")
    repository = f"{DEMO_REGISTRY_HOST}/ml/pytorch"
    page = persona_page(User.objects.get(username="alice"), DEMO_PASSWORD)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)

    page.goto("/images/")
    row = page.locator("tr", has_text=f"{repository}:2.4-cuda12.4")
    digest = row.locator("[data-copy-source]")
    expect(digest).to_have_text(pytorch.digest)
    assert digest.evaluate("e => e.scrollWidth > e.clientWidth"), "cut short on screen"
    row.get_by_role("button", name="Copy the digest").click()
    expect(row.get_by_role("status")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == pytorch.digest

    page.goto("/runs/new/")
    page.select_option("#id_project", "detection")
    tag_label = page.locator("#id_image option", has_text=f"{repository}:2.4-cuda12.4")
    page.select_option("#id_image", label=tag_label.inner_text())
    page.fill("#id_command", "python train.py")
    page.select_option("#id_flavor", "a100-80gb")
    page.fill("#id_gpus_per_node", "1")
    page.get_by_role("button", name="Submit").click()
    expect(page).to_have_url(RUN_PAGE)

    run = Run.objects.select_related("experiment").get(pk=RUN_PAGE.search(page.url).group(1))
    assert run.experiment.image_reference == f"{repository}@{pytorch.digest}"
    shown = page.locator("dd [data-copy-source]", has_text=repository)
    expect(shown).to_have_text(f"{repository}@{pytorch.digest}")
    page.get_by_role("button", name="Copy the image reference").click()
    expect(page.get_by_role("status").filter(has_text="Copied")).to_have_count(1)
    assert page.evaluate("navigator.clipboard.readText()") == f"{repository}@{pytorch.digest}"
