"""One clock: server code reads "now" only through ``django.utils.timezone.now`` (aware, UTC),
and tests move that clock with time-machine, never by patching a module's ``now``.

Durations and deadlines use ``time.monotonic``, which is no reading of the date and which
time-machine leaves alone, so timeouts stay real while a test stands at another instant.
"""

import ast
from datetime import UTC, datetime
from pathlib import Path

import time_machine
from django.utils import timezone

from tests import REPOSITORY

ROOT = REPOSITORY
SERVER_PACKAGES = (
    "portal",
    "core",
    "tenants",
    "images",
    "clusters",
    "jobs",
    "telemetry",
    "finance",
    "policy",
)
# Calls that read the wall clock behind ``timezone.now``'s back (naive, or local, or both).
OTHER_CLOCKS = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "localtime"),
    ("time", "gmtime"),
}


# Pure modules import no Django, so they cannot call ``timezone.now``: each takes its clock as
# a parameter, and its default reads the same UTC epoch clock that ``timezone.now`` reads
# (and that time-machine moves).
PURE_DEFAULT_CLOCKS = {("telemetry/sources.py", "time", "time_ns")}


def _python_files(*packages: str) -> list[Path]:
    return sorted(
        path
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def _attribute_calls(path: Path) -> list[tuple[str, str, int]]:
    """Every ``a.b(...)`` and ``a.b.c(...)`` call in the file, as (a or b, c, line)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = getattr(owner, "id", None) or getattr(owner, "attr", None)
            if name is not None:
                found.append((name, node.func.attr, node.lineno))
    return found


def test_server_code_reads_now_only_through_timezone_now():
    readings = [
        f"{path.relative_to(ROOT)}:{line}: {owner}.{attr}()"
        for path in _python_files(*SERVER_PACKAGES)
        for owner, attr, line in _attribute_calls(path)
        if (owner, attr) in OTHER_CLOCKS
        and (str(path.relative_to(ROOT)), owner, attr) not in PURE_DEFAULT_CLOCKS
    ]
    assert readings == []


def test_tests_move_the_clock_with_time_machine_not_by_patching_now():
    patched = []
    for path in _python_files("tests", "bench"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            is_setattr = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"setattr", "patch", "object"}
            )
            if is_setattr and any(
                isinstance(arg, ast.Constant) and str(arg.value).split(".")[-1] in {"now", "time"}
                for arg in node.args
            ):
                patched.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert patched == []


def test_the_guard_sees_a_clock_reading(tmp_path):
    """The scan above would catch a reading: shown on a file that has each kind."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import datetime, time\n"
        "a = datetime.datetime.now()\n"
        "b = datetime.date.today()\n"
        "c = time.time()\n"
        "d = time.monotonic()\n"
    )
    assert _attribute_calls(sample) == [
        ("datetime", "now", 2),
        ("date", "today", 3),
        ("time", "time", 4),
        ("time", "monotonic", 5),
    ]


def test_time_machine_moves_timezone_now_in_every_thread():
    """What the date tests rely on: a travel moves Django's clock, aware and in UTC, for the
    test's thread and for others (the live server's)."""
    import threading

    instant = datetime(2028, 2, 29, 23, 59, 59, 900_000, tzinfo=UTC)
    seen = []
    with time_machine.travel(instant, tick=False):
        thread = threading.Thread(target=lambda: seen.append(timezone.now()))
        thread.start()
        thread.join()
        assert timezone.now() == instant
    assert seen == [instant]
