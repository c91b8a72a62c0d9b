"""GPU-hours released by idle handling (issue 37, point 7): a simulated week of 50 people's
workspaces under three policies, minute by minute, the same people and days for each.

- *no limit*: a workspace holds its GPUs from its launch until its owner stops it;
- *8-hour limit*: every workspace ends 8 hours after its launch, whatever runs in it (the
  owner launches again when next at work);
- *Gantry*: the tenant's idle policy, decided by ``telemetry.workspace_idle.idle_verdict``
  (suspended after 60 idle minutes on every signal, warned 10 minutes before); the owner
  resumes when next at work.

The people (seeded, ``SEED``): on each weekday each arrives between 8:00 and 10:30 and
launches a 1-, 2-, 4- or 8-GPU workspace (60/25/10/5 %); works in bursts (a kernel runs a
cell every 1 to 6 minutes), reads or thinks for 5 to 25 minutes between bursts, is away
45 to 75 minutes for lunch and once or twice 30 to 90 minutes in a meeting, the tab left
open; on half of the days starts a GPU computation of 30 minutes to 6 hours, silent, and
on 15 % of the days one that runs through the night (6 to 14 hours); leaves between 16:30
and 19:00, stopping the workspace (60 %) or forgetting it (40 %). On Saturdays 10 % start
a long computation (4 to 20 hours) and leave it. Nothing in this model is measured from a
real site: it states the patterns the anchors' trackers describe (the forgotten tab, the
long cell in a closed tab, the meeting) with made-up but plausible frequencies.

Reported per policy: GPU-hours held, GPU-hours in use (a person active in the last 15
minutes or the GPUs busy), the computations ended before they finished and their
GPU-hours, and how often a person came back to a workspace that was gone.
"""

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bench.report import Section, quick
from telemetry.workspace_idle import IdleAction, WorkspacePolicy, WorkspaceSignals, idle_verdict

SEED = 3737
PEOPLE = 50
QUICK_PEOPLE = 10
DAYS = 7
MINUTES = DAYS * 24 * 60
FIXED_LIMIT_MIN = 8 * 60
POLICY = WorkspacePolicy(suspend_after=timedelta(minutes=60), warn_before=timedelta(minutes=10))
IN_USE_MIN = 15
MONDAY = datetime(2026, 11, 30, tzinfo=UTC)


@dataclass
class Person:
    gpus: int
    present: list[bool] = field(default_factory=lambda: [False] * MINUTES)
    acts: list[bool] = field(default_factory=lambda: [False] * MINUTES)  # ran a cell
    gpu_busy: list[bool] = field(default_factory=lambda: [False] * MINUTES)
    launches: list[int] = field(default_factory=list)  # minutes of a launch
    stops: set[int] = field(default_factory=set)  # minutes of an explicit stop
    computations: list[tuple[int, int]] = field(default_factory=list)  # [start, end)


def _mark(flags: list[bool], start: int, end: int) -> None:
    for minute in range(max(0, start), min(MINUTES, end)):
        flags[minute] = True


def person(rng: random.Random) -> Person:
    gpus = rng.choices((1, 2, 4, 8), weights=(60, 25, 10, 5))[0]
    who = Person(gpus)
    for day in range(DAYS):
        base = day * 24 * 60
        if day == 5 and rng.random() < 0.10:  # Saturday
            start = base + rng.randint(10 * 60, 14 * 60)
            who.launches.append(start)
            _mark(who.present, start, start + 20)
            _mark(who.acts, start, start + 5)
            length = rng.randint(4 * 60, 20 * 60)
            who.computations.append((start + 5, start + 5 + length))
            _mark(who.gpu_busy, start + 5, start + 5 + length)
            continue
        if day >= 5:
            continue
        arrive = base + rng.randint(8 * 60, 10 * 60 + 30)
        leave = base + rng.randint(16 * 60 + 30, 19 * 60)
        who.launches.append(arrive)
        _mark(who.present, arrive, leave)
        away = [(base + rng.randint(12 * 60, 13 * 60), rng.randint(45, 75))]
        for _ in range(rng.randint(1, 2)):
            away.append((rng.randint(arrive + 30, leave - 120), rng.randint(30, 90)))
        minute = arrive
        while minute < leave:
            gone = next(
                (end for start, length in away if start <= minute < (end := start + length)), None
            )
            if gone is not None:
                minute = gone
                continue
            burst = rng.randint(10, 40)
            for t in range(minute, min(leave, minute + burst), rng.randint(1, 6)):
                who.acts[t] = True
            minute += burst + rng.randint(5, 25)
        if rng.random() < 0.5:
            start = rng.randint(arrive + 30, leave - 30)
            length = rng.randint(30, 6 * 60)
            who.computations.append((start, start + length))
            _mark(who.gpu_busy, start, start + length)
        if rng.random() < 0.15:
            start = leave - rng.randint(5, 30)
            length = rng.randint(6 * 60, 14 * 60)
            who.computations.append((start, start + length))
            _mark(who.gpu_busy, start, start + length)
        if rng.random() < 0.6:
            who.stops.add(leave)
    return who


