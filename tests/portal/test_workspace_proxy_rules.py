"""The workspace proxy's pure rules: which paths are a workspace's, where a request came
from, what goes upstream and back (portal/workspace_proxy/rules.py)."""

import pytest

from portal.workspace_proxy import rules


@pytest.mark.parametrize(
    ("raw_path", "run_id"),
    [
        ("/w/1/", 1),
        ("/w/42/api/kernels", 42),
        ("/w/999999999999999999/lab", 999999999999999999),
        ("/w/1000000000000000000/lab", None),  # 19 digits: past a bigint
        ("/w/01/lab", None),
        ("/w/0/lab", None),
        ("/w/1", None),
        ("//w/1/", None),
        ("/w/-1/", None),
        ("/W/1/", None),
        ("/w/1%2F/", None),
        ("http://evil/w/1/", None),
    ],
)
def test_only_a_workspace_path_names_a_run(raw_path, run_id):
    assert rules.workspace_run_id(raw_path) == run_id


@pytest.mark.parametrize(
    ("raw_path", "dotted"),
    [
        ("/w/1/lab", False),
        ("/w/1/api/contents/..hidden", False),
        ("/w/1/api/contents/a.b", False),
        ("/w/1/../2/", True),
        ("/w/1/./lab", True),
        ("/w/1/%2e%2E/2/", True),
        ("/w/1/%2E/lab", True),
        ("/w/1/%252e%252e/2/", False),  # decoded once by the server: '%2e%2e', a name
        ("/w/1/..", True),
    ],
)
def test_dot_segments_are_found_also_percent_encoded(raw_path, dotted):
    assert rules.has_dot_segment(raw_path) is dotted


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://127.0.0.1:8001", "http://127.0.0.1:8001"),
        ("HTTPS://Gantry.Example.org:443/w/1/lab?x=1", "https://gantry.example.org"),
        ("http://gantry.example.org:80", "http://gantry.example.org"),
        ("https://gantry.example.org:8443/", "https://gantry.example.org:8443"),
        ("http://[::1]:8001/x", "http://[::1]:8001"),
        ("null", None),
        ("/w/1/lab", None),
        ("file:///etc/passwd", None),
        ("http://host:99999", None),
        ("javascript:alert(1)", None),
    ],
)
def test_an_origin_is_scheme_host_and_a_port_other_than_the_default(url, origin):
    assert rules.origin_of(url) == origin


PUBLIC = "https://gantry.example.org:8443"


def refusal(method="POST", websocket=False, origin=None, referer=None):
    return rules.origin_refusal(
        method=method, websocket=websocket, origin=origin, referer=referer, expected=PUBLIC
    )


def test_state_changing_requests_and_websockets_must_come_from_the_proxys_origin():
    assert [refusal(method) for method in ("GET", "HEAD", "OPTIONS", "get")] == [None] * 4
    assert refusal("POST", origin=PUBLIC) is None
    assert refusal("DELETE", origin=PUBLIC + "/") is None
    assert refusal("PUT", referer=PUBLIC + "/w/1/lab") is None
    assert refusal("GET", websocket=True, origin=PUBLIC) is None
    # Origin decides when both are sent.
    assert refusal("POST", origin="https://evil.example", referer=PUBLIC + "/w/1/lab")
    assert refusal("PATCH", origin="https://gantry.example.org") == (
        "Refused: this request changes a workspace or opens a connection to it, and it did not "
        "come from a page of https://gantry.example.org:8443 (its Origin or Referer header is "
        "'https://gantry.example.org').\n"
    )
    assert refusal("GET", websocket=True) == (
        "Refused: this request changes a workspace or opens a connection to it, and it did not "
        "come from a page of https://gantry.example.org:8443 (its Origin or Referer header is "
        "missing).\n"
    )
    assert refusal("POST", origin="null")
    assert refusal("POST", origin="http://gantry.example.org:8443")  # another scheme


def test_upstream_headers_carry_the_token_and_none_of_the_portals_secrets():
    sent = rules.upstream_headers(
        [
            ("Host", "evil.example:22"),
            ("Authorization", "token guessed"),
            ("Cookie", "sessionid=s3cret; _xsrf=2|abc; csrftoken=c5rf"),
            ("Cookie", "username-127-0-0-1-9=xyz"),
            ("X-Forwarded-Host", "evil.example"),
            ("Connection", "keep-alive, Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "k"),
            ("Accept", "application/json"),
            ("Origin", PUBLIC),
        ],
        portal_cookies=frozenset({"sessionid", "csrftoken"}),
        host="10.1.2.3:40001",
        token="t0k3n",
        websocket=True,
    )
    assert sent == [
        ("Accept", "application/json"),
        ("Origin", PUBLIC),
        ("Cookie", "_xsrf=2|abc; username-127-0-0-1-9=xyz"),
        ("Host", "10.1.2.3:40001"),
        ("Authorization", "token t0k3n"),
    ]


def test_no_cookie_header_is_sent_when_only_the_portals_were_there():
    sent = rules.upstream_headers(
        [("Cookie", "sessionid=s3cret")],
        portal_cookies=frozenset({"sessionid"}),
        host="127.0.0.1:9",
        token="t",
        websocket=False,
    )
    assert sent == [("Host", "127.0.0.1:9"), ("Authorization", "token t")]


def test_the_answer_keeps_no_hop_by_hop_header_and_sets_no_portal_cookie():
    kept = rules.downstream_headers(
        [
            ("Content-Type", "application/json"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "keep-alive"),
            ("Set-Cookie", "sessionid=planted; Path=/"),
            ("Set-Cookie", " csrftoken=planted"),
            ("Set-Cookie", "_xsrf=2|abc; Path=/w/1/"),
        ],
        portal_cookies=frozenset({"sessionid", "csrftoken"}),
    )
    assert kept == [("Content-Type", "application/json"), ("Set-Cookie", "_xsrf=2|abc; Path=/w/1/")]


def test_hosts_and_close_codes():
    assert rules.host_header("127.0.0.1", 8888) == "127.0.0.1:8888"
    assert rules.host_header("::1", 8888) == "[::1]:8888"
    assert [rules.close_code_to_send(code) for code in (None, 1000, 1001, 1005, 1006, 1008)] == [
        1000, 1000, 1001, 1000, 1011, 1008,
    ]  # fmt: skip
    assert [rules.close_code_to_send(code) for code in (1004, 1015, 2999, 3000, 4999, 5000)] == [
        1011, 1011, 1011, 3000, 4999, 1011,
    ]  # fmt: skip
