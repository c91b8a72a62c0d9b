"""``gantry``: submit, follow and manage GPU experiments from a terminal or a script.

Commands: login, logout, submit, simulate, ls, show, logs, cancel, restart, rerun, spec, quota,
images, workspace start|ls|open|stop (``gantry COMMAND --help`` for each). Output is a
human-readable table by default; ``--json`` prints the API's JSON for scripts. The server
and token come from ``--url``, ``$GANTRY_URL`` and ``$GANTRY_TOKEN``, else from what
``gantry login`` stored in ``$GANTRY_CONFIG_DIR/credentials.json`` (default
``~/.config/gantry/``, mode 0600).

Exit codes:

    0  success
    1  the run ended unsuccessfully (``--wait``, ``logs -f``), or another API failure
    2  usage error, or bad local input (spec file missing or not YAML, bad ``--set``)
    3  not logged in, or the server rejected the token (401)
    4  validation error (400); each dotted field is printed with its messages
    5  not found (404) or forbidden (403)
    6  cannot reach the server (connection refused, DNS failure, timeout)
"""

import argparse
import sys
from collections.abc import Sequence

from gantry_cli.arguments import seconds
from gantry_cli.catalog import add_catalog_commands
from gantry_cli.client import DEFAULT_TIMEOUT
from gantry_cli.context import DEFAULT_POLL_INTERVAL, Context, PollHook
from gantry_cli.diagnose import add_diagnose_command
from gantry_cli.errors import EXIT_USAGE, ApiValidationError, CliError
from gantry_cli.runs import add_run_commands
from gantry_cli.session import add_session_commands
from gantry_cli.workspaces import add_workspace_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gantry",
        description="Submit, follow and manage GPU experiments on Gantry.",
        epilog="Exit codes: 0 ok, 1 run failed or API error, 2 usage, 3 not logged in, "
        "4 invalid input, 5 not found or forbidden, 6 server unreachable.",
    )
    parser.add_argument("--url", help="Gantry server URL (default: $GANTRY_URL, then login's)")
    parser.add_argument(
        "--request-timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"Give up on a request after this long (default {DEFAULT_TIMEOUT:g})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In this order in ``gantry --help``.
    add_session_commands(commands)
    add_run_commands(commands)
    add_diagnose_command(commands)
    add_catalog_commands(commands)
    add_workspace_commands(commands)
    return parser


def _print_validation(errors: dict[str, list[str]]) -> None:
    print("gantry: error: the server rejected the request:", file=sys.stderr)
    for field, messages in errors.items():
        name = "(request)" if field in ("non_field_errors", "") else field
        for message in messages:
            print(f"  {name}: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None, *, poll_hook: PollHook | None = None) -> int:
    """Run one command and return its exit code. ``poll_hook`` is called between two
    polls (``--wait``, ``logs -f``): tests use it to move a simulated cluster along."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not hasattr(args, "poll_interval"):
        args.poll_interval = DEFAULT_POLL_INTERVAL
    try:
        code: int = args.handler(Context(args=args, poll_hook=poll_hook))
        return code
    except ApiValidationError as exc:
        _print_validation(exc.errors)
        return exc.exit_code
    except CliError as exc:
        print(f"gantry: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
