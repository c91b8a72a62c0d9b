"""The workspace proxy in front of a real Jupyter Server (issue 37, points 3 and "Bad input"):
its owner reaches it, runs code over the kernel WebSocket; nobody else does, whatever the
session; a foreign page cannot drive it; its traffic is recorded as activity.

Each test's sequences start at 1 (``reset_sequences``): its workspace is run 1 with attempt
1, the base URL and token of the one Jupyter Server this module starts."""

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
import requests
import time_machine
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client

from jobs.models import Attempt, AttemptState, Run, RunState, Workspace
from jobs.services.workspaces import workspace_base_path, workspace_server_token
from portal.workspace_proxy.gate import DECISION_TTL_S
from portal.workspace_proxy.rules import NOT_FOUND_TEXT
from tests.workspace_support import (
    jupyter_server,
    proxy_serving,
    run_coroutine,
    session_cookie,
    workspace_running,
)

pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)

RUN_ID = ATTEMPT_ID = 1
BASE = workspace_base_path(RUN_ID)


@pytest.fixture(scope="module")
def jupyter_port(tmp_path_factory):
    with jupyter_server(
        base_url=BASE,
        token=workspace_server_token(ATTEMPT_ID),
        scratch=tmp_path_factory.mktemp("jupyter"),
    ) as port:
        yield port


@pytest.fixture
def workspace(world, jupyter_port):
    run = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=jupyter_port)
    assert (run.pk, Workspace.objects.get(run=run).attempt_id) == (RUN_ID, ATTEMPT_ID)
    return run


@pytest.fixture
def proxy():
    with proxy_serving() as base:
        yield base


def http(method, url, **options):
    return requests.request(method, url, timeout=60, **options)


def owner_get(proxy, cookie, path="api/status", **headers):
    return http(
        "GET",
        f"{proxy}{BASE}{path}",
        cookies={settings.SESSION_COOKIE_NAME: cookie},
        headers=headers,
    )


def test_the_owner_reaches_jupyter_through_the_proxy(world, workspace, proxy):
    cookie = session_cookie(world.researcher_a)
    answer = owner_get(proxy, cookie)
    assert answer.status_code == 200
    assert set(answer.json()) == {"connections", "kernels", "last_activity", "started"}
    lab = owner_get(proxy, cookie, "lab")
    assert (lab.status_code, "JupyterLab" in lab.text) == (200, True)


async def execute(proxy, cookie, kernel_id, code, *, origin):
    """Run ``code`` on the kernel over its WebSocket through the proxy: the stdout text."""
    session_id = uuid.uuid4().hex
    message_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": message_id, "username": "alice", "session": session_id,
            "msg_type": "execute_request", "version": "5.3",
        },
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {
            "code": code, "silent": False, "store_history": False, "user_expressions": {},
            "allow_stdin": False, "stop_on_error": True,
        },
    }  # fmt: skip
    url = f"{proxy.replace('http', 'ws')}{BASE}api/kernels/{kernel_id}/channels"
    async with (
        aiohttp.ClientSession(cookies={settings.SESSION_COOKIE_NAME: cookie}) as client,
        client.ws_connect(url, params={"session_id": session_id}, headers={"Origin": origin}) as ws,
    ):
        await ws.send_str(json.dumps(request))
        stdout = ""
        async with asyncio.timeout(60):
            async for message in ws:
                data = json.loads(message.data)
                if data["parent_header"].get("msg_id") != message_id:
                    continue
                if data["msg_type"] == "stream":
                    stdout += data["content"]["text"]
                # Idle again on IOPub: every output came before (the reply, on the shell
                # channel, may come first).
                if (data["msg_type"], data["content"].get("execution_state")) == ("status", "idle"):
                    return stdout


def test_the_owner_runs_code_on_a_kernel_over_the_websocket(world, workspace, proxy):
    cookie = session_cookie(world.researcher_a)
    jar = {settings.SESSION_COOKIE_NAME: cookie}
    started = http("POST",
        f"{proxy}{BASE}api/kernels", json={"name": "python3"}, cookies=jar,
        headers={"Origin": proxy},
    )  # fmt: skip
    assert started.status_code == 201
    kernel_id = started.json()["id"]
    try:
        assert (
            run_coroutine(execute(proxy, cookie, kernel_id, "print(6*7)", origin=proxy)) == "42\n"
        )
    finally:
        stopped = http(
            "DELETE",
            f"{proxy}{BASE}api/kernels/{kernel_id}",
            cookies=jar,
            headers={"Origin": proxy},
        )
    assert stopped.status_code == 204


