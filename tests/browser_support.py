"""Shared plumbing for real-browser tests: Debian's headless Chromium driven by Playwright.

- ``CHROMIUM``: the browser executable, ``/usr/bin/chromium``. `make test` installs Debian's
  ``chromium`` when it is missing (scripts/test-services.sh); Playwright never downloads a
  browser of its own (no ``playwright install``). Without it the tests fail, never skip.
- ``browser`` (session fixture): one headless Chromium for the whole session.
- ``persona_page`` (fixture): a factory ``persona_page(user, password=PASSWORD) -> Page``
  giving a page in a fresh browser context, logged in as that user through the real login
  form of pytest-django's ``live_server`` (so tests using it are transactional: the server
  thread sees their data). The page's ``base_url`` is the live server, so
  ``page.goto("/runs/new/")`` works; downloads are accepted.
- ``login(page, username)``: the login form, for tests that log in again mid-journey.
- ``screenshot(page, name, tmp_path, readme=False)``: a full-page PNG into ``tmp_path``; one
  of the README's pictures (``readme=True``) goes to docs/screenshots instead when
  ``GANTRY_SCREENSHOTS=1`` (how they are made and kept current).

Use it from a test module with ``pytest_plugins = ["tests.browser_support"]`` and request the
fixtures by name. Fixture users are the personas of tests/conftest.py (password ``PASSWORD``).

Playwright's sync API runs an asyncio loop in the test's thread, which makes Django refuse ORM
calls there ("You cannot call this from an async context"); the ``browser`` fixture therefore
sets DJANGO_ALLOW_ASYNC_UNSAFE for its lifetime. The calls really are synchronous: the flag only
silences Django's guess.

PYTEST_DONT_REWRITE: loaded as a plugin after import; it asserts nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.conftest import PASSWORD

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = (
    "install Debian's chromium (apt-get install --no-install-recommends chromium; "
    "`make test` does it through scripts/test-services.sh)"
)
# No sandbox: CI runs as root, where Chromium's sandbox refuses to start. Nothing phones home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 800}
SCREENSHOTS_DIR = ROOT / "docs" / "screenshots"
# Generous for a shared 2-core machine (actions and ``expect`` alike); a test that needs
# less waits less.
DEFAULT_TIMEOUT_MS = 15_000
expect.set_options(timeout=DEFAULT_TIMEOUT_MS)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the session, closed at its end."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: {INSTALL_HINT}")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def login(page: Page, username: str, password: str = PASSWORD) -> None:
    """Log in through the real form (from wherever the page is) and wait for the landing page."""
    if "/accounts/login/" not in page.url:
        page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    with page.expect_navigation():
        page.click("form button[type=submit]")
    if "/accounts/login/" in page.url:
        raise AssertionError(f"login as {username} failed: still on {page.url}")


@pytest.fixture
def persona_page(browser: Browser, live_server) -> Iterator[Callable[[User], Page]]:
    """``persona_page(user)``: a logged-in page of its own context (cookies) on the live server."""
    contexts: list[BrowserContext] = []

    def open_as(user: User, password: str = PASSWORD) -> Page:
        context = browser.new_context(
            base_url=live_server.url, viewport=VIEWPORT, accept_downloads=True
        )
        context.set_default_timeout(DEFAULT_TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        login(page, user.username, password)
        return page

    yield open_as
    for context in contexts:
        context.close()


def screenshot(page: Page, name: str, tmp_path: Path, *, readme: bool = False) -> Path:
    """A full-page PNG ``name``.png: the README's copy when ``readme`` and GANTRY_SCREENSHOTS=1."""
    folder = SCREENSHOTS_DIR if readme and os.environ.get("GANTRY_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    # From the top, nothing focused: a sticky header scrolled to a focused field would be
    # drawn in the middle of a full-page picture.
    page.evaluate("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    return path
