"""Refresh the README's screenshots (docs/screenshots/*.png).

The browser tests take them: ``test_readme_pages_on_the_demo`` in
tests/portal/test_browser_journeys.py opens each page of the ``make run`` demo in Debian's headless
Chromium as its persona, checks it, and writes a full-page PNG to docs/screenshots when
GANTRY_SCREENSHOTS=1 (into pytest's temporary directory otherwise). This runs only that test,
with the test services of ``make test`` (scripts/test-services.sh, which also installs
chromium when it is missing). ``GANTRY_SCREENSHOTS=1 make test`` refreshes them as well.

Usage: ``.venv/bin/python scripts/screenshots.py``
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    command = [
        "bash", "scripts/test-services.sh", "exec", "--",
        sys.executable, "-m", "pytest", "tests/portal/test_browser_journeys.py",
        "-k", "test_readme_pages_on_the_demo", "-q", "-p", "no:cacheprovider",
    ]  # fmt: skip
    env = os.environ | {"GANTRY_SCREENSHOTS": "1"}
    status = subprocess.call(command, cwd=ROOT, env=env)  # noqa: S603 - a fixed command
    if status == 0:
        print(f"screenshots written to {ROOT / 'docs' / 'screenshots'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
