"""The run commands: submit, simulate, ls, show, logs, cancel, restart, rerun, spec, and their
parsers."""

import argparse
import sys
import time
from typing import Any

from gantry_cli.arguments import Commands, add_command, add_json_flag, positive, seconds
from gantry_cli.client import Client
from gantry_cli.context import DEFAULT_POLL_INTERVAL, Context
from gantry_cli.errors import EXIT_FAILED, EXIT_OK, UsageError
from gantry_cli.output import print_fields, print_json, table, when
from gantry_cli.run_status import Progress, run_status, run_summary, start_estimate, wait_details
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
DEFAULT_LIST_LIMIT = 50


def _outcome(run: dict[str, Any]) -> int:
    return EXIT_OK if run["state"] == "SUCCEEDED" else EXIT_FAILED


def _wait(ctx: Context, client: Client, run: dict[str, Any]) -> dict[str, Any]:
    """Poll the run until it ends, showing its progress; return its final state."""
    progress = Progress()
    started = time.monotonic()
    try:
        while run["state"] not in TERMINAL_STATES:
            progress.show(run_status(run), time.monotonic() - started)
            ctx.pause()
            run = client.get(f"runs/{run['id']}/")
        progress.show(run_status(run), time.monotonic() - started)
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
        print(run_summary(run))
    return _outcome(run) if args.wait else EXIT_OK


def _new_lines(previous: list[str], current: list[str]) -> list[str]:
    """Lines of ``current`` after its overlap with the end of ``previous``: what a
    growing log (seen through a tail window) gained since the last look."""
    for overlap in range(min(len(previous), len(current)), 0, -1):
        if previous[-overlap:] == current[:overlap]:
            return current[overlap:]
    return current


def cmd_submit(ctx: Context) -> int:
    args = ctx.args
    spec = spec_load(args.spec)
    for assignment in args.set:
        spec_set(spec, assignment)
    client = ctx.client()
    run = client.post("specs/", spec)
    return _submitted(ctx, client, run, "Submitted")


def cmd_simulate(ctx: Context) -> int:
    """What submitting the spec now would do, and when it would start in other shapes:
    nothing is submitted."""
    args = ctx.args
    spec = spec_load(args.spec)
    for assignment in args.set:
        spec_set(spec, assignment)
    preview = ctx.client().post("runs/simulate/", spec)
    if args.json:
        print_json(preview)
        return EXIT_OK
    print(preview["message"] + ".")
    if preview["start"]:
        print(preview["start"][:1].upper() + preview["start"][1:] + ".")
    rows = [
        (
            ", ".join(
                word
                for word, on in (("fastest", shape["fastest"]), ("asked", shape["asked"]))
                if on
            ),
            f"{shape['nodes']}×{shape['gpus_per_node']}",
            shape["flavor"],
            _topology(shape),
            _start(shape, shape["expected_start"]),
            _start(shape, shape["full_limits_start"]),
        )
        for shape in preview["shapes"]
    ]
    headers = ("", "SHAPE", "FLAVOR", "TOPOLOGY", "EXPECTED START", "AT FULL LIMITS")
    print()
    print(table(headers, rows))
    return EXIT_OK


def _topology(shape: dict[str, Any]) -> str:
    if not shape["topology_level"]:
        return "any"
    return f"one {shape['topology_level']}, {shape['topology_mode']}"


def _start(shape: dict[str, Any], at: str | None) -> str:
    if shape["starts_now"]:
        return "now"
    if at is None:
        return f"{'never' if shape['never'] else 'no estimate'}: {shape['note']}"
    return when(at)


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


def cause_line(attempt: dict[str, Any]) -> str:
    """Whose fault the attempt's end was, with its evidence: "a hardware fault on its node
    (XID 79 on GPU 3); node n1, GPU 3, at 2027-01-15T08:01:00+00:00"."""
    evidence = attempt.get("cause_evidence") or {}
    where = [
        f"{label}{evidence[key]}"
        for key, label in (("node", "node "), ("gpu", "GPU "), ("at", "at "))
        if evidence.get(key)
    ]
    words = str(attempt.get("cause") or attempt["cause_class"])
    return words + (f"; {', '.join(where)}" if where else "")


