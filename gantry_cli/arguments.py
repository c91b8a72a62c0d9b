"""The pieces every area's parser builder shares: argument types, one sub-command, the
``--json`` flag."""

import argparse
from collections.abc import Callable
from typing import Any, TypeAlias

from gantry_cli.context import Context

# The sub-command action of the top-level parser (its class is private to argparse).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def add_command(
    commands: Commands, name: str, handler: Callable[[Context], int], help: str, **kwargs: Any
) -> argparse.ArgumentParser:
    """A sub-command whose help is also its description, run by ``handler``."""
    sub = commands.add_parser(name, help=help, description=help, **kwargs)
    sub.set_defaults(handler=handler)
    return sub


def add_json_flag(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--json", action="store_true", help="Print JSON for scripts")
