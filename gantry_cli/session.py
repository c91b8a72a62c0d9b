"""``gantry login`` and ``gantry logout``: the API token stored for a server."""

import argparse
import getpass
import os
import sys

from gantry_cli.arguments import Commands, add_command
from gantry_cli.client import Client
from gantry_cli.config import Credentials, credentials_delete, credentials_load, credentials_save
from gantry_cli.context import Context
from gantry_cli.errors import EXIT_OK, ApiValidationError, AuthError, UsageError
from gantry_cli.output import when

CLIENT_NAME = "gantry-cli"  # the name of the tokens it creates


def cmd_login(ctx: Context) -> int:
    args = ctx.args
    stored = credentials_load()
    url = args.url or os.environ.get("GANTRY_URL") or (stored.url if stored else "")
    if not url:
        raise UsageError("Which server? Pass --url URL or set GANTRY_URL.")
    client = Client(url=url, timeout=args.request_timeout)
    username = args.username
    if not username:
        print("Username: ", end="", file=sys.stderr, flush=True)
        username = sys.stdin.readline().strip()
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
    if not username or not password:
        raise UsageError("A username and a password are required.")
    try:
        created = client.post(
            "tokens/", {"username": username, "password": password, "name": CLIENT_NAME}
        )
    except ApiValidationError as exc:
        if set(exc.errors) <= {"non_field_errors"}:
            messages = " ".join(exc.errors.get("non_field_errors", []))
            raise AuthError(messages or "Wrong username or password.") from None
        raise
    path = credentials_save(Credentials(url=client.url, token=created["token"]))
    expires = f", token expires {when(created['expires_at'])}" if created.get("expires_at") else ""
    print(f"Logged in to {client.url} as {username}{expires}. Saved in {path}.")
    return EXIT_OK


def cmd_logout(ctx: Context) -> int:
    try:
        client = ctx.client()
    except AuthError:
        credentials_delete()
        print("Not logged in.")
        return EXIT_OK
    try:
        client.delete("tokens/current/")
    except AuthError:
        pass  # already expired or revoked: nothing left to revoke
    finally:
        credentials_delete()
    print(f"Logged out of {client.url}; the token is revoked.")
    return EXIT_OK


def add_session_commands(commands: Commands) -> None:
    login = add_command(commands, "login", cmd_login, "Log in and store an API token (mode 0600).")
    login.add_argument("--url", default=argparse.SUPPRESS, help="Gantry server URL")
    login.add_argument("--username", help="Prompted for if not given")
    login.add_argument(
        "--password-stdin", action="store_true", help="Read the password from standard input"
    )

    add_command(commands, "logout", cmd_logout, "Revoke the stored token and forget it.")
