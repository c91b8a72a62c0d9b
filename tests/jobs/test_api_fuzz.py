"""Fuzzing the REST API against its own OpenAPI schema (issue 10, point 4a).

schemathesis reads ``/api/schema/`` from the real Django application and calls it in
process (WSGI, no server), with requests that fit the schema and requests that break it,
as a researcher, as a platform admin and without credentials. Bodies that fit the schema
but carry hostile strings (NUL, unpaired surrogates, shell metacharacters, very long text)
are mixed in where a write reaches deep into the services. No answer may be a 5xx, and
every answer must use a documented status code, content type and body schema.

The regression tests below the fuzzer replay, with the exact input, what it found: each
5xx, and cache keys another cache backend would have refused.
"""

import contextlib
import hashlib
import json
import logging
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.cache.backends.base import CacheKeyWarning
from django.core.exceptions import ValidationError
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.urls import Resolver404, resolve
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobs.models import Attempt, ExperimentTemplate, Run
from jobs.services.backend_submit import attempt_token_issue
from jobs.services.submission import run_submit
from jobs.services.workspaces import WorkspaceInput, workspace_launch
from policy.services.reports import replay_report_create
from tenants.api import TokenCreateThrottle
from tenants.services.tokens import api_token_create
from tests.conftest import COMMIT, PASSWORD, experiment_input
from tests.jobs.test_lifecycle import run_to_running, submit

MIN_REQUESTS = 2_000
# Cases per operation and generation mode, each sent by the researcher and the platform
# admin: 20 operations x 2 modes x 30 cases x 2 personas = 2,400 authenticated requests.
EXAMPLES_PER_OPERATION = 30
ANONYMOUS_EXAMPLES = 3
OPERATIONS = {
    "GET /api/v1/",
    "POST /api/v1/attempts/events/",
    "POST /api/v1/attempts/report/",
    "POST /api/v1/attempts/rank-report/",
    "POST /api/v1/attempts/workspace/",
    "GET /api/v1/experiments/",
    "GET /api/v1/experiments/{id}/",
    "GET /api/v1/experiments/{id}/spec/",
    "POST /api/v1/experiments/{id}/rerun/",
    "GET /api/v1/images/",
    "GET /api/v1/quotas/",
    "GET /api/v1/replays/",
    "POST /api/v1/replays/",
    "GET /api/v1/replays/{id}/",
    "POST /api/v1/replays/{id}/cancel/",
    "GET /api/v1/runs/",
    "POST /api/v1/runs/",
    "POST /api/v1/runs/simulate/",
    "GET /api/v1/runs/{id}/",
    "POST /api/v1/runs/{id}/cancel/",
    "POST /api/v1/runs/{id}/restart-excluding/",
    "GET /api/v1/runs/{id}/logs/",
    "GET /api/v1/runs/{id}/verdicts/",
    "GET /api/v1/spec/schema/",
    "POST /api/v1/specs/",
    "GET /api/v1/templates/",
    "POST /api/v1/tokens/",
    "DELETE /api/v1/tokens/current/",
    "GET /api/v1/workspaces/",
    "POST /api/v1/workspaces/",
    "GET /api/v1/workspaces/{id}/",
    "POST /api/v1/workspaces/{id}/extend/",
    "POST /api/v1/workspaces/{id}/stop/",
    "POST /api/v1/workspaces/{id}/suspend/",
    "POST /api/v1/workspaces/{id}/resume/",
}

# --- hostile values -------------------------------------------------------------------------

NASTY_STRINGS = (
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",  # an unpaired surrogate: valid in JSON text, not encodable as UTF-8
    "x\udfffy",
    "$(touch /tmp/pwned)",
    "`id`",
    "; rm -rf / #",
    "a\nb\r\nc",
    "'\"\\",
    "${HOME}",
    "%s%n{0}",
    "../../etc/passwd",
    "<script>alert(1)</script>",
    "\u202etxt.exe",
    "😀 ünï",
    "x" * 5000,
)
NASTY_TEXT = st.one_of(
    st.sampled_from(NASTY_STRINGS),
    st.text(st.characters(exclude_categories=()), max_size=40),  # surrogates included
)


