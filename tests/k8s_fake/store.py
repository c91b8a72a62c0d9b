"""The fake API server's storage: objects by resource, namespace and name, one global
resourceVersion, an event log for watches, label and field selectors, owner-reference
garbage collection. Thread-safe: every method takes the store's lock.

Two forms of each object. The live one is the store's and the controller's working copy,
changed in place. The recorded one is what every change writes, under a new
resourceVersion (``_emit``): an immutable snapshot and its JSON text, as the API server's
watch cache keeps them. Every read a client makes (get, list, watch) is served from the
recorded form, so a client never sees a change that was not written, and a list sends the
text written with the change instead of encoding the object again."""

from __future__ import annotations

import base64
import bisect
import copy
import itertools
import json
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# plural -> (apiVersion, kind, namespaced, group for messages)
RESOURCES: dict[str, tuple[str, str, bool, str]] = {
    "namespaces": ("v1", "Namespace", False, ""),
    "nodes": ("v1", "Node", False, ""),
    "pods": ("v1", "Pod", True, ""),
    "services": ("v1", "Service", True, ""),
    "secrets": ("v1", "Secret", True, ""),
    "persistentvolumeclaims": ("v1", "PersistentVolumeClaim", True, ""),
    "events": ("v1", "Event", True, ""),
    "jobs": ("batch/v1", "Job", True, "batch"),
    "podgroups": ("scheduling.volcano.sh/v1beta1", "PodGroup", True, "scheduling.volcano.sh"),
}
EVENT_LOG_SIZE = 100_000
# What the API server's StorageObjectInUseProtection admission puts on every claim: deleting
# a claim a pod uses leaves it Terminating until no pod does (the controller finishes it).
PVC_PROTECTION = "kubernetes.io/pvc-protection"


class ApiError(Exception):
    """Rendered by the server as a Status object with this code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _qualified(plural: str) -> str:
    group = RESOURCES[plural][3]
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(plural)} "{name}" not found',
        {"name": name, "group": RESOURCES[plural][3], "kind": plural},
    )


# --- selectors -------------------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*(\S+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([^!=\s]+)\s*(==|=|!=)\s*([^=\s]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)([^!=\s()]+)\s*$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def label_matcher(selector: str | None) -> Callable[[dict], bool]:
    """=, ==, !=, in, notin, exists and !exists, ANDed; a bad selector is a 400."""
    if not selector:
        return lambda labels: True
    checks: list[Callable[[dict], bool]] = []
    for term in _split_terms(selector):
        if match := _SET_TERM.match(term):
            key, op = match.group(1), match.group(2)
            values = {v.strip() for v in match.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda lb, k=key, vs=values: lb.get(k) in vs)
            else:
                checks.append(lambda lb, k=key, vs=values: lb.get(k) not in vs)
        elif match := _EQ_TERM.match(term):
            key, op, value = match.groups()
            if op == "!=":
                checks.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                checks.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif match := _EXISTS_TERM.match(term):
            negate, key = match.groups()
            if negate:
                checks.append(lambda lb, k=key: k not in lb)
            else:
                checks.append(lambda lb, k=key: k in lb)
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    if len(checks) == 1:
        return checks[0]
    return lambda labels: all(check(labels) for check in checks)


def _path(obj: dict, dotted: str):
    value = obj
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


# The fields each resource may be selected by (the API server's field label conversions);
# metadata.name and metadata.namespace work for every resource.
SELECTABLE_FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "nodes": frozenset({"spec.unschedulable"}),
    "events": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    "jobs": frozenset({"status.successful"}),
}


def field_matcher(selector: str | None, plural: str = "") -> Callable[[dict], bool]:
    """=, == and != on the fields the resource supports, ANDed; an empty value matches an
    unset field (``spec.nodeName!=``: the pods bound to a node). Others are a 400."""
    if not selector:
        return lambda obj: True
    supported = {"metadata.name", "metadata.namespace"} | SELECTABLE_FIELDS.get(plural, set())
    checks = []
    for term in _split_terms(selector):
        match = _EQ_TERM.match(term)
        if not match:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        key, op, value = match.groups()
        if plural and key not in supported:
            raise ApiError(400, "BadRequest", f'field label not supported: "{key}"')
        if op == "!=":
            checks.append(lambda o, k=key, v=value: str(_path(o, k) or "") != v)
        else:
            checks.append(lambda o, k=key, v=value: str(_path(o, k) or "") == v)
    return lambda obj: all(check(obj) for check in checks)


# --- paging ----------------------------------------------------------------------------------


def _key(obj: dict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def _encode_continue(rv: int, after: tuple[str, str]) -> str:
    raw = json.dumps({"rv": rv, "start": list(after)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(raw["rv"]), (str(raw["start"][0]), str(raw["start"][1]))
    except (ValueError, KeyError, IndexError, TypeError):
        raise ApiError(400, "BadRequest", "continue key is not valid") from None


# --- patches ---------------------------------------------------------------------------------


def merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386 merge patch; strategic merge patches are applied the same way, which is
    right for every patch Gantry sends (maps and whole lists)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def json_patch(target: dict, operations: list) -> dict:
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = target
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if op["op"] == "add":
                    parent.insert(index, op["value"])
                else:
                    parent[index] = op["value"]
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                parent.pop(last, None)
        else:
            raise ApiError(422, "Invalid", f"unsupported JSON patch op {op['op']}")
    return target


# --- the store -------------------------------------------------------------------------------


def claims_of(pod: dict) -> list[str]:
    """The PersistentVolumeClaims a pod's volumes name."""
    return [
        volume["persistentVolumeClaim"]["claimName"]
        for volume in (pod.get("spec") or {}).get("volumes") or []
        if "persistentVolumeClaim" in volume
    ]


