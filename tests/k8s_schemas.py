"""Kubernetes manifests checked against the official schemas, with each schema read once.

``kubernetes_validate.validate`` reads its JSON schema files (megabytes) and builds a new
validator on every call: 10 manifests a second. ``validate`` here picks the same schema
file the same way (the newest bundled version not newer than the one asked for, strict:
unknown fields fail), but builds one ``Draft202012Validator`` per (version, kind,
apiVersion), with the definitions already resolved, and reuses it. It raises what
kubernetes-validate raises: ``kubernetes_validate.ValidationError`` for a manifest the
schema refuses, ``SchemaNotFoundError`` for a kind it has no schema of.

PodGroup is a Volcano CRD, absent from the official schemas: it is checked against the
schema of its CRD (volcano-sh/volcano, scheduling.volcano.sh_podgroups.yaml, v1beta1),
vendored in tests/k8s_fake.
"""

import functools
import json
import re
from typing import Any

import importlib_resources
import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import major_minor
from referencing import Registry, Resource

from tests import TESTS

PODGROUP_SCHEMA = TESTS / "k8s_fake" / "podgroup-v1beta1.schema.json"
_SCHEMAS = "kubernetes-json-schema"


@functools.cache
def _bundled_version(desired: str) -> str:
    """The schema version kubernetes-validate would use for ``desired``."""
    desired = desired.removeprefix("v")
    if major_minor(desired) > kubernetes_validate.utils.latest_version():
        raise kubernetes_validate.utils.VersionNotSupportedError(version=major_minor(desired))
    return [
        version
        for version in kubernetes_validate.utils.all_versions()
        if major_minor(version) <= major_minor(desired)
    ][-1]


def _read(path: str) -> Any:
    resource = importlib_resources.files("kubernetes_validate").joinpath(path)
    return json.loads(resource.read_text())


@functools.cache
def _definitions(schema_dir: str) -> Registry:
    """The shared definitions of one schema directory, crawled once: every $ref into them
    resolves from memory."""
    return Resource.from_contents(_read(f"{_SCHEMAS}/{schema_dir}/_definitions.json")) @ Registry()


@functools.cache
def validator_for(version: str, kind: str, api_version: str) -> jsonschema.Draft202012Validator:
    """The strict validator of one kind, built once (same schema file and $ref resolution
    as ``kubernetes_validate.validate(…, strict=True)``)."""
    if kind == "PodGroup":
        return jsonschema.Draft202012Validator(json.loads(PODGROUP_SCHEMA.read_text()))
    bundled = _bundled_version(version)
    schema_dir = f"v{bundled}-local-strict"
    # rbac.authorization.k8s.io/v1 -> rbac-v1, as kubernetes-validate names its files
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = _read(f"{_SCHEMAS}/{schema_dir}/{kind.lower()}-{group_version}.json")
    except FileNotFoundError:
        raise kubernetes_validate.utils.SchemaNotFoundError(
            version=major_minor(version), kind=kind, api_version=api_version
        ) from None
    registry = (Resource.from_contents(schema) @ _definitions(schema_dir)).crawl()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(obj: dict, version: str) -> None:
    """Refuse ``obj`` exactly as ``kubernetes_validate.validate(obj, version, strict=True)``
    does (or, for a PodGroup, its CRD's schema)."""
    validator = validator_for(version, obj["kind"], obj["apiVersion"])
    if obj["kind"] == "PodGroup":
        validator.validate(obj)
        return
    try:
        validator.validate(obj)
    except jsonschema.ValidationError as error:
        raise kubernetes_validate.ValidationError(
            error, version=major_minor(_bundled_version(version))
        ) from None