def _storable(text: str) -> bool:
    return "\x00" not in text and not any("\ud800" <= char <= "\udfff" for char in text)


# Hostile, yet text the database can store: what gets past validation into the records,
# and then into every answer that shows them.
STORABLE_TEXT = st.one_of(
    st.sampled_from([text for text in NASTY_STRINGS if _storable(text)]),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40),
)
ENV_NAME = st.from_regex(r"\A[A-Z][A-Z0-9_]{0,12}\Z")
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    NASTY_TEXT,
)
NASTY_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NASTY_TEXT, inner, max_size=3),
    max_leaves=8,
)
NASTY_INT = st.one_of(
    st.integers(min_value=-3, max_value=200), st.sampled_from([2**31, 2**63, 2**64])
)


def _with_some_of(base: dict, overrides: dict) -> st.SearchStrategy[dict]:
    """``base`` with any subset of its fields replaced by a drawn hostile value."""
    return st.fixed_dictionaries({}, optional=overrides).map(lambda drawn: {**base, **drawn})


# --- the world the fuzzer runs in -----------------------------------------------------------


REVOKES_ITS_TOKEN = "DELETE /api/v1/tokens/current/"
# A valid launch (its image is the world's, set where the world is known).
WORKSPACE_BODY = {
    "tenant": "vision",
    "project": "detection",
    "image": "",
    "flavor": "a100-80gb",
    "gpus": 1,
    "hours": 2,
}


@dataclass
class Persona:
    name: str
    user: User | None  # None: no credentials
    attempt_authorization: str | None  # for the operations a job calls
    token: str = ""
    previous_label: str = ""

    def authorization(self, operation_label: str) -> str | None:
        if self.user is None:
            return None
        # The revoking operation spends a token per request, and leaves the last one revoked
        # for the operations after it.
        if not self.token or REVOKES_ITS_TOKEN in (operation_label, self.previous_label):
            _, self.token = api_token_create(user=self.user, name="fuzz")
        self.previous_label = operation_label
        return f"Bearer {self.token}"


@dataclass
class FuzzWorld:
    schema: schemathesis.BaseSchema
    ids: list[int]
    workspace_ids: list[int]
    replay_ids: list[int]
    replay_body: dict
    run_body: dict
    spec_body: dict
    researcher: Persona
    platform_admin: Persona
    anonymous: Persona
    requests: Counter = field(default_factory=Counter)  # by persona
    statuses: Counter = field(default_factory=Counter)  # by persona, operation, status


