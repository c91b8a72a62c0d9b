"""``gantry diagnose RUN``: the run's verdicts, attempt by attempt (issue 36, point 3)."""

from typing import Any

from gantry_cli.arguments import Commands, add_command, add_json_flag, positive
from gantry_cli.context import Context
from gantry_cli.errors import EXIT_OK
from gantry_cli.output import print_json

STATUS_WORDS = {
    "accounted": "",
    "pending": " (where the GPU time went follows once its accounting is computed)",
    "running": " (running: where the GPU time went follows when it ends)",
    "waiting": "",
}


def attempt_lines(attempt: dict[str, Any]) -> list[str]:
    """One attempt's verdicts as text: a heading, one line per verdict, what was missing."""
    head = f"Attempt {attempt['attempt']} ({attempt['state']}){STATUS_WORDS[attempt['status']]}"
    verdicts = attempt["verdicts"]
    if verdicts is None:
        return [head, "  Not started yet."]
    lines = [head]
    if not verdicts:
        lines.append("  Nothing to fix.")
    lines += [f"  - [{v['code']}] {v['text']}" for v in verdicts]
    if attempt["missing"]:
        lines.append("  Not checked, for want of its signal: " + "; ".join(attempt["missing"]))
    return lines


def cmd_diagnose(ctx: Context) -> int:
    body = ctx.client().get(f"runs/{ctx.args.run}/verdicts/")
    if ctx.args.json:
        print_json(body)
        return EXIT_OK
    if not body["attempts"]:
        print(f"Run {body['run']} has no attempts yet.")
        return EXIT_OK
    blocks = ["\n".join(attempt_lines(attempt)) for attempt in body["attempts"]]
    print("\n\n".join(blocks))
    return EXIT_OK


def add_diagnose_command(commands: Commands) -> None:
    diagnose = add_command(
        commands,
        "diagnose",
        cmd_diagnose,
        "Why a run was slow or failed, attempt by attempt, and what to do next.",
    )
    diagnose.add_argument("run", type=positive, metavar="RUN")
    add_json_flag(diagnose)
