"""Who may do what, for every URL of Gantry: one table, every URL pattern, six personas.

``EXPECTED`` is the authorization matrix. Each row is a URL pattern (by its name) and an
HTTP method, each column a persona, each cell the status that persona gets when it asks for
that URL about objects of tenant vision (tenant A): alice's run, its experiment and attempt,
vision's slug, quota, idle policy and statement, a template of vision, an image allow-listed
for vision only. The rules it encodes:

- Whatever a tenant owns answers 404 to outsiders, exactly as if it did not exist: bob
  (tenant nlp) never gets a 403 about vision's objects. Platform pages answer 404 to
  everybody who may not use them, so their existence is no more visible.
- Somebody who may read an object but not change it gets 403 on the change: the object is
  no secret to them, so the 403 leaks nothing (finance cancelling a run it can read).
- A tenant named in submitted input (the submit form, its preview, the API, a spec) that the
  user may not submit to is a validation error (400), worded exactly as for a tenant that
  does not exist.
- Anonymous browsers are sent to the login page (302); the API answers 401.
- A write that is refused changes nothing: every denied POST/PUT/PATCH/DELETE is checked
  against a snapshot of every table (row count and a hash of every row).
- Django admin (the ``admin:`` namespace, ~120 generated patterns, one rule row): staff only.
  Everybody else is sent to the admin login page, for every method; inside, Django's model
  permissions decide (the platform admin here holds "view tenant" only, so it reads the
  tenant pages and may not post a change). Checked on the index, a changelist and a change
  page.
- The OpenAPI schema and its docs page are public: they describe the API, not any data.

A URL pattern without a row fails ``test_every_url_pattern_has_a_row``: a new URL cannot be
added without deciding who may use it. Methods a view does not accept must answer 405
(``test_methods_without_a_row_are_refused``), so the table lists every method a view takes.

Every request runs in a savepoint that is rolled back, so an allowed write (alice cancelling
her run) does not change the world the next cell sees.
"""

import copy
import json
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from decimal import Decimal
from urllib.parse import urlencode

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.db import connection, transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from finance.services import rate_card_add
from images.models import Image
from images.services.registries import registry_create
from jobs.models import Attempt, Experiment, ExperimentTemplate, Run
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit, attempt_token_issue
from jobs.services.backend_sync import cluster_sync
from jobs.services.specs import experiment_spec
from jobs.services.submission import experiment_input_of, run_submit
from jobs.services.templates import template_save
from jobs.services.workspaces import WorkspaceInput, workspace_launch
from policy.selectors import proposal_editor_lines
from policy.services.reports import replay_report_create
from tenants.invitations import membership_invite
from tenants.models import Notification
from tenants.services.notifications import notification_create
from tenants.services.tokens import api_token_create
from tests.conftest import COMMIT, PASSWORD, experiment_input
from tests.registry_support import free_port

# A node of the world's simulated cluster (its inventory names them so).
NODE = "sim-1-a100-80gb-00"
ANON, ALICE, BOB, TARA, FIONA, PAUL = PERSONAS = (
    "anonymous",
    "alice",
    "bob",
    "tara",
    "fiona",
    "paul",
)
ADMIN_RULE = "admin:*"  # one row for every pattern of the admin: namespace
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ANONYMOUS_WRITES = frozenset({"login", "api:token-create"})  # writes meant for anonymous users

