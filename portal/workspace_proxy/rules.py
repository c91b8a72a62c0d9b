"""What the workspace proxy lets through, and what it sends on (pure: no Django, no I/O).

The target of a request is never read from the request: only the run id in its path
chooses which workspace's *recorded* address is used (docs/workspaces.md, "The proxy").
"""

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

# A workspace's path: /w/<run id>/… (jobs.services.workspaces.workspace_base_path). No
# leading zero and at most 18 digits: one id has one spelling, and it fits a bigint.
WORKSPACE_PATH = re.compile(r"/w/([1-9][0-9]{0,17})/")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# RFC 9110 §7.6.1: meaningful for one connection only, never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Never sent upstream from the client: the proxy sets Host and Authorization itself, the
# portal's cookies are filtered out of Cookie, and the client's forwarding headers would
# only claim things the proxy cannot vouch for.
CLIENT_ONLY_HEADERS = HOP_BY_HOP | {
    "host",
    "authorization",
    "cookie",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-proto",
    "x-real-ip",
}
# The WebSocket handshake's own headers: the proxy's client makes its own handshake.
WEBSOCKET_HANDSHAKE_HEADERS = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)

NOT_FOUND_TEXT = "Not found: there is no workspace of yours at this address.\n"
DOT_SEGMENT_TEXT = "Refused: a workspace path may not contain '.' or '..' segments.\n"
ORIGIN_TEXT = (
    "Refused: this request changes a workspace or opens a connection to it, and it did not "
    "come from a page of {origin} (its Origin or Referer header is {given}).\n"
)


def workspace_run_id(raw_path: str) -> int | None:
    """The run id of a path /w/<run id>/…, as sent (not percent-decoded); None otherwise."""
    match = WORKSPACE_PATH.match(raw_path)
    return int(match.group(1)) if match else None


def has_dot_segment(raw_path: str) -> bool:
    """Whether a segment of the path is '.' or '..', also percent-encoded ('%2e%2E')."""
    return any(unquote(segment) in {".", ".."} for segment in raw_path.split("/"))


def origin_of(url: str) -> str | None:
    """scheme://host[:port] of an absolute http(s) or ws(s) URL, lower-cased, without its
    scheme's default port; None for anything else (``null``, a relative or a broken URL)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if port is None or port == DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def origin_refusal(
    *, method: str, websocket: bool, origin: str | None, referer: str | None, expected: str
) -> str | None:
    """Why a request must be refused for where it came from, or None.

    The workspace server skips its own XSRF and Origin checks for token-authenticated
    requests, and the proxy adds the token: so every WebSocket handshake and every request
    that may change something must come from a page of the proxy's own origin
    (``expected``, from origin_of). Its Origin header decides; without one, its Referer."""
    if not websocket and method.upper() in SAFE_METHODS:
        return None
    given = origin if origin is not None else referer
    if given is not None and origin_of(given) == expected:
        return None
    shown = "missing" if given is None else repr(given[:200])
    return ORIGIN_TEXT.format(origin=expected, given=shown)


def cookies_without(cookie_header: str, names: frozenset[str]) -> str:
    """A Cookie header without the cookies called one of ``names`` (the portal's)."""
    kept = [
        pair.strip()
        for pair in cookie_header.split(";")
        if pair.strip() and pair.split("=", 1)[0].strip() not in names
    ]
    return "; ".join(kept)


def upstream_headers(
    headers: Iterable[tuple[str, str]],
    *,
    portal_cookies: frozenset[str],
    host: str,
    token: str,
    websocket: bool,
) -> list[tuple[str, str]]:
    """The headers sent to the workspace server: the client's, less what only the client
    or the portal may see, with the server's Host and the workspace's token."""
    dropped = CLIENT_ONLY_HEADERS | (WEBSOCKET_HANDSHAKE_HEADERS if websocket else frozenset())
    forwarded = [(name, value) for name, value in headers if name.lower() not in dropped]
    cookies = cookies_without(
        "; ".join(value for name, value in headers if name.lower() == "cookie"), portal_cookies
    )
    if cookies:
        forwarded.append(("Cookie", cookies))
    forwarded.append(("Host", host))
    forwarded.append(("Authorization", f"token {token}"))
    return forwarded


def downstream_headers(
    headers: Iterable[tuple[str, str]], *, portal_cookies: frozenset[str]
) -> list[tuple[str, str]]:
    """The headers of the server's answer sent to the browser: no hop-by-hop header, and
    no Set-Cookie for a name of the portal's (a workspace runs its owner's code: it must
    not replace the portal's session or CSRF cookie, which browsers share across ports)."""
    return [
        (name, value)
        for name, value in headers
        if name.lower() not in HOP_BY_HOP
        and not (name.lower() == "set-cookie" and value.split("=", 1)[0].strip() in portal_cookies)
    ]


def host_header(host: str, port: int) -> str:
    """The Host the workspace server is sent: its own address, which Jupyter Server accepts
    (loopback when it listens on loopback; any when it listens on a node's address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def close_code_to_send(code: int | None) -> int:
    """A close code received on one side, as one that may be sent on the other: 1005 (no
    code) and 1006 (connection lost) are never sent (RFC 6455 §7.4.1)."""
    if code is None or code == 1005:
        return 1000
    if 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999:
        return code
    return 1011
