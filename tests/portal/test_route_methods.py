"""Issue 31.2: every route answers every HTTP method without a 5xx, as every persona.

One walk over ``get_resolver()``: every URL pattern, its URL arguments filled once with
objects that exist (tenant vision's, as in the authorization matrix) and once with ones
that do not, plus the matrix's own URL of the pattern (with its query string); each URL
gets GET, HEAD, OPTIONS, POST, PUT, PATCH, DELETE and TRACE from the six personas (the
matrix's valid bodies where it has them, none elsewhere). Whatever the answer, it is not a
server error. Each request is rolled back, so the walk's writes do not change what the next
request sees."""

import copy
import json
import re
import time
from urllib.parse import urlencode

import pytest
from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.core.cache import cache
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.exceptions import Resolver404

from tenants.models import Tenant

# The authorization matrix's fixture: tenant vision's run, experiment, template, image…
from tests.portal.test_authz_matrix import (
    ANON,
    PERSONAS,
    Objects,
    bodies,
    clients,
    objects,  # noqa: F401
    paths,
)

METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE", "TRACE")
MISSING_ID, MISSING_SLUG = "987654", "no-such-thing"

# A URL argument in a route: path() converters and regular-expression groups.
_CONVERTER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")
_GROUP = re.compile(r"\(\?P<(?P<name>\w+)>(?P<body>[^()]*(?:\([^()]*\)[^()]*)*)\)")


def patterns(resolver=None, prefix: str = "", namespace: str = ""):
    """(full name or None, route text, pattern) of every URL pattern, includes walked."""
    for pattern in (resolver or get_resolver()).url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = namespace
            if pattern.namespace:
                inner = f"{namespace}:{pattern.namespace}" if namespace else pattern.namespace
            yield from patterns(pattern, route, inner)
        elif isinstance(pattern, URLPattern):
            name = pattern.name and (f"{namespace}:{pattern.name}" if namespace else pattern.name)
            yield name, route, pattern


def _existing(argument: str, route: str, world_objects: Objects) -> str:
    """A value of ``argument`` naming an object that exists, by what the route is about."""
    admin = re.match(r"admin/(\w+)/(\w+)/", route)
    if admin and argument in {"object_id", "id"}:
        model = apps.get_model(admin[1], admin[2])
        first = model._default_manager.order_by("pk").first()
        return str(first.pk) if first is not None else MISSING_ID
    by_route = [
        ("experiments", world_objects.experiment.pk),
        ("runs", world_objects.run.pk),
        ("images", world_objects.image.pk),
        ("templates", world_objects.template.pk),
        ("tokens", world_objects.alice_token_id),
        ("members", world_objects.users["alice"].pk),
        ("registries", "matrix"),
        ("clusters", "sim-1"),
        ("flavors", "a100-80gb"),
        ("what-if", world_objects.replay_id),
        ("replays", world_objects.replay_id),
    ]
    values = {
        "user_id": str(world_objects.users["alice"].pk),
        "tenant_slug": "vision",
        "month": f"{world_objects.month:%Y-%m}",
        "format": "json",
        "content_type_id": str(ContentType.objects.get_for_model(Tenant).pk),
        "object_id": str(world_objects.run.tenant_id),
        "url": "nothing-here",  # the admin's catch-all: only URLs of nothing match it
    }
    if argument in values:
        return values[argument]
    if argument in {"slug", "name"}:
        for word, value in by_route:
            if f"{word}/" in route and isinstance(value, str):
                return value
        return "vision"
    # An integer id: the last resource named before it in the route.
    before = route[: route.find(argument)]
    named = [(before.rfind(f"{word}/"), value) for word, value in by_route]
    position, value = max(named, key=lambda pair: pair[0])
    return str(value) if position >= 0 else MISSING_ID


