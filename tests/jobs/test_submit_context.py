"""submit_context reads in one query what the ORM selectors it stands for read: the same
rows, field for field, for every user, tenant, project, image, flavor and quota case."""

import itertools

import pytest
from django.db.models import Model

from clusters.models import Cluster, ClusterFlavor
from images.access import image_list_usable
from images.models import Image
from jobs.selectors.refusals import flavor_node_limits
from jobs.selectors.submit_context import submit_context
from tenants.access import roles_forget, tenant_list_submittable
from tenants.models import GpuFlavor, Membership, Project, Quota, Tenant


def fields(instance: Model | None) -> dict | None:
    if instance is None:
        return None
    return {f.attname: getattr(instance, f.attname) for f in instance._meta.concrete_fields}


def expected(user, *, tenant, project, image, flavor) -> dict:
    """What the ORM selectors answer (the submit's reads before submit_context)."""
    found_tenant = tenant_list_submittable(user=user).filter(slug=tenant).first()
    found_project = found_image = found_quota = None
    if found_tenant is not None:
        found_project = found_tenant.projects.filter(slug=project).first()
        if image is not None:
            repository, digest = image
            found_image = (
                image_list_usable(tenant=found_tenant)
                .filter(repository=repository, digest=digest)
                .first()
            )
        found_quota = Quota.objects.filter(tenant=found_tenant, flavor__slug=flavor).first()
    return {
        "tenant": fields(found_tenant),
        "project": fields(found_project),
        "image": fields(found_image),
        "flavor": fields(GpuFlavor.objects.filter(slug=flavor).first()),
        "quota": fields(found_quota),
        "node_limits": flavor_node_limits().get(flavor),
    }


def answered(user, **asked) -> dict:
    context = submit_context(user=user, **asked)
    return {
        "tenant": fields(context.tenant),
        "project": fields(context.project),
        "image": fields(context.image),
        "flavor": fields(context.flavor),
        "quota": fields(context.quota),
        "node_limits": context.node_limits,
    }


@pytest.fixture
def cases(world):
    """The world, plus an inactive tenant the researcher belongs to, a pending image, a
    flavor no enabled cluster offers (its cluster is disabled), a flavor no cluster has at
    all, and a tenant with no quota of a flavor."""
    idle = Tenant.objects.create(slug="idle", name="Idle", active=False)
    Project.objects.create(tenant=idle, slug="detection", name="Detection")
    Membership.objects.create(user=world.researcher_a, tenant=idle, role="researcher")
    roles_forget(world.researcher_a)
    pending = Image.objects.create(
        repository="registry.example.org/ml/pending",
        digest="sha256:" + "c" * 64,
        status=Image.Status.PENDING,
    )
    v100 = GpuFlavor.objects.create(slug="v100", name="V100", memory_gb=32)
    off = Cluster.objects.create(name="off", backend=Cluster.Backend.SIMULATOR, enabled=False)
    ClusterFlavor.objects.create(cluster=off, flavor=v100, nodes=2, gpus_per_node=4, gpus=8)
    GpuFlavor.objects.create(slug="t4", name="T4", memory_gb=16)
    Quota.objects.create(tenant=world.vision, flavor=v100, guaranteed_gpus=4)
    Quota.objects.filter(tenant=world.nlp, flavor=world.h100).delete()
    images = [
        None,
        (world.image.repository, world.image.digest),
        (world.nlp_only_image.repository, world.nlp_only_image.digest),
        (world.blocked_image.repository, world.blocked_image.digest),
        (pending.repository, pending.digest),
        (world.image.repository, world.nlp_only_image.digest),  # another image's digest
        ("registry.example.org/unknown", world.image.digest),
    ]
    return {
        "users": [
            world.researcher_a,
            world.researcher_b,
            world.tenant_admin_a,
            world.finance,
            world.platform_admin,
        ],
        "tenants": ["vision", "nlp", "idle", "nowhere", ""],
        "projects": ["detection", "llm", "nowhere"],
        "images": images,
        "flavors": ["a100-80gb", "h100-80gb", "v100", "t4", "nowhere"],
    }


def test_submit_context_reads_what_the_selectors_read(cases):
    for user, tenant, project, image, flavor in itertools.product(
        cases["users"], cases["tenants"], cases["projects"], cases["images"], cases["flavors"]
    ):
        asked = {"tenant": tenant, "project": project, "image": image, "flavor": flavor}
        assert answered(user, **asked) == expected(user, **asked), (user.username, asked)


def test_submit_context_is_one_query(world, django_assert_num_queries):
    user = world.researcher_a
    submit_context(user=user, tenant="vision", project="detection", flavor="a100-80gb")  # roles
    with django_assert_num_queries(1):
        context = submit_context(
            user=user,
            tenant="vision",
            project="detection",
            flavor="a100-80gb",
            image=(world.image.repository, world.image.digest),
        )
    assert context.tenant == world.vision
    assert context.project == world.vision_project
    assert context.project.tenant is context.tenant  # no query to reach it
    assert context.image == world.image
    assert context.flavor == world.a100
    assert context.quota == Quota.objects.get(tenant=world.vision, flavor=world.a100)
    assert context.node_limits == (4, 8)


def test_submit_context_compares_values_as_text_like_the_orm(world):
    """A value that is not a string is compared as the ORM compares it with a text column."""
    context = submit_context(user=world.researcher_a, tenant=None, project=1, flavor=100)  # type: ignore[arg-type]
    assert context.tenant is None
    assert context.flavor is None
