"""Screenshots of the main pages for the README, taken from a fresh embedded Gantry.

Usage: ``.venv/bin/python scripts/screenshots.py`` (needs Debian's ``chromium`` or
``chromium-headless-shell`` and the ``playwright`` package from the dev extras; no browser is
downloaded).
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
CHROMIUM = next(
    (
        path
        for path in ("/usr/bin/chromium", "/usr/bin/chromium-headless-shell")
        if Path(path).exists()
    ),
    "/usr/bin/chromium",
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(base: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2):  # noqa: S310 - loopback
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the embedded server did not come up")


def shoot(base: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})

        def login(username: str) -> None:
            page.context.clear_cookies()
            page.goto(f"{base}/accounts/login/")
            page.fill("input[name=username]", username)
            page.fill("input[name=password]", "gantry-demo")
            page.click("button[type=submit]")
            page.wait_for_load_state()

        def shots(*pages: tuple[str, str]) -> None:
            for name, path in pages:
                page.goto(base + path)
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(OUT / f"{name}.png"), full_page=False)

        login("alice")
        time.sleep(12)  # let the first admission and sync cycles place the live runs
        shots(
            ("runs", "/"),
            ("run-waiting", "/runs/10/"),
            ("submit", "/runs/new/"),
            ("quotas", "/quotas/"),
            ("images", "/images/"),
            ("experiment", "/experiments/1/"),
        )
        shots(("run-telemetry", "/runs/2/telemetry/"), ("goodput", "/tenants/vision/goodput/"))
        login("fiona")
        month = time.strftime("%Y-%m", time.gmtime())
        shots(("finance", f"/finance/vision/{month}/"), ("kpis", "/platform/kpis/"))
        login("admin")
        page.goto(base + "/audit/")
        page.screenshot(path=str(OUT / "audit.png"), full_page=False)
        browser.close()


def main() -> int:
    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        env = {
            k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}
        }
        env |= {"GANTRY_DATA_DIR": data_dir, "GANTRY_PORT": str(port)}
        server = subprocess.Popen(
            [sys.executable, "-m", "portal.embedded"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base)
            shoot(base)
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=30)
    print(f"screenshots written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
