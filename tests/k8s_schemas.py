"""Kubernetes manifests checked against the official schemas, with each schema read once.

``kubernetes_validate.validate`` reads its JSON schema files (megabytes) and builds a new
validator on every call: 10 manifests a second. ``validate`` here picks the same schema
file the same way (the newest bundled version not newer than the one asked for, strict:
unknown fields fail), but builds one validator per (version, kind, apiVersion), with the
definitions already resolved, and reuses it: jsonschema-rs's compiled one answers whether a
manifest is valid (~190,000 a second); only for one it refuses does jsonschema's
``Draft202012Validator`` of the same schema find the error to raise. It raises what
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
import jsonschema_rs
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


@functools.cache
def _compiled_for(version: str, kind: str, api_version: str) -> jsonschema_rs.Validator:
    """The same schema as ``validator_for``, compiled by jsonschema-rs. The schemas name
    their definitions by an absolute path (``/api/_definitions.json``), which resolves
    against the definitions' own ``$id`` when the schema is given one on that host."""
    if kind == "PodGroup":
        return jsonschema_rs.Draft202012Validator(json.loads(PODGROUP_SCHEMA.read_text()))
    schema = validator_for(version, kind, api_version).schema  # its errors, if any, first
    schema_dir = f"v{_bundled_version(version)}-local-strict"
    definitions = _read(f"{_SCHEMAS}/{schema_dir}/_definitions.json")
    home = definitions["$id"].rsplit("/", 1)[0]
    registry = jsonschema_rs.Registry([(definitions["$id"], definitions)])
    return jsonschema_rs.Draft202012Validator(
        {**schema, "$id": f"{home}/{kind.lower()}.json"}, registry=registry
    )


def validate(obj: dict, version: str) -> None:
    """Refuse ``obj`` exactly as ``kubernetes_validate.validate(obj, version, strict=True)``
    does (or, for a PodGroup, its CRD's schema)."""
    if _compiled_for(version, obj["kind"], obj["apiVersion"]).is_valid(obj):
        return
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
