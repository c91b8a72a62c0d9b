"""``gantry``: submit, follow and manage GPU experiments from a terminal or a script.

Commands: login, logout, submit, ls, show, logs, cancel, rerun, spec, quota, images
(``gantry COMMAND --help`` for each). Output is a human-readable table by default;
``--json`` prints the API's JSON for scripts. The server and token come from ``--url``,
``$GANTRY_URL`` and ``$GANTRY_TOKEN``, else from what ``gantry login`` stored in
``$GANTRY_CONFIG_DIR/credentials.json`` (default ``~/.config/gantry/``, mode 0600).

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
import getpass
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gantry_cli.client import DEFAULT_TIMEOUT, Client, normalize_url
from gantry_cli.config import (
    Credentials,
    credentials_delete,
    credentials_load,
    credentials_save,
)
from gantry_cli.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ApiValidationError,
    AuthError,
    CliError,
    UsageError,
)
from gantry_cli.output import duration, print_json, table, when
from gantry_cli.spec import spec_dump, spec_load, spec_set

RUN_STATES = (
    "QUEUED",
    "ADMITTED",
    "SUBMITTING",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "CANCELLED",
    "PREEMPTED",
)
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
DEFAULT_POLL_INTERVAL = 2.0
DEFAULT_LIST_LIMIT = 50
CLIENT_NAME = "gantry-cli"  # the name of the tokens it creates

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


class Progress:
    """One status line on stderr: redrawn in place on a terminal, else printed whenever
    the status (not the elapsed time) changes, so logs of scripts stay short."""

    def __init__(self) -> None:
        self.stream = sys.stderr
        self.interactive = self.stream.isatty()
        self.last = ""

    def show(self, status: str, elapsed: float) -> None:
        if self.interactive:
            self.stream.write(f"\r\033[K{status}  {duration(elapsed)}")
            self.stream.flush()
        elif status != self.last:
            print(f"{status}  {duration(elapsed)}", file=self.stream)
        self.last = status

    def close(self) -> None:
        if self.interactive and self.last:
            self.stream.write("\n")
            self.stream.flush()


# --- helpers ---------------------------------------------------------------------------


def _wait_details(run: dict[str, Any]) -> str:
    """Why a queued run waits: its queue position, the reason and the scheduler's words."""
    if run["state"] != "QUEUED":
        return ""
    details = []
    if run.get("queue_position"):
        details.append(f"queue position {run['queue_position']}")
    if run.get("wait_reason"):
        details.append(run["wait_reason"].lower().replace("_", " "))
    if run.get("wait_message"):
        details.append(run["wait_message"])
    return "; ".join(details)


def _start_estimate(run: dict[str, Any]) -> str:
    """When a queued run should start, in local time, or why there is no estimate."""
    if run["state"] != "QUEUED":
        return ""
    full, expected = run.get("start_full_limits_at"), run.get("start_expected_at")
    if full:
        text = f"starts about {when(expected or full)}"
        if expected and expected != full:
            text += f"; about {when(full)} if every run ahead uses its full time limit"
        record = run.get("start_record")  # the run's own page has it, a list does not
        if record:
            text += f" ({_start_record(record)})"
        return text
    if run.get("start_note"):
        return f"no start estimate: {run['start_note']}"
    return ""


def _start_record(record: dict[str, Any]) -> str:
    """How the full-limits estimates of the run's flavor fared, as the run page says it."""
    text = "an estimate, not a promise: "
    flavor, days, started = record["flavor"], record["days"], record["started"]
    if not started:
        return text + f"no {flavor} run has started with one in the last {days} days"
    text += (
        f"met by {record['met']} of {started} {flavor} run{'s' if started > 1 else ''} "
        f"started in the last {days} days"
    )
    if record["last_met_at"]:
        text += f", last at {when(record['last_met_at'])}"
    if record["worst_miss_s"] is not None:
        text += f"; at worst {record['worst_miss_s']:,.0f} s late"
    return text


def _run_status(run: dict[str, Any]) -> str:
    details = "; ".join(part for part in (_wait_details(run), _start_estimate(run)) if part)
    return f"run {run['id']} {run['state']}" + (f" ({details})" if details else "")