# fmt: off
EXPECTED: dict[tuple[str, str], tuple[int, int, int, int, int, int]] = {
    # URL pattern name, method                 anon alice  bob tara fiona paul
    ("healthz", "GET"):                         (200, 200, 200, 200, 200, 200),
    ("readyz", "GET"):                          (200, 200, 200, 200, 200, 200),
    ("login", "GET"):                           (200, 200, 200, 200, 200, 200),
    ("login", "POST"):                          (302, 302, 302, 302, 302, 302),
    ("login", "PUT"):                           (200, 200, 200, 200, 200, 200),
    ("logout", "POST"):                         (302, 302, 302, 302, 302, 302),
    # the home page: a section for each role the person holds, none for another's
    ("home", "GET"):                            (302, 200, 200, 200, 200, 200),
    # the navigation's Members: the tenant admin's tenant's members page, nobody else's
    ("members", "GET"):                         (302, 404, 404, 302, 404, 404),
    # the person's own account: alice's token is nobody else's to revoke
    ("account", "GET"):                         (302, 200, 200, 200, 200, 200),
    ("password_change", "GET"):                 (302, 200, 200, 200, 200, 200),
    ("password_change", "POST"):                (302, 302, 302, 302, 302, 302),
    ("password_change", "PUT"):                 (302, 200, 200, 200, 200, 200),
    ("api_token_create", "POST"):               (302, 200, 200, 200, 200, 200),
    ("api_token_revoke", "POST"):               (302, 302, 404, 404, 404, 404),
    # single sign-on is off unless GANTRY_OIDC_ISSUER is set
    ("oidc_authentication_init", "GET"):        (404, 404, 404, 404, 404, 404),
    ("oidc_authentication_callback", "GET"):    (404, 404, 404, 404, 404, 404),
    ("api-schema", "GET"):                      (200, 200, 200, 200, 200, 200),
    # Gantry's own metrics: for a bearer token only, and none is configured here
    ("metrics", "GET"):                         (404, 404, 404, 404, 404, 404),
    ("api-docs", "GET"):                        (200, 200, 200, 200, 200, 200),
    (ADMIN_RULE, "GET"):                        (302, 302, 302, 302, 302, 200),
    (ADMIN_RULE, "POST"):                       (302, 302, 302, 302, 302, 403),
    # REST API /api/v1/: its index of resources, signed in like the rest
    ("api:index", "GET"):                       (401, 200, 200, 200, 200, 200),
    ("api:token-create", "POST"):               (201, 201, 201, 201, 201, 201),
    ("api:token-revoke", "DELETE"):             (401, 204, 204, 204, 204, 204),
    ("api:image-list", "GET"):                  (401, 200, 200, 200, 200, 200),
    # only a job's attempt token, never a person's session or token (see the 405 sweep)
    ("api:attempt-report", "POST"):             (401, 401, 401, 401, 401, 401),
    ("api:attempt-rank-report", "POST"):        (401, 401, 401, 401, 401, 401),
    ("api:attempt-events", "POST"):             (401, 401, 401, 401, 401, 401),
    ("api:attempt-workspace-address", "POST"):  (401, 401, 401, 401, 401, 401),
    ("api:quota-list", "GET"):                  (401, 200, 200, 200, 200, 200),
    ("api:spec-submit", "POST"):                (401, 201, 400, 201, 400, 400),
    # the submit's preview: the same refusals, nothing created
    ("api:run-simulate", "POST"):               (401, 200, 400, 200, 400, 400),
    ("api:spec-schema", "GET"):                 (401, 200, 200, 200, 200, 200),
    ("api:experiment-spec", "GET"):             (401, 200, 404, 200, 200, 200),
    ("api:template-list", "GET"):               (401, 200, 200, 200, 200, 200),
    ("api:run-list", "GET"):                    (401, 200, 200, 200, 200, 200),
    ("api:run-list", "POST"):                   (401, 201, 400, 201, 400, 400),
    ("api:run-detail", "GET"):                  (401, 200, 404, 200, 200, 200),
    ("api:run-verdicts", "GET"):                (401, 200, 404, 200, 200, 200),
    ("api:run-cancel", "POST"):                 (401, 202, 404, 202, 403, 202),
    # restarting without one of its nodes: whoever may cancel the run
    ("api:run-restart-excluding", "POST"):      (401, 202, 404, 202, 403, 202),
    ("api:run-logs", "GET"):                    (401, 200, 404, 200, 200, 200),
    # workspaces: their owner, their tenant's admins, platform admins; extending spends the
    # tenant's hours (owner, tenant admin), stopping is a cancel (platform admins too)
    ("api:workspace-list", "GET"):              (401, 200, 200, 200, 200, 200),
    ("api:workspace-list", "POST"):             (401, 201, 400, 201, 400, 400),
    ("api:workspace-detail", "GET"):            (401, 200, 404, 200, 404, 200),
    ("api:workspace-extend", "POST"):           (401, 200, 404, 200, 404, 403),
    ("api:workspace-stop", "POST"):             (401, 202, 404, 202, 404, 202),
    # suspending and resuming: its owner only (a queued workspace is neither: 409)
    ("api:workspace-suspend", "POST"):          (401, 409, 404, 403, 404, 403),
    ("api:workspace-resume", "POST"):           (401, 409, 404, 403, 404, 403),
    ("api:experiment-list", "GET"):             (401, 200, 200, 200, 200, 200),
    ("api:experiment-detail", "GET"):           (401, 200, 404, 200, 200, 200),
    ("api:experiment-rerun", "POST"):           (401, 201, 404, 201, 403, 403),
    # notifications: only ever the user's own
    ("notifications:list", "GET"):              (302, 200, 200, 200, 200, 200),
    ("notifications:read_all", "POST"):         (302, 302, 302, 302, 302, 302),
    # invitations: only the invitee (fiona, by her username) answers hers
    ("invitations:list", "GET"):                (302, 200, 200, 200, 200, 200),
    ("invitations:accept", "POST"):             (302, 404, 404, 404, 302, 404),
    ("invitations:decline", "POST"):            (302, 404, 404, 404, 302, 404),
    # image catalog: researchers read what they may run, platform admins manage it
    ("images:image_list", "GET"):               (302, 200, 200, 200, 200, 200),
    ("images:image_import", "GET"):             (302, 404, 404, 404, 404, 200),
    ("images:image_import", "POST"):            (302, 404, 404, 404, 404, 400),
    ("images:image_detail", "GET"):             (302, 200, 404, 200, 404, 200),
    ("images:image_status", "POST"):            (302, 404, 404, 404, 404, 302),
    ("images:image_visibility", "POST"):        (302, 404, 404, 404, 404, 302),
    ("images:image_recheck", "POST"):           (302, 404, 404, 404, 404, 302),
    ("images:registry_list", "GET"):            (302, 404, 404, 404, 404, 200),
    ("images:registry_create", "GET"):          (302, 404, 404, 404, 404, 200),
    ("images:registry_create", "POST"):         (302, 404, 404, 404, 404, 302),
    ("images:registry_edit", "GET"):            (302, 404, 404, 404, 404, 200),
    ("images:registry_edit", "POST"):           (302, 404, 404, 404, 404, 302),
    ("images:registry_test", "POST"):           (302, 404, 404, 404, 404, 302),
    # finance: finance and platform admins read all tenants, tenant admins their own
    ("finance:index", "GET"):                   (302, 404, 404, 302, 302, 302),
    ("finance:rate_cards", "GET"):              (302, 404, 404, 200, 200, 200),
    ("finance:rate_cards", "POST"):             (302, 404, 404, 403, 302, 302),
    ("finance:export_csv", "GET"):              (302, 404, 404, 200, 200, 200),
    ("finance:export_xlsx", "GET"):             (302, 404, 404, 200, 200, 200),
    ("finance:statement", "GET"):               (302, 404, 404, 200, 200, 200),
    ("finance:runs", "GET"):                    (302, 404, 404, 200, 200, 200),
    ("finance:rate_card_credit_policy", "POST"): (302, 404, 404, 403, 302, 302),
    # telemetry
    ("telemetry:run_telemetry", "GET"):         (302, 200, 404, 200, 200, 200),
    ("telemetry:goodput", "GET"):               (302, 302, 404, 302, 302, 302),
    ("telemetry:tenant_goodput", "GET"):        (302, 200, 404, 200, 200, 200),
    ("telemetry:unmapped_samples", "GET"):      (302, 404, 404, 404, 404, 200),
    ("telemetry:platform_kpis", "GET"):         (302, 404, 404, 404, 200, 200),
    ("telemetry:node_health", "GET"):           (302, 404, 404, 404, 404, 200),
    ("telemetry:node_detail", "GET"):           (302, 404, 404, 404, 404, 200),
    # Sent without a note: refused before the clusters app is asked (allowed acts: tests/telemetry)
    ("telemetry:node_quarantine", "POST"):      (302, 404, 404, 404, 404, 400),
    ("telemetry:node_release", "POST"):         (302, 404, 404, 404, 404, 400),
    ("telemetry:node_health_check", "POST"):    (302, 404, 404, 404, 404, 302),
    # tenants: flavors (platform), the audit log, a tenant's idle-GPU policy
    ("tenants:flavor_list", "GET"):             (302, 404, 404, 404, 404, 200),
    ("tenants:flavor_create", "GET"):           (302, 404, 404, 404, 404, 200),
    ("tenants:flavor_create", "POST"):          (302, 404, 404, 404, 404, 302),
    ("tenants:flavor_edit", "GET"):             (302, 404, 404, 404, 404, 200),
    ("tenants:flavor_edit", "POST"):            (302, 404, 404, 404, 404, 302),
    ("tenants:audit_list", "GET"):              (302, 404, 404, 200, 404, 200),
    ("tenants:idle_policy", "GET"):             (302, 200, 404, 200, 200, 200),
    ("tenants:idle_policy", "POST"):            (302, 403, 404, 302, 403, 302),
    ("tenants:workspace_policy", "GET"):        (302, 200, 404, 200, 200, 200),
    ("tenants:workspace_policy", "POST"):       (302, 403, 404, 302, 403, 302),
    # what-if reports (policy): platform admins ask and act; finance and the admins of the
    # tenants a shared report concerns (vision here) read it, and get 403 on an act
    ("policy:report_list", "GET"):              (302, 404, 404, 200, 200, 200),
    ("policy:report_new", "GET"):               (302, 404, 404, 404, 404, 200),
    ("policy:report_new", "POST"):              (302, 404, 404, 404, 404, 302),
    ("policy:report_detail", "GET"):            (302, 404, 404, 200, 200, 200),
    ("policy:report_cancel", "POST"):           (302, 404, 404, 403, 403, 302),
    ("policy:report_rerun", "POST"):            (302, 404, 404, 403, 403, 302),
    ("policy:report_share", "POST"):            (302, 404, 404, 403, 403, 302),
    # applying: the report is still queued, so the platform admin's confirmation is refused
    ("policy:report_apply", "GET"):             (302, 404, 404, 403, 403, 200),
    ("policy:report_apply", "POST"):            (302, 404, 404, 403, 403, 400),
    # the API's list answers everybody, with the reports they may read (none for researchers)
    ("api:replay-list", "GET"):                 (401, 200, 200, 200, 200, 200),
    ("api:replay-list", "POST"):                (401, 404, 404, 404, 404, 201),
    ("api:replay-detail", "GET"):               (401, 404, 404, 200, 200, 200),
    ("api:replay-cancel", "POST"):              (401, 404, 404, 403, 403, 202),
    # jobs: runs, experiments, quotas, clusters, templates
    ("jobs:run_list", "GET"):                   (302, 200, 200, 200, 200, 200),
    ("jobs:run_submit", "GET"):                 (302, 200, 404, 200, 200, 200),
    ("jobs:run_submit", "POST"):                (302, 302, 400, 302, 400, 400),
    ("jobs:run_preview", "GET"):                (302, 200, 400, 200, 400, 400),
    ("jobs:run_detail", "GET"):                 (302, 200, 404, 200, 200, 200),
    ("jobs:run_live", "GET"):                 (302, 200, 404, 200, 200, 200),
    ("jobs:run_log_download", "GET"):           (302, 200, 404, 200, 200, 200),
    ("jobs:run_cancel", "POST"):                (302, 302, 404, 302, 403, 302),
    ("jobs:run_restart_excluding", "POST"):     (302, 302, 404, 302, 403, 302),
    ("jobs:workspace_list", "GET"):             (302, 200, 200, 200, 200, 200),
    ("jobs:workspace_launch", "GET"):           (302, 200, 200, 200, 404, 404),
    ("jobs:workspace_launch", "POST"):          (302, 302, 400, 302, 404, 404),
    ("jobs:workspace_detail", "GET"):           (302, 200, 404, 200, 404, 200),
    ("jobs:workspace_extend", "POST"):          (302, 302, 404, 302, 404, 403),
    ("jobs:workspace_stop", "POST"):            (302, 302, 404, 302, 404, 302),
    ("jobs:workspace_suspend", "POST"):         (302, 302, 404, 403, 404, 403),
    ("jobs:workspace_resume", "POST"):          (302, 302, 404, 403, 404, 403),
    # the experiments list in its compare mode: picking the other side for vision's experiment
    ("jobs:experiment_list", "GET"):            (302, 200, 404, 200, 200, 200),
    ("jobs:experiment_detail", "GET"):          (302, 200, 404, 200, 200, 200),
    ("jobs:experiment_rerun", "POST"):          (302, 302, 404, 302, 403, 403),
    ("jobs:experiment_diff", "GET"):            (302, 200, 404, 200, 200, 200),
    ("jobs:experiment_spec", "GET"):            (302, 200, 404, 200, 200, 200),
    ("jobs:quota_list", "GET"):                 (302, 200, 200, 200, 200, 200),
    ("jobs:tenant_members", "GET"):             (302, 403, 404, 200, 403, 200),
    ("jobs:member_add", "POST"):                (302, 403, 404, 302, 403, 302),
    ("jobs:member_role", "POST"):               (302, 403, 404, 302, 403, 302),
    ("jobs:member_remove", "POST"):             (302, 403, 404, 302, 403, 302),
    ("jobs:invitation_revoke", "POST"):         (302, 403, 404, 302, 403, 302),
    ("jobs:quota_edit", "GET"):                 (302, 404, 404, 404, 404, 200),
    ("jobs:quota_edit", "POST"):                (302, 404, 404, 404, 404, 302),
    ("jobs:cluster_list", "GET"):               (302, 404, 404, 404, 404, 200),
    # the node map: members, finance and platform admins; other tenants' runs anonymised
    ("jobs:cluster_nodes", "GET"):              (302, 200, 200, 200, 200, 200),
    ("jobs:cluster_capacity", "GET"):           (302, 404, 404, 404, 404, 200),
    ("jobs:cluster_capacity", "POST"):          (302, 404, 404, 404, 404, 302),
    ("jobs:cluster_test", "POST"):              (302, 404, 404, 404, 404, 302),
    ("jobs:template_list", "GET"):              (302, 404, 404, 200, 404, 200),
    ("jobs:template_create", "GET"):            (302, 404, 404, 200, 404, 200),
    ("jobs:template_create", "POST"):           (302, 404, 404, 302, 404, 302),
    ("jobs:template_edit", "GET"):              (302, 404, 404, 200, 404, 200),
    ("jobs:template_edit", "POST"):             (302, 404, 404, 302, 404, 302),
    ("jobs:template_delete", "POST"):           (302, 404, 404, 302, 404, 302),
}
# fmt: on

