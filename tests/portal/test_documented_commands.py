"""Every command of README.md and docs/cli.md runs against the demo (issue 31.7), as a new
user types it: the embedded default started as `make run` starts it (on a free port, with
its demo speed), the installed `gantry` console script, bash, curl and jq.

The commands are read from the two files (README: its ``sh`` blocks, a line each; docs/cli.md:
the ``$`` lines of its ``console`` blocks and its ``sh`` blocks whole), so a command added to
either page is run here without anyone adding it. What cannot run here is listed in
NOT_RUN, with the reason. The demo's URL replaces the pages' example URLs; docs/cli.md's
example run numbers are mapped to the runs its own commands made (RUN_NUMBERS).
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from portal.demo import DEMO_PASSWORD
from tests import REPOSITORY
from tests.celery_support import free_port, wait_for

pytestmark = pytest.mark.integration

NOT_RUN = {
    "make run": "it starts the demo these commands run against: this test starts it as "
    "`make run` does (python -m portal.embedded)",
    "make test": "the whole test suite, this test included",
    "pip install -e .": "installs the package; the test runs the `gantry` it installed",
    "/attempts/report/": "a job sends it with the attempt token only its own environment "
    "holds (tests/jobs/test_reproducibility.py reports a runtime with it)",
}
PAGE_URLS = ("http://127.0.0.1:8000", "https://gantry.example.org")
# docs/cli.md's example run numbers: 43 is the run its `submit train.yaml --wait` made, 41 a
# run of alice's that waits (the first QUEUED row its `ls` printed).
RUN_NUMBERS = ("43", "41")


def fenced_blocks(path: Path) -> list[tuple[str, str]]:
    """(language, text) of every fenced block of a Markdown file, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(), flags=re.MULTILINE | re.DOTALL)


def shell_commands(text: str) -> list[str]:
    """The commands of a shell block: a line each, or more while a quote or a trailing
    backslash continues it."""
    commands, pending = [], ""
    for line in text.splitlines(keepends=True):
        pending += line
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if pending.rstrip("\n").endswith("\\"):
            continue
        if pending.strip():
            commands.append(pending.strip())
        pending = ""
    assert pending == "", pending
    return commands


def readme_commands() -> list[str]:
    commands = []
    for language, text in fenced_blocks(REPOSITORY / "README.md"):
        if language == "sh":
            commands += shell_commands(text)
    return commands


def cli_doc_commands() -> list[tuple[str, list[str]]]:
    """(command, the output the page shows under it) of docs/cli.md, in order."""
    commands: list[tuple[str, list[str]]] = []
    for language, text in fenced_blocks(REPOSITORY / "docs" / "cli.md"):
        if language == "sh":
            commands.append((text, []))
        elif language == "console":
            for line in text.splitlines():
                if line.startswith("$ "):
                    commands.append((line[2:], []))
                elif commands:
                    commands[-1][1].append(line)
    return commands


def not_run(command: str) -> bool:
    return any(marker in command for marker in NOT_RUN)


def test_the_pages_hold_the_commands_this_test_expects():
    """The extraction finds what the pages show (so the test below cannot pass on nothing),
    and every command left out is named with its reason."""
    readme = readme_commands()
    docs = [command for command, _ in cli_doc_commands()]
    assert len(readme) == 10 and len(docs) == 16, (readme, docs)
    assert {marker for marker in NOT_RUN if any(marker in c for c in readme + docs)} == set(NOT_RUN)
    assert "gantry submit yolo.yaml --set resources.nodes=2 --wait" in " ".join(readme)


class Shell:
    """bash in a scratch directory with the `gantry` and Python of this environment."""

    def __init__(self, tmp_path: Path, base: str):
        self.cwd = tmp_path / "work"
        self.cwd.mkdir()
        self.base = base
        self.env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "GANTRY_CONFIG_DIR": str(tmp_path / "config"),
            "LANG": "C.UTF-8",
            # The gantry of this checkout, whatever the environment installed.
            "PYTHONPATH": str(REPOSITORY),
        }
        self.numbers: dict[str, str] = {}

    def __call__(self, command: str, *, stdin: str = "", timeout: float = 300):
        for url in PAGE_URLS:
            command = command.replace(url, self.base)
        for number, actual in self.numbers.items():
            command = re.sub(rf"\b{number}\b", actual, command)
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "-c", command], cwd=self.cwd, env=self.env, input=stdin,
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        took = time.monotonic() - started
        print(f"{took:6.1f} s  exit {result.returncode}  {command}")  # the test's log
        return result.returncode, result.stdout, result.stderr, took


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def demo(tmp_path):
    """The embedded default with its demo, as `make run` starts it, on a free port."""
    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env |= {"GANTRY_DATA_DIR": str(tmp_path / "data"), "GANTRY_PORT": str(port)}
    log_path = tmp_path / "embedded.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "portal.embedded"], cwd=REPOSITORY, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(base), timeout=240, what="the demo")
        yield base, log_path
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, log_path.read_text()[-3000:]