@pytest.fixture
def wsgi_app():
    """The project's WSGI application, as gunicorn runs it. Like Django's test client, it
    must not close the database connection after each request: the test's transaction
    lives on it."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    request_logger = logging.getLogger("django.request")
    level = request_logger.level
    request_logger.setLevel(logging.ERROR)  # thousands of 4xx warnings say nothing
    try:
        yield WSGIHandler()
    finally:
        request_logger.setLevel(level)
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
        cache.clear()  # the token throttle's counters


def _attempt_of(run: Run) -> str:
    attempt = Attempt.objects.get(run=run)
    return f"Attempt {attempt_token_issue(attempt=attempt)}"


@pytest.fixture
def fuzz_world(world, wsgi_app) -> FuzzWorld:
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app)
    # The real runs and experiments get ids far above the small integers Hypothesis draws
    # most: on a fresh database (the workspace's id was 109) a generated id could cancel or
    # stop a real run before the fuzz reached it (a CI run once saw no extend accepted).
    # The real ids reach the operations through ``ids`` and ``workspace_ids``.
    with connection.cursor() as cursor:
        for table in ("jobs_run", "jobs_experiment"):
            cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), 7000000)", [table])
    own = submit(world)
    other = submit(world, user=world.researcher_b, tenant="nlp", project="llm")
    run_to_running(world, own)
    attempt = _attempt_of(own)
    workspace = workspace_launch(
        user=world.researcher_a,
        data=WorkspaceInput(**{**WORKSPACE_BODY, "image": world.image.reference}),
    )
    ExperimentTemplate.objects.create(
        name="small",
        values={"resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 1}},
        locked=["resources.flavor"],
        ranges={"resources.gpus_per_node": {"min": 1, "max": 2}},
    )
    run_body = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "command": "python train.py",
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 1,
        "code_repository": "https://git.example.org/vision/detection.git",
        "code_commit": COMMIT,
    }
    spec_body = {
        "version": 1,
        "kind": "experiment",
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "command": "python train.py",
        "resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 1},
    }
    window_end = timezone.now()
    proposal = {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 8}]}
    replay = replay_report_create(
        actor=world.platform_admin,
        window_start=window_end - timedelta(hours=1),
        window_end=window_end,
        proposal=proposal,
    )
    replay_body = {
        "window_start": (window_end - timedelta(hours=1)).isoformat(),
        "window_end": window_end.isoformat(),
        "proposal": proposal,
    }
    return FuzzWorld(
        schema=schema,
        ids=[own.pk, other.pk, own.experiment_id, other.experiment_id],
        # Apart: the runs' operations (a cancel) would end the workspace before its own.
        workspace_ids=[workspace.pk, own.pk],
        replay_ids=[replay.pk],
        replay_body=replay_body,
        run_body=run_body,
        spec_body=spec_body,
        researcher=Persona("researcher", world.researcher_a, attempt),
        platform_admin=Persona("platform_admin", world.platform_admin, attempt),
        anonymous=Persona("anonymous", None, None),
    )


# --- what the answers must satisfy ----------------------------------------------------------


def documented_content_type(ctx, response, case):
    """The documented content type, except for a path no route matches (a negated path
    parameter, e.g. ``/runs/-1/``): that gets the site's HTML 404 page, which is no API
    operation's answer."""
    if response.status_code == 404 and not _is_route(case.formatted_path):
        return None
    return content_type_conformance(ctx, response, case)


def _is_route(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    documented_content_type,
    response_schema_conformance,
]