EXPERIMENT_NAME = "matrix-vision-experiment"
TEMPLATE_NAME = "matrix-vision-template"
VISION_IMAGE = "registry.example.org/vision/secret-detector"
NOTIFICATION = "80 % of the a100-80gb budget of vision is used."
# What researchers of the other tenant must never find in a page they may open.
VISION_MARKERS = ("Vision Lab", EXPERIMENT_NAME, TEMPLATE_NAME, VISION_IMAGE, NOTIFICATION)
NLP_MARKERS = ("NLP Group", "registry.example.org/nlp/megatron")
LEAK_MARKERS = {ALICE: NLP_MARKERS, TARA: NLP_MARKERS, BOB: VISION_MARKERS}

# Columns a request may touch without changing anything that matters: the session store
# (a login), and when a user last logged in or a token was last used.
SNAPSHOT_SKIPPED_TABLES = frozenset({"django_session"})
ROWS_DIGEST = "md5(coalesce(string_agg(r::text, '|' ORDER BY r::text), ''))"
SNAPSHOT_SKIPPED_COLUMNS = frozenset(
    {("auth_user", "last_login"), ("tenants_apitoken", "last_used_at")}
)


def workspace_input(image: str) -> WorkspaceInput:
    return WorkspaceInput(
        tenant="vision",
        project="detection",
        image=image,
        flavor="a100-80gb",
        gpus=1,
        name="matrix-workspace",
        hours=2,
    )