def token_for(base: str, username: str) -> str:
    """An API token as the README says to get one (POST /api/v1/tokens/)."""
    body = json.dumps({"username": username, "password": DEMO_PASSWORD}).encode()
    request = urllib.request.Request(
        f"{base}/api/v1/tokens/", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["token"]


# Starting the demo, and three runs that the commands wait for at the demo's own speed.
@pytest.mark.timeout(1200)
def test_every_command_of_the_readme_and_the_cli_docs_runs_against_the_demo(demo, tmp_path):
    base, log_path = demo
    shell = Shell(tmp_path, base)
    shell.env["TOKEN"] = token_for(base, "alice")
    ran = []

    # README.md, in the order a reader meets them.
    for command in readme_commands():
        if not_run(command):
            continue
        stdin = DEMO_PASSWORD + "\n" if command.startswith("gantry login") else ""
        code, out, err, took = shell(command, stdin=stdin)
        assert code == 0, (command, out, err, log_path.read_text()[-2000:])
        if command.startswith("curl") and "-d" in command:
            assert json.loads(out)["state"] == "QUEUED", out
        elif command.startswith("curl"):
            assert "results" in json.loads(out), out
        elif "--wait" in command:
            # The README's CLI example finishes on the demo, and soon.
            assert re.search(r"^Run \d+ SUCCEEDED\.$", out, flags=re.MULTILINE), (out, err)
            assert took < 300, took
        elif "jq '.[0].state'" in command:
            assert out == '"SUCCEEDED"\n'
        elif command.startswith("gantry logs"):
            assert out.startswith("[simulator] "), out
        ran.append(command)

    # docs/cli.md: train.yaml is its spec example.
    spec = next(text for language, text in fenced_blocks(REPOSITORY / "docs/cli.md")
                if language == "yaml")  # fmt: skip
    (shell.cwd / "train.yaml").write_text(spec)
    for command, shown in cli_doc_commands():
        if not_run(command):
            continue
        stdin = DEMO_PASSWORD + "\n" if command.startswith("gantry login") else ""
        code, out, err, _ = shell(command, stdin=stdin)
        expected_code = 4 if "gpus_per_node=0" in command else 0
        assert code == expected_code, (command, out, err)
        if command.startswith("gantry login"):
            assert out.startswith(f"Logged in to {base} as alice, token expires "), out
        elif "gpus_per_node=0" in command:
            # Exactly what the page shows, every failing field named.
            assert err.splitlines() == shown, err
        elif "case $?" in command:
            assert re.fullmatch(r"trained: run \d+\n", out), (out, err)
        elif command.startswith("gantry submit") and "--wait" in command:
            submitted = re.search(r"^Submitted run (\d+) ", err + out, flags=re.MULTILINE)
            assert submitted and f"Run {submitted.group(1)} SUCCEEDED." in out, (out, err)
            shell.numbers.setdefault("43", submitted.group(1))
        elif command.startswith("gantry submit") or "gantry submit again.yaml" in command:
            assert re.fullmatch(r"Submitted run \d+ of experiment \d+ \([\w-]+\): \w+\.\n", out)
        elif command.startswith(("gantry ls", "gantry quota", "gantry images")):
            # The columns the page shows, in its order.
            assert out.splitlines()[0].split() == shown[0].split(), (out, shown)
            queued = re.search(r"^(\d+) .* QUEUED ", out, flags=re.MULTILINE)
            if command.startswith("gantry ls") and queued:
                shell.numbers.setdefault("41", queued.group(1))
        elif command.startswith("gantry simulate"):
            # The shapes' table, with the columns the page shows, the asked shape in it.
            header = next(line for line in out.splitlines() if line.split()[:1] == ["SHAPE"])
            shown_header = next(line for line in shown if line.split()[:1] == ["SHAPE"])
            assert header.split() == shown_header.split(), (out, shown)
            assert re.search(r"^(fastest, )?asked +1×8 +h100-80gb ", out, flags=re.MULTILINE), out
        elif command.startswith("gantry show"):
            assert out.splitlines()[0].split() == ["Run", shell.numbers["43"]]
        elif command.startswith("gantry logs"):
            assert out.startswith("[simulator] ") and "SUCCEEDED" in err, (out, err)
        elif command.startswith("gantry cancel"):
            assert out == f"Cancel requested for run {shell.numbers['41']}: CANCELLED.\n"
        elif command.startswith("gantry rerun"):
            assert re.fullmatch(r"Rerun: submitted run \d+ of experiment \d+ \(resnet-baseline\)"
                                r": \w+\.\n", out), out  # fmt: skip
        ran.append(command)
    assert set(RUN_NUMBERS) <= set(shell.numbers)
    assert len(ran) == len(readme_commands()) + len(cli_doc_commands()) - 4
