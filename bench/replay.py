"""What-if replay (issue 38, points 2, 4 and 5): how fast a month replays, and how closely a
replay of the policy in force reproduces what the product did.

(a) Speed. 30 days of 10,000 runs from the Alibaba GPU trace (v2023, openb): the 6,203 GPU
tasks of its default pod list that ran, then the first 3,797 of them again (as new runs
after the trace's last arrival), their arrivals scaled into 30 days, run times as recorded;
on 1/64 of the trace's nodes (the clusters of bench/trace.py), tenants and quotas as there
(``tenant_of``, ``make_quotas``), every cluster's queueing policy ``backfill`` (the
product's default). ``jobs.replay.replay`` against the same replay deciding after every
batch of events, as the engine of bench/trace.py always did (``skip_idle_cycles`` off), in
the same run; both must give the same outcome.

(b) Validation. A slice of the trace recorded through the product: tenants, quotas, users
and a simulated cluster (speed-up 1) in PostgreSQL; each task submitted through
``run_submit`` at its arrival with its run time as the simulated work, and at that moment
and every ``TICK_S`` (on a clock moved by hand) what the worker does: sync the cluster,
an admission cycle, then at once what follows a cycle (submit the admitted runs, take
preempted ones off, sync; a cycle again for runs back in the queue); in between, an
admission cycle every ``BEAT_S``, as beat sends them.
The window is read back by ``jobs.selectors.replay_history`` and replayed under the policy
in force: per tenant, the p50 queue time observed and replayed; the utilisation of both.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bench.report import Section, quick
from bench.trace import (
    NODE_SHARE,
    PRIORITY,
    TASKS_CSV,
    Task,
    make_quotas,
    max_runtime,
    node_groups,
    ran,
    read_pods,
    tenant_of,
)
from jobs import replay as replay_module
from jobs.admission_types import Pool, Queueing, nodes_of
from jobs.replay import observed_outcome, replay
from jobs.replay_report import fidelity
from jobs.replay_types import History, Outcome, Submission

DAY = 86400.0
RUNS, DAYS = 10_000, 30
QUICK_RUNS, QUICK_DAYS = 300, 1
GOAL_S = 120.0
SLICE_TASKS, SLICE_HOURS = 300, 3  # recorded through the product
SLICE_ARRIVING = 0.5  # the share of the window the slice's arrivals are scaled into
SLICE_NODES = 4  # of 8 GPUs
QUICK_SLICE_TASKS, QUICK_SLICE_HOURS = 40, 1
SLICE_RUN_MAX_S = 3600.0
TICK_S = 60  # the worker's sync in the recorded slice (production: every 3 s)
BEAT_S = 5  # its admission cycles (GANTRY_ADMISSION_INTERVAL_S)
RECORDED_FLAVOR = "gpu"


def trace_tasks(count: int, seconds: float) -> list[Task]:
    """The default pod list's GPU tasks that ran, repeated until there are ``count``, their
    arrivals scaled into ``seconds``."""
    rows = [row for row in read_pods(TASKS_CSV) if ran(row)]
    created = [int(row["creation_time"]) for row in rows]
    first, span = min(created), max(created) - min(created) + 1
    offsets = [created[i % len(rows)] - first + (i // len(rows)) * span for i in range(count)]
    scale = seconds / (max(offsets) + 1)
    return [
        Task(
            id=i + 1, name=rows[i % len(rows)]["name"], qos=rows[i % len(rows)]["qos"],
            gpus_per_node=int(rows[i % len(rows)]["num_gpu"]), arrival=offsets[i] * scale,
            runtime=float(max(1, int(rows[i % len(rows)]["deletion_time"])
                              - int(rows[i % len(rows)]["scheduled_time"]))),
        )
        for i in range(count)
    ]  # fmt: skip


def pools(share: float) -> tuple[Pool, ...]:
    return tuple(
        Pool(f"{model.lower()}-x{gpus}", "gpu", nodes=max(1, round(count * share)),
             gpus_per_node=gpus)
        for (model, gpus), count in sorted(node_groups().items())
    )  # fmt: skip


def trace_history(count: int, days: float) -> History:
    tasks = trace_tasks(count, days * DAY)
    clusters = pools(NODE_SHARE)
    nodes = nodes_of(*clusters)
    quotas = make_quotas(tasks, {"gpu": sum(p.capacity for p in clusters)})
    submissions = tuple(
        Submission(
            id=t.id, tenant=tenant_of(t), flavor="gpu", nodes=1, gpus_per_node=t.gpus_per_node,
            priority=PRIORITY[t.qos], submitted=t.arrival, ran_s=t.runtime,
            max_runtime_s=max_runtime(t),
        )
        for t in tasks
    )  # fmt: skip
    return History(
        start=0.0, end=days * DAY, submissions=submissions, holding=(), nodes=nodes,
        quotas=quotas, tenants=tuple(sorted({t for t, _ in quotas})), flavors=("gpu",),
        starvation_after_s=1800.0,
        queueing={p.cluster: Queueing.BACKFILL for p in clusters},
    )  # fmt: skip


@dataclass
class Timed:
    seconds: float  # wall time
    cpu_seconds: float  # this process's CPU time: what a machine to itself would take
    outcome: Outcome
    cycles: int
    decided: int


def timed_replay(history: History, *, skip: bool) -> Timed:
    counted: dict[str, int] = {}

    class Counting(replay_module._Replay):
        skip_idle_cycles = skip

        def run(self) -> None:
            super().run()
            counted.update(cycles=self.cycles, decided=self.cycles - self.skipped)

    original = replay_module._Replay
    replay_module._Replay = Counting  # type: ignore[misc]
    try:
        started, cpu = time.perf_counter(), time.process_time()
        outcome = replay(history)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        replay_module._Replay = original  # type: ignore[misc]
    return Timed(seconds, cpu, outcome, counted["cycles"], counted["decided"])


def speed() -> Section:
    runs, days = (QUICK_RUNS, QUICK_DAYS) if quick() else (RUNS, DAYS)
    history = trace_history(runs, days)
    fast = timed_replay(history, skip=True)
    slow = timed_replay(history, skip=False)
    assert fast.outcome == slow.outcome, "skipping idle cycles changed the outcome"
    gpus = sum(n.gpus for n in history.nodes)
    out = fast.outcome
    section = Section(
        title="What-if replay: 30 days of 10,000 runs (issue 38, points 4 and 5)",
        intro=" ".join((__doc__ or "").split("\n\n")[1].split()),
        columns=["history", "replay", "baseline: decide after every batch", "ratio",
                 "outcome", f"goal ≤ {GOAL_S:.0f} s"],
    )  # fmt: skip
    section.rows.append(
        [
            f"{runs:,} runs, {days} days, {len(history.nodes)} nodes ({gpus} GPUs), "
            f"{len({s.tenant for s in history.submissions})} tenants",
            f"{fast.seconds:,.1f} s, CPU {fast.cpu_seconds:,.1f} s ({fast.decided:,} of "
            f"{fast.cycles:,} cycles decided)",
            f"{slow.seconds:,.1f} s, CPU {slow.cpu_seconds:,.1f} s ({slow.decided:,} cycles)",
            f"{slow.cpu_seconds / fast.cpu_seconds:.2f}× (CPU)",
            f"utilisation {out.utilisation:.1f} %, {out.preemptions:,} preemptions, "
            f"{out.not_started:,} runs not started by the end; the same for both",
            f"{'met' if fast.seconds <= GOAL_S else 'missed'} in wall time, "
            f"{'met' if fast.cpu_seconds <= GOAL_S else 'missed'} in CPU time",
        ]
    )
    section.notes.append(
        "Wall time counts the other work on the machine (its load is at the head of this "
        "page); CPU time is the replay's own, what the machine alone would take. The ratio "
        "compares CPU times."
    )
    return section


# --- (b) recorded through the product -------------------------------------------------------


def record_slice(tasks: list[Task], *, start: datetime, seconds: int) -> None:
    """The tasks submitted through the product at their arrivals (after ``start``), the
    worker's loop every ``TICK_S``."""
    import time_machine
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.utils import timezone

    from clusters.models import Cluster
    from clusters.services import cluster_refresh_inventory
    from images.models import Image
    from jobs.models import (
        HOLDING_STATES,
        Run,
        RunState,
    )
    from jobs.services.admission_cycle import admission_run_cycle
    from jobs.services.backend_sync import cluster_sync
    from jobs.services.submission import ExperimentInput, run_submit
    from tenants.models import GpuFlavor, Membership, Project, Quota, Tenant
    from tests.jobs.replay_support import hand_over_attempts

    call_command("flush", interactive=False, verbosity=0)
    with time_machine.travel(start, tick=False) as clock:
        flavor = GpuFlavor.objects.create(slug=RECORDED_FLAVOR, name="Trace GPU", memory_gb=32)
        # One cluster of 8-GPU nodes (every task of the trace fits one): a simulated cluster
        # names its nodes by flavor, so it has one pool of the trace's one flavor.
        cluster = Cluster.objects.create(
            name="trace", backend=Cluster.Backend.SIMULATOR,
            settings={"speedup": 1, "pools": [
                {"flavor": RECORDED_FLAVOR, "nodes": SLICE_NODES, "gpus_per_node": 8},
            ]},
            queueing=Queueing.BACKFILL,
        )  # fmt: skip
        cluster_refresh_inventory(cluster=cluster)
        image = Image.objects.create(
            repository="registry.example.org/trace/job", digest="sha256:" + "e" * 64,
            tag="1", status=Image.Status.APPROVED,
        )  # fmt: skip
        capacity = SLICE_NODES * 8
        users: dict[str, User] = {}
        for (slug, _), quota in sorted(make_quotas(tasks, {RECORDED_FLAVOR: capacity}).items()):
            tenant = Tenant.objects.create(slug=slug, name=slug)
            Project.objects.create(tenant=tenant, slug="jobs", name="jobs")
            users[slug] = User.objects.create_user(username=f"user-{slug}")
            Membership.objects.create(user=users[slug], tenant=tenant, role="researcher")
            Quota.objects.create(
                tenant=tenant, flavor=flavor, guaranteed_gpus=quota.guaranteed,
                borrow_limit_gpus=quota.borrow_limit,
            )  # fmt: skip

        def submit(task: Task) -> None:
            slug = tenant_of(task)
            run_submit(
                user=users[slug],
                data=ExperimentInput(
                    tenant=slug, project="jobs", image=image.reference, command="train",
                    flavor=RECORDED_FLAVOR, nodes=1, gpus_per_node=task.gpus_per_node,
                    name=task.name, priority=PRIORITY[task.qos],
                    max_runtime_minutes=int(max_runtime(task) // 60),
                    env={"GANTRY_SIM_DURATION_S": str(int(task.runtime))},
                ),
            )  # fmt: skip

        def waiting_and_holding() -> tuple[int, int]:
            return (
                Run.objects.filter(state=RunState.QUEUED).count(),
                Run.objects.filter(state__in=HOLDING_STATES).count(),
            )

        def settle() -> bool:
            """What the worker does at once after a cycle commits: take preempted runs'
            jobs off and submit the admitted ones, then the sync. True if a run went back
            to the queue or gave its GPUs back: that sends a cycle (the kick)."""
            hand_over_attempts()
            before = waiting_and_holding()
            cluster_sync(cluster=cluster)
            waiting, holding = waiting_and_holding()
            return waiting > before[0] or holding < before[1]

        def tick() -> None:
            """The sync notices runs that ended, a cycle decides, the worker acts on it;
            a run back in the queue or one that ended sends another cycle at once."""
            cluster_sync(cluster=cluster)
            admission_run_cycle(now=timezone.now())
            while settle():
                admission_run_cycle(now=timezone.now())

        arrivals: dict[int, list[Task]] = {}
        for task in tasks:
            arrivals.setdefault(math.ceil(task.arrival), []).append(task)
        moments = sorted(set(arrivals) | set(range(0, seconds, BEAT_S)))
        for second in moments:
            if second >= seconds:
                break
            clock.move_to(start + timedelta(seconds=second))
            for task in arrivals.get(second, []):
                submit(task)
            if second in arrivals or second % TICK_S == 0:
                tick()
            else:  # beat's admission cycle: fair share follows the clock, as in production
                admission_run_cycle(now=timezone.now())
                while settle():
                    admission_run_cycle(now=timezone.now())


def validation(recorder: Callable[[list[Task], datetime, int], None] | None = None) -> Section:
    import time_machine

    from jobs.selectors.replay_history import replay_history

    count, hours = (QUICK_SLICE_TASKS, QUICK_SLICE_HOURS) if quick() else (SLICE_TASKS, SLICE_HOURS)
    # The trace's first tasks that ran an hour at most (most do: the median is 11 minutes),
    # arrivals scaled so they come in the first part of the window.
    seconds = hours * 3600
    arriving = SLICE_ARRIVING * seconds
    short = [t for t in trace_tasks(6203, arriving) if t.runtime <= SLICE_RUN_MAX_S][:count]
    first, last = short[0].arrival, short[-1].arrival
    tasks = [
        Task(id=i + 1, name=t.name, qos=t.qos, gpus_per_node=t.gpus_per_node,
             arrival=(t.arrival - first) / (last - first + 1) * arriving,
             runtime=t.runtime)
        for i, t in enumerate(short)
    ]  # fmt: skip
    start = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)
    started = time.perf_counter()
    record_slice(tasks, start=start, seconds=seconds)
    recorded_s = time.perf_counter() - started
    end = start + timedelta(seconds=seconds)
    with time_machine.travel(end + timedelta(hours=1), tick=False):  # read after the window
        history = replay_history(start=start, end=end)
    observed = observed_outcome(history)
    replayed = replay(history)
    check = fidelity(history, observed, replayed, slack_s=BEAT_S)
    section = Section(
        title="What-if replay: the policy in force replayed against what happened (issue 38, "
        "point 2)",
        intro=(
            f"{' '.join((__doc__ or '').split(chr(10) * 2)[2].split())} Here: the trace's "
            f"first {count} GPU tasks that ran an hour at most, arrivals scaled into the "
            f"first {arriving / 3600:g} hours of a {hours}-hour window, on "
            f"{len(history.nodes)} nodes of 8 GPUs, queueing ``backfill``; recorded in "
            f"{recorded_s:,.0f} s. Goal: every "
            f"tenant's p50 within 10 % or {BEAT_S} s (one admission interval, the recorded "
            "clock's resolution), utilisation within 3 points."
        ),
        columns=["tenant", "runs", "p50 observed", "p50 replayed", f"within 10 % or {BEAT_S} s",
                 "p95 observed", "p95 replayed"],
    )  # fmt: skip
    for figures in check.tenants:
        seen, again = observed.tenant(figures.tenant), replayed.tenant(figures.tenant)
        if seen is None or again is None or not seen.runs:
            continue
        section.rows.append(
            [
                figures.tenant,
                f"{seen.runs}",
                f"{seen.queue_p50_s:,.0f} s",
                f"{again.queue_p50_s:,.0f} s",
                "yes" if figures.within else "no",
                f"{seen.queue_p95_s:,.0f} s",
                f"{again.queue_p95_s:,.0f} s",
            ]
        )
    section.notes.append(
        f"Utilisation: observed {observed.utilisation:.2f} %, replayed "
        f"{replayed.utilisation:.2f} % ({replayed.utilisation - observed.utilisation:+.2f} "
        f"points): {'within' if check.utilisation_within else 'outside'} 3 points."
    )
    section.notes.extend(f"Where replay and reality differ: {reason}" for reason in check.reasons)
    return section


def run() -> list[Section]:
    return [speed(), validation()]