@dataclass
class Objects:
    """Tenant A's objects the requests are about, and the personas' credentials."""

    run: Run
    experiment: Experiment
    attempt: Attempt
    workspace: Run  # alice's, queued
    template: ExperimentTemplate
    image: Image
    month: date
    users: dict
    tokens: dict[str, str]  # persona -> the secret of an API token of theirs
    alice_token_id: int
    invitation_id: int  # vision's invitation of fiona
    rate_card_id: int
    replay_id: int  # a what-if report of the last hour, shared: it concerns vision


@dataclass(frozen=True)
class Call:
    path: str
    data: dict | None = None
    api: bool = False  # a JSON body


@pytest.fixture
def objects(world) -> Objects:
    alice = world.researcher_a
    run = run_submit(user=alice, data=experiment_input(world, name=EXPERIMENT_NAME))
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)  # placed: the run is RUNNING
    template = template_save(
        actor=world.tenant_admin_a,
        tenant=world.vision,
        name=TEMPLATE_NAME,
        description="",
        values={"resources": {"flavor": "a100-80gb", "gpus_per_node": 1}},
        locked=[],
        ranges={},
    )
    image = Image.objects.create(
        repository=VISION_IMAGE,
        digest="sha256:" + "d" * 64,
        tag="1.0",
        status=Image.Status.APPROVED,
        visible_to_all=False,
    )
    image.allowed_tenants.add(world.vision)
    registry_create(  # nobody listens there: testing the connection fails at once
        name="matrix", url=f"http://127.0.0.1:{free_port()}", actor=world.platform_admin
    )
    notification_create(
        user=alice,
        tenant=world.vision,
        kind=Notification.Kind.BUDGET_80,
        message=NOTIFICATION,
        now=timezone.now(),
    )
    # The platform admin is staff and may read tenants in Django admin, nothing more.
    world.platform_admin.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    users = {
        ALICE: alice,
        BOB: world.researcher_b,
        TARA: world.tenant_admin_a,
        FIONA: world.finance,
        PAUL: world.platform_admin,
    }
    run.refresh_from_db()
    workspace = workspace_launch(user=alice, data=workspace_input(world.image.reference))
    tokens = {persona: api_token_create(user=user) for persona, user in users.items()}
    replay = replay_report_create(
        actor=world.platform_admin,
        window_start=timezone.now() - timedelta(hours=1),
        window_end=timezone.now(),
        proposal={},
        share=True,
    )
    return Objects(
        run=run,
        experiment=run.experiment,
        attempt=attempt,
        workspace=workspace,
        template=template,
        image=image,
        month=timezone.now().date().replace(day=1),
        users=users,
        tokens={persona: secret for persona, (_, secret) in tokens.items()},
        alice_token_id=tokens[ALICE][0].pk,
        invitation_id=membership_invite(
            tenant=world.vision,
            identifier="fiona",
            role="researcher",
            actor=world.tenant_admin_a,
            now=timezone.now(),
        ).pk,
        rate_card_id=rate_card_add(
            flavor=world.a100,
            price_per_gpu_hour=Decimal("2.00"),
            currency="EUR",
            valid_from=date(2020, 1, 1),
            actor=world.finance,
        ).pk,
        replay_id=replay.pk,
    )


