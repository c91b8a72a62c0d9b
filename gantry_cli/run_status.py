"""How a run's state reads in a terminal: why it waits, when it should start, how it ended,
and the status line redrawn while ``--wait`` and ``logs -f`` poll."""

import sys
from typing import Any

from gantry_cli.output import duration, when


def wait_details(run: dict[str, Any]) -> str:
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


def start_estimate(run: dict[str, Any]) -> str:
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


def run_status(run: dict[str, Any]) -> str:
    details = "; ".join(part for part in (wait_details(run), start_estimate(run)) if part)
    return f"run {run['id']} {run['state']}" + (f" ({details})" if details else "")


def run_summary(run: dict[str, Any]) -> str:
    line = f"Run {run['id']} {run['state']}"
    if run.get("failure_reason"):
        line += f" ({run['failure_reason']})"
    return line + "."


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
