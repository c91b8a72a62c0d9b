"""Today's start-estimate simulation, kept as the reference the incremental one in
``jobs.estimates`` must agree with exactly (tests/jobs/test_estimates_incremental.py, on
random snapshots; bench/estimates.py, on the benchmark's, timing both in the same run).

This is ``jobs.estimates.simulate`` as it was before issue 38 (commit 14ddd5a): every
simulated cycle calls ``jobs.admission.decide`` on a snapshot of the flavors whose GPUs
changed hands, which builds the clusters' state from the held runs again and reserves
nodes for every starving head. Only its name changed; the helpers it shares with the
incremental simulation (the grid, the reasons, ``Start``/``Step``/``Forecast``) are
imported from ``jobs.estimates``.
"""

from bisect import insort
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from jobs import admission, admission_types
from jobs.estimates import (
    _NOTHING,
    DAY_S,
    STUCK,
    Forecast,
    Start,
    Step,
    _free_at_start,
    _leave,
    _no_bound_reasons,
    _on_grid,
    _ready,
)


def simulate_reference(
    snapshot: admission_types.Snapshot,
    *,
    ends: Mapping[int, float | None],
    runtimes: Mapping[int, float | None],
    horizon_s: float = 7 * DAY_S,
    max_steps: int = 200,
    resolution: float = 0.05,
    min_step_s: float = 60.0,
) -> Forecast:
    """Starts for every queued run of ``snapshot``. ``ends``: held run id -> when it frees
    its GPUs (None: not known to end); ``runtimes``: queued run id -> seconds it holds them
    once started (None: no bound). Missing ids count as None."""
    now = snapshot.now
    until = now + horizon_s
    run = _Simulation(snapshot, ends=ends, runtimes=runtimes)
    # Why the simulation ended: "steps", "horizon" or "stuck" (nothing more is known to end).
    # Read only for the runs left without a start, so a queue emptied early needs no state.
    stopped = "steps"
    for _ in range(max_steps):
        decisions = run.cycle()
        run.record_step()
        future = [end for end in run.end_at.values() if end is not None]
        if not future:
            stopped = "stuck"
            break
        following = _on_grid(min(future), now=now, at=run.at, resolution=resolution,
                             min_step_s=min_step_s)  # fmt: skip
        if following > until:
            stopped = "horizon"
            break
        run.advance(following, requeued=decisions.preempted)

    starts = {**run.starts, **run.no_starts(stopped=stopped, horizon_s=horizon_s)}
    return Forecast(
        starts=starts, steps=tuple(run.steps), until=until, ready=_ready(snapshot.queued, starts)
    )