@dataclass
class Tally:
    held_gpu_min: int = 0
    in_use_gpu_min: int = 0
    killed: int = 0
    killed_gpu_min: int = 0
    gone_on_return: int = 0


def _in_use(who: Person, minute: int) -> bool:
    recent = any(who.acts[max(0, minute - IN_USE_MIN) : minute + 1])
    return recent or who.gpu_busy[minute]


def simulate(who: Person, policy: str) -> Tally:
    tally = Tally()
    held = False
    since = 0  # launch of the current workspace
    last_use = warned = None
    starts = set(who.launches)
    for minute in range(MINUTES):
        wants = minute in starts or who.acts[minute]
        if not held and wants:
            if minute not in starts:
                tally.gone_on_return += 1  # came back to act: launched / resumed again
            held, since, last_use, warned = True, minute, minute, None
        if not held:
            continue
        if minute in who.stops:
            held = False
            continue
        if who.acts[minute] or who.gpu_busy[minute]:
            last_use = minute
        if policy == "8-hour limit" and minute - since >= FIXED_LIMIT_MIN:
            for start, end in who.computations:
                if start <= minute < end:
                    tally.killed += 1
                    tally.killed_gpu_min += (minute - start) * who.gpus
            _clear(who, minute)
            held = False
            continue
        if policy == "Gantry":
            now = MONDAY + timedelta(minutes=minute)
            signals = WorkspaceSignals(
                now=now,
                ready_at=MONDAY + timedelta(minutes=since),
                kernel_activity_at=MONDAY + timedelta(minutes=last_use),
                gpu_active_at=now if who.gpu_busy[minute] else None,
            )
            verdict = idle_verdict(signals, POLICY, warned_at=warned)
            if verdict.action == IdleAction.WARN and (
                warned is None or warned < verdict.idle_since
            ):
                warned = now
            if verdict.action == IdleAction.SUSPEND:
                held = False
                continue
        tally.held_gpu_min += who.gpus
        tally.in_use_gpu_min += who.gpus * _in_use(who, minute)
    return tally


def _clear(who: Person, minute: int) -> None:
    """A killed computation is gone: its GPUs are not busy afterwards."""
    for start, end in who.computations:
        if start <= minute < end:
            for t in range(minute, min(MINUTES, end)):
                who.gpu_busy[t] = False


POLICIES = ("no limit", "8-hour limit", "Gantry")


def run() -> list[Section]:
    people = QUICK_PEOPLE if quick() else PEOPLE
    totals = {}
    for policy in POLICIES:
        rng = random.Random(SEED)  # the same people and days for every policy
        total = Tally()
        for _ in range(people):
            tally = simulate(person(rng), policy)
            for name in vars(total):
                setattr(total, name, getattr(total, name) + getattr(tally, name))
        totals[policy] = total
    free = totals["no limit"].held_gpu_min
    section = Section(
        title=(
            "Workspaces: GPU-hours released by idle handling, a simulated week of "
            f"{people} people (issue 37)"
        ),
        intro=(
            "One week, minute by minute, the same people and days under each policy "
            "(bench/workspace_idle.py has the model: weekday sessions with bursts, reading, "
            "lunch and meetings with the tab open, GPU computations in closed tabs, forgotten "
            "workspaces, weekend runs). Gantry's column is decided by "
            "``telemetry.workspace_idle.idle_verdict``; the baselines are measured in the "
            "same run."
        ),
        columns=[
            "policy",
            "GPU-hours held",
            "held vs no limit",
            "GPU-hours in use",
            "computations ended early",
            "their GPU-hours lost",
            "came back to a workspace gone",
        ],
    )
    for policy in POLICIES:
        total = totals[policy]
        section.rows.append(
            [
                policy,
                f"{total.held_gpu_min / 60:,.0f}",
                f"{total.held_gpu_min / free:.2f}×",
                f"{total.in_use_gpu_min / 60:,.0f}",
                str(total.killed),
                f"{total.killed_gpu_min / 60:,.1f}",
                str(total.gone_on_return),
            ]
        )
    gantry = totals["Gantry"].held_gpu_min
    section.notes.append(
        f"Gantry releases {(free - gantry) / 60:,.0f} GPU-hours of {free / 60:,.0f} against no "
        f"limit ({1 - gantry / free:.0%}) and ends no computation; the 8-hour limit ends "
        f"{totals['8-hour limit'].killed} computations."
    )
    return [section]