def _strategies(fuzz: FuzzWorld, operation, mode: GenerationMode) -> list[st.SearchStrategy]:
    """schemathesis's own cases, plus cases that reach past the first validation: real
    ids in paths, and schema-valid bodies with hostile values."""
    generated = [operation.as_strategy(generation_mode=mode)]
    if "{id}" in operation.path:
        ids = fuzz.ids
        if operation.path.startswith("/api/v1/workspaces/"):
            ids = fuzz.workspace_ids
        elif operation.path.startswith("/api/v1/replays/"):
            ids = fuzz.replay_ids
        generated += [
            operation.as_strategy(generation_mode=mode, path_parameters={"id": pk}) for pk in ids
        ]
    if mode is not GenerationMode.POSITIVE:
        return generated
    free_text = {
        "name": STORABLE_TEXT,
        "command": STORABLE_TEXT.filter(str.strip),
        "checkpoint_dir": STORABLE_TEXT,
        "params": st.dictionaries(STORABLE_TEXT, STORABLE_TEXT, max_size=3),
        "env": st.dictionaries(ENV_NAME, STORABLE_TEXT, max_size=3),
    }
    spec_free_text = {
        **free_text,
        "dataset": st.fixed_dictionaries({"uri": STORABLE_TEXT, "version": STORABLE_TEXT}),
    }
    workspace_body = {**WORKSPACE_BODY, "image": fuzz.run_body["image"]}
    # What submits a spec also previews it (``/runs/simulate/``).
    spec_bodies = _with_some_of(fuzz.spec_body, spec_free_text) | _with_some_of(
        fuzz.spec_body,
        {
            "tenant": NASTY_TEXT,
            "project": NASTY_TEXT,
            "name": NASTY_TEXT,
            "image": NASTY_TEXT,
            "command": NASTY_TEXT,
            "template": st.one_of(st.just("small"), NASTY_TEXT),
            "resources": st.dictionaries(
                st.sampled_from(["flavor", "nodes", "gpus_per_node", "max_runtime_minutes"]),
                st.one_of(NASTY_TEXT, NASTY_INT),
            ),
            "code": st.dictionaries(st.sampled_from(["repository", "commit"]), NASTY_TEXT),
            "dataset": st.dictionaries(st.sampled_from(["uri", "version"]), NASTY_TEXT),
            "params": st.dictionaries(NASTY_TEXT, NASTY_JSON, max_size=4),
            "env": st.dictionaries(NASTY_TEXT, NASTY_TEXT, max_size=3),
            "checkpoint_dir": NASTY_TEXT,
        },
    )
    bodies = {
        "POST /api/v1/runs/": _with_some_of(
            fuzz.run_body, {**free_text, "dataset_uri": STORABLE_TEXT}
        )
        | _with_some_of(
            fuzz.run_body,
            {
                "tenant": NASTY_TEXT,
                "project": NASTY_TEXT,
                "image": NASTY_TEXT,
                "command": NASTY_TEXT,
                "name": NASTY_TEXT,
                "checkpoint_dir": NASTY_TEXT,
                "dataset_uri": NASTY_TEXT,
                "params": st.dictionaries(NASTY_TEXT, NASTY_JSON, max_size=4),
                "env": st.dictionaries(NASTY_TEXT, NASTY_TEXT, max_size=3),
                "nodes": NASTY_INT,
                "gpus_per_node": NASTY_INT,
                "priority": NASTY_INT,
                "cloned_from": st.one_of(st.none(), NASTY_INT),
            },
        ),
        "POST /api/v1/specs/": spec_bodies,
        "POST /api/v1/replays/": _with_some_of(
            fuzz.replay_body,
            {
                "window_start": st.one_of(NASTY_TEXT, st.datetimes().map(str)),
                "proposal": st.one_of(
                    NASTY_JSON,
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "quotas": st.lists(
                                st.dictionaries(
                                    st.sampled_from(
                                        [
                                            "tenant",
                                            "flavor",
                                            "guaranteed",
                                            "borrow_limit",
                                            "weight",
                                            "budget_gpu_hours",
                                            "budget_hard",
                                        ]
                                    ),
                                    st.one_of(NASTY_TEXT, NASTY_INT, JSON_SCALARS),
                                ),
                                max_size=3,
                            ),
                            "nodes": st.lists(
                                st.dictionaries(
                                    st.sampled_from(["cluster", "flavor", "count"]),
                                    st.one_of(NASTY_TEXT, NASTY_INT),
                                ),
                                max_size=2,
                            ),
                            "starvation_after_s": JSON_SCALARS,
                            "preemption": JSON_SCALARS,
                        },
                    ),
                ),
                "confirm_warnings": st.booleans(),
            },
        ),
        "POST /api/v1/runs/simulate/": spec_bodies,
        "POST /api/v1/attempts/report/": _with_some_of(
            {"driver_version": "550.54.15"},
            {
                "driver_version": NASTY_TEXT,
                "framework": st.dictionaries(NASTY_TEXT, NASTY_TEXT, max_size=3),
                "node_list": st.lists(NASTY_TEXT, max_size=3),
                "gpu_uuids": st.lists(NASTY_TEXT, max_size=3),
            },
        ),
        "POST /api/v1/attempts/events/": st.fixed_dictionaries(
            {
                "source": st.one_of(st.just("rank-0"), NASTY_TEXT),
                "events": st.lists(
                    _with_some_of(
                        {"seq": 1, "ts": 1_767_225_600, "type": "checkpoint_saved", "step": 10},
                        {
                            "seq": NASTY_INT,
                            "type": st.one_of(
                                st.sampled_from(["ready", "step_window", "checkpoint_restored"]),
                                NASTY_TEXT,
                            ),
                            "uri": NASTY_TEXT,
                            "seconds": JSON_SCALARS,
                            "step": NASTY_INT,
                        },
                    ),
                    min_size=1,
                    max_size=3,
                ),
            }
        ),
        "POST /api/v1/workspaces/": _with_some_of(workspace_body, {"name": STORABLE_TEXT})
        | _with_some_of(
            workspace_body,
            {
                "name": NASTY_TEXT,
                "tenant": NASTY_TEXT,
                "project": NASTY_TEXT,
                "image": NASTY_TEXT,
                "flavor": NASTY_TEXT,
                "server": NASTY_TEXT,
                "gpus": NASTY_INT,
                "hours": NASTY_INT,
            },
        ),
        "POST /api/v1/tokens/": st.fixed_dictionaries(
            {
                "username": st.one_of(st.sampled_from(["alice", "paul"]), NASTY_TEXT),
                "password": st.one_of(st.just(PASSWORD), NASTY_TEXT),
                "name": NASTY_TEXT,
            }
        ),
    }
    if operation.label == "POST /api/v1/workspaces/{id}/extend/":
        # Hours the tenant allows (a 2-hour workspace, 12 at most), and hostile ones.
        generated.append(
            st.one_of(st.integers(1, 2), NASTY_INT, NASTY_TEXT).map(
                lambda hours: operation.Case(
                    body={"hours": hours},
                    media_type="application/json",
                    path_parameters={"id": fuzz.workspace_ids[0]},
                )
            )
        )
    hostile = bodies.get(operation.label)
    if hostile is not None:
        generated.append(
            hostile.map(lambda body: operation.Case(body=body, media_type="application/json"))
        )
    return generated


