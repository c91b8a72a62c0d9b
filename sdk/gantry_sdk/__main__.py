"""``python -m gantry_sdk``: report to Gantry from a shell-based job.

    python -m gantry_sdk ready
    python -m gantry_sdk checkpoint-saved --step 100 --uri s3://bucket/ckpt/100 --seconds 12.5
    python -m gantry_sdk checkpoint-restored --step 100 --uri s3://bucket/ckpt/100 --seconds 3
    python -m gantry_sdk step-window --steps 50 --step-time 0.8 --data-wait 4 --comm-wait 2
    python -m gantry_sdk runtime-env [--print]
    python -m gantry_sdk resume-info           # prints GANTRY_RESUME_STEP / _FROM as shell

Each command sends once, synchronously, with a timeout (``--timeout``, default 10 s). The
exit code is 0 whether or not the portal answered (a warning goes to stderr), so a report
never fails the job; ``--strict`` makes an undelivered report exit 1. Usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

from .client import Reporter
from .runtime_env import clean_runtime_report, collect_runtime_env


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError("must be a finite number >= 0")
    return value


def _non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _common_options(parser, defaults):
    def default(value):
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--timeout", type=_non_negative_float, default=default(10.0), help="seconds (10)"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        default=default(False),
        help="exit 1 when the report was not delivered",
    )
    parser.add_argument(
        "--all-ranks",
        action="store_true",
        default=default(False),
        help="report even when this rank is not 0",
    )


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m gantry_sdk", description="Report to Gantry from a job."
    )
    _common_options(parser, defaults=True)
    # The same options after the command too (``ready --timeout 2``).
    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    commands.add_parser("ready", parents=[common], help="the job is set up and starts working")
    for name, text in (
        ("checkpoint-saved", "a checkpoint was written"),
        ("checkpoint-restored", "the job resumed from a checkpoint"),
    ):
        sub = commands.add_parser(name, parents=[common], help=text)
        sub.add_argument("--step", type=_non_negative_int, required=True)
        sub.add_argument("--uri", required=True)
        sub.add_argument("--seconds", type=_non_negative_float, required=True)
    window = commands.add_parser("step-window", parents=[common], help="a window of training steps")
    window.add_argument("--steps", type=_non_negative_int, required=True)
    window.add_argument("--step-time", type=_non_negative_float, required=True, help="s/step")
    window.add_argument("--data-wait", type=_non_negative_float, default=0.0, help="seconds")
    window.add_argument("--comm-wait", type=_non_negative_float, default=0.0, help="seconds")
    window.add_argument("--checkpoint", type=_non_negative_float, default=0.0, help="seconds")
    window.add_argument("--step", type=_non_negative_int, default=None, help="global step")
    env = commands.add_parser(
        "runtime-env", parents=[common], help="driver, CUDA, framework and NCCL versions"
    )
    env.add_argument("--print", action="store_true", help="also print the report as JSON")
    env.add_argument("--no-torch", action="store_true", help="do not import torch")
    commands.add_parser(
        "resume-info", parents=[common], help="print the resume variables as shell assignments"
    )
    return parser


def _warn(text):
    sys.stderr.write(f"gantry_sdk: {text}\n")


def main(argv=None):
    args = _parser().parse_args(argv)
    # A shell command is not a training rank's loop: no rank windows from here.
    reporter = Reporter.from_env(
        all_ranks=args.all_ranks, ranks=False, timeout=args.timeout, background=False
    )
    if args.command == "resume-info":
        step = "" if reporter.resume_step is None else str(reporter.resume_step)
        sys.stdout.write(f"GANTRY_RESUME_STEP={shlex.quote(step)}\n")
        sys.stdout.write("GANTRY_RESUME_FROM={}\n".format(shlex.quote(reporter.resume_from or "")))
        return 0
    if args.command == "runtime-env":
        report = clean_runtime_report(collect_runtime_env(import_torch=not args.no_torch))
        if args.print:
            sys.stdout.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
        if not reporter.enabled:
            _warn("not running under Gantry (no GANTRY_API_URL / token): nothing sent")
            return 0
        status = reporter.send_runtime_env(report, timeout=args.timeout)
    else:
        if args.command == "ready":
            reporter.ready()
        elif args.command == "checkpoint-saved":
            reporter.checkpoint_saved(args.step, args.uri, args.seconds)
        elif args.command == "checkpoint-restored":
            reporter.checkpoint_restored(args.step, args.uri, args.seconds)
        elif args.command == "step-window":
            reporter.step_window(
                steps=args.steps,
                step_time_s=args.step_time,
                data_wait_s=args.data_wait,
                comm_wait_s=args.comm_wait,
                checkpoint_s=args.checkpoint,
                step=args.step,
            )
        if not reporter.enabled:
            _warn("not running under Gantry (no GANTRY_API_URL / token): nothing sent")
            return 0
        status = reporter.send_once(timeout=args.timeout)
        if status is None:
            _warn("the event was invalid: nothing sent")
            return 1 if args.strict else 0
    if status is not None and 200 <= status < 300:
        return 0
    if status == 0:
        _warn(f"the portal did not answer within {args.timeout:g}s: report not delivered")
    else:
        _warn(f"the portal refused the report (HTTP {status})")
    return 1 if args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
