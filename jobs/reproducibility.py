"""Pure helpers of the reproducibility record: per-attempt tokens and experiment diffs.

Plain data in, plain data out; no ORM, no settings.
"""

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from core.ids import MAX_ID
from jobs.experiment_fields import RECORD_FIELDS

ATTEMPT_TOKEN_PREFIX = "gat_"  # noqa: S105 (a prefix, not a password)

# The record's fields, in the order a diff shows them (``jobs.experiment_fields``): objects
# (``env``, ``params``) expand into one row per key (``env.NAME``, ``params.optimizer.lr``),
# labelled "<its label> <key>".
FIELD_LABELS = {field.name: field.row_label for field in RECORD_FIELDS}
_EXPANDED = {field.name for field in RECORD_FIELDS if field.type == "object"}


# --- per-attempt tokens ------------------------------------------------------------------

# ``gat_<attempt id>.<43 characters of base64url>``: 256 random bits. The id only says which
# attempt's digests to compare with; the random part is the secret. Nothing in it derives
# from a key, so reading the source (or the secret key) forges nothing.
ATTEMPT_TOKEN_RANDOM_BYTES = 32
_TOKEN_RANDOM_CHARS = 43  # base64url of 32 bytes, unpadded
_TOKEN_RANDOM = re.compile(r"[A-Za-z0-9_-]{43}")


def attempt_token_new(*, attempt_id: int) -> str:
    """A fresh token for one attempt, from the operating system's random source."""
    random_part = secrets.token_urlsafe(ATTEMPT_TOKEN_RANDOM_BYTES)
    assert len(random_part) == _TOKEN_RANDOM_CHARS
    return f"{ATTEMPT_TOKEN_PREFIX}{attempt_id}.{random_part}"


def attempt_token_digest(token: str) -> str:
    """What is stored of a token: its SHA-256, hex. A token has 256 random bits, so a fast
    hash is enough; the digest alone lets nobody report."""
    return hashlib.sha256(token.encode()).hexdigest()


def attempt_id_of_token(token: str) -> int | None:
    """The attempt id a token names, if it has a token's shape (canonical id, a random
    part of the right length and alphabet); None otherwise. Says nothing of genuineness."""
    if not token.startswith(ATTEMPT_TOKEN_PREFIX):
        return None
    raw_id, dot, random_part = token[len(ATTEMPT_TOKEN_PREFIX) :].partition(".")
    # Only the canonical spelling of an id: no signs, no leading zeros, no other digits.
    if not dot or not raw_id.isascii() or not raw_id.isdigit() or raw_id != str(int(raw_id)):
        return None
    if not _TOKEN_RANDOM.fullmatch(random_part) or int(raw_id) > MAX_ID:
        return None
    return int(raw_id)


def attempt_token_matches(token: str, digests: Iterable[str]) -> bool:
    """Whether the token's digest is one of ``digests``, each compared in constant time
    (and all of them, so the time says nothing about which one matched)."""
    mine = attempt_token_digest(token).encode()
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(mine, digest.encode())
    return matched


# --- experiment diff -----------------------------------------------------------------------


class DiffRow(NamedTuple):
    """One field of two records side by side. A value is None when the key is absent."""

    field: str
    value_a: str | None
    value_b: str | None
    differs: bool

    @property
    def label(self) -> str:
        section, dot, key = self.field.partition(".")
        if dot and section in _EXPANDED:
            return f"{FIELD_LABELS[section]} {key}"
        return FIELD_LABELS.get(self.field, self.field)


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested objects flattened to dotted keys; every leaf as its JSON text, so a string
    "1" and a number 1 stay apart. An empty object is a leaf ``{}``."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_params(value, prefix=f"{path}."))
        else:
            flat[path] = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return flat


def _scalar(value: object) -> str:
    return "" if value is None else str(value)


def _keyed_rows(name: str, a: Mapping[str, str], b: Mapping[str, str]) -> list[DiffRow]:
    return [
        DiffRow(f"{name}.{key}", a.get(key), b.get(key), a.get(key) != b.get(key))
        for key in sorted(set(a) | set(b))
    ]


def experiment_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[DiffRow]:
    """Every field of two records (mappings with the keys of ``RECORD_FIELDS``) side by
    side; environment variables and parameters key by key, nested parameters dotted."""
    rows: list[DiffRow] = []
    for name in FIELD_LABELS:
        if name == "env":
            env_a = {str(k): _scalar(v) for k, v in (a.get("env") or {}).items()}
            env_b = {str(k): _scalar(v) for k, v in (b.get("env") or {}).items()}
            rows.extend(_keyed_rows("env", env_a, env_b))
        elif name == "params":
            rows.extend(
                _keyed_rows(
                    "params",
                    flatten_params(a.get("params") or {}),
                    flatten_params(b.get("params") or {}),
                )
            )
        else:
            value_a, value_b = _scalar(a.get(name)), _scalar(b.get(name))
            rows.append(DiffRow(name, value_a, value_b, value_a != value_b))
    return rows


# --- runtime report ------------------------------------------------------------------------

# What a job may report about itself, in the order it is shown. Versions are strings;
# ``framework`` maps a framework's name to its version.
RUNTIME_VERSION_FIELDS = {
    "driver_version": "Driver",
    "cuda_version": "CUDA",
    "cudnn_version": "cuDNN",
    "nccl_version": "NCCL",
    "python_version": "Python",
}
RUNTIME_HOST_FIELDS = {"hostname": "Host", "kernel_version": "Kernel"}
RUNTIME_LIST_FIELDS = ("node_list", "gpu_uuids")


def runtime_env_of(report: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a report kept as the attempt's runtime environment: everything but the
    node list and GPU UUIDs, which have columns of their own."""
    return {name: value for name, value in report.items() if name not in RUNTIME_LIST_FIELDS}


def runtime_summary(report: Mapping[str, Any], *, attempt_number: int) -> str:
    """One line for the run's timeline, e.g. ``Attempt 1 reported driver 550.54.15, CUDA
    12.4, NCCL 2.21.5, torch 2.4.0 on 2 nodes with 16 GPUs``."""
    parts = [
        f"{label} {report[name]}"
        for name, label in RUNTIME_VERSION_FIELDS.items()
        if name in report
    ]
    parts += [f"{name} {version}" for name, version in sorted(report.get("framework", {}).items())]
    text = f"Attempt {attempt_number} reported " + (", ".join(parts) or "its runtime")
    where = []
    if report.get("node_list"):
        count = len(report["node_list"])
        where.append(f"{count} node{'s' if count != 1 else ''}")
    if report.get("gpu_uuids"):
        count = len(report["gpu_uuids"])
        where.append(f"{count} GPU{'s' if count != 1 else ''}")
    if where:
        text += " on " + " with ".join(where)
    return text


def runtime_rows(runtime_env: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A stored runtime environment as (label, value) rows to show, versions first."""
    rows = [
        (label, str(runtime_env[name]))
        for name, label in RUNTIME_VERSION_FIELDS.items()
        if name in runtime_env
    ]
    frameworks = runtime_env.get("framework") or {}
    if frameworks:
        listed = ", ".join(f"{name} {version}" for name, version in sorted(frameworks.items()))
        rows.append(("Frameworks", listed))
    rows += [
        (label, str(runtime_env[name]))
        for name, label in RUNTIME_HOST_FIELDS.items()
        if name in runtime_env
    ]
    return rows
