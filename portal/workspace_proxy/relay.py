"""The workspace proxy's aiohttp application: HTTP and WebSocket relayed to the address
recorded for a workspace, for its owner only (docs/workspaces.md, "The proxy").

Who may pass and where to is asked of a ``Gate`` (portal.workspace_proxy.gate on Django);
this module knows no Django, so its rules are typed strictly and tested without a database.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import (
    ClientError,
    ClientResponse,
    ClientSession,
    ClientTimeout,
    ClientWebSocketResponse,
    ClientWSTimeout,
    DummyCookieJar,
    TCPConnector,
    WSMsgType,
    WSServerHandshakeError,
    web,
)
from multidict import CIMultiDict
from yarl import URL

from portal.workspace_proxy import rules

log = logging.getLogger("gantry.workspace_proxy")

BODY_CHUNK_BYTES = 64 * 1024
SMALL_BODY_BYTES = 64 * 1024
# Jupyter's kernel messages carry a cell's outputs (a plot, a table): far above aiohttp's
# 4 MiB default, far below what a browser tab could hold.
WS_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
PLAIN = "text/plain"


@dataclass(frozen=True)
class Target:
    """Where a workspace's server answers, and the secret it accepts."""

    run_id: int
    attempt_id: int
    host: str
    port: int
    token: str


@dataclass(frozen=True)
class Closed:
    """A workspace of the session's person that does not answer now: why, for them."""

    text: str


class Gate(Protocol):
    async def target(self, *, session_key: str | None, run_id: int) -> Target | Closed | None:
        """The workspace's target if the session's person owns run ``run_id`` and its
        current attempt's server has an address; Closed if they own it and it has none now;
        None in every other case."""

    def activity(self, run_id: int) -> None:
        """Note traffic to the workspace (without waiting for any write)."""


@dataclass(frozen=True)
class ProxyConfig:
    public_origin: str  # rules.origin_of(GANTRY_WORKSPACE_URL)
    session_cookie: str
    portal_cookies: frozenset[str]  # never sent to a workspace server
    max_body_bytes: int
    connect_timeout_s: float
    read_timeout_s: float
    # How often an open WebSocket's session is checked again.
    recheck_s: float = 30.0


def _small(request: web.Request, upstream: ClientResponse) -> bool:
    """An answer read whole before it is sent on: a body of a known, small size."""
    return (
        upstream.content_length is not None
        and upstream.content_length <= SMALL_BODY_BYTES
        and request.method != "HEAD"
        and upstream.status not in (204, 304)
    )


class BodyTooLarge(Exception):
    pass


SESSION_KEY = web.AppKey("client_session", ClientSession)


def make_app(config: ProxyConfig, gate: Gate) -> web.Application:
    app = web.Application(handler_args={"max_field_size": 16384})

    async def client_session(app: web.Application) -> AsyncIterator[None]:
        app[SESSION_KEY] = ClientSession(
            # No pool limit: one connection per open WebSocket, however many are open.
            connector=TCPConnector(limit=0, limit_per_host=0),
            auto_decompress=False,  # bodies pass as the server encoded them
            # Keeps no cookie: each request carries only its browser's.
            cookie_jar=DummyCookieJar(),
            timeout=ClientTimeout(
                total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
            ),
        )
        yield
        await app[SESSION_KEY].close()

    app.cleanup_ctx.append(client_session)
    relay = _Relay(config, gate, app)
    app.router.add_route("*", "/{tail:.*}", relay.handle)
    return app


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type=PLAIN)


