"""Issue 31.2: a refused request (403) writes one log line, not a traceback."""

import logging

from django.test import Client
from django.urls import reverse

from portal.log_format import JsonFormatter


def _formatted(records) -> list[str]:
    text = logging.Formatter("%(levelname)s %(name)s %(message)s")
    return [text.format(record) for record in records] + [
        JsonFormatter().format(record) for record in records
    ]


def test_a_permission_denied_is_one_line_without_a_traceback(world, caplog):
    # Given a researcher, who may read the idle-GPU policy of her tenant but not change it
    client = Client()
    client.force_login(world.researcher_a)
    url = reverse("tenants:idle_policy", args=["vision"])

    # When she posts a change (the view raises PermissionDenied)
    with caplog.at_level(logging.INFO):
        response = client.post(url, {"idle_notify_after_min": "30"})

    # Then 403, and one line that says so, with no stack in either log format
    assert response.status_code == 403
    records = [r for r in caplog.records if r.name.startswith("django")]
    assert [(r.name, r.levelname, r.getMessage()) for r in records] == [
        ("django.request", "WARNING", f"Forbidden (Permission denied): {url}")
    ]
    assert records[0].exc_info is None
    for line in _formatted(records):
        assert "\n" not in line and "Traceback" not in line, line


def test_a_server_error_still_logs_its_traceback(caplog):
    """Only refusals lose their stack: an error of any other kind keeps it."""
    try:
        raise RuntimeError("a real bug")
    except RuntimeError:
        logging.getLogger("django.request").exception("Internal Server Error: /runs/")

    error = next(r for r in caplog.records if r.name == "django.request")
    assert error.exc_info is not None and isinstance(error.exc_info[1], RuntimeError)
    assert "Traceback" in logging.Formatter().format(error)