def kernel_ids(proxy, cookie):
    return sorted(kernel["id"] for kernel in owner_get(proxy, cookie, "api/kernels").json())


def test_nobody_but_the_owner_gets_in_and_everyone_else_sees_the_same_404(world, workspace, proxy):
    batch = Run.objects.create(
        experiment=workspace.experiment, tenant=world.vision, flavor=world.a100, gpus=1,
        submitted_by=world.researcher_a, state=RunState.RUNNING,
    )  # fmt: skip
    refused = {
        "another tenant's researcher": (session_cookie(world.researcher_b), RUN_ID),
        "another researcher of the same tenant": (session_cookie(world.researcher_a2), RUN_ID),
        "the tenant's admin": (session_cookie(world.tenant_admin_a), RUN_ID),
        "a platform admin": (session_cookie(world.platform_admin), RUN_ID),
        "anonymous": ("", RUN_ID),
        "a made-up session": ("x" * 32, RUN_ID),
        "a missing run": (session_cookie(world.researcher_a), 999),
        "a batch run": (session_cookie(world.researcher_a), batch.pk),
    }
    answers = {
        who: http(
            "GET", f"{proxy}/w/{run_id}/api/status", cookies={settings.SESSION_COOKIE_NAME: cookie}
        )
        for who, (cookie, run_id) in refused.items()
    }
    assert {who: (a.status_code, a.text) for who, a in answers.items()} == dict.fromkeys(
        refused, (404, NOT_FOUND_TEXT)
    )


def test_the_owner_of_a_workspace_with_no_current_address_is_told_where_it_stands(
    world, workspace, proxy
):
    cookie = session_cookie(world.researcher_a)
    assert owner_get(proxy, cookie).status_code == 200
    answers = []

    def after_the_kept_decision():
        # What a session may open is kept DECISION_TTL_S; its session is loaded every time.
        time.sleep(DECISION_TTL_S + 0.1)
        answer = owner_get(proxy, cookie)
        answers.append((answer.status_code, answer.text))

    # A later attempt (a resume) whose server has not reported yet: the first's address is
    # not its.
    second = Attempt.objects.create(
        run=workspace, number=2, cluster=world.cluster, state=AttemptState.RUNNING
    )
    after_the_kept_decision()
    second.delete()
    Attempt.objects.filter(pk=ATTEMPT_ID).update(state=AttemptState.FAILED)
    after_the_kept_decision()
    Attempt.objects.filter(pk=ATTEMPT_ID).update(state=AttemptState.RUNNING)
    Run.objects.filter(pk=RUN_ID).update(state=RunState.SUSPENDED)
    after_the_kept_decision()
    Run.objects.filter(pk=RUN_ID).update(state=RunState.RUNNING)
    Workspace.objects.filter(run_id=RUN_ID).update(host="", port=None)
    after_the_kept_decision()
    Run.objects.filter(pk=RUN_ID).update(state=RunState.CANCELLED)
    after_the_kept_decision()

    page = f"{settings.GANTRY_PUBLIC_URL}/workspaces/{RUN_ID}/"
    starting = (
        409,
        f"Workspace {RUN_ID} is not answering yet (queued or starting). Its page shows where "
        f"it stands: {page}\n",
    )
    assert answers == [
        starting,
        starting,
        (
            409,
            f"Workspace {RUN_ID} is suspended: its GPUs were released and its files kept. "
            f"Resume it from {page}\n",
        ),
        starting,
        (409, f"Workspace {RUN_ID} has ended. Its page is {page}\n"),
    ]
    # Nobody else learns it exists.
    other = http(
        "GET",
        f"{proxy}{BASE}api/status",
        cookies={settings.SESSION_COOKIE_NAME: session_cookie(world.researcher_a2)},
    )
    assert (other.status_code, other.text) == (404, NOT_FOUND_TEXT)


