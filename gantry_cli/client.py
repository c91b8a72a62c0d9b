"""A small JSON client of the Gantry API over ``urllib``: every call has a timeout, no
redirect is followed (it would carry the token elsewhere), and every failure becomes one
of the ``errors`` classes."""

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from gantry_cli.errors import (
    ApiValidationError,
    AuthError,
    CliError,
    NotFoundError,
    UnreachableError,
    UsageError,
    flatten_errors,
)

API_PREFIX = "/api/v1/"
DEFAULT_TIMEOUT = 30.0
USER_AGENT = "gantry-cli/1"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> None:
        return None  # the 3xx answer is raised as an HTTPError instead


_opener = urllib.request.build_opener(_NoRedirect)


def normalize_url(url: str) -> str:
    """``https://gantry.example.org/`` → ``https://gantry.example.org``; only http(s)."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"Not an http(s) URL: {url!r}.")
    return url.strip().rstrip("/")


class Client:
    def __init__(self, *, url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT):
        self.url = normalize_url(url)
        self._token = token
        self.timeout = timeout

    def __repr__(self) -> str:  # never the token
        return f"Client(url={self.url!r})"

    def endpoint(self, path: str, params: Mapping[str, Any] | None = None) -> str:
        query = urllib.parse.urlencode(params or {}, doseq=True)
        return self.url + API_PREFIX + path.lstrip("/") + (f"?{query}" if query else "")

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", self.endpoint(path, params))

    def post(self, path: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        return self.request("POST", self.endpoint(path), body, headers)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", self.endpoint(path))

    def get_all(
        self, path: str, params: Mapping[str, Any] | None = None, limit: int = 0
    ) -> list[Any]:
        """The ``results`` of every page (at most ``limit`` items if given), following
        ``next`` links only while they stay on this server."""
        return list(self._pages(path, params, limit))

    def _pages(self, path: str, params: Mapping[str, Any] | None, limit: int) -> Iterator[Any]:
        url: str | None = self.endpoint(path, params)
        count = 0
        while url:
            page = self.request("GET", url)
            for item in page["results"]:
                yield item
                count += 1
                if limit and count >= limit:
                    return
            url = page.get("next")
            if url and not url.startswith(self.url + API_PREFIX):
                return

    def request(
        self, method: str, url: str, body: Any = None, extra: Mapping[str, str] | None = None
    ) -> Any:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT, **(extra or {})}
        data = None
        if body is not None:
            data = json.dumps(body, default=str).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        # Only http(s): the base URL passed normalize_url, and next links must extend it.
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
        try:
            with _opener.open(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, socket.timeout | TimeoutError):
                reason = f"no answer within {self.timeout:g} s"
            raise UnreachableError(
                sentence(f"Cannot reach the Gantry server at {self.url}: {reason}")
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CliError(f"The server at {self.url} did not answer with JSON.") from None

    def _error(self, exc: urllib.error.HTTPError) -> CliError:
        try:
            raw = exc.read()
        except OSError:
            raw = b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        detail = body.get("detail") if isinstance(body, dict) else None
        detail = str(detail).strip() if detail else ""
        if exc.code == 401:
            reason = sentence(detail or "Authentication required")
            return AuthError(f"The server rejected your token: {reason} Run `gantry login`.")
        if exc.code == 400 and body:
            return ApiValidationError(flatten_errors(body))
        if exc.code == 403:
            return NotFoundError(sentence(detail or "Forbidden: you may not do this"))
        if exc.code == 404:
            return NotFoundError(sentence(detail or f"Not found: {exc.url}"))
        if exc.code == 429:
            return CliError(f"Too many requests; retry later. {sentence(detail)}".strip())
        return CliError(sentence(f"The server answered {exc.code}: {detail or exc.reason}"))


def sentence(text: str) -> str:
    """``text`` ending in one full stop (or the question or exclamation mark it has): the
    server's messages mostly end in one already, and a second reads as a typo."""
    text = text.strip()
    return text if not text or text.endswith((".", "!", "?")) else f"{text}."