def _outcome(run: dict[str, Any]) -> int:
    return EXIT_OK if run["state"] == "SUCCEEDED" else EXIT_FAILED


def _summary(run: dict[str, Any]) -> str:
    line = f"Run {run['id']} {run['state']}"
    if run.get("failure_reason"):
        line += f" ({run['failure_reason']})"
    return line + "."


def _wait(ctx: Context, client: Client, run: dict[str, Any]) -> dict[str, Any]:
    """Poll the run until it ends, showing its progress; return its final state."""
    progress = Progress()
    started = time.monotonic()
    try:
        while run["state"] not in TERMINAL_STATES:
            progress.show(_run_status(run), time.monotonic() - started)
            ctx.pause()
            run = client.get(f"runs/{run['id']}/")
        progress.show(_run_status(run), time.monotonic() - started)
    finally:
        progress.close()
    return run


def _submitted(ctx: Context, client: Client, run: dict[str, Any], verb: str) -> int:
    args = ctx.args
    if not args.json:
        print(
            f"{verb} run {run['id']} of experiment {run['experiment']} "
            f"({run['experiment_name'] or 'unnamed'}): {run['state']}."
        )
    if args.wait:
        run = _wait(ctx, client, run)
    if args.json:
        print_json(run)
    elif args.wait:
        print(_summary(run))
    return _outcome(run) if args.wait else EXIT_OK


def _new_lines(previous: list[str], current: list[str]) -> list[str]:
    """Lines of ``current`` after its overlap with the end of ``previous``: what a
    growing log (seen through a tail window) gained since the last look."""
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current


def _print_fields(rows: Sequence[tuple[str, Any]]) -> None:
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {'-' if value in (None, '') else value}")


# --- commands --------------------------------------------------------------------------


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


def cmd_submit(ctx: Context) -> int:
    args = ctx.args
    spec = spec_load(args.spec)
    for assignment in args.set:
        spec_set(spec, assignment)
    client = ctx.client()
    run = client.post("specs/", spec)
    return _submitted(ctx, client, run, "Submitted")


def cmd_ls(ctx: Context) -> int:
    args = ctx.args
    params: dict[str, Any] = {}
    if args.state:
        params["state"] = [state.upper() for state in args.state]
    if args.tenant:
        params["tenant"] = args.tenant
    runs = ctx.client().get_all("runs/", params, limit=args.limit)
    if args.json:
        print_json(runs)
        return EXIT_OK
    if not runs:
        print("No runs.")
        return EXIT_OK
    rows = [
        (
            run["id"],
            run["experiment_name"],
            f"{run['tenant']}/{run['project']}",
            run["flavor"],
            run["gpus"],
            run["state"],
            run["wait_reason"] or run["failure_reason"],
            when(run["submitted_at"]),
        )
        for run in runs
    ]
    headers = ("ID", "NAME", "TENANT/PROJECT", "FLAVOR", "GPUS", "STATE", "REASON", "SUBMITTED")
    print(table(headers, rows))
    return EXIT_OK


def cmd_show(ctx: Context) -> int:
    run = ctx.client().get(f"runs/{ctx.args.run}/")
    if ctx.args.json:
        print_json(run)
        return EXIT_OK
    _print_fields(
        [
            ("Run", run["id"]),
            ("Experiment", f"{run['experiment']} ({run['experiment_name'] or 'unnamed'})"),
            ("Tenant", f"{run['tenant']} / {run['project']}"),
            ("State", run["state"]),
            ("Waiting", _wait_details(run)),
            ("Starts", _start_estimate(run)),
            ("Failure", run["failure_reason"]),
            ("Resources", f"{run['gpus']} x {run['flavor']}"),
            ("Cluster", run["cluster"]),
            ("Image", run["image"]),
            ("Submitted by", run["submitted_by"]),
            ("Submitted", when(run["submitted_at"])),
            ("Started", when(run["started_at"])),
            ("Finished", when(run["finished_at"])),
            ("Restarts", run["restarts"]),
        ]
    )
    if run["attempts"]:
        print()
        rows = [
            (
                a["number"],
                a["state"],
                a["cluster"],
                ",".join(a["node_list"]),
                a["exit_code"],
                a["failure_reason"],
                when(a["started_at"]),
                when(a["finished_at"]),
            )
            for a in run["attempts"]
        ]
        headers = ("ATTEMPT", "STATE", "CLUSTER", "NODES", "EXIT", "FAILURE", "STARTED", "ENDED")
        print(table(headers, rows))
    if run["events"]:
        print()
        event_rows = [
            (when(e["at"]), e["from_state"], e["to_state"], e["reason"], e["message"])
            for e in run["events"]
        ]
        print(table(("AT", "FROM", "TO", "REASON", "MESSAGE"), event_rows))
    return EXIT_OK