def cmd_show(ctx: Context) -> int:
    run = ctx.client().get(f"runs/{ctx.args.run}/")
    if ctx.args.json:
        print_json(run)
        return EXIT_OK
    print_fields(
        [
            ("Run", run["id"]),
            ("Experiment", f"{run['experiment']} ({run['experiment_name'] or 'unnamed'})"),
            ("Tenant", f"{run['tenant']} / {run['project']}"),
            ("State", run["state"]),
            ("Waiting", wait_details(run)),
            ("Starts", start_estimate(run)),
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
                a.get("cause_class", ""),  # a server older than causes sends none
                when(a["started_at"]),
                when(a["finished_at"]),
            )
            for a in run["attempts"]
        ]
        headers = (
            "ATTEMPT", "STATE", "CLUSTER", "NODES", "EXIT", "FAILURE", "CAUSE", "STARTED", "ENDED"
        )  # fmt: skip
        print(table(headers, rows))
        for a in run["attempts"]:
            if a.get("cause_class"):
                print(f"Attempt {a['number']}: {cause_line(a)}")
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
            print(run_summary(run), file=sys.stderr)
            return _outcome(run)
        ctx.pause()


def cmd_cancel(ctx: Context) -> int:
    run = ctx.client().post(f"runs/{ctx.args.run}/cancel/")
    if ctx.args.json:
        print_json(run)
    else:
        print(f"Cancel requested for run {run['id']}: {run['state']}.")
    return EXIT_OK


def cmd_restart(ctx: Context) -> int:
    run = ctx.client().post(f"runs/{ctx.args.run}/restart-excluding/", {"node": ctx.args.exclude})
    if ctx.args.json:
        print_json(run)
    else:
        print(
            f"Run {run['id']} restarts without {ctx.args.exclude}: {run['state']}; it resumes "
            "from its latest checkpoint on other nodes."
        )
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


def _add_wait_flags(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--wait", action="store_true", help="Wait for the run to end; exit 1 unless it succeeds"
    )
    sub.add_argument(
        "--poll-interval",
        type=seconds,
        default=DEFAULT_POLL_INTERVAL,
        metavar="SECONDS",
        help=f"Seconds between two polls (default {DEFAULT_POLL_INTERVAL:g})",
    )


def _add_spec_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("spec", metavar="SPEC", help="Spec file; - reads standard input")
    sub.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override a dotted key, e.g. resources.nodes=2 (repeatable; values are YAML)",
    )


def add_run_commands(commands: Commands) -> None:
    submit = add_command(commands, "submit", cmd_submit, "Submit an experiment spec (YAML).")
    _add_spec_arguments(submit)
    _add_wait_flags(submit)
    add_json_flag(submit)

    simulate = add_command(
        commands,
        "simulate",
        cmd_simulate,
        "Say what submitting a spec now would do, and when it would start in other shapes "
        "(other splits over nodes, other flavors, a looser topology); submits nothing.",
    )
    _add_spec_arguments(simulate)
    add_json_flag(simulate)

    ls = add_command(commands, "ls", cmd_ls, "List runs, newest first.")
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
        type=positive,
        default=DEFAULT_LIST_LIMIT,
        help=f"At most this many runs (default {DEFAULT_LIST_LIMIT})",
    )
    add_json_flag(ls)

    show = add_command(commands, "show", cmd_show, "Show a run: state, attempts, events.")
    show.add_argument("run", type=positive, metavar="RUN")
    add_json_flag(show)

    logs = add_command(commands, "logs", cmd_logs, "Print a run's logs (latest attempt).")
    logs.add_argument("run", type=positive, metavar="RUN")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="Keep printing new lines until the run ends; exit 1 unless it succeeds",
    )
    logs.add_argument("--tail", type=positive, default=200, help="Last lines (default 200)")
    logs.add_argument(
        "--poll-interval",
        type=seconds,
        default=DEFAULT_POLL_INTERVAL,
        metavar="SECONDS",
        help=f"Seconds between two polls with -f (default {DEFAULT_POLL_INTERVAL:g})",
    )

    cancel = add_command(commands, "cancel", cmd_cancel, "Cancel a run.")
    cancel.add_argument("run", type=positive, metavar="RUN")
    add_json_flag(cancel)

    restart = add_command(
        commands,
        "restart",
        cmd_restart,
        "Restart a running run from its latest checkpoint without one of its nodes.",
    )
    restart.add_argument("run", type=positive, metavar="RUN")
    restart.add_argument(
        "--exclude",
        required=True,
        metavar="NODE",
        help="The node to leave out (one the run runs on); it stays excluded for the run",
    )
    add_json_flag(restart)

    rerun = add_command(
        commands, "rerun", cmd_rerun, "Run a run's experiment again, exactly as recorded."
    )
    rerun.add_argument("run", type=positive, metavar="RUN")
    _add_wait_flags(rerun)
    add_json_flag(rerun)

    spec = add_command(commands, "spec", cmd_spec, "Print the experiment spec of a run as YAML.")
    spec.add_argument("run", type=positive, nargs="?", metavar="RUN")
    spec.add_argument("--experiment", type=positive, metavar="ID", help="An experiment id")