def _missing(argument: str, converter_or_regex: str) -> str:
    if argument == "month":
        return "1999-01"
    if argument == "format":
        return "xml"
    if argument == "url":
        return "no-such-page/"
    if argument == "app_label":
        return "tenants"
    digits_only = converter_or_regex in {"int"} or converter_or_regex.startswith(("[0-9]", r"\d"))
    return MISSING_ID if digits_only or argument.endswith("id") else MISSING_SLUG


def urls_of(route: str, world_objects: Objects) -> dict[str, str]:
    """The route with its arguments filled: {"exists": url, "missing": url}."""
    filled = {}
    for variant in ("exists", "missing"):

        def convert(match: re.Match, variant=variant) -> str:
            name = match["name"]
            spec = match.groupdict().get("converter") or match.groupdict().get("body") or "str"
            if name == "app_label":
                return spec.split("|")[0] if "|" in spec else "tenants"
            if variant == "missing":
                return _missing(name, spec)
            return _existing(name, route, world_objects)

        text = _CONVERTER.sub(convert, _GROUP.sub(convert, route))
        text = text.replace("^", "").replace("$", "").replace("/?", "/").replace("\\.", ".")
        filled[variant] = "/" + text
    return filled


def _send(client: Client, method: str, path: str, data, *, api: bool, headers: dict):
    if method in {"GET", "HEAD", "OPTIONS", "TRACE"}:
        return client.generic(method, path, headers=headers)
    if api:
        body, content_type = json.dumps(data or {}), "application/json"
    elif method == "POST":
        return client.post(path, data or {}, headers=headers)
    else:
        body, content_type = urlencode(data or {}, doseq=True), "application/x-www-form-urlencoded"
    return client.generic(method, path, body, content_type=content_type, headers=headers)


def targets_of(objects: Objects) -> list[tuple[str | None, str]]:  # noqa: F811
    """(pattern name, URL) for every URL pattern: its arguments filled with objects that
    exist and with ones that do not, and the authorization matrix's URL of it."""
    known = paths(objects)
    targets, unresolved = [], []
    for name, route, pattern in patterns():
        urls = set(urls_of(route, objects).values())
        if name in known:
            urls.add(known[name])
        for url in sorted(urls):
            try:
                match = resolve(url.split("?")[0])
            except Resolver404:
                match = None
            if match is None or match.func is not pattern.callback:
                unresolved.append(f"{route} -> {url}")
                continue
            targets.append((name, url))
    assert not unresolved, "routes the walk could not fill:\n" + "\n".join(unresolved)
    return targets


# One test, run once per persona: the personas' walks are independent (every request is
# rolled back), so pytest-xdist runs them side by side and each stays under a minute.
@pytest.mark.django_db
@pytest.mark.parametrize("persona", PERSONAS)
def test_every_route_answers_every_method_without_a_server_error(objects, persona):  # noqa: F811
    cache.clear()  # the token endpoint's throttle
    client = clients(objects)[persona]
    client.raise_request_exception = False
    sent, targets = bodies(objects), targets_of(objects)
    errors: list[str] = []
    count = 0
    started = time.monotonic()
    for name, url in targets:
        api = url.startswith("/api/v1/")
        headers = {}
        if api and persona != ANON:
            headers = {"Authorization": f"Bearer {objects.tokens[persona]}"}
        for method in METHODS:
            cookies = copy.deepcopy(client.cookies)  # a logout rotates them
            with transaction.atomic():
                response = _send(
                    client, method, url, sent.get(name or ""), api=api, headers=headers
                )
                transaction.set_rollback(True)
            client.cookies = cookies
            count += 1
            if response.status_code >= 500:
                errors.append(f"{method} {url}: {response.status_code}")
    elapsed = time.monotonic() - started
    print(f"{persona}: {count} requests to {len(targets)} URLs in {elapsed:.1f} s")
    assert not errors, f"{len(errors)} of {count} requests answered 5xx:\n" + "\n".join(errors)
    assert count == len(targets) * len(METHODS)