def cmd_logs(ctx: Context) -> int:
    args = ctx.args
    client = ctx.client()
    shown: list[str] = []
    attempt = None
    said_none = False
    while True:
        run = client.get(f"runs/{args.run}/") if args.follow else None
        body = client.get(f"runs/{args.run}/logs/", {"tail": args.tail})
        lines = body["logs"].splitlines()
        if body["attempt"] != attempt:
            if attempt is not None:
                print(f"--- attempt {body['attempt']} ---", file=sys.stderr)
            attempt, shown = body["attempt"], []
        if not lines and not shown and not said_none:
            # Say so, rather than print nothing: a run that has not started has no logs.
            state = (run or client.get(f"runs/{args.run}/"))["state"]
            print(f"Run {args.run} has no logs yet: it is {state}.", file=sys.stderr)
            said_none = True
        for line in _new_lines(shown, lines):
            print(line, flush=True)
        shown = lines
        if run is None:
            return EXIT_OK
        if run["state"] in TERMINAL_STATES:
            print(_summary(run), file=sys.stderr)
            return _outcome(run)
        ctx.pause()


def cmd_cancel(ctx: Context) -> int:
    run = ctx.client().post(f"runs/{ctx.args.run}/cancel/")
    if ctx.args.json:
        print_json(run)
    else:
        print(f"Cancel requested for run {run['id']}: {run['state']}.")
    return EXIT_OK


def cmd_rerun(ctx: Context) -> int:
    client = ctx.client()
    experiment = client.get(f"runs/{ctx.args.run}/")["experiment"]
    run = client.post(f"experiments/{experiment}/rerun/")
    return _submitted(ctx, client, run, "Rerun: submitted")


def cmd_spec(ctx: Context) -> int:
    args = ctx.args
    if (args.run is None) == (args.experiment is None):
        raise UsageError("Name a run, or an experiment with --experiment ID (not both).")
    client = ctx.client()
    experiment = args.experiment or client.get(f"runs/{args.run}/")["experiment"]
    print(spec_dump(client.get(f"experiments/{experiment}/spec/")), end="")
    return EXIT_OK


def cmd_quota(ctx: Context) -> int:
    params = {"tenant": ctx.args.tenant} if ctx.args.tenant else {}
    quotas = ctx.client().get_all("quotas/", params)
    if ctx.args.json:
        print_json(quotas)
        return EXIT_OK
    if not quotas:
        print("No quotas.")
        return EXIT_OK
    rows = [
        (
            q["tenant"],
            q["flavor"],
            q["guaranteed_gpus"],
            q["borrow_limit_gpus"],
            q["in_use"],
            q["borrowable"],
            q["gpu_hours"],
            q["monthly_gpu_hour_budget"],
            q["burn_percent"],
        )
        for q in quotas
    ]
    headers = (
        "TENANT",
        "FLAVOR",
        "GUARANTEED",
        "BORROW_LIMIT",
        "IN_USE",
        "BORROWABLE",
        "GPU_HOURS",
        "BUDGET",
        "BURN_%",
    )
    print(table(headers, rows))
    return EXIT_OK


