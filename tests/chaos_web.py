"""The portal's WSGI application with a kill point, for gunicorn in the chaos test
(tests/portal/test_chaos.py): ``gunicorn -c python:portal.gunicorn_conf tests.chaos_web``.

With ``GANTRY_CHAOS_WEB_KILL_POINT`` set to a directory, the first gunicorn worker that
answers a submit (``POST /api/v1/runs/``) with 201 after the test armed the point (the file
``plan`` there) stops before it sends a byte of the answer: the run is committed, its client
has heard nothing. The worker claims the plan (a rename: only one worker stops), writes its
pid and the request's Idempotency-Key to ``reached`` and waits for the test's ``kill -9``.
"""

import os
import time
from pathlib import Path

from portal.wsgi import application as portal_application

KILL_POINT_ENV = "GANTRY_CHAOS_WEB_KILL_POINT"
SUBMIT_PATH = "/api/v1/runs/"
WAIT_S = 15.0  # the test kills the worker well before


def application(environ, start_response):
    answered = []

    def recording_start_response(status, headers, exc_info=None):
        answered.append(status)
        return start_response(status, headers, exc_info)

    response = portal_application(environ, recording_start_response)
    directory = os.environ.get(KILL_POINT_ENV)
    if (
        directory
        and environ.get("REQUEST_METHOD") == "POST"
        and environ.get("PATH_INFO") == SUBMIT_PATH
        and answered
        and answered[0].startswith("201")
    ):
        _reach(Path(directory), environ.get("HTTP_IDEMPOTENCY_KEY", ""))
    return response


def _reach(directory: Path, key: str) -> None:
    try:
        os.rename(directory / "plan", directory / "claimed")
    except FileNotFoundError:
        return  # not armed, or another worker claimed it
    staged = directory / "reached.new"
    staged.write_text(f"{os.getpid()} {key}\n")
    os.replace(staged, directory / "reached")
    time.sleep(WAIT_S)
