"""What every command gets: its parsed arguments, a client for the chosen server, and the
pause between two polls."""

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from gantry_cli.client import Client, normalize_url
from gantry_cli.config import credentials_load
from gantry_cli.errors import AuthError

DEFAULT_POLL_INTERVAL = 2.0

PollHook = Callable[[], None]


@dataclass
class Context:
    args: argparse.Namespace
    poll_hook: PollHook | None

    def client(self, *, authenticated: bool = True) -> Client:
        """A client for the chosen server with its token: ``$GANTRY_TOKEN``, else the
        stored token, but only if it was issued by that same server."""
        stored = credentials_load()
        url = self.args.url or os.environ.get("GANTRY_URL") or (stored.url if stored else "")
        if not url:
            raise AuthError("Not logged in: run `gantry login --url URL`.")
        url = normalize_url(url)
        token = os.environ.get("GANTRY_TOKEN") or (
            stored.token if stored and normalize_url(stored.url) == url else None
        )
        if authenticated and not token:
            raise AuthError(f"Not logged in to {url}: run `gantry login`.")
        return Client(url=url, token=token, timeout=self.args.request_timeout)

    def pause(self) -> None:
        """Between two polls: sleep, then let a test move the world along."""
        time.sleep(self.args.poll_interval)
        if self.poll_hook is not None:
            self.poll_hook()
