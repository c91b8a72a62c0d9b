"""Web hardening: CSRF, output escaping, Content-Security-Policy, production settings, login
lockout, API tokens and sessions (docs/security.md says what is enforced)."""

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters.models import SimulatedJob
from images.models import Image, Registry
from jobs.models import ExperimentTemplate, Run, RunState
from telemetry.models import GpuMinute
from tenants.authentication import login_failure_record, login_lockout
from tenants.models import (
    ApiToken,
    AuditEvent,
    GpuFlavor,
    LoginFailure,
    Notification,
    Project,
    Quota,
)
from tenants.services.tokens import api_token_create
from tests import REPOSITORY
from tests.conftest import PASSWORD, make_user
from tests.jobs.test_lifecycle import run_to_running, submit
from tests.jobs.test_web import form_data

pytest_plugins = ["tests.browser_support"]

ROOT = REPOSITORY
SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
TEMPLATE = "{{ 7|add:35 }}{% debug %}"
JS_URL = "javascript:alert(1)"
PAYLOAD = SCRIPT + ATTRIBUTE + TEMPLATE
ESCAPED = (
    "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"
    "{{ 7|add:35 }}{% debug %}"
)


class PageScan(HTMLParser):
    """What a page would run: scripts, event-handler attributes, javascript: URLs."""

    URL_ATTRIBUTES = {"href", "src", "action", "formaction", "xlink:href", "data"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.json_blocks: list[str] = []
        self.post_forms: list[dict] = []  # {"action": …, "has_token": bool}
        self._in_json = False
        self._form: dict | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=…>")
            if name in self.URL_ATTRIBUTES and (value or "").strip().lower().startswith(
                "javascript:"
            ):
                self.problems.append(f"<{tag} {name}={value!r}>")
        if tag == "script":
            if attributes.get("type") == "application/json":
                self._in_json = True
                self.json_blocks.append("")
            elif not re.match(r"^/[^/]", attributes.get("src") or ""):
                self.problems.append(f"<script {attributes}> is not a same-origin file")
        if tag == "form" and (attributes.get("method") or "get").lower() == "post":
            self._form = {"action": attributes.get("action"), "has_token": False}
            self.post_forms.append(self._form)
        token = attributes.get("name") == "csrfmiddlewaretoken" and attributes.get("value")
        if tag == "input" and self._form is not None and token:
            self._form["has_token"] = True

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_json = False
        if tag == "form":
            self._form = None

    def handle_data(self, data):
        if self._in_json:
            self.json_blocks[-1] += data


def scan(html: str) -> PageScan:
    scanner = PageScan()
    scanner.feed(html)
    scanner.close()
    return scanner


def strings_in(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in [*strings_in(key), *strings_in(item)]]
    if isinstance(value, list):
        return [s for item in value for s in strings_in(item)]
    return []


def assert_inert(html: str, where: str) -> None:
    """Nothing a user typed can run: no raw tag of a payload, no handler, no script URL."""
    page = scan(html)
    assert page.problems == [], where
    assert "<script>alert" not in html, where
    assert "<img src=x" not in html, where
    for block in page.json_blocks:
        assert "<" not in block, f"{where}: json_script escapes <, > and & in its block"
        # Plotly reads a little HTML in labels, so the values themselves carry none either.
        assert not [s for s in strings_in(json.loads(block)) if "<" in s], where


def csp_directives(response) -> dict[str, list[str]]:
    policy = response["Content-Security-Policy"]
    return {part.split()[0]: part.split()[1:] for part in policy.split(";") if part.strip()}


def assert_strict_csp(response, where: str) -> None:
    directives = csp_directives(response)
    assert directives["script-src"] == ["'self'"], where
    assert directives["default-src"] == ["'self'"], where
    assert directives["object-src"] == ["'none'"], where
    assert directives["frame-ancestors"] == ["'none'"], where
    assert "unsafe-eval" not in response["Content-Security-Policy"], where
    assert response["Referrer-Policy"] == "same-origin", where
    assert response["Cross-Origin-Opener-Policy"] == "same-origin", where
    assert response["X-Content-Type-Options"] == "nosniff", where
    assert response["X-Frame-Options"] == "DENY", where


# --- a world with forms to fill and hostile strings everywhere ----------------------------


@pytest.fixture
def hostile(world, monkeypatch):
    """Every field a person can type into, shown somewhere, holds an XSS payload."""
    monkeypatch.setenv("GANTRY_SIM_DURATION_S", "600")
    world.vision.name = "Vision " + PAYLOAD
    world.vision.save(update_fields=["name"])
    Project.objects.filter(pk=world.vision_project.pk).update(name=PAYLOAD)
    GpuFlavor.objects.filter(pk=world.a100.pk).update(name=PAYLOAD)
    run = submit(
        world,
        name=PAYLOAD,
        params={PAYLOAD: PAYLOAD, "link": JS_URL},
        dataset_uri=JS_URL,
        env={"GANTRY_SIM_DURATION_S": "600", "NOTE": PAYLOAD},
    )
    other = submit(world, name="baseline", params={PAYLOAD: 1})
    run_to_running(world, run)
    run.refresh_from_db()
    # The backend's log of the run ends with what the job printed.
    SimulatedJob.objects.filter(name=run.attempts.get().name).update(
        message=PAYLOAD, finished_at=timezone.now(), state="FAILED", exit_code=1
    )
    GpuMinute.objects.create(
        attempt=run.attempts.get(), host=PAYLOAD, gpu="0", minute=timezone.now(), activity=0.5
    )
    Image.objects.filter(pk=world.image.pk).update(
        description=PAYLOAD,
        labels={PAYLOAD: PAYLOAD, "org.opencontainers.image.source": JS_URL},
    )
    pending = Image.objects.create(
        repository="registry.example.org/ml/new", digest="sha256:" + "d" * 64, tag="1"
    )
    template = ExperimentTemplate.objects.create(
        tenant=world.vision,
        name=SCRIPT + ATTRIBUTE,  # a slug when made with the form; escaping must not rely on it
        description=PAYLOAD,
        values={"command": PAYLOAD},
        created_by=world.tenant_admin_a,
    )
    registry = Registry.objects.create(
        name="internal", url="https://registry.internal.example", host="registry.internal.example"
    )
    for user in (world.researcher_a, world.tenant_admin_a, world.finance, world.platform_admin):
        Notification.objects.create(
            user=user, tenant=world.vision, kind=Notification.Kind.BUDGET_80, message=PAYLOAD
        )
    api_token_create(user=world.researcher_a, name=PAYLOAD)
    AuditEvent.objects.create(
        actor=world.platform_admin,
        tenant=world.vision,
        action="quota.update",
        target=PAYLOAD,
        before={"note": JS_URL},
        after={"note": PAYLOAD},
    )
    return {
        "run": run,
        "other": other,
        "template": template,
        "image": pending,
        "registry": registry,
    }


def pages_for(world, hostile) -> dict[str, list[str]]:
    """The pages each persona works with (some are 404 for some personas: skipped)."""
    run, other, template = hostile["run"], hostile["other"], hostile["template"]
    month = timezone.localdate().replace(day=1)
    common = [
        reverse("jobs:run_list"),
        reverse("jobs:run_submit"),
        reverse("jobs:run_submit") + f"?template={template.pk}",
        reverse("jobs:run_detail", args=[run.pk]),
        reverse("jobs:experiment_detail", args=[run.experiment_id]),
        reverse("jobs:experiment_diff") + f"?a={run.experiment_id}&b={other.experiment_id}",
        reverse("telemetry:run_telemetry", args=[run.pk]),
        reverse("telemetry:tenant_goodput", args=["vision"]),
        reverse("jobs:quota_list"),
        reverse("jobs:template_list"),
        reverse("jobs:template_edit", args=[template.pk]),
        reverse("images:image_list"),
        reverse("images:image_detail", args=[world.image.pk]),
        reverse("images:image_detail", args=[hostile["image"].pk]),
        reverse("notifications:list"),
        reverse("tenants:audit_list"),
        reverse("tenants:idle_policy", args=["vision"]),
        reverse("finance:index"),
        reverse("finance:statement", args=["vision", month]),
        reverse("finance:rate_cards"),
        reverse("telemetry:platform_kpis"),
        reverse("account"),
        reverse("password_change"),
    ]
    admin = [
        reverse("jobs:quota_edit") + "?tenant=vision&flavor=a100-80gb",
        reverse("jobs:cluster_list"),
        reverse("jobs:cluster_capacity", args=[world.cluster.name]),
        reverse("jobs:template_create"),
        reverse("tenants:flavor_list"),
        reverse("tenants:flavor_create"),
        reverse("images:image_import"),
        reverse("images:registry_list"),
        reverse("images:registry_edit", args=[hostile["registry"].name]),
        reverse("telemetry:unmapped_samples"),
        reverse("policy:report_list"),
        reverse("policy:report_new"),
        reverse("admin:index"),
    ]
    members = [reverse("jobs:tenant_members", args=["vision"])]
    return {
        "researcher_a": common,
        "tenant_admin_a": common + members,
        "finance": common,
        "platform_admin": common + admin + members,
    }


def visit(client, urls: list[str]) -> dict[str, object]:
    """GET each page; the ones the persona may see (200)."""
    shown = {}
    for url in urls:
        response = client.get(url)
        assert response.status_code in (200, 404), (url, response.status_code)
        if response.status_code == 200:
            shown[url] = response
    return shown


# The POST forms each persona must meet on the pages above: proof the scan saw them.
EXPECTED_FORMS = {
    "researcher_a": {"/accounts/logout/", "/runs/new/", "cancel", "rerun", "/accounts/password/",
                     "revoke", "/notifications/read/", "/accounts/tokens/new/"},
    "tenant_admin_a": {"/accounts/logout/", "cancel", "/templates/", "delete", "idle-policy",
                       "/members/add/", "/role/", "/remove/"},
    "finance": {"/accounts/logout/", "/notifications/read/"},
    "platform_admin": {"/accounts/logout/", "/quotas/edit/", "status", "recheck", "visibility",
                       "/flavors/new/", "/images/import/", "capacity", "/test/", "/finance/rates/",
                       "/admin/logout/", "/what-if/new/"},
}  # fmt: skip


@pytest.mark.parametrize("persona", list(EXPECTED_FORMS))
def test_every_post_form_carries_a_csrf_token_and_every_page_is_inert(
    client, world, hostile, persona
):
    client.force_login(getattr(world, persona))

    shown = visit(client, pages_for(world, hostile)[persona])

    actions = set()
    for url, response in shown.items():
        html = response.content.decode()
        page = scan(html)
        assert [f["action"] for f in page.post_forms if not f["has_token"]] == [], url
        actions |= {form["action"] for form in page.post_forms}
        assert_inert(html, url)
        assert_strict_csp(response, url)
    for expected in EXPECTED_FORMS[persona]:
        assert any(expected in (action or "") for action in actions), (expected, actions)


def test_payloads_are_shown_as_text_where_people_typed_them(client, world, hostile):
    run, template = hostile["run"], hostile["template"]
    shows_payload = {
        "researcher_a": [
            reverse("jobs:run_list"),  # experiment name
            reverse("jobs:run_detail", args=[run.pk]),  # name and the job's log
            reverse("jobs:experiment_detail", args=[run.experiment_id]),  # params, env, tenant
            reverse("jobs:experiment_diff")
            + f"?a={run.experiment_id}&b={hostile['other'].experiment_id}",
            reverse("jobs:run_submit") + f"?template={template.pk}",  # template description
            reverse("images:image_detail", args=[world.image.pk]),  # labels, description
            reverse("notifications:list"),
            reverse("account"),  # token name
            reverse("telemetry:run_telemetry", args=[run.pk]),  # host of a GPU minute
            reverse("telemetry:tenant_goodput", args=["vision"]),  # tenant name
            reverse("jobs:quota_list"),  # tenant name
        ],
        "tenant_admin_a": [
            reverse("jobs:template_list"),
            reverse("tenants:audit_list"),
            reverse("jobs:tenant_members", args=["vision"]),  # tenant name
        ],
        "platform_admin": [
            reverse("tenants:flavor_list"),
            reverse("jobs:quota_edit") + "?tenant=vision&flavor=a100-80gb",
        ],
    }
    for persona, urls in shows_payload.items():
        client.force_login(getattr(world, persona))
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, url
            html = response.content.decode()
            assert ESCAPED in html, url
            assert_inert(html, url)

    client.force_login(world.researcher_a)
    log = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()
    assert f"exit=1 {ESCAPED}" in log  # the backend's log, escaped in its <pre>
    experiment = client.get(reverse("jobs:experiment_detail", args=[run.experiment_id]))
    assert JS_URL in experiment.content.decode()  # shown as text, never as a link
    charts = client.get(reverse("telemetry:run_telemetry", args=[run.pk])).content.decode()
    activity = json.loads(
        re.search(r'id="activity-chart-data" type="application/json">(.*?)</script>', charts).group(
            1
        )
    )
    assert activity["lines"][0]["name"].endswith(f"· {ESCAPED} GPU 0")


# --- CSRF -----------------------------------------------------------------------------------


def csrf_token(client, url: str) -> str:
    html = client.get(url).content.decode()
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def test_writes_without_a_csrf_token_are_refused_and_change_nothing(world):
    run = submit(world)
    image = Image.objects.create(
        repository="registry.example.org/ml/new", digest="sha256:" + "e" * 64, tag="1"
    )
    quota = Quota.objects.get(tenant=world.vision, flavor=world.a100)
    alice = Client(enforce_csrf_checks=True)
    alice.force_login(world.researcher_a)
    paul = Client(enforce_csrf_checks=True)
    paul.force_login(world.platform_admin)
    quota_url = reverse("jobs:quota_edit") + "?tenant=vision&flavor=a100-80gb"
    quota_form = {
        "guaranteed_gpus": "30",
        "borrow_limit_gpus": "0",
        "max_gpus_per_run": "",
        "monthly_gpu_hour_budget": "",
        "budget_mode": "hard",
        "fair_share_weight": "1",
    }
    writes = [
        (alice, reverse("jobs:run_submit"), form_data(world)),
        (alice, reverse("jobs:run_cancel", args=[run.pk]), {}),
        (alice, reverse("jobs:experiment_rerun", args=[run.experiment_id]), {}),
        (paul, quota_url, quota_form),
        (paul, reverse("images:image_status", args=[image.pk]), {"status": "approved"}),
        (Client(enforce_csrf_checks=True), reverse("login"),
         {"username": "alice", "password": PASSWORD}),
        (alice, reverse("logout"), {}),
    ]  # fmt: skip
    runs_before = list(Run.objects.values_list("pk", "state"))

    for client, url, data in writes:
        response = client.post(url, data)
        assert response.status_code == 403, url
        assert "CSRF verification failed" in response.content.decode(), url

    assert list(Run.objects.values_list("pk", "state")) == runs_before
    quota.refresh_from_db()
    assert quota.guaranteed_gpus == 16
    image.refresh_from_db()
    assert image.status == Image.Status.PENDING
    assert alice.get(reverse("jobs:run_list")).status_code == 200  # still logged in

    # The same requests with the token go through: the 403s were the missing token.
    cancel = reverse("jobs:run_cancel", args=[run.pk])
    token = csrf_token(alice, reverse("jobs:run_detail", args=[run.pk]))
    assert alice.post(cancel, {"csrfmiddlewaretoken": token}).status_code == 302
    assert Run.objects.get(pk=run.pk).state == RunState.CANCELLED
    token = csrf_token(paul, reverse("images:image_detail", args=[image.pk]))
    approve = {"status": "approved", "csrfmiddlewaretoken": token}
    assert paul.post(reverse("images:image_status", args=[image.pk]), approve).status_code == 302
    assert Image.objects.get(pk=image.pk).status == Image.Status.APPROVED


# --- Content-Security-Policy ----------------------------------------------------------------


def test_every_response_carries_the_strict_policy(client, world):
    anonymous = client.get(reverse("login"))
    assert_strict_csp(anonymous, "login")
    assert csp_directives(anonymous) == {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "blob:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
    assert anonymous["Permissions-Policy"] == (
        "camera=(), microphone=(), geolocation=(), payment=(), usb=()"
    )
    client.force_login(world.researcher_a)
    for url in ("/no-such-page/", reverse("api:token-create"), reverse("api-schema")):
        assert_strict_csp(client.get(url), url)


def test_swagger_ui_needs_no_inline_script(client, world):
    client.force_login(world.researcher_a)

    page = client.get(reverse("api-docs"))
    script = client.get(reverse("api-docs") + "?script=")

    assert_strict_csp(page, "api-docs")
    # Its icons are data: images: allowed there, and nowhere else.
    assert csp_directives(page)["img-src"] == ["'self'", "blob:", "data:"]
    assert csp_directives(client.get(reverse("account")))["img-src"] == ["'self'", "blob:"]
    html = page.content.decode()
    assert scan(html).problems == []
    assert '<script src="/api/docs/?script="></script>' in html
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in script.content.decode()


def test_templates_and_scripts_contain_nothing_the_policy_would_block():
    offenders = []
    for template in sorted((ROOT / "templates").rglob("*.html")):
        source = template.read_text()
        name = template.relative_to(ROOT)
        for match in re.finditer(r"<script\b[^>]*>", source):
            if "src=" not in match.group(0):
                offenders.append(f"{name}: inline {match.group(0)}")
        for pattern in (r"\son[a-z]+\s*=", r"javascript:", r"\|\s*safe\b", r"autoescape\s+off"):
            offenders += [f"{name}: {m.group(0)!r}" for m in re.finditer(pattern, source)]
    for script in sorted((ROOT / "static" / "gantry").glob("*.js")):
        source = script.read_text()
        for pattern in (
            r"\beval\s*\(",
            r"new\s+Function\b",
            r"set(Timeout|Interval)\s*\(\s*[\"'`]",
        ):
            offenders += [f"{script.name}: {m.group(0)!r}" for m in re.finditer(pattern, source)]
    assert offenders == []


@pytest.mark.integration
def test_charts_and_swagger_ui_work_under_the_policy_in_a_real_browser(
    persona_page, world, hostile
):
    page = persona_page(world.platform_admin)
    page.add_init_script(
        "window.__violations = [];"
        "document.addEventListener('securitypolicyviolation', e =>"
        "  window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
    )
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    page.goto(reverse("telemetry:run_telemetry", args=[hostile["run"].pk]))
    page.wait_for_selector("[data-chart-source] svg.main-svg")  # Plotly drew its SVG
    exported = page.evaluate(
        "() => Plotly.toImage(document.querySelector('[data-chart-source]'), {format: 'png'})"
    )
    assert exported.startswith("data:image/png;base64,")  # the modebar's download works
    assert page.evaluate("window.__violations") == []
    # The policy is enforced: a script added to the page does not run, and it is reported.
    page.evaluate(
        "() => { const s = document.createElement('script');"
        "s.textContent = 'window.__ran = true'; document.head.appendChild(s); }"
    )
    page.wait_for_function("window.__violations.length > 0")
    assert page.evaluate("window.__ran === undefined")
    assert page.evaluate("window.__violations")[0].startswith("script-src")

    page.goto(reverse("api-docs"))
    page.wait_for_selector(".swagger-ui .info .title")
    assert "Gantry API" in page.inner_text(".swagger-ui .info .title")
    assert page.evaluate("window.__violations") == []
    assert errors == []


# --- production settings --------------------------------------------------------------------

PRODUCTION = {
    "GANTRY_EMBEDDED": "0",
    "DJANGO_SECRET_KEY": "a-production-secret-of-more-than-fifty-characters-0123456789",
    "DATABASE_URL": "postgres://gantry:pw@db.internal:5432/gantry",
    "CELERY_BROKER_URL": "redis://redis.internal:6379/0",
    "GANTRY_ALLOWED_HOSTS": "gantry.example.org",
}
SECURITY_REPORT = """
import io, json, os, re
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
names = ["DEBUG", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY",
    "SESSION_COOKIE_SAMESITE", "CSRF_COOKIE_SAMESITE", "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SECURE_SSL_REDIRECT",
    "SECURE_PROXY_SSL_HEADER", "SECURE_REDIRECT_EXEMPT", "GANTRY_NUM_PROXIES"]
report = {name: getattr(settings, name, None) for name in names}
if os.environ.get("REPORT_CHECK_DEPLOY") == "1":
    out = io.StringIO()
    call_command("check", deploy=True, stdout=out, stderr=out)
    found = re.findall(r"\\(([a-z_]+\\.[WE]\\d+)\\)", out.getvalue())
    report["check --deploy"] = sorted(set(found))
print(json.dumps(report))
"""


def security_reports(tmp_path, *environments: dict) -> list[dict]:
    """The security settings and ``check --deploy``'s findings, one process per environment
    (run side by side: each imports the whole project)."""
    processes = []
    for number, env in enumerate(environments):
        clean = {
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "GANTRY_DATA_DIR": str(tmp_path / f"data-{number}"),
            **env,
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", SECURITY_REPORT],
                cwd=ROOT,
                env=clean,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    reports = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        reports.append(json.loads(stdout))
    return reports


def test_production_settings_are_secure_and_pass_check_deploy(tmp_path):
    default, behind_proxy, hsts_narrowed = security_reports(
        tmp_path,
        {**PRODUCTION, "REPORT_CHECK_DEPLOY": "1"},
        {
            **PRODUCTION,
            "REPORT_CHECK_DEPLOY": "1",
            "GANTRY_SSL_REDIRECT": "1",
            "GANTRY_PROXY_SSL_HEADER": "X-Forwarded-Proto",
            "GANTRY_NUM_PROXIES": "1",
            "GANTRY_HSTS_PRELOAD": "1",
        },
        {**PRODUCTION, "GANTRY_HSTS_SECONDS": "600", "GANTRY_HSTS_INCLUDE_SUBDOMAINS": "0"},
    )

    assert default == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "CSRF_COOKIE_SAMESITE": "Lax",
        "SECURE_HSTS_SECONDS": 31_536_000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_HSTS_PRELOAD": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_PROXY_SSL_HEADER": None,
        "SECURE_REDIRECT_EXEMPT": ["^healthz$", "^readyz$"],
        "GANTRY_NUM_PROXIES": 0,
        # W008: by default the TLS proxy in front redirects http to https (docs/security.md);
        # W021: HSTS preload is a promise to browser vendors an operator must choose to make.
        "check --deploy": ["security.W008", "security.W021"],
    }
    assert behind_proxy == {
        **default,
        "SECURE_HSTS_PRELOAD": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "GANTRY_NUM_PROXIES": 1,
        "check --deploy": [],
    }
    assert hsts_narrowed == {
        **{name: value for name, value in default.items() if name != "check --deploy"},
        "SECURE_HSTS_SECONDS": 600,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
    }


def test_hsts_and_the_ssl_redirect_apply_to_https_behind_the_proxy(client, world, settings):
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]

    plain = client.get(reverse("login"))
    proxied = client.get(reverse("login"), HTTP_X_FORWARDED_PROTO="https")
    health = client.get(reverse("healthz"))

    assert (plain.status_code, plain["Location"]) == (301, "https://testserver/accounts/login/")
    assert proxied.status_code == 200
    assert proxied["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert health.status_code == 200  # the container's health check speaks plain HTTP


# --- login lockout --------------------------------------------------------------------------


def login(client, username: str, password: str, **extra):
    return client.post(reverse("login"), {"username": username, "password": password}, **extra)


def test_five_failures_lock_the_username_even_for_the_right_password(client, world):
    statuses = [login(client, "alice", f"guess-{i}").status_code for i in range(5)]
    locked = login(client, "alice", PASSWORD)

    assert statuses == [200] * 5
    assert locked.status_code == 429
    assert 890 <= int(locked["Retry-After"]) <= 900
    assert (
        "Too many failed logins for this username. Logins are refused for 15 more minutes, "
        "even with the right password."
    ) in locked.content.decode()
    assert "_auth_user_id" not in client.session
    assert LoginFailure.objects.filter(username="alice").count() == 5  # in the shared database
    # Another account from the same address is not affected; the username is case-blind.
    assert login(Client(), "ALICE", PASSWORD).status_code == 429
    assert login(client, "bob", PASSWORD).status_code == 302


def test_four_failures_then_a_success_start_the_count_again(client, world):
    for i in range(4):
        assert login(client, "alice", f"guess-{i}").status_code == 200
    assert login(client, "alice", PASSWORD).status_code == 302
    client.logout()
    for i in range(4):
        assert login(client, "alice", f"guess-{i}").status_code == 200

    assert login(client, "alice", PASSWORD).status_code == 302  # 8 failures, none 5 in a row


def test_the_lockout_ends_when_the_oldest_failure_leaves_the_window(world):
    now = timezone.now()
    for minutes_ago in (14, 10, 6, 3, 1):
        login_failure_record(
            username="alice", ip_address=None, now=now - timedelta(minutes=minutes_ago)
        )

    lockout = login_lockout(username="alice", ip_address=None, now=now)
    assert (lockout.retry_after_s, lockout.by_address) == (60, False)  # 15 - 14 minutes
    assert login_lockout(username="alice", ip_address=None, now=now + timedelta(seconds=59))
    assert login_lockout(username="alice", ip_address=None, now=now + timedelta(seconds=61)) is None
    # A new failure inside the window locks again, until the then oldest (10 min ago) leaves.
    login_failure_record(username="alice", ip_address=None, now=now + timedelta(seconds=61))
    lockout = login_lockout(username="alice", ip_address=None, now=now + timedelta(seconds=61))
    assert lockout.retry_after_s == 5 * 60 - 61


def test_twenty_failures_from_one_address_lock_every_username_from_it(world):
    office = Client(REMOTE_ADDR="198.51.100.7")
    for i in range(20):
        assert login(office, f"user-{i}", "guess").status_code == 200

    locked = login(office, "alice", PASSWORD)

    assert locked.status_code == 429
    assert "Too many failed logins from your network address." in locked.content.decode()
    assert login(Client(REMOTE_ADDR="198.51.100.8"), "alice", PASSWORD).status_code == 302


def test_the_client_address_is_read_through_the_trusted_proxies(world, settings):
    settings.GANTRY_NUM_PROXIES = 1
    # The client may write anything left of what the proxy appended.
    forwarded = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 203.0.113.9"}
    login(Client(**forwarded), "alice", "guess")

    assert list(LoginFailure.objects.values_list("username", "ip_address")) == [
        ("alice", "203.0.113.9")
    ]


def test_the_api_token_endpoint_and_the_admin_login_share_the_lockout(client, world):
    for i in range(5):
        login(client, "paul", f"guess-{i}")

    api = client.post(
        reverse("api:token-create"),
        {"username": "paul", "password": PASSWORD},
        content_type="application/json",
    )
    admin = client.post(
        reverse("admin:login"), {"username": "paul", "password": PASSWORD, "next": "/admin/"}
    )

    assert api.status_code == 429
    assert api.json()["detail"].startswith("Too many failed logins for this username.")
    assert ApiToken.objects.count() == 0
    assert admin.status_code == 200  # the admin's form, with its error: not logged in
    assert "_auth_user_id" not in client.session


# --- API tokens -----------------------------------------------------------------------------


def bearer(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def test_a_token_secret_is_never_stored_or_logged(client, world, caplog):
    caplog.set_level(logging.DEBUG)
    with CaptureQueriesContext(connection) as queries:
        created = client.post(
            reverse("api:token-create"),
            {"username": "alice", "password": PASSWORD, "name": "laptop"},
            content_type="application/json",
        )
        secret = created.json()["token"]
        assert client.get(reverse("api:run-list"), **bearer(secret)).status_code == 200

    token = ApiToken.objects.get()
    assert token.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert token.prefix == secret[4:12]
    assert secret not in json.dumps(list(ApiToken.objects.values()), default=str)
    assert not [q["sql"] for q in queries.captured_queries if secret in q["sql"]]
    assert not [r for r in caplog.records if secret in r.getMessage()]


def test_expired_and_revoked_tokens_are_refused_and_use_is_recorded(client, world):
    now = timezone.now()
    live, live_secret = api_token_create(
        user=world.researcher_a, expires_at=now + timedelta(days=1)
    )
    _, expired_secret = api_token_create(user=world.researcher_a, expires_at=now)
    revoked, revoked_secret = api_token_create(user=world.researcher_a)
    ApiToken.objects.filter(pk=revoked.pk).update(revoked_at=now)
    runs = reverse("api:run-list")

    assert live.last_used_at is None
    assert client.get(runs, **bearer(live_secret)).status_code == 200
    live.refresh_from_db()
    assert now <= live.last_used_at <= timezone.now()
    expired = client.get(runs, **bearer(expired_secret))
    assert (expired.status_code, expired.json()) == (401, {"detail": "Token expired."})
    refused = client.get(runs, **bearer(revoked_secret))
    assert (refused.status_code, refused.json()) == (401, {"detail": "Invalid or revoked token."})


def test_a_user_revokes_their_own_tokens_on_their_account_page(client, world):
    mine, secret = api_token_create(user=world.researcher_a, name="laptop")
    theirs, their_secret = api_token_create(user=world.researcher_b, name="ci")
    client.force_login(world.researcher_a)

    page = client.get(reverse("account")).content.decode()
    assert f"<code>gty_{mine.prefix}…</code>" in page
    assert theirs.prefix not in page
    assert client.get(reverse("api_token_revoke", args=[mine.pk])).status_code == 405
    assert client.post(reverse("api_token_revoke", args=[theirs.pk])).status_code == 404
    response = client.post(reverse("api_token_revoke", args=[mine.pk]), follow=True)

    assert response.redirect_chain == [(reverse("account"), 302)]
    assert f"Revoked the token laptop ({mine.prefix}…)." in response.content.decode()
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.revoked_at is not None
    assert theirs.revoked_at is None
    assert Client().get(reverse("api:run-list"), **bearer(secret)).status_code == 401
    assert Client().get(reverse("api:run-list"), **bearer(their_secret)).status_code == 200


# --- sessions -------------------------------------------------------------------------------


def test_a_password_change_logs_out_the_other_sessions_only(world):
    laptop, phone = Client(), Client()
    assert login(laptop, "alice", PASSWORD).status_code == 302
    assert login(phone, "alice", PASSWORD).status_code == 302
    new_password = "a-much-longer-new-passphrase-41"

    changed = laptop.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": new_password, "new_password2": new_password},
    )

    assert (changed.status_code, changed["Location"]) == (302, reverse("account"))
    assert laptop.get(reverse("jobs:run_list")).status_code == 200
    phone_response = phone.get(reverse("jobs:run_list"))
    assert phone_response.status_code == 302
    assert phone_response["Location"].startswith(reverse("login"))
    assert login(Client(), "alice", PASSWORD).status_code == 200  # the old password is gone
    assert login(Client(), "alice", new_password).status_code == 302


def test_a_wrong_old_password_changes_nothing(client, world):
    client.force_login(world.researcher_a)

    response = client.post(
        reverse("password_change"),
        {"old_password": "not-it", "new_password1": "x-new-passphrase-9", "new_password2": "x"},
    )

    assert response.status_code == 200
    assert User.objects.get(username="alice").check_password(PASSWORD)


def test_hostile_usernames_are_escaped_too(client, world):
    make_user(PAYLOAD[:150])
    client.force_login(User.objects.get(username=PAYLOAD[:150]))

    html = client.get(reverse("account")).content.decode()

    assert_inert(html, "account")
    assert ESCAPED[:60] in html