def _fuzz_operation(
    fuzz: FuzzWorld, personas: list[Persona], operation, mode: GenerationMode, examples: int
) -> None:
    """Every generated case is sent once by each persona (generating costs as much as
    answering), each answer checked."""
    uses_attempt_token = any(
        "attemptToken" in s for s in operation.definition.raw.get("security", [])
    )

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same requests on every run, so CI is deterministic
        database=None,
        # A failure is reported as drawn, with the curl line that repeats it: shrinking
        # through thousands of requests would take minutes.
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(_strategies(fuzz, operation, mode)))
    def fuzz_one(case):
        for persona in personas:
            authorization = (
                persona.attempt_authorization
                if uses_attempt_token
                else persona.authorization(operation.label)
            )
            headers = {"Authorization": authorization} if authorization else {}
            # A savepoint per request: a database error stays in this request.
            with contextlib.suppress(DatabaseError), transaction.atomic():
                response = case.call(headers=headers)
            fuzz.requests[persona.name] += 1
            fuzz.statuses[persona.name, operation.label, response.status_code] += 1
            try:
                case.validate_response(response, checks=CHECKS)
            except BaseExceptionGroup as failures:
                raise AssertionError(f"{persona.name}: {failures}\nbody: {_shown(case)}") from None

    fuzz_one()


def _shown(case) -> str:
    body = getattr(case, "body", None)
    return json.dumps(body, ensure_ascii=True)[:2000] if isinstance(body, dict | list) else "-"