class _Simulation:
    """The clusters and the queue as the simulation moves them forward, one admission cycle
    at a time (``cycle``, then ``advance`` to the next end), and the starts found so far."""

    def __init__(
        self,
        snapshot: admission_types.Snapshot,
        *,
        ends: Mapping[int, float | None],
        runtimes: Mapping[int, float | None],
    ):
        self.snapshot = snapshot
        self.runtimes = runtimes
        self.at = snapshot.now
        self.queued = {run.id: run for run in snapshot.queued}
        self.originals = set(self.queued)
        # A run preempted in the simulation starts again with its whole max runtime, as a
        # new attempt does; known for the queued runs of the snapshot (None: no bound).
        self.max_runtimes = {run.id: run.max_runtime_s for run in snapshot.queued}
        self.held = {run.id: run for run in snapshot.held}
        self.end_at = {run.id: ends.get(run.id) for run in snapshot.held}
        self.on_nodes = {
            run_id: dict(nodes) for run_id, nodes in admission.held_placements(snapshot).items()
        }
        self.free = _free_at_start(snapshot, self.on_nodes)
        self.usage: dict[str, int] = defaultdict(int)
        for run in snapshot.held:
            self.usage[f"{run.tenant}/{run.flavor}"] += run.gpus
        self.starts: dict[int, Start] = {}
        self.steps: list[Step] = []
        self.left_by: dict[str, int] = {}  # "cluster/node" -> the run that last left it
        self.last_free: dict[str, int] = {}
        self.last_usage: dict[str, int] = {}
        self.waits: dict[
            tuple[str, str], admission_types.Wait
        ] = {}  # (tenant, flavor) -> head's wait
        self.lines = _Lines(self.queued.values())
        self.resumed: dict[int, float | None] = {}  # preempted run -> the time it had left
        # Flavors whose GPUs changed hands since the last simulated cycle. Flavors share
        # nothing in admission, and a cycle over a flavor where nothing changed decides
        # nothing new (what could start started the cycle before; a run that began starving
        # since only holds nodes back), so only these are decided again.
        self.changed = {run.flavor for run in snapshot.queued}

    def cycle(self) -> admission_types.Decisions:
        """The admission cycle at ``at``, its decisions applied: the heads' waits noted,
        the preempted runs back in the queue, the admitted ones holding their nodes."""
        decisions = self._decide()
        for wait in decisions.waiting:
            blocked = self.queued[wait.run_id]
            if self.lines.is_head(blocked):
                self.waits[(blocked.tenant, blocked.flavor)] = wait.reason
        for preempt in decisions.preempted:
            self._requeue(self.held.pop(preempt.run_id))
        for admit in decisions.admitted:
            self._admit(admit)
        return decisions

    def _decide(self) -> admission_types.Decisions:
        # Once the queue is empty the steps go on, without decisions, as the held runs end:
        # the preview places a newcomer on them (``first_fit``).
        decisions = _NOTHING
        while self.lines and self.changed:
            decisions = admission.decide(
                replace(
                    self.snapshot,
                    queued=self.lines.front(self.changed),
                    held=tuple(run for run in self.held.values() if run.flavor in self.changed),
                    nodes=tuple(
                        node for node in self.snapshot.nodes if node.flavor in self.changed
                    ),
                    now=self.at,
                ),
                explain=False,
            )
            if not self.lines.deepen({admit.run_id for admit in decisions.admitted}):
                break
        return decisions

    def _requeue(self, victim: admission_types.HeldRun) -> None:
        end = self.end_at.pop(victim.id, None)
        # Back in the queue with the work it had left (``runtimes`` knows queued runs only);
        # it holds its GPUs for that long once it starts again.
        self.resumed[victim.id] = None if end is None else max(0.0, end - self.at)
        _leave(victim, self.on_nodes.pop(victim.id, {}), self.free, self.usage, self.left_by,
               record=False)  # fmt: skip
        # It goes back to the queue, as the real cycle sends it, and competes again.
        count = max(1, len(victim.nodes))
        self.queued[victim.id] = admission_types.QueuedRun(
            id=victim.id, tenant=victim.tenant, flavor=victim.flavor, nodes=count,
            gpus_per_node=max(1, victim.gpus // count), priority=victim.priority,
            submitted=victim.admitted, max_runtime_s=self.max_runtimes.get(victim.id),
        )  # fmt: skip
        self.lines.add(self.queued[victim.id])

    def _admit(self, admit: admission_types.Admit) -> None:
        entering = self.queued.pop(admit.run_id)
        self.lines.remove(entering)
        if entering.id in self.originals and entering.id not in self.starts:
            keys = [f"{admit.cluster}/{name}" for name in admit.nodes]
            behind = tuple(sorted({self.left_by[key] for key in keys if key in self.left_by}))
            self.starts[entering.id] = Start(
                entering.id, self.at, admit.cluster, admit.nodes, behind
            )
        # Bounded by its max runtime, whatever ``runtimes`` says it takes: the bound the real
        # cycle's backfill reads of a held run (``HeldRun.latest_end``).
        bound = entering.max_runtime_s
        self.held[entering.id] = admission_types.HeldRun(
            id=entering.id,
            tenant=entering.tenant,
            flavor=entering.flavor,
            cluster=admit.cluster,
            gpus=entering.gpus,
            priority=entering.priority,
            admitted=self.at,
            borrowed=admit.borrowed,
            nodes=admit.nodes,
            latest_end=None if bound is None else self.at + bound,
        )
        self.on_nodes[entering.id] = dict.fromkeys(admit.nodes, entering.gpus_per_node)
        runtime = (
            self.resumed.pop(entering.id)
            if entering.id in self.resumed
            else self.runtimes.get(entering.id)
        )
        self.end_at[entering.id] = self.at + runtime if runtime is not None else None
        self.usage[f"{entering.tenant}/{entering.flavor}"] += entering.gpus
        for name in admit.nodes:
            key = f"{admit.cluster}/{name}"
            self.free[key] = max(0, self.free[key] - entering.gpus_per_node)

    def record_step(self) -> None:
        """The clusters after this cycle, as what changed since the previous step."""
        self.steps.append(
            Step(
                at=self.at,
                free={k: v for k, v in self.free.items() if self.last_free.get(k) != v},
                usage={k: v for k, v in self.usage.items() if self.last_usage.get(k) != v},
            )
        )
        self.last_free, self.last_usage = dict(self.free), dict(self.usage)

    def advance(self, following: float, *, requeued: Sequence[admission_types.Preempt]) -> None:
        """To ``following``: every run ending by then leaves its nodes, and the flavors of
        those runs and of the runs ``requeued`` this cycle are decided again."""
        ending = [
            run_id for run_id, end in self.end_at.items() if end is not None and end <= following
        ]
        self.changed = {self.queued[preempt.run_id].flavor for preempt in requeued}
        for run_id in ending:
            self.changed.add(self.held[run_id].flavor)
            del self.end_at[run_id]
            _leave(self.held.pop(run_id), self.on_nodes.pop(run_id, {}), self.free, self.usage,
                   self.left_by, record=True)  # fmt: skip
        self.at = following

    def no_starts(self, *, stopped: str, horizon_s: float) -> dict[int, Start]:
        """A start without a number for every queued run of the snapshot that did not
        start, with the reason, by what ended the simulation (``stopped``)."""
        unbounded = _no_bound_reasons(self.snapshot, end_at=self.end_at, held=self.held)
        flavors = {node.flavor for node in self.snapshot.nodes}
        starts = {}
        for run_id in sorted(self.originals - self.starts.keys()):
            left = self.queued[run_id]
            wait = self.waits.get((left.tenant, left.flavor))
            if left.flavor not in flavors:
                why = f"no enabled cluster has {left.flavor} GPUs"
            elif wait in STUCK:
                why = STUCK[wait]
            elif stopped == "horizon":
                why = f"it does not start within the {horizon_s / 3600:,.0f} hours looked ahead"
            elif stopped == "steps":
                simulated = (self.at - self.snapshot.now) / 3600
                why = f"it does not start within the {simulated:,.0f} hours simulated"
            else:
                why = (
                    unbounded.get(left.flavor)
                    or "it cannot start while the clusters stay as they are"
                )
            starts[run_id] = Start(run_id, None, why=why)
        return starts


class _Lines:
    """The queued runs of each tenant and flavor, in line (priority, then FIFO). A cycle
    admits a prefix of each line at most (a tenant's blocked run holds back its later ones),
    so ``decide`` is given only each line's first few runs (``front``): the same decisions
    as on the whole queue unless a whole front was admitted, in which case that line is
    given more (``deepen``) and the cycle decided again. With a long queue it is what keeps
    each simulated cycle cheap."""

    FRONT = 2

    def __init__(self, runs: Iterable[admission_types.QueuedRun]):
        self.lines: dict[tuple[str, str], list[admission_types.QueuedRun]] = defaultdict(list)
        for run in sorted(runs, key=admission_types.queue_order):
            self.lines[(run.tenant, run.flavor)].append(run)
        self.depth: dict[tuple[str, str], int] = {}

    def __bool__(self) -> bool:
        return bool(self.lines)

    def add(self, run: admission_types.QueuedRun) -> None:
        insort(self.lines[(run.tenant, run.flavor)], run, key=admission_types.queue_order)

    def remove(self, run: admission_types.QueuedRun) -> None:
        line = self.lines[(run.tenant, run.flavor)]
        line.remove(run)
        if not line:
            del self.lines[(run.tenant, run.flavor)]

    def is_head(self, run: admission_types.QueuedRun) -> bool:
        return self.lines[(run.tenant, run.flavor)][0] is run

    def front(self, flavors: set[str]) -> tuple[admission_types.QueuedRun, ...]:
        return tuple(
            run
            for key, line in self.lines.items()
            if key[1] in flavors
            for run in line[: self.depth.get(key, self.FRONT)]
        )

    def deepen(self, admitted: set[int]) -> bool:
        """Give more runs to each line whose whole front was admitted; whether any was."""
        deeper = False
        for key, line in self.lines.items():
            depth = self.depth.get(key, self.FRONT)
            if len(line) > depth and all(run.id in admitted for run in line[:depth]):
                self.depth[key] = depth * 4
                deeper = True
        return deeper
