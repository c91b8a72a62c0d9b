"""The workspace proxy against crafted and hostile input (issue 37, "Bad input"): requests
that try to reach another port, what it sends upstream, huge uploads, a server that is gone
or never answers, WebSocket messages and close codes both ways, 500 WebSockets at once.

The workspace's "server" here is a recording HTTP/WebSocket server (tests/workspace_support):
it shows exactly what reached it. A decoy server on another port must never be reached."""

import asyncio
import contextlib
import socket
import threading
import time

import aiohttp
import pytest
from django.conf import settings

from jobs.services.workspaces import workspace_server_token
from portal.workspace_proxy.rules import DOT_SEGMENT_TEXT, NOT_FOUND_TEXT
from tests.workspace_support import (
    RecordingServer,
    free_port,
    proxy_serving,
    run_coroutine,
    served,
    session_cookie,
    workspace_running,
)

pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)

MB = 1024 * 1024


@pytest.fixture
def upstream():
    server, port = RecordingServer(), free_port()
    with served(server.app, port):
        yield server, port


@pytest.fixture
def decoy():
    server, port = RecordingServer(), free_port()
    with served(server.app, port):
        yield server, port


@pytest.fixture
def workspace(world, upstream):
    return workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=upstream[1])


def raw_request(base: str, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """``head`` (request line and headers, without the blank line) sent as is: the status
    and body of the answer."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n")

        def send_body():  # as a browser does: sending while the answer may already come
            with contextlib.suppress(OSError):
                connection.sendall(body)

        sender = threading.Thread(target=send_body)
        sender.start()
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := connection.recv(65536):
                received += chunk
        sender.join(30)
    status_line, _, rest = received.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_no_path_or_header_reaches_another_host_or_port(world, workspace, upstream, decoy):
    server, _ = upstream
    decoy_server, decoy_port = decoy
    cookie = f"{settings.SESSION_COOKIE_NAME}={session_cookie(world.researcher_a)}"
    other = f"127.0.0.1:{decoy_port}"
    crafted = {
        f"GET http://{other}/w/1/api HTTP/1.1\nHost: {other}": (200, "/w/1/api"),
        f"GET /w/1/api HTTP/1.1\nHost: {other}\nX-Forwarded-Host: {other}\n"
        f"Forwarded: host={other}\nX-Forwarded-Port: {decoy_port}": (200, "/w/1/api"),
        f"GET /w/1/@{other}/api HTTP/1.1\nHost: x": (200, f"/w/1/@{other}/api"),
        f"GET /w/1/%2F%2F{other}/api HTTP/1.1\nHost: x": (200, f"/w/1/%2F%2F{other}/api"),
        f"GET /w/1/api?url=http://{other}/&next=//{other} HTTP/1.1\nHost: x": (200, "/w/1/api"),
        "GET /w/1/../2/api HTTP/1.1\nHost: x": (400, None),
        "GET /w/1/%2e%2E/%2e%2e/api HTTP/1.1\nHost: x": (400, None),
        "GET /w/1/./api HTTP/1.1\nHost: x": (400, None),
        f"GET //{other}/w/1/api HTTP/1.1\nHost: x": (404, None),
        f"GET /w/{decoy_port}/api HTTP/1.1\nHost: x": (404, None),
        "GET /w/01/api HTTP/1.1\nHost: x": (404, None),
        "GET /w/1 HTTP/1.1\nHost: x": (404, None),
    }
    with proxy_serving() as proxy:
        answers = {
            head: raw_request(proxy, f"{head}\nCookie: {cookie}\nConnection: close")[0]
            for head in crafted
        }
    assert answers == {head: status for head, (status, _) in crafted.items()}
    assert decoy_server.requests == []
    assert [seen["path"] for seen in server.requests] == [
        path for status, path in crafted.values() if status == 200
    ]


def test_refusals_name_their_reason(world, workspace):
    with proxy_serving() as proxy:
        dots = raw_request(proxy, "GET /w/1/%2e%2e/api HTTP/1.1\nHost: x\nConnection: close")
        missing = raw_request(proxy, "GET /w/1/api HTTP/1.1\nHost: x\nConnection: close")
    assert dots == (400, DOT_SEGMENT_TEXT.encode())
    assert missing == (404, NOT_FOUND_TEXT.encode())


def test_upstream_gets_the_workspace_token_and_none_of_the_portals_secrets(
    world, workspace, upstream
):
    server, port = upstream
    cookies = {
        settings.SESSION_COOKIE_NAME: session_cookie(world.researcher_a),
        settings.CSRF_COOKIE_NAME: "portal-csrf-secret",
        "_xsrf": "jupyters-own",
    }

    async def get(proxy):
        async with aiohttp.ClientSession(cookies=cookies) as client:
            response = await client.get(
                f"{proxy}/w/1/api/contents?type=directory",
                headers={
                    "Authorization": "token the-clients-guess",
                    "X-Forwarded-For": "10.0.0.1",
                    "X-Real-IP": "10.0.0.1",
                    "Accept": "application/json",
                },
            )
            return response.status

    with proxy_serving() as proxy:
        assert run_coroutine(get(proxy)) == 200
    [seen] = server.requests
    headers = {name.lower(): value for name, value in seen["headers"]}
    assert (seen["path"], seen["query"]) == ("/w/1/api/contents", "type=directory")
    assert headers["authorization"] == f"token {workspace_server_token(1)}"
    assert headers["host"] == f"127.0.0.1:{port}"
    assert headers["cookie"] == "_xsrf=jupyters-own"
    assert headers["accept"] == "application/json"
    assert {"x-forwarded-for", "x-real-ip"} & set(headers) == set()


def test_an_upload_above_the_limit_is_refused_with_413_while_it_streams(world, workspace, upstream):
    server, _ = upstream
    cookie = f"{settings.SESSION_COOKIE_NAME}={session_cookie(world.researcher_a)}"
    head = f"PUT /w/1/api/contents/big HTTP/1.1\nHost: x\nCookie: {cookie}\nOrigin: {{proxy}}"

    def chunked(size: int) -> bytes:
        piece = b"x" * (64 * 1024)
        chunks = [piece] * (size // len(piece))
        return b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"

    with proxy_serving(max_body_bytes=1 * MB) as proxy:
        head = head.format(proxy=proxy)
        declared = raw_request(proxy, f"{head}\nContent-Length: {2 * MB}", b"x" * (2 * MB))
        assert server.requests == []  # refused before any byte went on
        streamed = raw_request(proxy, f"{head}\nTransfer-Encoding: chunked", chunked(2 * MB))
        within = raw_request(
            proxy, f"{head}\nContent-Length: {MB - 1}\nConnection: close", b"y" * (MB - 1)
        )
    refused = b"Refused: a workspace accepts requests of at most 1 MB.\n"
    assert (declared, streamed) == ((413, refused), (413, refused))
    assert within[0] == 200
    assert b'"body_bytes": 1048575' in within[1]


def test_a_server_that_is_gone_is_502_and_one_that_never_answers_is_504(world):
    gone = free_port()
    workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=gone)
    cookies = {settings.SESSION_COOKIE_NAME: session_cookie(world.researcher_a)}

    async def get_and_open(proxy):
        async with aiohttp.ClientSession(cookies=cookies) as client:
            async with client.get(f"{proxy}/w/1/api/status") as response:
                http = (response.status, await response.text())
            try:
                await client.ws_connect(f"{proxy}/w/1/echo", headers={"Origin": proxy})
            except aiohttp.WSServerHandshakeError as refused:
                return http, refused.status

    with proxy_serving() as proxy:
        (status, text), ws_status = run_coroutine(get_and_open(proxy))
    assert (status, ws_status) == (502, 502)
    assert text.startswith("The workspace's server cannot be reached")

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        from jobs.models import Workspace

        Workspace.objects.filter(run_id=1).update(port=silent.getsockname()[1])
        with proxy_serving(read_timeout_s=0.5) as proxy:
            started = time.monotonic()
            (status, text), _ = run_coroutine(get_and_open(proxy))
            waited = time.monotonic() - started
    finally:
        silent.close()
    assert status == 504
    assert text.startswith("The workspace's server did not answer in time (0.5 s)")
    assert waited < 5


def test_websocket_messages_and_close_codes_pass_both_ways(world, workspace, upstream):
    cookies = {settings.SESSION_COOKIE_NAME: session_cookie(world.researcher_a)}

    async def talk(proxy):
        async with aiohttp.ClientSession(cookies=cookies) as client:
            ws = await client.ws_connect(f"{proxy}/w/1/echo", headers={"Origin": proxy})
            await ws.send_str("héllo")
            text = await ws.receive_str()
            await ws.send_bytes(bytes(range(256)) * 4096)  # 1 MiB
            data = await ws.receive_bytes()
            await ws.send_str("close 4001")  # the server closes with 4001
            closing = await ws.receive()
            await ws.close()
            # And the other way: the browser closes with 4002.
            second = await client.ws_connect(f"{proxy}/w/1/echo", headers={"Origin": proxy})
            await second.send_str("ping")
            assert await second.receive_str() == "ping"
            await second.close(code=4002)
            return text, data, closing.type, ws.close_code

    server, _ = upstream
    with proxy_serving() as proxy:
        text, data, kind, code = run_coroutine(talk(proxy))
        assert wait_until(lambda: len(server.closes) == 2)
    assert (text, data, kind, code) == (
        "héllo",
        bytes(range(256)) * 4096,
        aiohttp.WSMsgType.CLOSE,
        4001,
    )
    assert server.closes == [4001, 4002]


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_five_hundred_websockets_stay_open_at_once(world, workspace, upstream):
    cookies = {settings.SESSION_COOKIE_NAME: session_cookie(world.researcher_a)}
    count = 500

    async def many(proxy):
        async with aiohttp.ClientSession(
            cookies=cookies, connector=aiohttp.TCPConnector(limit=0)
        ) as client:
            sockets = await asyncio.gather(
                *(
                    client.ws_connect(f"{proxy}/w/1/echo", headers={"Origin": proxy})
                    for _ in range(count)
                )
            )
            await asyncio.gather(*(ws.send_str(f"n{n}") for n, ws in enumerate(sockets)))
            echoes = await asyncio.gather(*(ws.receive_str() for ws in sockets))
            await asyncio.gather(*(ws.close() for ws in sockets))
            return echoes

    with proxy_serving() as proxy:
        started = time.monotonic()
        echoes = run_coroutine(many(proxy))
        seconds = time.monotonic() - started
    assert echoes == [f"n{n}" for n in range(count)]
    assert seconds < 120


def test_a_server_that_dies_mid_session_closes_its_websockets_then_answers_502(world):
    server, port = RecordingServer(), free_port()
    workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=port)
    cookies = {settings.SESSION_COOKIE_NAME: session_cookie(world.researcher_a)}
    stack = contextlib.ExitStack()
    stack.enter_context(served(server.app, port))

    async def session(proxy):
        async with aiohttp.ClientSession(cookies=cookies) as client:
            ws = await client.ws_connect(f"{proxy}/w/1/echo", headers={"Origin": proxy})
            await ws.send_str("before")
            assert await ws.receive_str() == "before"
            await asyncio.to_thread(stack.close)  # the server stops, dropping its connections
            async with asyncio.timeout(10):
                closing = await ws.receive()
            async with client.get(f"{proxy}/w/1/api/status") as after:
                return closing.type, closing.data, after.status

    try:
        with proxy_serving() as proxy:
            kind, code, status = run_coroutine(session(proxy))
    finally:
        stack.close()
    # It sent no close frame: the browser is told 1011 (1006, a lost connection, may not be
    # sent), and the next request finds nobody there.
    assert (kind, code, status) == (aiohttp.WSMsgType.CLOSE, 1011, 502)
