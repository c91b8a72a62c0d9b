"""The workspace commands: ``gantry workspace start | ls | open | stop``."""

import time
import uuid
import webbrowser
from typing import Any

from gantry_cli.arguments import Commands, add_command, add_json_flag, positive, seconds
from gantry_cli.context import DEFAULT_POLL_INTERVAL, Context
from gantry_cli.errors import EXIT_OK, CliError
from gantry_cli.output import print_json, table, when

SERVERS = ("jupyter", "vscode")
READY_PHASES = frozenset({"running", "idle warning"})
DEFAULT_START_TIMEOUT = 600.0


def time_left(card: dict[str, Any]) -> str:
    """``2 h 05 min``, ``45 min``; "" before it started and once it ended."""
    seconds_left = card.get("time_left_s")
    if seconds_left is None:
        return ""
    hours, minutes = divmod(int(seconds_left) // 60, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def _steps_reached(card: dict[str, Any], shown: set[str]) -> None:
    """Print each step the card reached since the last look, with its time."""
    for step in card["steps"]:
        if step["at"] and step["key"] not in shown:
            shown.add(step["key"])
            print(f"  {step['name']:<26}{when(step['at'])}", flush=True)


def _wait_until_ready(ctx: Context, card: dict[str, Any]) -> dict[str, Any]:
    client = ctx.client()
    shown: set[str] = set()
    deadline = time.monotonic() + ctx.args.timeout
    while True:
        if not ctx.args.json:
            _steps_reached(card, shown)
        if card["phase"] in READY_PHASES and card["url"]:
            return card
        if card["phase"] in ("ended", "suspended"):
            raise CliError(f"Workspace {card['id']} is {card['phase']} before it was ready.")
        if time.monotonic() > deadline:
            raise CliError(
                f"Workspace {card['id']} is not ready after {ctx.args.timeout:g} s: it is "
                f"{card['phase']}. `gantry workspace ls` shows it; it keeps starting."
            )
        ctx.pause()
        card = client.get(f"workspaces/{card['id']}/")


def cmd_start(ctx: Context) -> int:
    args = ctx.args
    body = {
        "tenant": args.tenant,
        "project": args.project,
        "image": args.image,
        "flavor": args.flavor,
        "gpus": args.gpus,
        "server": args.server,
        "hours": args.hours,
        "name": args.name,
    }
    # One key per command: a retried request cannot launch a second workspace.
    card = ctx.client().post("workspaces/", body, {"Idempotency-Key": str(uuid.uuid4())})
    if not args.json:
        print(f"Launched workspace {card['id']} ({card['name']}): {card['phase']}.")
    if args.wait:
        card = _wait_until_ready(ctx, card)
        if not args.json:
            print(f"Workspace {card['id']} is ready: {card['url']}")
    if args.json:
        print_json(card)
    return EXIT_OK


def cmd_ls(ctx: Context) -> int:
    cards = ctx.client().get_all("workspaces/", limit=ctx.args.limit)
    if ctx.args.json:
        print_json(cards)
        return EXIT_OK
    if not cards:
        print("No workspaces.")
        return EXIT_OK
    rows = [
        (
            card["id"],
            card["name"],
            f"{card['tenant']}/{card['project']}",
            card["owner"],
            card["server"],
            f"{card['gpus']} x {card['flavor']}",
            card["phase"],
            time_left(card),
        )
        for card in cards
    ]
    headers = ("ID", "NAME", "TENANT/PROJECT", "OWNER", "SERVER", "GPUS", "PHASE", "TIME LEFT")
    print(table(headers, rows))
    # A warned owner reads why and when below the table (the page and the API say the same).
    for card in cards:
        if card.get("idle_warning"):
            print(f"\n{card['idle_warning']}")
    return EXIT_OK


def cmd_open(ctx: Context) -> int:
    card = ctx.client().get(f"workspaces/{ctx.args.workspace}/")
    if not card["url"]:
        raise CliError(
            f"Workspace {card['id']} does not open: "
            + (
                f"it is {card['phase']}."
                if card["phase"] not in READY_PHASES
                else "only its owner opens it."
            )
        )
    print(card["url"])
    if ctx.args.browser:
        webbrowser.open(card["url"])
    return EXIT_OK


def cmd_stop(ctx: Context) -> int:
    card = ctx.client().post(f"workspaces/{ctx.args.workspace}/stop/")
    if ctx.args.json:
        print_json(card)
    elif card["phase"] == "ended":
        print(f"Workspace {card['id']} is stopped.")
    else:
        print(f"Workspace {card['id']} is stopping: its job is being cancelled.")
    return EXIT_OK


def cmd_suspend(ctx: Context) -> int:
    card = ctx.client().post(f"workspaces/{ctx.args.workspace}/suspend/")
    if ctx.args.json:
        print_json(card)
    else:
        print(
            f"Workspace {card['id']} is being suspended: its GPUs are released, its files "
            f"kept (gantry workspace resume {card['id']})."
        )
    return EXIT_OK


def cmd_resume(ctx: Context) -> int:
    card = ctx.client().post(f"workspaces/{ctx.args.workspace}/resume/")
    if ctx.args.json:
        print_json(card)
    else:
        print(f"Workspace {card['id']} is back in the queue ({card['phase']}).")
    return EXIT_OK


def add_workspace_commands(commands: Commands) -> None:
    workspace = commands.add_parser(
        "workspace",
        help="Interactive workspaces (JupyterLab) on GPUs.",
        description="Interactive workspaces (JupyterLab) on GPUs.",
    )
    verbs = workspace.add_subparsers(dest="workspace_command", required=True, metavar="COMMAND")

    start = add_command(verbs, "start", cmd_start, "Launch a workspace (queued like a run).")
    start.add_argument("--tenant", required=True, help="Tenant slug")
    start.add_argument("--project", required=True, help="Project slug")
    start.add_argument("--image", required=True, help="repository@sha256:… or repository:tag")
    start.add_argument("--flavor", required=True, help="GPU flavor slug")
    start.add_argument("--gpus", type=positive, default=1, help="GPUs on one node (default 1)")
    start.add_argument("--server", choices=SERVERS, default="jupyter", help="Default jupyter")
    start.add_argument(
        "--hours", type=positive, default=4, help="Its limit, within the tenant's (default 4)"
    )
    start.add_argument("--name", default="", help="Default: the project and the time")
    start.add_argument(
        "--wait", action="store_true", help="Wait until its server answers, printing each step"
    )
    start.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_START_TIMEOUT,
        metavar="SECONDS",
        help=f"Give up waiting after this long (default {DEFAULT_START_TIMEOUT:g}); exit 1",
    )
    start.add_argument(
        "--poll-interval",
        type=seconds,
        default=DEFAULT_POLL_INTERVAL,
        metavar="SECONDS",
        help=f"Seconds between two polls (default {DEFAULT_POLL_INTERVAL:g})",
    )
    add_json_flag(start)

    ls = add_command(verbs, "ls", cmd_ls, "List your workspaces (a tenant admin's: the tenant's).")
    ls.add_argument("--limit", type=positive, default=50, help="At most this many (default 50)")
    add_json_flag(ls)

    opener = add_command(verbs, "open", cmd_open, "Print a workspace's URL (yours, once ready).")
    opener.add_argument("workspace", type=positive, metavar="WORKSPACE")
    opener.add_argument("--browser", action="store_true", help="Also open it in a web browser")

    stop = add_command(verbs, "stop", cmd_stop, "Stop a workspace: its GPUs are released.")
    stop.add_argument("workspace", type=positive, metavar="WORKSPACE")
    add_json_flag(stop)

    suspend = add_command(
        verbs, "suspend", cmd_suspend, "Release a workspace's GPUs and keep its files."
    )
    suspend.add_argument("workspace", type=positive, metavar="WORKSPACE")
    add_json_flag(suspend)

    resume = add_command(verbs, "resume", cmd_resume, "Queue a suspended workspace again.")
    resume.add_argument("workspace", type=positive, metavar="WORKSPACE")
    add_json_flag(resume)
