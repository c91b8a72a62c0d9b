"""Experiment specs on the client side: read the YAML, apply ``--set`` overrides."""

import sys
from pathlib import Path
from typing import Any

import yaml

from gantry_cli.errors import UsageError


def spec_load(source: str) -> dict[str, Any]:
    """The spec in file ``source`` (``-``: standard input) as a mapping."""
    name = "standard input" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        raise UsageError(f"Cannot read the spec {name}: {exc.strerror or exc}.") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"The spec {name} is not valid YAML: {exc}") from None
    if not isinstance(spec, dict):
        raise UsageError(f"The spec {name} is not a YAML mapping of keys to values.")
    return spec


def spec_set(spec: dict[str, Any], assignment: str) -> None:
    """Apply ``a.b.c=value`` in place; the value is parsed as YAML (``2`` is a number,
    ``true`` a boolean, ``'2'`` a string), an empty value is the empty string."""
    key, sep, raw = assignment.partition("=")
    path = key.strip().split(".")
    if not sep or not all(path):
        raise UsageError(f"--set takes key=value with a dotted key, not {assignment!r}.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise UsageError(f"--set {key}: the value is not valid YAML: {exc}") from None
    node = spec
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(path[: depth + 1])
            raise UsageError(f"--set {key}: {where} is not a mapping in the spec.")
        node = child
    node[path[-1]] = value


def spec_dump(spec: Any) -> str:
    return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, default_flow_style=False)