def test_fuzzed_api_answers_no_5xx_and_only_what_its_schema_documents(fuzz_world):
    assert fuzz_world.schema.iter_schema_warnings() == []
    operations = [result.ok() for result in fuzz_world.schema.get_all_operations()]
    assert {operation.label for operation in operations} == OPERATIONS
    passes = [
        ([fuzz_world.researcher, fuzz_world.platform_admin], EXAMPLES_PER_OPERATION),
        ([fuzz_world.anonymous], ANONYMOUS_EXAMPLES),
    ]
    failures = []
    for personas, examples in passes:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    _fuzz_operation(fuzz_world, personas, operation, mode, examples)
                except AssertionError as exc:
                    failures.append(f"{operation.label} {mode.value}: {exc}")

    assert failures == []
    requests = fuzz_world.requests
    assert requests["researcher"] + requests["platform_admin"] >= MIN_REQUESTS, requests
    statuses = fuzz_world.statuses
    # The real ids take the fuzzer past the 404: the researcher reads her own run, and the
    # platform admin reads every tenant's runs and cancels another tenant's.
    assert statuses["researcher", "GET /api/v1/runs/{id}/", 200] > 0
    assert statuses["platform_admin", "GET /api/v1/runs/{id}/", 200] > 0
    assert statuses["platform_admin", "POST /api/v1/runs/{id}/cancel/", 202] > 0
    assert statuses["platform_admin", "GET /api/v1/experiments/{id}/spec/", 200] > 0
    # The hostile bodies are valid enough to be accepted, not only refused.
    assert statuses["researcher", "POST /api/v1/runs/", 201] > 0
    assert statuses["researcher", "POST /api/v1/specs/", 201] > 0
    assert statuses["researcher", "POST /api/v1/runs/simulate/", 200] > 0
    assert statuses["researcher", "POST /api/v1/attempts/report/", 200] > 0
    assert statuses["researcher", "POST /api/v1/attempts/events/", 202] > 0
    assert statuses["researcher", "POST /api/v1/workspaces/", 201] > 0
    extends = {key: count for key, count in statuses.items() if key[1].endswith("/extend/")}
    assert statuses["researcher", "POST /api/v1/workspaces/{id}/extend/", 200] > 0, extends
    assert statuses["platform_admin", "GET /api/v1/workspaces/{id}/", 200] > 0
    assert statuses["platform_admin", "GET /api/v1/replays/{id}/", 200] > 0
    assert statuses["platform_admin", "POST /api/v1/replays/", 201] > 0
    # Without credentials every operation but the token exchange is refused (or, for a
    # path no route matches, not found).
    anonymous = {
        code
        for (name, label, code) in statuses
        if name == "anonymous" and label != "POST /api/v1/tokens/"
    }
    assert 401 in anonymous
    assert anonymous <= {401, 404}


# --- regressions: each 5xx the fuzzer found, replayed with its input --------------------------

SPEC = {
    "version": 1,
    "kind": "experiment",
    "tenant": "vision",
    "project": "detection",
    "image": "registry.example.org/ml/pytorch@sha256:" + "a" * 64,
    "command": "python train.py",
    "resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 1},
}


def _client(user) -> APIClient:
    _, secret = api_token_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _post_json(client: APIClient, url: str, body) -> Response:
    # json.dumps writes an unpaired surrogate as the escape "\ud800", as a client would.
    return client.post(url, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant", "\x00\xa8\xcds\x85"),  # found by the fuzzer: a DataError on the lookup
        ("project", "detection\x00"),
        ("image", "\x00"),
        ("template", "small\x00"),
    ],
)
def test_spec_with_nul_in_a_looked_up_field_is_400_and_creates_nothing(world, field, value):
    response = _post_json(_client(world.researcher_a), "/api/v1/specs/", {**SPEC, field: value})

    assert response.status_code == 400
    assert response.json() == {field: ["Must not contain NUL characters."]}
    assert Run.objects.count() == 0


def test_spec_with_nul_in_a_grouped_field_or_env_names_the_dotted_field(world):
    body = {
        **SPEC,
        "resources": {**SPEC["resources"], "flavor": "a100\x00"},
        "env": {"MODE\x00": "fast"},
    }

    response = _post_json(_client(world.researcher_a), "/api/v1/specs/", body)

    assert response.status_code == 400
    assert response.json() == {
        "resources.flavor": ["Must not contain NUL characters."],
        "env": ["Must not contain NUL characters."],
    }
    assert Run.objects.count() == 0


UNPAIRED_SURROGATE = (
    "JSON parse error - a string holds an unpaired surrogate (\\ud800 to \\udfff), "
    "which is not Unicode text."
)


