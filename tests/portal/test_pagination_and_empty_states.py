"""Every list page pages through its rows, and every list or report page with nothing to show
says what to do next.

For each list: more rows than a page holds → the first page shows exactly a page of them
and links to a next page, which shows the rest. With no rows → the empty state's heading
and its next step, never an empty table.
"""

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster
from images.access import image_list_browsable
from images.models import Image, Registry
from jobs.models import Attempt, AttemptState, ExperimentTemplate, Run
from jobs.services.submission import run_submit
from policy.models import ReplayReport
from telemetry.models import AttemptAccounting, UnmappedSamples
from tenants.models import AuditEvent, GpuFlavor, Notification, Quota, Tenant
from tests.conftest import DIGEST_A, World, experiment_input

pytestmark = pytest.mark.django_db

NEXT_LINK = re.compile(r'<a\b[^>]*\brel="next"[^>]*>')
HREF = re.compile(r'href="([^"]*)"')


def this_month() -> date:
    return timezone.now().astimezone(UTC).date().replace(day=1)


# --- making rows in bulk ------------------------------------------------------------------


def make_runs(world: World, count: int) -> None:
    """``count`` runs of one experiment of alice's (vision)."""
    first = run_submit(user=world.researcher_a, data=experiment_input(world))
    Run.objects.bulk_create(
        Run(
            experiment=first.experiment,
            tenant=first.tenant,
            flavor=first.flavor,
            gpus=first.gpus,
            submitted_by=first.submitted_by,
        )
        for _ in range(count - 1)
    )


def make_experiments(world: World, count: int) -> None:
    """``count`` experiments of alice's (vision), one run each."""
    for number in range(count):
        run_submit(user=world.researcher_a, data=experiment_input(world, name=f"exp-{number:02}"))


def make_templates(world: World, count: int) -> None:
    ExperimentTemplate.objects.bulk_create(
        ExperimentTemplate(tenant=world.vision, name=f"template-{number:02}")
        for number in range(count)
    )


def make_images(world: World, count: int) -> None:
    Image.objects.bulk_create(
        Image(
            repository=f"registry.example.org/ml/model-{number:02}",
            digest="sha256:" + f"{number:02}" * 32,
            status=Image.Status.APPROVED,
        )
        for number in range(count - image_list_browsable(user=world.researcher_a).count())
    )