@pytest.mark.parametrize("on_loop_sessions", [True, False], ids=["on the loop", "in threads"])
def test_a_session_logged_out_expired_or_deleted_is_refused_at_once(
    world, workspace, on_loop_sessions
):
    with proxy_serving(on_loop_sessions=on_loop_sessions) as proxy:
        refused_at_once(world, proxy)


def refused_at_once(world, proxy):
    client = Client()
    client.force_login(world.researcher_a)
    logged_out = client.cookies[settings.SESSION_COOKIE_NAME].value
    expired, deleted = session_cookie(world.researcher_a), session_cookie(world.researcher_a)
    for cookie in (logged_out, expired, deleted):  # each one's decision is kept from now on
        assert owner_get(proxy, cookie).status_code == 200
    client.logout()
    Session.objects.filter(session_key=expired).update(
        expire_date=datetime.now(UTC) - timedelta(seconds=1)
    )
    Session.objects.filter(session_key=deleted).delete()
    answers = [owner_get(proxy, cookie) for cookie in (logged_out, expired, deleted)]
    assert [(a.status_code, a.text) for a in answers] == [(404, NOT_FOUND_TEXT)] * 3


def test_a_session_of_an_old_password_is_refused_within_the_kept_second(world, workspace, proxy):
    cookie = session_cookie(world.researcher_a)
    assert owner_get(proxy, cookie).status_code == 200
    world.researcher_a.set_password("a new password 2026")
    world.researcher_a.save(update_fields=["password"])
    time.sleep(DECISION_TTL_S + 0.1)
    answer = owner_get(proxy, cookie)
    assert (answer.status_code, answer.text) == (404, NOT_FOUND_TEXT)
    assert not Session.objects.filter(session_key=cookie).exists()  # flushed, as Django does


def test_a_foreign_page_cannot_start_a_kernel_or_open_a_websocket(world, workspace, proxy):
    cookie = session_cookie(world.researcher_a)
    jar = {settings.SESSION_COOKIE_NAME: cookie}
    before = kernel_ids(proxy, cookie)
    foreign = {"Origin": "http://evil.example"}
    forged = http(
        "POST", f"{proxy}{BASE}api/kernels", json={"name": "python3"}, cookies=jar, headers=foreign
    )
    unsigned = http("POST", f"{proxy}{BASE}api/kernels", json={"name": "python3"}, cookies=jar)
    foreign_referer = http("POST",
        f"{proxy}{BASE}api/kernels", json={"name": "python3"}, cookies=jar,
        headers={"Referer": "http://evil.example/w/1/lab"},
    )  # fmt: skip
    assert (forged.status_code, unsigned.status_code, foreign_referer.status_code) == (403,) * 3
    assert forged.text == (
        f"Refused: this request changes a workspace or opens a connection to it, and it did "
        f"not come from a page of {proxy} (its Origin or Referer header is "
        "'http://evil.example').\n"
    )
    assert "header is missing" in unsigned.text
    assert kernel_ids(proxy, cookie) == before

    async def handshake(headers):
        async with aiohttp.ClientSession(cookies=jar) as client:
            try:
                async with client.ws_connect(
                    f"{proxy.replace('http', 'ws')}{BASE}api/events/subscribe", headers=headers
                ):
                    return 101
            except aiohttp.WSServerHandshakeError as refused:
                return refused.status

    assert run_coroutine(handshake(foreign)) == 403
    assert run_coroutine(handshake({})) == 403
    assert run_coroutine(handshake({"Origin": proxy})) == 101


def test_a_page_of_the_proxy_may_send_a_referer_instead_of_an_origin(world, workspace, proxy):
    cookie = session_cookie(world.researcher_a)
    jar = {settings.SESSION_COOKIE_NAME: cookie}
    started = http("POST",
        f"{proxy}{BASE}api/kernels", json={"name": "python3"}, cookies=jar,
        headers={"Referer": f"{proxy}{BASE}lab"},
    )  # fmt: skip
    assert started.status_code == 201
    stopped = http("DELETE",
        f"{proxy}{BASE}api/kernels/{started.json()['id']}", cookies=jar,
        headers={"Referer": f"{proxy}{BASE}lab"},
    )  # fmt: skip
    assert stopped.status_code == 204


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def proxy_activity():
    return Workspace.objects.get(run_id=RUN_ID).proxy_activity_at


