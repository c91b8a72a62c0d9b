"""The fake API server's HTTP side: real HTTP/1.1 and JSON on 127.0.0.1, the paths and
bodies of the Kubernetes API for the resources in ``store.RESOURCES`` (lists namespaced
and across all namespaces, with label and field selectors, ``limit`` and ``continue``),
watch streams, pod logs, Status errors, optional bearer-token auth and TLS, injected
5xx/429 faults, and stop/start on the same port (an outage)."""

import contextlib
import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.k8s_fake.store import RESOURCES, ApiError, Store, label_matcher, not_found

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?"
    r"(?:/(?P<sub>log|status))?$"
)
VERSION = {
    "major": "1",
    "minor": "37",
    "emulationMajor": "1",
    "emulationMinor": "37",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "36",
    "gitVersion": "v1.37.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-08-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass
class Fault:
    status: int
    remaining: int
    path: re.Pattern | None
    retry_after: int | None


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class FakeApiServer:
    def __init__(
        self,
        store: Store,
        *,
        port: int = 0,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        logs=None,
    ):
        self.store = store
        self.port = port
        self.token = token
        self.ssl_context = ssl_context
        self.logs = logs  # callable (namespace, pod name) -> list[str]
        self.requests: list[Request] = []
        self.record = True
        self.faults: list[Fault] = []
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._guard = threading.Lock()
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> "FakeApiServer":
        self.stopping.clear()
        httpd = _Server(("127.0.0.1", self.port), _handler_for(self))
        if self.ssl_context is not None:
            httpd.socket = self.ssl_context.wrap_socket(httpd.socket, server_side=True)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering, and drop open keep-alive and watch connections: an outage."""
        if self._httpd is None:
            return
        self.stopping.set()
        with self.store.changed:
            self.store.changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._guard:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._connections.clear()
        self._httpd = None

    def fail_next(
        self, count: int, *, status: int = 503, path: str | None = None, retry_after=None
    ) -> None:
        """Answer the next ``count`` requests (whose path matches ``path``) with ``status``."""
        with self._guard:
            self.faults.append(
                Fault(status, count, re.compile(path) if path else None, retry_after)
            )

    def take_fault(self, path: str) -> Fault | None:
        with self._guard:
            for fault in self.faults:
                if fault.remaining > 0 and (fault.path is None or fault.path.search(path)):
                    fault.remaining -= 1
                    return fault
            self.faults = [f for f in self.faults if f.remaining > 0]
        return None

    def count(self, method: str | None = None, pattern: str = "") -> int:
        regex = re.compile(pattern)
        return sum(
            1
            for r in list(self.requests)
            if (method is None or r.method == method) and regex.search(r.path)
        )

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._guard:
            (self._connections.add if add else self._connections.discard)(conn)


def _handler_for(api: FakeApiServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "gantry-fake-apiserver"
        timeout = 30

        def setup(self):
            super().setup()
            # Headers and body go out in separate writes: without this, Nagle's algorithm
            # and delayed ACKs add 40 ms to every keep-alive request.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            api.track(self.connection, True)

        def finish(self):
            try:
                super().finish()
            finally:
                api.track(self.connection, False)

        def log_message(self, format, *args):  # quiet
            pass

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

        def do_PUT(self):
            self._serve("PUT")

        def do_PATCH(self):
            self._serve("PATCH")

        def do_DELETE(self):
            self._serve("DELETE")

        # plumbing

        def _send(self, code: int, body, content_type="application/json", headers=None):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return None
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError(400, "BadRequest", "the body is not JSON") from None

        def _serve(self, method: str):
            if api.stopping.is_set():
                self.close_connection = True
                return
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            if api.record:
                api.requests.append(Request(method, parts.path, query))
            try:
                fault = api.take_fault(parts.path)
                if fault is not None:
                    reason = "TooManyRequests" if fault.status == 429 else "InternalError"
                    headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after else {}
                    error = ApiError(fault.status, reason, f"injected fault {fault.status}")
                    self._body()
                    self._send(fault.status, error.status(), headers=headers)
                    return
                if api.token is not None and (
                    self.headers.get("Authorization") != f"Bearer {api.token}"
                ):
                    self._body()
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                self._route(method, parts.path, query)
            except ApiError as error:
                self._send(error.code, error.status())
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _route(self, method: str, path: str, query: dict):
            store = api.store
            if path.rstrip("/") == "/version" and method == "GET":
                self._send(200, VERSION)
                return
            if path == "/apis/authentication.k8s.io/v1/selfsubjectreviews" and method == "POST":
                self._body()
                self._send(
                    201,
                    {
                        "kind": "SelfSubjectReview",
                        "apiVersion": "authentication.k8s.io/v1",
                        "metadata": {"creationTimestamp": store.clock.stamp()},
                        "status": {
                            "userInfo": {
                                "username": "system:serviceaccount:gantry:gantry",
                                "groups": ["system:serviceaccounts", "system:authenticated"],
                            }
                        },
                    },
                )
                return
            match = _PATH.match(path)
            if not match:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            plural, name, sub = match["plural"], match["name"], match["sub"]
            namespace = match["ns"]
            api_version = "v1" if match["core"] else f"{match['group']}/{match['version']}"
            if plural not in RESOURCES or RESOURCES[plural][0] != api_version:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            namespaced = RESOURCES[plural][2]
            if namespaced != (namespace is not None) and not (
                namespaced and namespace is None and name is None and method == "GET"
            ):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            scope = namespace if namespaced else ""
            if sub == "log":
                self._log(scope, name, query)
                return
            if method == "GET" and name is None:
                if query.get("watch") in ("1", "true"):
                    self._watch(plural, namespace, query)
                    return
                try:
                    limit = int(query.get("limit") or 0)
                except ValueError:
                    raise ApiError(400, "BadRequest", "limit must be an integer") from None
                items, rv, token, remaining = store.list_page(
                    plural,
                    namespace if namespaced else None,
                    label_selector=query.get("labelSelector"),
                    field_selector=query.get("fieldSelector"),
                    limit=limit,
                    continue_token=query.get("continue") or "",
                    as_text=True,
                )
                list_meta: dict = {"resourceVersion": rv}
                if token:
                    list_meta["continue"] = token
                if token and remaining is not None:
                    list_meta["remainingItemCount"] = remaining
                kind = RESOURCES[plural][1]
                head = json.dumps(
                    {"kind": f"{kind}List", "apiVersion": api_version, "metadata": list_meta}
                )
                # Each item as its change recorded it (the watch cache's serialized form).
                body = f'{head[:-1]}, "items": [{", ".join(items)}]}}'
                self._send(200, body.encode())
            elif method == "GET":
                self._send(200, store.get(plural, scope, name))
            elif method == "POST" and name is None:
                body = self._body()
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "the body must be a JSON object")
                kind = RESOURCES[plural][1]
                if body.get("kind") not in (None, kind):
                    raise ApiError(400, "BadRequest", f"expected kind {kind}, got {body['kind']}")
                if plural == "jobs":
                    _validate_job(body)
                if plural == "persistentvolumeclaims":
                    _validate_claim(body)
                self._send(201, store.create(plural, scope, body))
            elif method == "PUT" and name:
                self._send(200, store.replace(plural, scope, name, self._body() or {}))
            elif method == "PATCH" and name:
                content_type = self.headers.get("Content-Type", "")
                self._send(200, store.patch(plural, scope, name, self._body(), content_type))
            elif method == "DELETE" and name:
                body = self._body() or {}
                policy = query.get("propagationPolicy") or body.get("propagationPolicy")
                self._send(200, store.delete(plural, scope, name, policy))
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

        def _log(self, namespace: str, name: str, query: dict):
            pod = api.store.get("pods", namespace, name)
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            state = statuses[0].get("state", {}) if statuses else {}
            if not state or "waiting" in state:
                reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
                container = query.get("container") or pod["spec"]["containers"][0]["name"]
                raise ApiError(
                    400,
                    "BadRequest",
                    f'container "{container}" in pod "{name}" is waiting to start: {reason}',
                )
            lines = list(api.logs(namespace, name)) if api.logs else []
            if "tailLines" in query:
                tail = int(query["tailLines"])
                lines = lines[-tail:] if tail > 0 else []
            text = "".join(f"{line}\n" for line in lines).encode()
            self._send(200, text, content_type="text/plain")

        def _watch(self, plural: str, namespace: str | None, query: dict):
            store = api.store
            matches = label_matcher(query.get("labelSelector"))
            timeout = float(query.get("timeoutSeconds") or 30)
            deadline = time.monotonic() + timeout
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def wanted(event_plural, event_ns, obj):
                return (
                    event_plural == plural
                    and (namespace is None or event_ns == namespace)
                    and matches((obj.get("metadata") or {}).get("labels") or {})
                )

            def chunk(kind: str, obj: dict):
                line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            try:
                with store.lock:
                    since = query.get("resourceVersion")
                    if since in (None, "", "0"):
                        items, rv = store.list(plural, namespace)
                        last = int(rv)
                        initial = [obj for obj in items if wanted(plural, namespace or "", obj)]
                        backlog = []
                    else:
                        last = int(since)
                        backlog = store.events_since(last)
                        initial = []
                        if backlog is None:
                            gone = ApiError(410, "Expired", f"too old resource version: {since}")
                            chunk("ERROR", gone.status())
                            self.wfile.write(b"0\r\n\r\n")
                            return
                for obj in initial:
                    chunk("ADDED", obj)
                for event in backlog:
                    if wanted(event.plural, event.namespace, event.obj):
                        chunk(event.type, event.obj)
                    last = event.rv
                while not api.stopping.is_set():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    with store.changed:
                        fresh = store.events_since(last) or []
                        if not fresh:
                            store.changed.wait(min(remaining, 0.5))
                            fresh = store.events_since(last) or []
                    for event in fresh:
                        if wanted(event.plural, event.namespace, event.obj):
                            chunk(event.type, event.obj)
                        last = event.rv
                if query.get("allowWatchBookmarks") in ("1", "true"):
                    bookmark_kind = RESOURCES[plural]
                    chunk(
                        "BOOKMARK",
                        {
                            "kind": bookmark_kind[1],
                            "apiVersion": bookmark_kind[0],
                            "metadata": {"resourceVersion": str(last)},
                        },
                    )
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
            self.close_connection = True

    return Handler


def _validate_job(body: dict) -> None:
    """The few checks of the real API server that a wrong manifest would trip first."""
    spec = body.get("spec") or {}
    template = spec.get("template") or {}
    pod_spec = template.get("spec") or {}
    if not pod_spec.get("containers"):
        raise ApiError(422, "Invalid", "spec.template.spec.containers: Required value")
    if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
        raise ApiError(422, "Invalid", "spec.template.spec.restartPolicy: Unsupported value")
    if spec.get("completionMode") == "Indexed" and not spec.get("completions"):
        raise ApiError(
            422, "Invalid", "spec.completions: Required value: when completionMode is Indexed"
        )
    _validate_node_fields(pod_spec)
    if spec.get("podFailurePolicy") and pod_spec.get("restartPolicy") != "Never":
        raise ApiError(
            422, "Invalid", "spec.template.spec.restartPolicy: only Never with podFailurePolicy"
        )


def _validate_claim(body: dict) -> None:
    """The API server's ValidatePersistentVolumeClaimSpec, for what a claim must have."""
    spec = body.get("spec") or {}
    if not spec.get("accessModes"):
        raise ApiError(
            422, "Invalid", "spec.accessModes: Required value: at least 1 access mode is required"
        )
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if storage is None:
        raise ApiError(422, "Invalid", "spec.resources[storage]: Required value")
    if not re.search(r"[1-9]", re.sub(r"[A-Za-z]+$", "", str(storage))):
        raise ApiError(
            422,
            "Invalid",
            f'spec.resources[storage]: Invalid value: "{storage}": must be greater than zero',
        )


def _validate_node_fields(pod_spec: dict) -> None:
    """The API server's ValidateNodeFieldSelectorRequirement: a node field selector (only
    metadata.name) takes In or NotIn with exactly one value."""
    required = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    for t, term in enumerate(required):
        for r, requirement in enumerate(term.get("matchFields") or []):
            where = (
                "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring"
                f"Execution.nodeSelectorTerms[{t}].matchFields[{r}]"
            )
            if requirement.get("key") != "metadata.name":
                raise ApiError(
                    422, "Invalid", f"{where}.key: Invalid value: not a valid field selector key"
                )
            if requirement.get("operator") not in ("In", "NotIn"):
                raise ApiError(
                    422,
                    "Invalid",
                    f"{where}.operator: Invalid value: not a valid selector operator",
                )
            if len(requirement.get("values") or []) != 1:
                raise ApiError(
                    422,
                    "Invalid",
                    f"{where}.values: Required value: must be only one value when `operator` "
                    "is 'In' or 'NotIn' for node field selector",
                )


__all__ = ["FakeApiServer", "not_found"]