@pytest.mark.parametrize(
    ("url", "body"),
    [
        # found by the fuzzer: a 500 (UnicodeEncodeError) looking the project up
        ("/api/v1/specs/", {**SPEC, "project": "\ud800"}),
        # 500s: an unknown key is named back in the 400, which then cannot be rendered
        ("/api/v1/specs/", {**SPEC, "\ud800": 1}),
        ("/api/v1/runs/", {"\ud800": 1}),
        # refused whole, before any field is read
        ("/api/v1/tokens/", {"username": "\ud800", "password": "x"}),
    ],
    ids=["spec-value", "spec-key", "run-key", "token"],
)
def test_body_with_an_unpaired_surrogate_is_400_and_creates_nothing(world, url, body):
    response = _post_json(_client(world.researcher_a), url, body)

    assert response.status_code == 400
    assert response.json() == {"detail": UNPAIRED_SURROGATE}
    assert Run.objects.count() == 0


def test_job_reports_with_an_unpaired_surrogate_are_400(world):
    run = submit(world)
    run_to_running(world, run)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=_attempt_of(run))
    event = {"seq": 1, "ts": 1_767_225_600, "type": "checkpoint_saved", "step": 10}

    report = _post_json(client, "/api/v1/attempts/report/", {"hostname": "node-\ud800"})
    events = _post_json(
        client,
        "/api/v1/attempts/events/",
        {"source": "rank-0", "events": [{**event, "uri": "s3://ckpt/\udfff", "seconds": 1}]},
    )

    assert (report.status_code, report.json()) == (400, {"detail": UNPAIRED_SURROGATE})
    assert (events.status_code, events.json()) == (400, {"detail": UNPAIRED_SURROGATE})
    attempt = Attempt.objects.get(run=run)
    assert (attempt.runtime_env, attempt.checkpoints.count()) == ({}, 0)


def test_runtime_report_with_nul_in_a_framework_name_is_400(world):
    run = submit(world)
    run_to_running(world, run)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=_attempt_of(run))

    response = _post_json(client, "/api/v1/attempts/report/", {"framework": {"torch\x00": "2.4"}})

    assert response.status_code == 400
    assert response.json() == {"framework": ["A framework name must not contain NUL characters."]}
    assert Attempt.objects.get(run=run).runtime_env == {}


def test_params_with_an_unpaired_surrogate_are_refused_by_the_submit_service(world):
    """The API's parser refuses such a body; a form's JSON reaches the service as parsed."""
    with pytest.raises(ValidationError) as refused:
        run_submit(
            user=world.researcher_a,
            data=experiment_input(world, params={"lr": 0.1, "note": "\ud800"}),
        )

    assert refused.value.message_dict == {
        "params": ["Must not contain unpaired surrogates (\\ud800 to \\udfff)."]
    }
    assert Run.objects.count() == 0


def test_token_throttle_keys_hold_no_raw_username(world):
    """The fuzzer's usernames made the throttle's cache keys carry spaces and control
    characters, which memcached refuses: a key now holds a hash of client and username."""

    def ident_for(username: str) -> str:
        body = {"username": username, "password": "guess"}
        request = APIRequestFactory().post("/api/v1/tokens/", body, format="json")
        return TokenCreateThrottle().ident(Request(request, parsers=[JSONParser()]))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        response = _post_json(
            APIClient(), "/api/v1/tokens/", {"username": "a b\x01", "password": "x"}
        )

    assert response.status_code == 400
    assert [w for w in caught if issubclass(w.category, CacheKeyWarning)] == []
    # The request claimed the first of its ten slots, under a key holding only a hash.
    digest = hashlib.sha256(b"127.0.0.1:a b\x01").hexdigest()
    assert cache.get(f"throttle:token-create:{digest}:0") is not None
    assert cache.get(f"throttle:token-create:{digest}:1") is None
    assert ident_for("Alice") == ident_for("alice") == "127.0.0.1:alice" != ident_for("bob")