def make_quotas(world: World, count: int) -> None:
    """Quotas of new tenants, one per flavor: ``count`` less the world's must be even."""
    tenants = Tenant.objects.bulk_create(
        Tenant(slug=f"tenant-{number:02}", name=f"Tenant {number:02}")
        for number in range((count - Quota.objects.count()) // 2)
    )
    Quota.objects.bulk_create(
        Quota(tenant=tenant, flavor=flavor, guaranteed_gpus=8)
        for tenant in tenants
        for flavor in (world.a100, world.h100)
    )


def make_notifications(world: World, count: int) -> None:
    Notification.objects.bulk_create(
        Notification(
            user=world.researcher_a,
            kind=Notification.Kind.BUDGET_80,
            message=f"Budget notice {number}",
        )
        for number in range(count)
    )


def make_audit_events(world: World, count: int) -> None:
    AuditEvent.objects.bulk_create(
        AuditEvent(actor=world.platform_admin, action="quota.update", target=f"quota {number}")
        for number in range(count)
    )


def make_flavors(world: World, count: int) -> None:
    GpuFlavor.objects.bulk_create(
        GpuFlavor(slug=f"mig-{number:02}", name=f"MIG slice {number:02}", memory_gb=10)
        for number in range(count - GpuFlavor.objects.count())
    )


def make_registries(world: World, count: int) -> None:
    Registry.objects.bulk_create(
        Registry(
            name=f"registry-{number:02}",
            url=f"https://registry-{number:02}.example.org",
            host=f"registry-{number:02}.example.org",
        )
        for number in range(count)
    )


def make_clusters(world: World, count: int) -> None:
    Cluster.objects.bulk_create(
        Cluster(name=f"cluster-{number:02}", backend=Cluster.Backend.SIMULATOR)
        for number in range(count - Cluster.objects.count())
    )


def make_unmapped(world: World, count: int) -> None:
    start = timezone.now().replace(second=0, microsecond=0)
    UnmappedSamples.objects.bulk_create(
        UnmappedSamples(minute=start - timedelta(minutes=number), source="dcgm:gpu-07", count=3)
        for number in range(count)
    )


def make_accounted_attempts(world: World, count: int) -> None:
    """``count`` accounted one-hour attempts of one run of vision, all in this month."""
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    start = datetime.combine(this_month(), datetime.min.time(), tzinfo=UTC) + timedelta(hours=1)
    attempts = Attempt.objects.bulk_create(
        Attempt(
            run=run,
            number=number + 1,
            cluster=world.cluster,
            state=AttemptState.SUCCEEDED,
            started_at=start,
            finished_at=start + timedelta(hours=1),
        )
        for number in range(count)
    )
    gpu_s = run.gpus * 3600
    AttemptAccounting.objects.bulk_create(
        AttemptAccounting(
            attempt=attempt,
            allocated_gpu_s=gpu_s,
            effective_gpu_s=gpu_s,
            lost_gpu_s=0,
            startup_gpu_s=0,
            checkpoint_gpu_s=0,
            idle_gpu_s=0,
            input_wait_gpu_s=0,
            comm_wait_gpu_s=0,
            activity_weighted_gpu_s=gpu_s,
            computed_at=timezone.now(),
        )
        for attempt in attempts
    )


def make_replay_reports(world: World, count: int) -> None:
    now = timezone.now()
    ReplayReport.objects.bulk_create(
        ReplayReport(
            requested_by=world.platform_admin,
            created_at=now - timedelta(minutes=number),
            window_start=now - timedelta(days=7),
            window_end=now,
            proposal={},
            submissions=1,
            estimate_s=0.01,
        )
        for number in range(count)
    )


# --- the list pages -----------------------------------------------------------------------


@dataclass(frozen=True)
class ListPage:
    persona: str
    url: Callable[[World], str]
    page_size: int
    rows: str  # the context variable holding the page's rows
    make: Callable[[World, int], None]


def experiment_url(world: World) -> str:
    experiment = Run.objects.filter(tenant=world.vision).values_list("experiment", flat=True)
    return reverse("jobs:experiment_detail", args=[experiment.first()])


def finance_runs_url(world: World) -> str:
    return reverse("finance:runs", args=["vision", this_month()])


LIST_PAGES = {
    "runs": ListPage("researcher_a", lambda w: reverse("jobs:run_list"), 25, "runs", make_runs),
    "runs of an experiment": ListPage("researcher_a", experiment_url, 25, "runs", make_runs),
    "experiments": ListPage(
        "researcher_a", lambda w: reverse("jobs:experiment_list"), 25, "rows", make_experiments
    ),
    "templates": ListPage(
        "platform_admin", lambda w: reverse("jobs:template_list"), 50, "templates", make_templates
    ),
    "images": ListPage(
        "researcher_a", lambda w: reverse("images:image_list"), 25, "images", make_images
    ),
    "quotas": ListPage(
        "platform_admin", lambda w: reverse("jobs:quota_list"), 50, "usages", make_quotas
    ),
    "notifications": ListPage(
        "researcher_a",
        lambda w: reverse("notifications:list"),
        25,
        "notifications",
        make_notifications,
    ),
    "audit log": ListPage(
        "platform_admin", lambda w: reverse("tenants:audit_list"), 50, "rows", make_audit_events
    ),
    "GPU flavors": ListPage(
        "platform_admin", lambda w: reverse("tenants:flavor_list"), 50, "flavors", make_flavors
    ),
    "registries": ListPage(
        "platform_admin", lambda w: reverse("images:registry_list"), 50, "rows", make_registries
    ),
    "clusters": ListPage(
        "platform_admin", lambda w: reverse("jobs:cluster_list"), 25, "rows", make_clusters
    ),
    "unmapped samples": ListPage(
        "platform_admin",
        lambda w: reverse("telemetry:unmapped_samples"),
        50,
        "rows",
        make_unmapped,
    ),
    "attempts behind a statement": ListPage(
        "finance", finance_runs_url, 50, "rows", make_accounted_attempts
    ),
    "what-if reports": ListPage(
        "platform_admin",
        lambda w: reverse("policy:report_list"),
        25,
        "reports",
        make_replay_reports,
    ),
}


def next_page_url(url: str, content: str) -> str:
    """The target of the page's rel="next" link, resolved against ``url``."""
    links = NEXT_LINK.findall(content)
    assert len(links) == 1, f"expected one next link on {url}, found {links}"
    target = html.unescape(HREF.search(links[0]).group(1))
    return url.split("?")[0] + target if target.startswith("?") else target


@pytest.mark.parametrize("name", LIST_PAGES)
def test_a_list_longer_than_a_page_is_split_into_pages(client, world, name):
    listing = LIST_PAGES[name]
    extra = 8
    listing.make(world, listing.page_size + extra)
    client.force_login(getattr(world, listing.persona))
    url = listing.url(world)

    first = client.get(url)
    assert first.status_code == 200
    assert len(first.context[listing.rows]) == listing.page_size
    second = client.get(next_page_url(url, first.content.decode()))

    assert second.status_code == 200
    assert len(second.context[listing.rows]) == extra
    assert NEXT_LINK.findall(second.content.decode()) == []
    assert 'rel="prev"' in second.content.decode()


# --- empty states -------------------------------------------------------------------------


def remove_world_rows(*models) -> Callable[[World], None]:
    def remove(world: World) -> None:
        for model in models:
            model.objects.all().delete()

    return remove


def keep(world: World) -> None:
    """The fixture world has none of these rows."""


def statement_url(world: World) -> str:
    return reverse("finance:statement", args=["vision", this_month()])


def goodput_url(world: World) -> str:
    return reverse("telemetry:tenant_goodput", args=["vision"])


# name: (persona, url, what to remove first, the heading, the next step it names)
EMPTY_PAGES = {
    "runs": (
        "researcher_a",
        lambda w: reverse("jobs:run_list"),
        keep,
        "No runs yet",
        "Submit an experiment</a> to start one.",
    ),
    "experiments": (
        "researcher_a",
        lambda w: reverse("jobs:experiment_list"),
        keep,
        "No experiments yet",
        "Submit an experiment</a> to start one.",
    ),
    "templates": (
        "platform_admin",
        lambda w: reverse("jobs:template_list"),
        keep,
        "No templates yet",
        "Create the first template</a>",
    ),
    "images": (
        "researcher_a",
        lambda w: reverse("images:image_list"),
        remove_world_rows(Image),
        "No approved images yet",
        "A platform admin approves the images your tenants may run.",
    ),
    "images, for a platform admin": (
        "platform_admin",
        lambda w: reverse("images:image_list"),
        remove_world_rows(Image),
        "No images yet",
        "Import one</a>",
    ),
    "quotas": (
        "researcher_a",
        lambda w: reverse("jobs:quota_list"),
        remove_world_rows(Quota),
        "No quotas",
        "A platform admin sets quotas.",
    ),
    "notifications": (
        "researcher_a",
        lambda w: reverse("notifications:list"),
        keep,
        "No notifications",
        "You are told here, and by e-mail",
    ),
    "audit log": (
        "platform_admin",
        lambda w: reverse("tenants:audit_list"),
        keep,
        "No changes recorded yet",
        "the change appears here: who, when, and each value before and after.",
    ),
    "registries": (
        "platform_admin",
        lambda w: reverse("images:registry_list"),
        keep,
        "No registries yet",
        "Register one</a> to import images from it.",
    ),
    "clusters": (
        "platform_admin",
        lambda w: reverse("jobs:cluster_list"),
        remove_world_rows(Cluster),
        "No clusters",
        "Add a cluster in the admin",
    ),
    "GPU flavors": (
        "platform_admin",
        lambda w: reverse("tenants:flavor_list"),
        remove_world_rows(Quota, Cluster, GpuFlavor),
        "No GPU flavors yet",
        "Create one</a> for each kind of GPU or MIG slice your clusters offer.",
    ),
    "unmapped samples": (
        "platform_admin",
        lambda w: reverse("telemetry:unmapped_samples"),
        keep,
        "No unmapped samples recorded yet.",
        "every sample was matched to an attempt.",
    ),
    "goodput": (
        "researcher_a",
        goodput_url,
        keep,
        "No finished attempts in the last 30 days",
        "Choose a longer period, or come back when runs have finished.",
    ),
    "finance statement": (
        "finance",
        statement_url,
        keep,
        "No GPU time in",
        "The statement counts attempts once they have ended",
    ),
    "attempts behind a statement": (
        "finance",
        finance_runs_url,
        keep,
        "No accounted attempts",
        "has accounted GPU time in",
    ),
    "what-if reports": (
        "platform_admin",
        lambda w: reverse("policy:report_list"),
        keep,
        "No reports yet",
        "Pick a past window and a proposal",
    ),
    "what-if reports shared": (
        "finance",
        lambda w: reverse("policy:report_list"),
        keep,
        "No reports yet",
        "A platform admin shares a report with you",
    ),
    "KPIs": (
        "platform_admin",
        lambda w: reverse("telemetry:platform_kpis"),
        keep,
        "No attempt ended unsuccessfully in this range",
        "No attempt started and no run or accounted attempt ended in this range.",
    ),
}


@pytest.mark.parametrize("name", EMPTY_PAGES)
def test_an_empty_page_says_what_to_do_next(client, world, name):
    persona, url, remove, heading, next_step = EMPTY_PAGES[name]
    remove(world)
    client.force_login(getattr(world, persona))

    response = client.get(url(world))

    content = response.content.decode()
    assert response.status_code == 200
    assert heading in content
    assert next_step in content
    assert 'rel="next"' not in content


def test_the_submit_form_tells_someone_without_a_tenant_whom_to_ask(client, world):
    outsider = User.objects.create_user("olga")
    client.force_login(outsider)

    content = client.get(reverse("jobs:run_submit")).content.decode()

    assert "You are not a member of any tenant" in content
    assert "Ask a tenant admin to add you, then come back here." in content
    assert DIGEST_A not in content