class _Relay:
    def __init__(self, config: ProxyConfig, gate: Gate, app: web.Application) -> None:
        self.config = config
        self.gate = gate
        self.app = app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw_path = request.rel_url.raw_path
        run_id = rules.workspace_run_id(raw_path)
        if run_id is None:
            return _text(404, rules.NOT_FOUND_TEXT)
        if rules.has_dot_segment(raw_path):
            return _text(400, rules.DOT_SEGMENT_TEXT)
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        refusal = rules.origin_refusal(
            method=request.method,
            websocket=websocket,
            origin=request.headers.get("Origin"),
            referer=request.headers.get("Referer"),
            expected=self.config.public_origin,
        )
        if refusal:
            return _text(403, refusal)
        if request.content_length is not None and (
            request.content_length > self.config.max_body_bytes
        ):
            return self._too_large()
        target = await self.gate.target(
            session_key=request.cookies.get(self.config.session_cookie), run_id=run_id
        )
        if target is None:
            return _text(404, rules.NOT_FOUND_TEXT)
        if isinstance(target, Closed):
            return _text(409, target.text)
        if request.method.upper() not in rules.SAFE_METHODS:
            # What a person does (a file saved, a kernel started): the proxy's idle signal.
            # Reads are not: JupyterLab polls while a tab stays open (docs/workspaces.md).
            self.gate.activity(run_id)
        query = request.rel_url.raw_query_string
        # The authority comes from the target alone; the path, as sent, always starts with
        # /w/<run id>/ (checked above), so it cannot be read as part of the authority.
        url = URL(
            f"http://{rules.host_header(target.host, target.port)}{raw_path}"
            + (f"?{query}" if query else ""),
            encoded=True,
        )
        headers = rules.upstream_headers(
            list(request.headers.items()),
            portal_cookies=self.config.portal_cookies,
            host=rules.host_header(target.host, target.port),
            token=target.token,
            websocket=websocket,
        )
        if websocket:
            return await self._websocket(request, url, headers, target)
        return await self._http(request, url, headers)

    def _too_large(self) -> web.Response:
        megabytes = self.config.max_body_bytes / 1024 / 1024
        response = _text(
            413, f"Refused: a workspace accepts requests of at most {megabytes:g} MB.\n"
        )
        response.force_close()
        return response

    async def _body(self, request: web.Request, too_large: asyncio.Event) -> AsyncIterator[bytes]:
        received = 0
        async for chunk in request.content.iter_chunked(BODY_CHUNK_BYTES):
            received += len(chunk)
            if received > self.config.max_body_bytes:
                # aiohttp's client swallows what a body's iterator raises (and would wait for
                # an answer the server never sends): the relay is told apart.
                too_large.set()
                raise BodyTooLarge
            yield chunk

    async def _http(
        self, request: web.Request, url: URL, headers: list[tuple[str, str]]
    ) -> web.StreamResponse:
        too_large = asyncio.Event()
        body = self._body(request, too_large) if request.body_exists else None
        response = web.StreamResponse()
        exchange = asyncio.ensure_future(self._exchange(request, url, headers, body, response))
        overflow = asyncio.ensure_future(too_large.wait())
        try:
            await asyncio.wait([exchange, overflow], return_when=asyncio.FIRST_COMPLETED)
        finally:
            overflow.cancel()
            if not exchange.done():
                exchange.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exchange
        if not too_large.is_set():
            return exchange.result()
        if response.prepared:  # the server answered before the body ended: cut it short
            self._cut(request)
            return response
        return self._too_large()

    async def _exchange(
        self,
        request: web.Request,
        url: URL,
        headers: list[tuple[str, str]],
        body: AsyncIterator[bytes] | None,
        response: web.StreamResponse,
    ) -> web.StreamResponse:
        session = self.app[SESSION_KEY]
        try:
            async with session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            ) as upstream:
                answer_headers = rules.downstream_headers(
                    list(upstream.headers.items()), portal_cookies=self.config.portal_cookies
                )
                if _small(request, upstream):
                    # Headers and body in one write: most of a page's requests (the API's
                    # JSON), and a send costs more than the bytes here.
                    return web.Response(
                        status=upstream.status,
                        reason=upstream.reason,
                        body=await upstream.read(),
                        headers=CIMultiDict(
                            (name, value)
                            for name, value in answer_headers
                            if name.lower() != "content-length"
                        ),
                    )
                response.set_status(upstream.status, upstream.reason)
                for name, value in answer_headers:
                    response.headers.add(name, value)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except Exception as error:
            if response.prepared:
                # Headers are out: nothing to answer; the client sees the connection end.
                log.info("workspace proxy: %s %s ended early: %r", request.method, url, error)
                self._cut(request)
                return response
            return self._upstream_failure(error)

    @staticmethod
    def _cut(request: web.Request) -> None:
        if request.transport is not None:
            request.transport.close()

    def _upstream_failure(self, error: BaseException) -> web.Response:
        if isinstance(error, TimeoutError):
            return _text(
                504,
                "The workspace's server did not answer in time "
                f"({self.config.read_timeout_s:g} s). Try again; if it keeps failing, stop "
                "and restart the workspace.\n",
            )
        if isinstance(error, ClientError | OSError):
            return _text(
                502,
                "The workspace's server cannot be reached: it may have stopped or be "
                "restarting. Reload in a moment; the workspace page shows its state.\n",
            )
        raise error

    async def _websocket(
        self, request: web.Request, url: URL, headers: list[tuple[str, str]], target: Target
    ) -> web.StreamResponse:
        protocols = [
            protocol.strip()
            for protocol in request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if protocol.strip()
        ]
        try:
            upstream = await self.app[SESSION_KEY].ws_connect(
                url,
                headers=headers,
                protocols=protocols,
                max_msg_size=WS_MAX_MESSAGE_BYTES,
                autoclose=False,
                timeout=ClientWSTimeout(ws_receive=None, ws_close=10.0),
            )
        except WSServerHandshakeError as refused:
            status = refused.status if 400 <= refused.status < 600 else 502
            return _text(status, f"The workspace's server refused the connection ({status}).\n")
        except Exception as error:
            return self._upstream_failure(error)
        downstream = web.WebSocketResponse(
            protocols=[upstream.protocol] if upstream.protocol else [],
            max_msg_size=WS_MAX_MESSAGE_BYTES,
            autoclose=False,
            compress=False,
        )
        try:
            await downstream.prepare(request)
        except Exception:
            await upstream.close()
            raise
        await _WebSocketPair(
            downstream, upstream, activity=lambda: self.gate.activity(target.run_id)
        ).relay(
            recheck=lambda: self._still_allowed(request, target),
            every_s=self.config.recheck_s,
        )
        return downstream

    async def _still_allowed(self, request: web.Request, target: Target) -> bool:
        current = await self.gate.target(
            session_key=request.cookies.get(self.config.session_cookie), run_id=target.run_id
        )
        return current == target