def cmd_images(ctx: Context) -> int:
    images = ctx.client().get_all("images/")
    if ctx.args.json:
        print_json(images)
        return EXIT_OK
    if not images:
        print("No images.")
        return EXIT_OK
    rows = [
        (
            image["id"],
            f"{image['repository']}:{image['tag']}" if image["tag"] else image["repository"],
            image["digest"],
            image["cuda_version"],
            " ".join(f"{name}={version}" for name, version in image["frameworks"].items()),
        )
        for image in images
    ]
    print(table(("ID", "IMAGE", "DIGEST", "CUDA", "FRAMEWORKS"), rows))
    return EXIT_OK


# --- the parser ------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


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
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"Give up on a request after this long (default {DEFAULT_TIMEOUT:g})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[Context], int], help: str, **kwargs: Any
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, **kwargs)
        sub.set_defaults(handler=handler)
        return sub

    def json_flag(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--json", action="store_true", help="Print JSON for scripts")

    def wait_flags(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--wait", action="store_true", help="Wait for the run to end; exit 1 unless it succeeds"
        )
        sub.add_argument(
            "--poll-interval",
            type=_seconds,
            default=DEFAULT_POLL_INTERVAL,
            metavar="SECONDS",
            help=f"Seconds between two polls (default {DEFAULT_POLL_INTERVAL:g})",
        )

    login = command("login", cmd_login, "Log in and store an API token (mode 0600).")
    login.add_argument("--url", default=argparse.SUPPRESS, help="Gantry server URL")
    login.add_argument("--username", help="Prompted for if not given")
    login.add_argument(
        "--password-stdin", action="store_true", help="Read the password from standard input"
    )

    command("logout", cmd_logout, "Revoke the stored token and forget it.")

    submit = command("submit", cmd_submit, "Submit an experiment spec (YAML).")
    submit.add_argument("spec", metavar="SPEC", help="Spec file; - reads standard input")
    submit.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override a dotted key, e.g. resources.nodes=2 (repeatable; values are YAML)",
    )
    wait_flags(submit)
    json_flag(submit)

    ls = command("ls", cmd_ls, "List runs, newest first.")
    ls.add_argument(
        "--state",
        action="append",
        type=str.upper,
        choices=RUN_STATES,
        metavar="STATE",
        help="Only runs in this state (repeatable)",
    )
    ls.add_argument("--tenant", help="Only runs of this tenant (slug)")
    ls.add_argument(
        "--limit",
        type=_positive,
        default=DEFAULT_LIST_LIMIT,
        help=f"At most this many runs (default {DEFAULT_LIST_LIMIT})",
    )
    json_flag(ls)

    show = command("show", cmd_show, "Show a run: state, attempts, events.")
    show.add_argument("run", type=_positive, metavar="RUN")
    json_flag(show)

    logs = command("logs", cmd_logs, "Print a run's logs (latest attempt).")
    logs.add_argument("run", type=_positive, metavar="RUN")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="Keep printing new lines until the run ends; exit 1 unless it succeeds",
    )
    logs.add_argument("--tail", type=_positive, default=200, help="Last lines (default 200)")
    logs.add_argument(
        "--poll-interval",
        type=_seconds,
        default=DEFAULT_POLL_INTERVAL,
        metavar="SECONDS",
        help=f"Seconds between two polls with -f (default {DEFAULT_POLL_INTERVAL:g})",
    )

    cancel = command("cancel", cmd_cancel, "Cancel a run.")
    cancel.add_argument("run", type=_positive, metavar="RUN")
    json_flag(cancel)

    rerun = command("rerun", cmd_rerun, "Run a run's experiment again, exactly as recorded.")
    rerun.add_argument("run", type=_positive, metavar="RUN")
    wait_flags(rerun)
    json_flag(rerun)

    spec = command("spec", cmd_spec, "Print the experiment spec of a run as YAML.")
    spec.add_argument("run", type=_positive, nargs="?", metavar="RUN")
    spec.add_argument("--experiment", type=_positive, metavar="ID", help="An experiment id")

    quota = command("quota", cmd_quota, "Quotas of your tenants and what they use.")
    quota.add_argument("--tenant", help="Only this tenant (slug)")
    json_flag(quota)

    images = command("images", cmd_images, "Images you may run.")
    json_flag(images)
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
