"""Each persona's home page in headless Chromium, on the demo world of `make run`: logging
in lands there, and it shows the sections of the persona's roles and nothing else."""

import re

from django.contrib.auth.models import User
from django.template.defaultfilters import floatformat
from django.utils import timezone
from playwright.sync_api import expect

from jobs.models import Run
from jobs.selectors.queue import gpu_hours_this_month
from portal.demo import DEMO_PASSWORD, demo_seed

pytest_plugins = ["tests.browser_support"]


def shown_sections(page) -> list[str]:
    return page.eval_on_selector_all("[data-home]", "nodes => nodes.map(n => n.dataset.home)")


def test_each_persona_lands_on_its_home_page(persona_page, transactional_db):
    demo_seed(speedup=30)
    people = {user.username: user for user in User.objects.all()}
    waiting = Run.objects.get(experiment__name="yolo-xl")

    alice = persona_page(people["alice"], DEMO_PASSWORD)
    assert re.search(r"/$", alice.url), alice.url
    assert shown_sections(alice) == ["researcher"]
    expect(alice.get_by_role("heading", name="Your runs")).to_be_visible()
    row = alice.locator(f"[data-table=my-waiting] tr[data-run='{waiting.pk}']")
    expect(row).to_contain_text("Borrow limit reached · #1 in queue")
    expect(row.locator("[data-start-estimate]")).to_contain_text("at about ")
    expect(alice.locator("[data-home-figure=goodput]")).to_contain_text("your runs: ")
    alice.get_by_role("link", name="Submit an experiment").click()
    expect(alice).to_have_url(re.compile(r"/runs/new/$"))

    tara = persona_page(people["tara"], DEMO_PASSWORD)
    assert shown_sections(tara) == ["researcher", "tenant-admin"]
    vision = tara.locator("[data-home=tenant-admin][data-tenant=vision]")
    # The budget burns on the charged GPU-hours of the month so far, as the seed's dates put
    # them in it: segformer-b5's, less its credit for the lemon's fault, and vit-gang's, on
    # most days.
    used = gpu_hours_this_month(now=timezone.now()).get(("vision", "a100-80gb"), 0.0)
    expect(vision.locator("[data-quota=a100-80gb]")).to_contain_text(
        f"{floatformat(used, 1)} of 5000 GPU-hours"
    )
    expect(vision.locator("[data-home-figure=waiting]")).to_have_text("1 run waiting")
    vision.locator("[data-home-figure=members]").click()
    expect(tara).to_have_url(re.compile(r"/tenants/vision/members/$"))

    admin = persona_page(people["admin"], DEMO_PASSWORD)
    assert shown_sections(admin) == ["platform", "kpis", "backends"]
    expect(
        admin.locator("[data-pool='sim-east:h100-80gb'] [data-figure=largest-gangs]")
    ).to_have_text("1 × 5–8, 2 × 1–4")
    expect(admin.locator("[data-cluster=sim-east] [data-health]")).to_have_text("Healthy")
    expect(admin.get_by_role("link", name="Submit an experiment")).to_have_count(0)

    fiona = persona_page(people["fiona"], DEMO_PASSWORD)
    assert shown_sections(fiona) == ["finance"]
    expect(fiona.locator("[data-table=statements] tbody tr")).to_have_count(3)
    expect(fiona.get_by_role("link", name="Submit an experiment")).to_have_count(0)
    fiona.locator("[data-tenant=vision] [data-statement=closed]").click()
    expect(fiona).to_have_url(re.compile(r"/finance/vision/\d{4}-\d{2}/$"))