@dataclass
class WatchEvent:
    rv: int
    type: str
    plural: str
    namespace: str
    obj: dict


@dataclass(frozen=True)
class Recorded:
    """An object as a change wrote it: never changed afterwards (a new change makes a new
    one), so its text is its JSON for as long as it is the object's latest."""

    obj: dict
    text: str


class Clock:
    """The fake cluster's time: starts at a whole second of real time, moves when told."""

    def __init__(self, start: datetime | None = None):
        self.now = (start or datetime.now(UTC)).replace(microsecond=0)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def catch_up(self) -> None:
        """To the next whole second of real time, if behind it: what the cluster does next
        comes after what Gantry recorded so far (a clock started while a slow machine set
        up the test's database can lag its first submit by seconds)."""
        self.now = max(self.now, datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1))

    def stamp(self, at: datetime | None = None) -> str:
        return (at or self.now).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(self, clock: Clock | None = None):
        self.clock = clock or Clock()
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects: dict[str, dict[str, dict[str, dict]]] = {p: {} for p in RESOURCES}
        # The same layout, each object's latest recorded form: what clients read.
        self.recorded: dict[str, dict[str, dict[str, Recorded]]] = {p: {} for p in RESOURCES}
        self._keys: dict[str, list[tuple[str, str]]] = {}  # plural -> sorted recorded keys
        self.rv = 1
        self.events: deque[WatchEvent] = deque(maxlen=EVENT_LOG_SIZE)
        self._names = itertools.count(1)

    # reads

    def get(self, plural: str, namespace: str, name: str) -> dict:
        with self.lock:
            recorded = self.recorded[plural].get(namespace, {}).get(name)
            if recorded is None:
                raise not_found(plural, name)
            return json.loads(recorded.text)

    def find(self, plural: str, namespace: str, name: str) -> dict | None:
        """The stored object itself (for the controller, under the lock), or None."""
        return self.objects[plural].get(namespace, {}).get(name)

    def iter(self, plural: str, namespace: str | None = None) -> Iterator[dict]:
        buckets = (
            [self.objects[plural].get(namespace, {})]
            if namespace is not None
            else list(self.objects[plural].values())
        )
        for bucket in buckets:
            yield from list(bucket.values())

    def list(
        self,
        plural: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict], str]:
        items, rv, _, _ = self.list_page(
            plural, namespace, label_selector=label_selector, field_selector=field_selector
        )
        return items, rv

    def list_page(
        self,
        plural: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 0,
        continue_token: str = "",
        as_text: bool = False,
    ) -> tuple[list, str, str, int | None]:
        """Matching objects in key order (namespace, name) as etcd keeps them, as last
        recorded: at most ``limit`` (0: all), read from the key after the one the continue
        token names, as etcd reads a range. Returns the items (copies, or with ``as_text``
        each one's recorded JSON text), the resourceVersion, the next continue token (""
        at the end) and how many remain (None with a selector: the API server does not
        count them either).

        A token older than the event log (what etcd compaction does) is 410 Expired. The
        pages are not a snapshot: objects changed between them show as they are now."""
        labels_ok = label_matcher(label_selector)
        fields_ok = field_matcher(field_selector, plural)
        selected = bool(label_selector or field_selector)
        with self.lock:
            if continue_token:
                started_rv, after = _decode_continue(continue_token)
                if self.events and started_rv < self.events[0].rv - 1:
                    raise ApiError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue "
                        "parameter.",
                    )
            else:
                started_rv, after = self.rv, None
            keys = self._sorted_keys(plural)
            # The keys of the namespace asked for (all of them if none): one range.
            first = 0 if namespace is None else bisect.bisect_left(keys, (namespace, ""))
            end = len(keys) if namespace is None else bisect.bisect_left(keys, (namespace + "\0",))
            if after is not None:
                first = max(first, bisect.bisect_right(keys, after))
            recorded = self.recorded[plural]
            page: list[Recorded] = []
            more, last = False, first - 1
            for index in range(first, end):
                key = keys[index]
                candidate = recorded[key[0]][key[1]]
                obj = candidate.obj
                if not (
                    labels_ok((obj.get("metadata") or {}).get("labels") or {}) and fields_ok(obj)
                ):
                    continue
                if limit > 0 and len(page) == limit:
                    more = True
                    break
                page.append(candidate)
                last = index
            token = _encode_continue(started_rv, _key(page[-1].obj)) if more else ""
            remaining = None if selected or not more else end - last - 1
            items = [r.text if as_text else json.loads(r.text) for r in page]
            return items, str(self.rv), token, remaining

    def _sorted_keys(self, plural: str) -> list[tuple[str, str]]:
        """Every recorded (namespace, name) of the resource in order, kept until one comes
        or goes (etcd's key order)."""
        keys = self._keys.get(plural)
        if keys is None:
            keys = self._keys[plural] = sorted(
                (namespace, name)
                for namespace, bucket in self.recorded[plural].items()
                for name in bucket
            )
        return keys

    def unrecorded(self) -> list[tuple[str, str, str]]:
        """(resource, namespace, name) of every object changed in place since its last
        recorded change, or never recorded: what no client could see. Empty, always."""
        with self.lock:
            return [
                (plural, namespace, name)
                for plural, buckets in self.objects.items()
                for namespace, bucket in buckets.items()
                for name, obj in bucket.items()
                if (recorded := self.recorded[plural].get(namespace, {}).get(name)) is None
                or recorded.obj != obj
            ]

    # writes

    def _emit(self, kind: str, plural: str, obj: dict) -> None:
        """Record a change: a new resourceVersion, the object's recorded form (gone with
        DELETED) and the event watches send."""
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        namespace = meta.get("namespace", "")
        recorded = self._record(plural, obj)
        if kind == "DELETED":
            self.recorded[plural].get(namespace, {}).pop(meta["name"], None)
            self._keys.pop(plural, None)
        self.events.append(WatchEvent(self.rv, kind, plural, namespace, recorded.obj))
        self.changed.notify_all()

    def _record(self, plural: str, obj: dict) -> Recorded:
        text = json.dumps(obj)
        recorded = Recorded(json.loads(text), text)
        meta = obj["metadata"]
        bucket = self.recorded[plural].setdefault(meta.get("namespace", ""), {})
        if meta["name"] not in bucket:
            self._keys.pop(plural, None)
        bucket[meta["name"]] = recorded
        return recorded

    def create(self, plural: str, namespace: str, body: dict) -> dict:
        api_version, kind, namespaced, _ = RESOURCES[plural]
        with self.lock:
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ApiError(422, "Invalid", f"{kind}: metadata.name: Required value")
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
            name = meta["name"]
            if namespaced:
                if namespace not in self.objects["namespaces"].get("", {}):
                    raise not_found("namespaces", namespace)
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            bucket = self.objects[plural].setdefault(namespace if namespaced else "", {})
            if name in bucket:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{_qualified(plural)} "{name}" already exists',
                    {"name": name, "group": RESOURCES[plural][3], "kind": plural},
                )
            obj["apiVersion"], obj["kind"] = api_version, kind
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = self.clock.stamp()
            meta.setdefault("generation", 1)
            if plural == "secrets" and "stringData" in obj:
                data = obj.setdefault("data", {})
                for key, value in obj.pop("stringData").items():
                    data[key] = base64.b64encode(str(value).encode()).decode()
            if plural == "namespaces":
                obj.setdefault("status", {"phase": "Active"})
            if plural == "persistentvolumeclaims":
                meta["finalizers"] = [*meta.get("finalizers", []), PVC_PROTECTION]
                obj["status"] = {"phase": "Pending"}
            bucket[name] = obj
            self._emit("ADDED", plural, obj)
            return copy.deepcopy(obj)

    def _check_version(self, current: dict, body: dict) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            name = current["metadata"]["name"]
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {current["kind"].lower()}s "{name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
            )

    def replace(self, plural: str, namespace: str, name: str, body: dict) -> dict:
        with self.lock:
            current = self.find(plural, namespace, name)
            if current is None:
                raise not_found(plural, name)
            self._check_version(current, body)
            obj = copy.deepcopy(body)
            for key in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
                if key in current["metadata"]:
                    obj.setdefault("metadata", {})[key] = current["metadata"][key]
            obj["apiVersion"], obj["kind"] = current["apiVersion"], current["kind"]
            self.objects[plural][namespace][name] = obj
            self._emit("MODIFIED", plural, obj)
            return copy.deepcopy(obj)

    def patch(self, plural: str, namespace: str, name: str, patch, content_type: str) -> dict:
        with self.lock:
            current = self.find(plural, namespace, name)
            if current is None:
                raise not_found(plural, name)
            # Applied to a copy: a patch refused halfway changes nothing.
            patched = copy.deepcopy(current)
            if isinstance(patch, list):
                if "json-patch" not in content_type:
                    raise ApiError(415, "UnsupportedMediaType", "a list body needs json-patch")
                json_patch(patched, copy.deepcopy(patch))
            elif isinstance(patch, dict):
                self._check_version(current, patch)
                patch = copy.deepcopy(patch)
                (patch.get("metadata") or {}).pop("resourceVersion", None)
                merge_patch(patched, patch)
            else:
                raise ApiError(400, "BadRequest", "the patch is not a JSON object or list")
            current.clear()
            current.update(patched)  # the same dict: the controller may hold it
            self._emit("MODIFIED", plural, current)
            return copy.deepcopy(current)

    def touch(self, plural: str, obj: dict) -> None:
        """Record a change the controller made to a stored object in place."""
        with self.lock:
            self._emit("MODIFIED", plural, obj)

    def dependents(self, uid: str) -> list[tuple[str, dict]]:
        found = []
        for plural in RESOURCES:
            for obj in self.iter(plural):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == uid for ref in refs):
                    found.append((plural, obj))
        return found

    def remove(self, plural: str, obj: dict) -> None:
        meta = obj["metadata"]
        bucket = self.objects[plural].get(meta.get("namespace", ""), {})
        if bucket.get(meta["name"]) is obj:
            del bucket[meta["name"]]
            self._emit("DELETED", plural, obj)

    def delete(self, plural: str, namespace: str, name: str, propagation: str | None) -> dict:
        """DELETE with propagationPolicy: Foreground keeps the object (deletionTimestamp,
        finalizer foregroundDeletion) until the controller has removed its dependents;
        Background removes it and collects its dependents; Orphan leaves them ownerless.
        Jobs default to Orphan, as on a real API server. A PersistentVolumeClaim that a pod
        still mounts stays, Terminating, until no pod does (``PVC_PROTECTION``; the
        controller removes it then)."""
        with self.lock:
            obj = self.find(plural, namespace, name)
            if obj is None:
                raise not_found(plural, name)
            if plural == "persistentvolumeclaims":
                return self._delete_claim(obj)
            policy = propagation or ("Orphan" if plural == "jobs" else "Background")
            uid = obj["metadata"]["uid"]
            dependents = self.dependents(uid)
            if policy == "Foreground" and dependents:
                meta = obj["metadata"]
                if not meta.get("deletionTimestamp"):
                    meta["deletionTimestamp"] = self.clock.stamp()
                    meta["finalizers"] = [*meta.get("finalizers", []), "foregroundDeletion"]
                    self._emit("MODIFIED", plural, obj)
                for dep_plural, dep in dependents:
                    self.mark_deleted(dep_plural, dep)
                return copy.deepcopy(obj)
            self.remove(plural, obj)
            if policy == "Orphan":
                for dep_plural, dep in dependents:
                    dep["metadata"]["ownerReferences"] = [
                        r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != uid
                    ]
                    self._emit("MODIFIED", dep_plural, dep)
            else:
                self.collect_garbage()
            if plural == "namespaces":
                for other in RESOURCES:
                    for item in list(self.objects[other].get(name, {}).values()):
                        self.remove(other, item)
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {
                    "name": name,
                    "group": RESOURCES[plural][3],
                    "kind": plural,
                    "uid": uid,
                },
            }

    def _delete_claim(self, claim: dict) -> dict:
        """A claim's DELETE answers with the claim (the API server returns the deleted
        object for claims, not a Status), marked as being deleted: kept while a pod mounts
        it, else gone at once (the pvc-protection controller is quick about it)."""
        meta = claim["metadata"]
        fresh = not meta.get("deletionTimestamp")
        if fresh:
            meta["deletionTimestamp"] = self.clock.stamp()
        if self.claim_in_use(meta["namespace"], meta["name"]):
            if fresh:
                self._emit("MODIFIED", "persistentvolumeclaims", claim)
            return copy.deepcopy(claim)
        meta["finalizers"] = [f for f in meta.get("finalizers", []) if f != PVC_PROTECTION]
        self.remove("persistentvolumeclaims", claim)
        return copy.deepcopy(claim)

    def claim_in_use(self, namespace: str, name: str) -> bool:
        """Whether a pod that has not ended mounts the claim ``name``."""
        return any(
            (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and name in claims_of(pod)
            for pod in self.iter("pods", namespace)
        )

    def mark_deleted(self, plural: str, obj: dict) -> None:
        """Pods terminate first (the controller removes them on its next step); other
        objects go at once."""
        if plural == "pods":
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = self.clock.stamp()
                self._emit("MODIFIED", plural, obj)
        else:
            self.remove(plural, obj)
            self.collect_garbage()

    def collect_garbage(self) -> None:
        """Remove what is owned only by objects that no longer exist; finish foreground
        deletions whose dependents are gone."""
        with self.lock:
            while True:
                uids = {obj["metadata"]["uid"] for p in RESOURCES for obj in self.iter(p)}
                removed = False
                for plural in RESOURCES:
                    for obj in self.iter(plural):
                        refs = obj["metadata"].get("ownerReferences") or []
                        if refs and not any(ref.get("uid") in uids for ref in refs):
                            if plural == "pods" and not obj["metadata"].get("deletionTimestamp"):
                                self.mark_deleted(plural, obj)
                            elif plural != "pods":
                                self.remove(plural, obj)
                                removed = True
                        finalizers = obj["metadata"].get("finalizers") or []
                        if "foregroundDeletion" in finalizers and not self.dependents(
                            obj["metadata"]["uid"]
                        ):
                            self.remove(plural, obj)
                            removed = True
                if not removed:
                    return

    def events_since(self, rv: int) -> list[WatchEvent] | None:
        """Events after ``rv``; None when ``rv`` is older than the log keeps (410 Gone)."""
        if self.events and rv < self.events[0].rv - 1:
            return None
        return [event for event in self.events if event.rv > rv]

    def next_name(self) -> int:
        return next(self._names)

    def seed(self, plural: str, obj: dict) -> None:
        """Put a finished object straight into the store (benchmarks): no checks."""
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", self.clock.stamp())
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        bucket = self.objects[plural].setdefault(meta.get("namespace", ""), {})
        bucket[meta["name"]] = obj
        self._record(plural, obj)