def paths(objects: Objects) -> dict[str, str]:
    """One URL per pattern name, about tenant A's objects."""
    run_id, experiment_id = objects.run.pk, objects.experiment.pk
    workspace_id = objects.workspace.pk
    alice_id = objects.users[ALICE].pk
    vision_month = ["vision", objects.month]
    today = timezone.now().date()
    export = urlencode({"tenant": "vision", "from": objects.month, "to": today})
    preview = urlencode({"tenant": "vision", "flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 2})
    return {
        "home": reverse("home"),
        "members": reverse("members"),
        "healthz": reverse("healthz"),
        "readyz": reverse("readyz"),
        "login": reverse("login"),
        "logout": reverse("logout"),
        "account": reverse("account"),
        "password_change": reverse("password_change"),
        "api_token_create": reverse("api_token_create"),
        "api_token_revoke": reverse("api_token_revoke", args=[objects.alice_token_id]),
        "oidc_authentication_init": reverse("oidc_authentication_init"),
        "oidc_authentication_callback": reverse("oidc_authentication_callback"),
        "api-schema": reverse("api-schema"),
        "metrics": reverse("metrics"),
        "api-docs": reverse("api-docs"),
        "api:index": reverse("api:index"),
        "api:token-create": reverse("api:token-create"),
        "api:token-revoke": reverse("api:token-revoke"),
        "api:image-list": reverse("api:image-list"),
        "api:attempt-report": reverse("api:attempt-report"),
        "api:attempt-rank-report": reverse("api:attempt-rank-report"),
        "api:attempt-events": reverse("api:attempt-events"),
        "api:attempt-workspace-address": reverse("api:attempt-workspace-address"),
        "api:quota-list": f"{reverse('api:quota-list')}?tenant=vision",
        "api:spec-submit": reverse("api:spec-submit"),
        "api:run-simulate": reverse("api:run-simulate"),
        "api:spec-schema": reverse("api:spec-schema"),
        "api:experiment-spec": reverse("api:experiment-spec", args=[experiment_id]),
        "api:template-list": reverse("api:template-list"),
        "api:run-list": f"{reverse('api:run-list')}?tenant=vision",
        "api:run-detail": reverse("api:run-detail", args=[run_id]),
        "api:run-verdicts": reverse("api:run-verdicts", args=[run_id]),
        "api:run-cancel": reverse("api:run-cancel", args=[run_id]),
        "api:run-restart-excluding": reverse("api:run-restart-excluding", args=[run_id]),
        "api:run-logs": reverse("api:run-logs", args=[run_id]),
        "api:workspace-list": reverse("api:workspace-list"),
        "api:workspace-detail": reverse("api:workspace-detail", args=[workspace_id]),
        "api:workspace-extend": reverse("api:workspace-extend", args=[workspace_id]),
        "api:workspace-stop": reverse("api:workspace-stop", args=[workspace_id]),
        "api:workspace-suspend": reverse("api:workspace-suspend", args=[workspace_id]),
        "api:workspace-resume": reverse("api:workspace-resume", args=[workspace_id]),
        "api:experiment-list": f"{reverse('api:experiment-list')}?tenant=vision",
        "api:experiment-detail": reverse("api:experiment-detail", args=[experiment_id]),
        "api:experiment-rerun": reverse("api:experiment-rerun", args=[experiment_id]),
        "notifications:list": reverse("notifications:list"),
        "notifications:read_all": reverse("notifications:read_all"),
        "invitations:list": reverse("invitations:list"),
        "invitations:accept": reverse("invitations:accept", args=[objects.invitation_id]),
        "invitations:decline": reverse("invitations:decline", args=[objects.invitation_id]),
        "images:image_list": reverse("images:image_list"),
        "images:image_import": reverse("images:image_import"),
        "images:image_detail": reverse("images:image_detail", args=[objects.image.pk]),
        "images:image_status": reverse("images:image_status", args=[objects.image.pk]),
        "images:image_visibility": reverse("images:image_visibility", args=[objects.image.pk]),
        "images:image_recheck": reverse("images:image_recheck", args=[objects.image.pk]),
        "images:registry_list": reverse("images:registry_list"),
        "images:registry_create": reverse("images:registry_create"),
        "images:registry_edit": reverse("images:registry_edit", args=["matrix"]),
        "images:registry_test": reverse("images:registry_test", args=["matrix"]),
        "finance:index": f"{reverse('finance:index')}?tenant=vision&month={objects.month:%Y-%m}",
        "finance:rate_cards": reverse("finance:rate_cards"),
        "finance:export_csv": f"{reverse('finance:export_csv')}?{export}",
        "finance:export_xlsx": f"{reverse('finance:export_xlsx')}?{export}",
        "finance:statement": reverse("finance:statement", args=vision_month),
        "finance:runs": reverse("finance:runs", args=vision_month),
        "finance:rate_card_credit_policy": reverse(
            "finance:rate_card_credit_policy", args=[objects.rate_card_id]
        ),
        "telemetry:run_telemetry": reverse("telemetry:run_telemetry", args=[run_id]),
        "telemetry:goodput": f"{reverse('telemetry:goodput')}?tenant=vision",
        "telemetry:tenant_goodput": reverse("telemetry:tenant_goodput", args=["vision"]),
        "telemetry:unmapped_samples": reverse("telemetry:unmapped_samples"),
        "telemetry:platform_kpis": reverse("telemetry:platform_kpis"),
        "telemetry:node_health": reverse("telemetry:node_health"),
        "telemetry:node_detail": reverse("telemetry:node_detail", args=["sim-1", NODE]),
        "telemetry:node_quarantine": reverse("telemetry:node_quarantine", args=["sim-1", NODE]),
        "telemetry:node_release": reverse("telemetry:node_release", args=["sim-1", NODE]),
        "telemetry:node_health_check": reverse("telemetry:node_health_check", args=["sim-1", NODE]),
        "tenants:flavor_list": reverse("tenants:flavor_list"),
        "tenants:flavor_create": reverse("tenants:flavor_create"),
        "tenants:flavor_edit": reverse("tenants:flavor_edit", args=["a100-80gb"]),
        "tenants:audit_list": f"{reverse('tenants:audit_list')}?tenant=vision",
        "tenants:idle_policy": reverse("tenants:idle_policy", args=["vision"]),
        "tenants:workspace_policy": reverse("tenants:workspace_policy", args=["vision"]),
        "policy:report_list": reverse("policy:report_list"),
        "policy:report_new": reverse("policy:report_new"),
        **{
            f"policy:{name}": reverse(f"policy:{name}", args=[objects.replay_id])
            for name in ("report_detail", "report_cancel", "report_rerun", "report_share")
        },
        "policy:report_apply": reverse("policy:report_apply", args=[objects.replay_id]),
        "api:replay-list": reverse("api:replay-list"),
        "api:replay-detail": reverse("api:replay-detail", args=[objects.replay_id]),
        "api:replay-cancel": reverse("api:replay-cancel", args=[objects.replay_id]),
        "jobs:run_list": f"{reverse('jobs:run_list')}?tenant=vision",
        "jobs:run_submit": f"{reverse('jobs:run_submit')}?from={experiment_id}",
        "jobs:run_preview": f"{reverse('jobs:run_preview')}?{preview}",
        "jobs:run_detail": reverse("jobs:run_detail", args=[run_id]),
        "jobs:run_live": reverse("jobs:run_live", args=[run_id]),
        "jobs:run_log_download": reverse("jobs:run_log_download", args=[run_id]),
        "jobs:run_cancel": reverse("jobs:run_cancel", args=[run_id]),
        "jobs:run_restart_excluding": reverse("jobs:run_restart_excluding", args=[run_id]),
        "jobs:workspace_list": reverse("jobs:workspace_list"),
        "jobs:workspace_launch": reverse("jobs:workspace_launch"),
        "jobs:workspace_detail": reverse("jobs:workspace_detail", args=[workspace_id]),
        "jobs:workspace_extend": reverse("jobs:workspace_extend", args=[workspace_id]),
        "jobs:workspace_stop": reverse("jobs:workspace_stop", args=[workspace_id]),
        "jobs:workspace_suspend": reverse("jobs:workspace_suspend", args=[workspace_id]),
        "jobs:workspace_resume": reverse("jobs:workspace_resume", args=[workspace_id]),
        "jobs:experiment_list": f"{reverse('jobs:experiment_list')}?compare={experiment_id}",
        "jobs:experiment_detail": reverse("jobs:experiment_detail", args=[experiment_id]),
        "jobs:experiment_rerun": reverse("jobs:experiment_rerun", args=[experiment_id]),
        "jobs:experiment_diff": (
            f"{reverse('jobs:experiment_diff')}?a={experiment_id}&b={experiment_id}"
        ),
        "jobs:experiment_spec": reverse("jobs:experiment_spec", args=[experiment_id]),
        "jobs:quota_list": f"{reverse('jobs:quota_list')}?tenant=vision",
        "jobs:tenant_members": reverse("jobs:tenant_members", args=["vision"]),
        "jobs:member_add": reverse("jobs:member_add", args=["vision"]),
        "jobs:member_role": reverse("jobs:member_role", args=["vision", alice_id]),
        "jobs:member_remove": reverse("jobs:member_remove", args=["vision", alice_id]),
        "jobs:invitation_revoke": reverse(
            "jobs:invitation_revoke", args=["vision", objects.invitation_id]
        ),
        "jobs:quota_edit": f"{reverse('jobs:quota_edit')}?tenant=vision&flavor=a100-80gb",
        "jobs:cluster_list": reverse("jobs:cluster_list"),
        "jobs:cluster_nodes": reverse("jobs:cluster_nodes"),
        "jobs:cluster_capacity": reverse("jobs:cluster_capacity", args=["sim-1"]),
        "jobs:cluster_test": reverse("jobs:cluster_test", args=["sim-1"]),
        "jobs:template_list": reverse("jobs:template_list"),
        "jobs:template_create": reverse("jobs:template_create"),
        "jobs:template_edit": reverse("jobs:template_edit", args=[objects.template.pk]),
        "jobs:template_delete": reverse("jobs:template_delete", args=[objects.template.pk]),
    }


def admin_paths(objects: Objects, method: str) -> list[str]:
    """The sample of the admin: namespace: the index, a changelist and a change page are
    read; a change is posted to the change page."""
    change = reverse("admin:tenants_tenant_change", args=[objects.run.tenant_id])
    if method != "GET":
        return [change]
    return [reverse("admin:index"), reverse("admin:tenants_tenant_changelist"), change]


def bodies(objects: Objects) -> dict[str, dict]:
    """What is sent to each write endpoint: valid input, so that a refusal is about access,
    not about the data. The login and token endpoints get the persona's own credentials."""
    experiment = objects.experiment
    values = '{"resources": {"flavor": "a100-80gb", "gpus_per_node": 1}}'
    template = {"tenant": "vision", "description": "", "values": values, "locked": "", "ranges": ""}
    registry = {
        "url": f"http://127.0.0.1:{free_port()}",
        "auth_kind": "anonymous",
        "timeout_s": "10",
        "enabled": "on",
    }
    new_password = "another-horse-battery-staple"
    launch = asdict(workspace_input(objects.workspace.experiment.image_reference))
    # The node alice's run runs on: restarting without it is allowed (3 other nodes remain).
    [node] = Attempt.objects.get(pk=objects.attempt.pk).node_list
    quotas, pools = proposal_editor_lines()
    whole_quotas = {
        f"q:{line.tenant}:{line.flavor}:{name}": str(value)
        for line in quotas
        for name, value in (
            ("guaranteed", line.quota.guaranteed),
            ("borrow_limit", line.quota.borrow_limit),
            ("weight", line.quota.weight),
            ("budget_mode", "hard" if line.quota.budget_hard else "soft"),
        )
    }
    no_nodes = {f"n:{pool.cluster}:{pool.flavor}": "0" for pool in pools}
    return {
        "policy:report_new": {"window": "7", **whole_quotas, **no_nodes},
        "policy:report_share": {"shared": "on"},
        "policy:report_apply": {"confirm": "on"},
        "api:replay-list": {
            "window_start": (timezone.now() - timedelta(hours=1)).isoformat(),
            "window_end": timezone.now().isoformat(),
            "proposal": {},
        },
        "api:run-restart-excluding": {"node": node},
        "jobs:run_restart_excluding": {"node": node},
        "password_change": {
            "old_password": PASSWORD,
            "new_password1": new_password,
            "new_password2": new_password,
        },
        "api:spec-submit": experiment_spec(experiment),
        "api:run-simulate": experiment_spec(experiment),
        "api:run-list": asdict(experiment_input_of(experiment)),
        "api:workspace-list": launch,
        "api:workspace-extend": {"hours": 1},
        "jobs:workspace_extend": {"hours": "1"},
        "jobs:workspace_launch": {key: str(value) for key, value in launch.items()},
        "api:attempt-report": {"driver_version": "550.54.15"},
        "api:attempt-rank-report": {"rank": 1, "nccl_version": "2.21.5"},
        "api:attempt-events": {"source": "rank-0", "events": [{"type": "ready"}]},
        "api:attempt-workspace-address": {"port": 8888},
        "images:image_import": {"registry": "matrix", "reference": "vision/new:1.0"},
        "images:image_status": {"status": Image.Status.BLOCKED},
        "images:image_visibility": {"visible_to_all": "on"},
        "images:registry_create": registry | {"name": "matrix-2"},
        "images:registry_edit": registry | {"timeout_s": "5"},
        "finance:rate_card_credit_policy": {"credit_policy": "charge"},
        "finance:rate_cards": {
            "flavor": "a100-80gb",
            "price_per_gpu_hour": "2.50",
            "currency": "EUR",
            "valid_from": timezone.now().date().isoformat(),
        },
        "tenants:flavor_create": {
            "slug": "a100-1g.10gb",
            "name": "A100 MIG 1g.10gb",
            "memory_gb": "10",
            "gpu_fraction": "0.1429",
        },
        "tenants:flavor_edit": {"name": "A100 renamed", "memory_gb": "80", "gpu_fraction": "1"},
        "tenants:idle_policy": {"idle_notify_after_min": "30", "idle_cancel_after_min": "60"},
        "tenants:workspace_policy": {
            "workspace_suspend_after_min": "90",
            "workspace_warn_before_min": "15",
            "workspace_max_hours": "24",
        },
        "api_token_create": {
            "submission_key": "7c0ffee0-0000-4000-8000-000000000031",
            "name": "matrix",
            "expires_in_days": "30",
        },
        "jobs:member_add": {"user": "fiona", "role": "researcher"},
        "jobs:member_role": {"role": "tenant_admin"},
        "jobs:run_submit": {
            "tenant": "vision",
            "project": experiment.project.slug,
            "image": experiment.image_reference,
            "name": "matrix-submitted",
            "command": experiment.command,
            "code_repository": experiment.code_repository,
            "code_commit": COMMIT,
            "dataset_uri": experiment.dataset_uri,
            "dataset_version": experiment.dataset_version,
            "params": json.dumps(experiment.params),
            "env": json.dumps(experiment.env),
            "flavor": "a100-80gb",
            "nodes": "1",
            "gpus_per_node": "2",
            "priority": "50",
            "max_runtime_minutes": "1440",
            "max_restarts": "0",
        },
        "jobs:quota_edit": {
            "guaranteed_gpus": "16",  # within the A100 capacity: no overcommit to confirm
            "borrow_limit_gpus": "8",
            "max_gpus_per_run": "16",
            "monthly_gpu_hour_budget": "500",
            "budget_mode": "soft",
            "fair_share_weight": "2",
        },
        "jobs:cluster_capacity": {"flavor": "a100-80gb", "nodes": "4", "gpus_per_node": "4"},
        "jobs:template_create": template | {"name": "matrix-new"},
        "jobs:template_edit": template | {"name": TEMPLATE_NAME, "description": "edited"},
        ADMIN_RULE: {"slug": "vision", "name": "Hijacked", "cost_center": "", "active": "on"},
    }


def body(name: str, method: str, persona: str, sent: dict[str, dict]) -> dict | None:
    if method == "GET":
        return None
    if name in ("login", "api:token-create"):
        # Anonymous logs in as alice: that is what the endpoints are for.
        return {"username": persona if persona != ANON else ALICE, "password": PASSWORD}
    return sent.get(name, {})


# --- running the requests ---------------------------------------------------------------


def clients(objects: Objects) -> dict[str, Client]:
    by_persona = {ANON: Client()}
    for persona, user in objects.users.items():
        client = Client()
        client.force_login(user)
        by_persona[persona] = client
    return by_persona


def headers_for(name: str, persona: str, objects: Objects) -> dict[str, str]:
    """Only a token can revoke itself: each persona sends its own."""
    if name == "api:token-revoke" and persona != ANON:
        return {"Authorization": f"Bearer {objects.tokens[persona]}"}
    return {}


def send(client: Client, method: str, path: str, data, *, api: bool, headers: dict):
    if method == "GET":
        return client.get(path, headers=headers)
    if api:
        return client.generic(
            method,
            path,
            json.dumps(data or {}),
            content_type="application/json",
            headers=headers,
        )
    if method == "POST":
        return client.post(path, data or {}, headers=headers)
    return client.generic(
        method,
        path,
        urlencode(data or {}, doseq=True),
        content_type="application/x-www-form-urlencoded",
        headers=headers,
    )


def snapshot_query() -> tuple[str, list[str]]:
    """One query and its parameters: per table, its row count and a hash of all its rows
    (PostgreSQL). Table and column names come from the models, quoted."""
    parts, tables = [], []
    quote = connection.ops.quote_name
    for model in apps.get_models(include_auto_created=True):
        table = model._meta.db_table
        if table in tables or table in SNAPSHOT_SKIPPED_TABLES or not model._meta.managed:
            continue
        tables.append(table)
        columns = ", ".join(
            quote(field.column)
            for field in model._meta.concrete_fields
            if (table, field.column) not in SNAPSHOT_SKIPPED_COLUMNS
        )
        rows = f"SELECT {columns} FROM {quote(table)}"  # noqa: S608
        parts.append(f"SELECT %s, count(*), {ROWS_DIGEST} FROM ({rows}) r")  # noqa: S608
    return " UNION ALL ".join(parts), tables


def snapshot(query: tuple[str, list[str]]) -> dict[str, tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute(*query)
        return {table: (count, digest) for table, count, digest in cursor.fetchall()}


class Unchanged:
    """The database as the world left it. Every request is rolled back, so this is the
    state before each of them: one snapshot serves them all."""

    def __init__(self) -> None:
        self.query = snapshot_query()
        self.baseline = snapshot(self.query)

    def changed_tables(self) -> list[str]:
        now = snapshot(self.query)
        return sorted(table for table in now if now[table] != self.baseline[table])


def body_text(response) -> str:
    if response.streaming:
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode(errors="replace")


def is_denied(name: str, persona: str, status: int) -> bool:
    """A refusal: an error status, or an anonymous user sent to the login page (except by
    the login endpoints themselves, whose redirect is a success)."""
    return status >= 400 or (persona == ANON and status == 302 and name not in ANONYMOUS_WRITES)


def check(
    failures: list[str],
    database: Unchanged,
    *,
    client: Client,
    persona: str,
    label: str,
    method: str,
    call: Call,
    expected: int,
    headers: dict,
) -> str:
    """One cell: the status, nothing changed by a refused write, no other tenant's data.
    Returns the body of a 200 response ("" for any other)."""
    cookies = copy.deepcopy(client.cookies)  # a login, logout or password change rotates them
    with transaction.atomic():
        response = send(client, method, call.path, call.data, api=call.api, headers=headers)
        client.cookies = cookies
        changed = []
        if method != "GET" and is_denied(label, persona, response.status_code):
            changed = database.changed_tables()
        text = body_text(response) if response.status_code == 200 else ""
        transaction.set_rollback(True)
    cell = f"{method} {label} as {persona}"
    if response.status_code != expected:
        failures.append(f"{cell}: expected {expected}, got {response.status_code}")
    if changed:
        failures.append(f"{cell}: refused with {response.status_code} but changed {changed}")
    leaked = [marker for marker in LEAK_MARKERS.get(persona, ()) if marker in text]
    if leaked:
        failures.append(f"{cell}: shows another tenant's {leaked}")
    return text


def url_patterns(resolver=None, namespace: str = "", prefix: str = ""):
    """(namespace, name, route) of every URL pattern, nested includes walked."""
    for pattern in (resolver or get_resolver()).url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = namespace
            if pattern.namespace:
                inner = f"{namespace}:{pattern.namespace}" if namespace else pattern.namespace
            yield from url_patterns(pattern, inner, route)
        elif isinstance(pattern, URLPattern):
            yield namespace, pattern.name, route


def row_name(namespace: str, name: str | None) -> str | None:
    if namespace.split(":")[0] == "admin":
        return ADMIN_RULE
    if name is None:
        return None
    return f"{namespace}:{name}" if namespace else name


# --- the tests ----------------------------------------------------------------------------


def test_every_url_pattern_has_a_row():
    """A URL added without deciding who may use it fails here, named."""
    named = set()
    missing = []
    for namespace, name, route in url_patterns():
        row = row_name(namespace, name)
        if row is None:
            missing.append(f"unnamed pattern /{route}")
            continue
        named.add(row)
        if not any(key[0] == row for key in EXPECTED):
            missing.append(f"{row} (/{route})")
    assert not missing, "URL patterns without a row in EXPECTED: " + ", ".join(missing)
    stale = sorted({name for name, _ in EXPECTED} - named)
    assert not stale, f"Rows of EXPECTED for URL patterns that no longer exist: {stale}"


@pytest.mark.django_db
def test_every_persona_gets_the_status_in_the_table(objects):
    cache.clear()  # the token endpoint's throttle
    urls, sent = paths(objects), bodies(objects)
    by_persona = clients(objects)
    database = Unchanged()
    failures: list[str] = []
    seen: dict[str, set[str]] = {persona: set() for persona in PERSONAS}
    for (name, method), statuses in EXPECTED.items():
        targets = admin_paths(objects, method) if name == ADMIN_RULE else [urls[name]]
        for persona, expected in zip(PERSONAS, statuses, strict=True):
            for path in targets:
                call = Call(
                    path=path,
                    data=body(name, method, persona, sent),
                    api=name.startswith("api:"),
                )
                text = check(
                    failures,
                    database,
                    client=by_persona[persona],
                    persona=persona,
                    label=name if name != ADMIN_RULE else path,
                    method=method,
                    call=call,
                    expected=expected,
                    headers=headers_for(name, persona, objects),
                )
                seen[persona].update(m for m in (*VISION_MARKERS, *NLP_MARKERS) if m in text)
    assert not failures, f"{len(failures)} cells differ from the table:\n" + "\n".join(failures)
    # The leak check looks for names that do show, to those who may see them.
    assert seen[ALICE] >= set(VISION_MARKERS)
    assert seen[BOB] >= set(NLP_MARKERS)


@pytest.mark.django_db
def test_methods_without_a_row_are_refused(objects):
    """Every method a view accepts has a row: the others answer 405 to a user who may use
    the view (the platform admin; the token or the attempt token where only those work),
    and change nothing."""
    cache.clear()
    urls = paths(objects)
    admin_client = clients(objects)[PAUL]
    job_token = attempt_token_issue(attempt=objects.attempt)
    credentials = {
        "api:token-revoke": {"Authorization": f"Bearer {objects.tokens[PAUL]}"},
        "api:attempt-report": {"Authorization": f"Attempt {job_token}"},
        "api:attempt-rank-report": {"Authorization": f"Attempt {job_token}"},
        "api:attempt-events": {"Authorization": f"Attempt {job_token}"},
        "api:attempt-workspace-address": {"Authorization": f"Attempt {job_token}"},
    }
    database = Unchanged()
    failures: list[str] = []
    for name, path in urls.items():
        listed = {method for row, method in EXPECTED if row == name}
        for method in METHODS:
            if method in listed:
                continue
            check(
                failures,
                database,
                client=admin_client,
                persona=PAUL,
                label=name,
                method=method,
                call=Call(path=path, api=name.startswith("api:")),
                expected=405,
                headers=credentials.get(name, {}),
            )
    assert not failures, f"{len(failures)} methods not refused:\n" + "\n".join(failures)


@pytest.mark.django_db
def test_the_snapshot_sees_a_changed_row(objects):
    """The "nothing changed" check can fail: one changed column of one row shows."""
    database = Unchanged()
    Run.objects.filter(pk=objects.run.pk).update(priority=objects.run.priority + 1)
    assert database.changed_tables() == ["jobs_run"]
