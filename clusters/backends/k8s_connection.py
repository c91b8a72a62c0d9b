"""The Kubernetes backend's connection to one cluster: its settings, its own ``ApiClient``
(built once per process, settings and token; nothing touches the client library's global
configuration) and every call, with a timeout, its failures translated into Gantry's two
kinds of error (the policy in ``clusters.backends.kubernetes``)."""

import hashlib
import json
import os
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config import load_kube_config
from kubernetes.config.config_exception import ConfigException

from clusters.backends.base import PermanentBackendError, TransientBackendError
from clusters.backends.k8s_settings import K8sSettings, parse_settings
from clusters.models import Cluster
from core.schema import SchemaError

_clients: dict[tuple[int, str], client.ApiClient] = {}
_clients_lock = threading.Lock()


def _describe(exc: BaseException) -> str:
    """The innermost useful words of a connection error."""
    reason = getattr(exc, "reason", None)
    while (
        isinstance(reason, BaseException) and (inner := getattr(reason, "reason", None)) is not None
    ):
        reason = inner
    text = str(reason or exc)
    if "Connection refused" in text:
        return "connection refused"
    if "certificate verify failed" in text or "CERTIFICATE_VERIFY_FAILED" in text:
        return "TLS certificate verification failed"
    if "timed out" in text.lower():
        return "timed out"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "host name not found"
    return text[:300]


class K8sConnection:
    """A cluster's parsed settings, its client and its calls: what the backend is built on."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._api: client.ApiClient | None = None
        try:
            self._settings: K8sSettings | None = parse_settings(cluster.settings or {})
            self._settings_error = ""
        except SchemaError as exc:
            self._settings, self._settings_error = None, str(exc)

    @property
    def settings(self) -> K8sSettings:
        """The parsed settings. Wrong settings are the cluster's fault, not a run's: every
        call says what is wrong (transient) until an admin fixes them; no run fails."""
        if self._settings is None:
            raise TransientBackendError(f"{self.cluster.name}: {self._settings_error}")
        return self._settings

    @property
    def where(self) -> str:
        return self.settings.url or f"kubeconfig {self.settings.kubeconfig}"

    def _token(self) -> str:
        settings = self.settings
        if settings.token_env:
            token = os.environ.get(settings.token_env, "")
            if not token:
                raise TransientBackendError(
                    f"the environment variable {settings.token_env} that holds the token for "
                    f"{self.cluster.name} is not set on this host"
                )
            return token.strip()
        if settings.token_file:
            try:
                with open(settings.token_file) as handle:
                    return handle.read().strip()
            except OSError as exc:
                raise TransientBackendError(
                    f"cannot read the token file {settings.token_file}: {exc.strerror}"
                ) from None
        return ""

    def _build_client(self, token: str) -> client.ApiClient:
        settings = self.settings
        # type.__call__: a fresh Configuration, never a copy of the library's global default.
        configuration = type.__call__(client.Configuration)
        if settings.kubeconfig:
            try:
                load_kube_config(
                    config_file=settings.kubeconfig,
                    context=settings.context or None,
                    client_configuration=configuration,
                    persist_config=False,
                )
            except (ConfigException, OSError) as exc:
                raise TransientBackendError(
                    f"cannot load kubeconfig {settings.kubeconfig}: {exc}"
                ) from None
        else:
            configuration.host = settings.url
            if token:
                configuration.api_key = {"authorization": token}
                configuration.api_key_prefix = {"authorization": "Bearer"}
            if settings.ca_file:
                if not os.path.isfile(settings.ca_file):
                    raise TransientBackendError(f"the CA file {settings.ca_file} does not exist")
                configuration.ssl_ca_cert = settings.ca_file
            configuration.verify_ssl = not settings.insecure_skip_tls_verify
        # No retries inside the client: the caller retries with backoff and sees the error.
        configuration.retries = False
        return client.ApiClient(configuration)

    def api(self) -> client.ApiClient:
        """This cluster's client, built once per process and settings (and token)."""
        if self._api is not None:
            return self._api
        token = self._token()
        fingerprint = hashlib.sha256(
            json.dumps([self.cluster.settings, token], sort_keys=True, default=str).encode()
        ).hexdigest()
        key = (self.cluster.pk or 0, fingerprint)
        with _clients_lock:
            api = _clients.get(key)
            if api is None:
                for stale in [k for k in _clients if k[0] == key[0]]:
                    _clients.pop(stale).close()
                api = _clients[key] = self._build_client(token)
        self._api = api
        return api

    def _call(
        self, what: str, fn: Callable[..., Any], *args, tolerate: tuple[int, ...] = (), **kwargs
    ) -> Any:
        """Call the client for the raw response (JSON is parsed here, not by the client's
        models); translate failures into Gantry's two kinds of error. An answer whose status
        is in ``tolerate`` comes back as the ApiException instead of being raised."""
        timeout = self.settings.timeout_s
        kwargs.setdefault("_request_timeout", (min(timeout, 5.0), timeout))
        kwargs.setdefault("_preload_content", False)
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status in tolerate:
                return exc
            raise self._api_error(what, exc) from None
        except ValueError as exc:  # the client's own validation of a request body
            raise PermanentBackendError(f"{what}: invalid object: {exc}"[:2000]) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientBackendError(
                f"cannot reach the Kubernetes API at {self.where}: {_describe(exc)}"
            ) from None

    def _api_error(self, what: str, exc: ApiException) -> Exception:
        status = exc.status or 0
        detail = status_message(exc)
        if status == 0:
            return TransientBackendError(f"{what}: {self.where}: {_describe(exc)} {detail}".strip())
        if status == 401:
            source = self.settings.token_env or self.settings.token_file or "the kubeconfig"
            return TransientBackendError(
                f"{what}: the API server rejected the credentials (401 Unauthorized): check "
                f"the token in {source}"
            )
        if status == 403:
            return TransientBackendError(f"{what}: forbidden (403): {detail}")
        if status == 429 or status >= 500:
            retry = (exc.headers or {}).get("Retry-After") if exc.headers else None
            hint = f", retry after {retry} s" if retry else ""
            return TransientBackendError(f"{what}: API server answered {status}{hint}: {detail}")
        return PermanentBackendError(f"{what}: the API server refused it ({status}): {detail}")


def status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return (exc.reason or "").strip()
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])[:500]
    return (exc.reason or "").strip()
