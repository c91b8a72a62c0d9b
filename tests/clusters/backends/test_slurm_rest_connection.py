"""The REST transport opens a connection per request to slurmrestd (``Connection: close``):
slurmrestd closes idle connections by itself, and a request sent on one it is closing
failed as "unreachable" (a submit, seen in CI). A real HTTP server on 127.0.0.1 records
what arrives."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clusters.backends.slurm_rest import RestTransport
from clusters.backends.slurm_settings import SlurmSettings


def _token() -> str:
    claims = base64.urlsafe_b64encode(json.dumps({"sun": "slurmrest"}).encode()).decode()
    return f"e30.{claims.rstrip('=')}.sig"


@pytest.fixture
def server():
    seen: list[tuple[str, str | None, tuple[str, int]]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive unless the client says otherwise

        def do_GET(self):
            seen.append((self.path, self.headers.get("Connection"), self.client_address))
            body = b'{"jobs": [], "errors": []}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", seen
    httpd.shutdown()
    httpd.server_close()


def test_each_request_has_a_connection_of_its_own(server, monkeypatch):
    url, seen = server
    monkeypatch.setenv("GANTRY_TEST_SLURM_TOKEN", _token())
    settings = SlurmSettings(
        job_dir="/tmp/jobs",
        flavors={},
        rest_url=url,
        rest_user="slurmrest",
        rest_token_env="GANTRY_TEST_SLURM_TOKEN",
    )
    transport = RestTransport(settings)

    for _ in range(3):
        assert transport.request("GET", "/slurm/v0.0.38/jobs") == (200, {"jobs": [], "errors": []})

    assert [(path, connection) for path, connection, _ in seen] == [
        ("/slurm/v0.0.38/jobs", "close")
    ] * 3
    # three connections: three client ports
    assert len({address for _, _, address in seen}) == 3