class _WebSocketPair:
    """A browser's WebSocket and the server's, relayed both ways until either closes."""

    def __init__(
        self,
        downstream: web.WebSocketResponse,
        upstream: ClientWebSocketResponse,
        *,
        activity: Callable[[], None],
    ) -> None:
        self.downstream = downstream
        self.upstream = upstream
        self.activity = activity

    async def relay(self, *, recheck: Callable[[], Awaitable[bool]], every_s: float) -> None:
        pumps = [
            asyncio.ensure_future(self._pump(self.downstream, self.upstream, person=True)),
            asyncio.ensure_future(self._pump(self.upstream, self.downstream, person=False)),
        ]
        watch = asyncio.ensure_future(self._watch(recheck, every_s))
        try:
            done, _ = await asyncio.wait([*pumps, watch], return_when=asyncio.FIRST_COMPLETED)
            # The side that closed first gave a code: the other side is closed with it (its
            # pump then ends too). A pump that failed, or the watch, closed it otherwise.
            ended = [pump for pump in pumps if pump in done and not pump.exception()]
            code = ended[0].result() if ended else 1011
            await self._close_both(code)
        finally:
            for task in [*pumps, watch]:
                task.cancel()
            for task in [*pumps, watch]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._close_both(1011)  # only if still open: the relay itself failed

    async def _pump(
        self,
        source: web.WebSocketResponse | ClientWebSocketResponse,
        sink: web.WebSocketResponse | ClientWebSocketResponse,
        *,
        person: bool,
    ) -> int | None:
        """Relay ``source``'s messages to ``sink`` until it closes: its close code. A
        message from the browser (``person``: code sent to a kernel, keys to a terminal) is
        activity; what the server sends is not (a kernel's output is its own signal)."""
        while True:
            message = await source.receive()
            if message.type == WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            elif message.type in (WSMsgType.PING, WSMsgType.PONG):
                continue
            else:  # CLOSE, CLOSING, CLOSED, ERROR
                return source.close_code
            if person:
                self.activity()

    async def _watch(self, recheck: Callable[[], Awaitable[bool]], every_s: float) -> None:
        """A WebSocket lives only as long as what let it open: a logged-out session, or a
        workspace that moved on, closes it (1008). Being open is not activity: a tab left
        open holds its WebSockets open (docs/workspaces.md, "Idle from evidence")."""
        while True:
            await asyncio.sleep(every_s)
            if not await recheck():
                await self._close_both(1008, b"Session or workspace no longer valid")
                return

    async def _close_both(self, code: int | None, message: bytes = b"") -> None:
        send = rules.close_code_to_send(code)
        for side in (self.downstream, self.upstream):
            if not side.closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(side.close(code=send, message=message), 10)