def closing_connection(work):
    """``work`` for a thread of asyncio's: Django's connection of that thread closed after."""

    def run():
        try:
            return work()
        finally:
            connection.close()

    return run


def owner_saves(proxy, cookie):
    """What a person does: a file saved (a PUT, from the proxy's own origin)."""
    return http(
        "PUT",
        f"{proxy}{BASE}api/contents/notes.txt",
        cookies={settings.SESSION_COOKIE_NAME: cookie},
        headers={"Origin": proxy},
        json={"type": "file", "format": "text", "content": "hello"},
    )


def test_what_a_person_does_is_recorded_as_activity_at_most_once_per_interval(
    world, workspace, proxy
):
    cookie = session_cookie(world.researcher_a)
    assert proxy_activity() is None
    # Reading is not activity: JupyterLab polls while a tab is open.
    assert owner_get(proxy, cookie).status_code == 200
    time.sleep(0.3)
    assert proxy_activity() is None
    at = datetime(2026, 12, 6, 21, 0, tzinfo=UTC)
    with time_machine.travel(at, tick=False):
        assert owner_saves(proxy, cookie).status_code in (200, 201)
        assert wait_for(lambda: proxy_activity() is not None)
    assert proxy_activity() == at
    # Within the interval (30 s of this process), it is not written again.
    assert owner_saves(proxy, cookie).status_code == 200
    time.sleep(0.3)
    assert proxy_activity() == at
    # A refused request is no activity.
    http("GET", f"{proxy}{BASE}api/status")
    time.sleep(0.3)
    assert proxy_activity() == at


def test_a_message_sent_is_activity_an_open_websocket_is_not_and_it_closes_with_its_session(
    world, workspace
):
    client = Client()
    client.force_login(world.researcher_a)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    jar = {settings.SESSION_COOKIE_NAME: cookie}
    unused = datetime(2026, 1, 1, tzinfo=UTC)

    async def open_then_log_out(proxy, kernel_id):
        url = f"{proxy.replace('http', 'ws')}{BASE}api/kernels/{kernel_id}/channels"
        async with (
            aiohttp.ClientSession(cookies=jar) as session,
            session.ws_connect(url, headers={"Origin": proxy}) as ws,
        ):
            marks = []
            await asyncio.sleep(0.5)  # open, the kernel's status coming in: not recorded
            marks.append(await asyncio.to_thread(closing_connection(proxy_activity)))
            await ws.send_str(
                json.dumps(
                    {
                        "header": {
                            "msg_id": "info-1", "username": "alice", "session": "s-1",
                            "msg_type": "kernel_info_request", "version": "5.3",
                        },
                        "parent_header": {}, "metadata": {}, "content": {}, "channel": "shell",
                    }
                )
            )  # fmt: skip
            await asyncio.sleep(0.5)  # what a browser sends is
            marks.append(await asyncio.to_thread(closing_connection(proxy_activity)))
            await asyncio.to_thread(closing_connection(client.logout))
            async with asyncio.timeout(5):
                while (message := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                    continue  # the kernel's answers, until the proxy closes it
            return marks, message.type, ws.close_code

    with proxy_serving(recheck_s=0.2, activity_every_s=0.1) as proxy:
        started = http(
            "POST", f"{proxy}{BASE}api/kernels", json={"name": "python3"}, cookies=jar,
            headers={"Origin": proxy},
        )  # fmt: skip
        assert started.status_code == 201
        kernel_id = started.json()["id"]
        time.sleep(0.3)  # the start (a POST) was recorded; what follows is measured from here
        Workspace.objects.filter(run_id=RUN_ID).update(proxy_activity_at=unused)
        marks, kind, code = run_coroutine(open_then_log_out(proxy, kernel_id))
        owner = {settings.SESSION_COOKIE_NAME: session_cookie(world.researcher_a)}
        http(
            "DELETE", f"{proxy}{BASE}api/kernels/{kernel_id}", cookies=owner,
            headers={"Origin": proxy},
        )  # fmt: skip
    assert marks[0] == unused
    assert marks[1] > marks[0]
    assert (kind, code) == (aiohttp.WSMsgType.CLOSE, 1008)
