"""Who sees what in SQL written by hand: ``tenants.access.tenant_scope_sql`` is the one
source of the condition, and each raw read that uses it gives, for every persona, the rows
its selector gives: the home page's run lists (``portal.home._run_rows``) and
``run_list_viewable``, the run page's one statement (``run_get_viewable``) and
``run_list_viewable``, "my tenants" of the home page's goodput (``goodput_of_my_tenants``)
and ``tenant_list_submittable``. On PostgreSQL, where the suite runs."""

import contextlib

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.utils import timezone

from jobs.access import run_list_viewable
from jobs.models import Run
from jobs.selectors.runs import run_get_viewable
from portal.home import _LATEST, _run_rows, _runs
from telemetry.goodput import goodput_of_my_tenants, goodput_window
from tenants.access import tenant_list_submittable, tenant_list_viewable, tenant_scope_sql
from tenants.models import Membership, Tenant
from tests.conftest import make_user
from tests.telemetry.test_telemetry_pages import finished, submit

pytestmark = pytest.mark.django_db

PERSONAS = (
    "researcher_a",
    "researcher_a2",
    "researcher_b",
    "tenant_admin_a",
    "finance",
    "platform_admin",
    "member_of_both",
    "stranger",
    "anonymous",
)


@pytest.fixture
def scoped(world):
    """Runs of vision and nlp, two of them finished with accounting (one each), a third
    tenant with a run, and personas beyond the fixed ones: a member of both tenants, a
    signed-in user of none, the anonymous visitor."""
    both = make_user("bea")
    Membership.objects.create(user=both, tenant=world.vision, role="researcher")
    Membership.objects.create(user=both, tenant=world.nlp, role="tenant_admin")
    speech = Tenant.objects.create(slug="speech", name="Speech")
    Membership.objects.create(user=both, tenant=speech, role="researcher")
    finished(world, submit(world), days_ago=1, allocated=3600, idle=600)
    submit(world, user=world.researcher_a2)
    finished(
        world,
        submit(world, user=world.researcher_b, tenant="nlp", project="llm"),
        days_ago=2,
        allocated=7200,
    )
    submit(world, user=both, tenant="nlp", project="llm")
    people = {name: getattr(world, name) for name in PERSONAS[:6]}
    return people | {"member_of_both": both, "stranger": make_user("sam"), "anonymous": None}


def persona(scoped, name):
    return scoped[name] or AnonymousUser()


@pytest.fixture(params=["both active", "nlp inactive"])
def activity(request, world):
    if request.param == "nlp inactive":
        Tenant.objects.filter(pk=world.nlp.pk).update(active=False)
    return request.param


def scope_tenant_ids(user, *, members_only: bool) -> list[int]:
    sql, params = tenant_scope_sql(user=user, tenant="t", members_only=members_only)
    table = connection.ops.quote_name(Tenant._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT t.id FROM {table} t WHERE {sql} ORDER BY t.id", params)  # noqa: S608
        return [row[0] for row in cursor.fetchall()]


def test_the_suite_runs_these_on_postgresql():
    assert connection.vendor == "postgresql"


@pytest.mark.parametrize("name", PERSONAS)
def test_the_scope_selects_the_tenants_of_the_restricted_querysets(scoped, activity, name):
    user = persona(scoped, name)

    viewable = scope_tenant_ids(user, members_only=False)
    members = scope_tenant_ids(user, members_only=True)

    assert viewable == sorted(tenant_list_viewable(user=user).values_list("pk", flat=True))
    assert members == sorted(tenant_list_submittable(user=user).values_list("pk", flat=True))


def test_the_scopes_differ_where_the_roles_do(scoped, world):
    # Sanity of the comparison above: the personas do not all see the same tenants
    ids = {name: scope_tenant_ids(persona(scoped, name), members_only=False) for name in PERSONAS}
    speech = Tenant.objects.get(slug="speech").pk

    assert ids == {
        "researcher_a": [world.vision.pk],
        "researcher_a2": [world.vision.pk],
        "researcher_b": [world.nlp.pk],
        "tenant_admin_a": [world.vision.pk],
        "finance": [world.vision.pk, world.nlp.pk, speech],
        "platform_admin": [world.vision.pk, world.nlp.pk, speech],
        "member_of_both": [world.vision.pk, world.nlp.pk, speech],
        "stranger": [],
        "anonymous": [],
    }
    assert scope_tenant_ids(world.platform_admin, members_only=True) == []


@pytest.mark.parametrize("name", PERSONAS[:-1])  # the home page is for the signed-in
def test_the_home_pages_run_rows_are_the_runs_of_run_list_viewable(scoped, activity, name):
    user = persona(scoped, name)

    rows = _runs(*_run_rows(user=user, where="1 = 1", params=[], order=_LATEST, limit=100))

    expected = run_list_viewable(user=user).order_by("-submitted_at", "-id")
    assert [run.pk for run in rows] == list(expected.values_list("pk", flat=True))


@pytest.mark.parametrize("name", PERSONAS)
def test_run_get_viewable_finds_exactly_the_runs_of_run_list_viewable(scoped, activity, name):
    user = persona(scoped, name)
    found = []
    for run_id in Run.objects.order_by("pk").values_list("pk", flat=True):
        with contextlib.suppress(Run.DoesNotExist):
            found.append(run_get_viewable(user=user, run_id=run_id).pk)

    assert found == list(run_list_viewable(user=user).order_by("pk").values_list("pk", flat=True))


@pytest.mark.parametrize("name", PERSONAS[:-1])
def test_my_tenants_of_the_goodput_are_the_submittable_ones_with_finished_work(
    scoped, activity, name
):
    user = persona(scoped, name)
    since, until = goodput_window(days=7, today=timezone.localdate())

    found = [item.slug for item in goodput_of_my_tenants(user=user, since=since, until=until)]

    with_work = Run.objects.filter(attempts__accounting__isnull=False).values("tenant")
    expected = tenant_list_submittable(user=user).filter(pk__in=with_work).order_by("slug")
    assert found == list(expected.values_list("slug", flat=True))
