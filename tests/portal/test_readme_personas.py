"""The README says only what each persona can do (issue 31.7): its sentence on who manages
what is read from README.md, and each page it promises answers that persona, while the
persona it does not name gets the 404 an outsider gets."""

import re

import pytest
from django.urls import reverse

from tests import REPOSITORY

pytestmark = pytest.mark.django_db


def readme_admin_sentence() -> tuple[str, str]:
    """(what platform admins manage, what tenant admins manage) as the README says it."""
    text = " ".join((REPOSITORY / "README.md").read_text().split())
    match = re.search(r"Platform admins manage (.*?); tenant admins manage (.*?), and see", text)
    assert match is not None, "README.md no longer says who manages what"
    return match.group(1), match.group(2)


def test_the_readme_names_what_each_admin_manages_and_nothing_more():
    platform, tenant = readme_admin_sentence()
    assert platform == "tenants and their GPU quotas per GPU flavor"
    assert tenant == "their tenant's members, templates and idle-GPU policy"


def pages(world) -> dict[str, str]:
    """The page where each thing the README names is managed, for tenant vision."""
    quota = reverse("jobs:quota_edit") + "?tenant=vision&flavor=" + world.a100.slug
    return {
        "GPU quotas": quota,
        "members": reverse("jobs:tenant_members", args=["vision"]),
        "templates": reverse("jobs:template_create"),
        "idle-GPU policy": reverse("tenants:idle_policy", args=["vision"]),
    }


@pytest.mark.parametrize(
    ("persona", "thing", "status"),
    [
        ("platform_admin", "GPU quotas", 200),
        ("tenant_admin_a", "GPU quotas", 404),  # the README no longer says they may
        ("tenant_admin_a", "members", 200),
        ("tenant_admin_a", "templates", 200),
        ("tenant_admin_a", "idle-GPU policy", 200),
        ("researcher_a", "templates", 404),
    ],
)
def test_each_page_the_readme_promises_answers_its_persona(client, world, persona, thing, status):
    _, tenant_admins = readme_admin_sentence()
    if persona == "tenant_admin_a":
        assert (thing in tenant_admins) == (status == 200)
    client.force_login(getattr(world, persona))
    assert client.get(pages(world)[thing]).status_code == status
