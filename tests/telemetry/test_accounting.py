"""Per-attempt accounting (design §7): the invariant, precedence, golden scenarios, KPIs."""

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.accounting import (
    CATEGORIES,
    WASTE,
    Accounting,
    AttemptTimeline,
    Outcome,
    ResumedAttempt,
    ResumedCheckpoint,
    StepWindow,
    account,
    checkpoint_recovery_success,
    goodput,
)

T0 = 1_699_999_980  # Unix seconds at the start of a minute
STARTUP_S = 30  # clusters.simulation.STARTUP_S


def busy(gpus: int, minutes: int, activity: float = 0.9) -> dict[str, dict[int, float]]:
    return {str(gpu): {T0 + 60 * m: activity for m in range(minutes)} for gpu in range(gpus)}


def minute_windows(first: int, count: int, **fields) -> list[StepWindow]:
    return [
        StepWindow(
            T0 + first + 60 * i, T0 + first + 60 * (i + 1), steps=60, step_time_s=1.0, **fields
        )
        for i in range(count)
    ]


def assert_invariant(accounting: Accounting) -> None:
    parts = accounting.categories()
    assert sum(parts.values()) == accounting.allocated
    assert all(value >= 0 for value in parts.values())
    whole = accounting.whole_seconds()
    assert sum(whole[name] for name in CATEGORIES) == whole["allocated"]
    assert all(whole[name] >= 0 for name in CATEGORIES)


# Golden scenarios from the simulator's profiles -----------------------------------------


def test_healthy_compute_bound_job_has_goodput_above_90_percent():
    # 8 GPUs, 30 s startup, 20 one-minute step windows; three 5 s blocking saves.
    windows = minute_windows(STARTUP_S, 20, data_wait_s=0.6, comm_wait_s=1.2)
    for index in (4, 9, 14):
        windows[index] = StepWindow(
            windows[index].start,
            windows[index].end,
            60,
            1.0,
            data_wait_s=0.6,
            comm_wait_s=1.2,
            checkpoint_s=5,
        )

    accounting = account(
        AttemptTimeline(
            gpus=8,
            start=T0,
            end=T0 + 1230,
            outcome=Outcome.SUCCEEDED,
            step_windows=windows,
            activity=busy(8, 21),
            submitted_at=T0 - 95,
        )
    )

    assert accounting.categories() == {
        "lost": 0,
        "startup": 8 * 30,
        "checkpoint": 3 * 8 * 5,
        "interactive_idle": 0,
        "idle": 0,
        "input_wait": Fraction(96),
        "comm_wait": Fraction(192),
        "effective": 9192,
    }
    assert accounting.allocated == 9840
    assert accounting.goodput > Fraction(9, 10)
    assert accounting.queue_s == 95
    assert accounting.active_gpu_hours == 0.9 * 8 * 1230 / 3600
    assert_invariant(accounting)


def test_input_bound_job_shows_input_wait_as_its_largest_waste():
    accounting = account(
        AttemptTimeline(
            gpus=4,
            start=T0,
            end=T0 + 1230,
            outcome=Outcome.SUCCEEDED,
            step_windows=minute_windows(STARTUP_S, 20, data_wait_s=36, comm_wait_s=3),
            activity=busy(4, 21, activity=0.35),
        )
    )

    waste = {name: accounting.categories()[name] for name in WASTE}
    assert max(waste, key=waste.__getitem__) == "input_wait"
    assert accounting.input_wait == 4 * 20 * 36
    assert accounting.comm_wait == 4 * 20 * 3
    assert_invariant(accounting)


def test_crash_after_the_last_checkpoint_loses_the_work_since_that_checkpoint():
    # The "crash" profile: 1,200 s of work fails at step 720; checkpoints every 300 steps
    # block for 10 s each, so step 600 is saved at +650 and the crash comes at +770.
    windows = [
        StepWindow(T0 + 30, T0 + 330, 300, 1.0, data_wait_s=15),
        StepWindow(T0 + 340, T0 + 640, 300, 1.0, data_wait_s=15),
        StepWindow(T0 + 650, T0 + 770, 120, 1.0, data_wait_s=6),
    ]

    accounting = account(
        AttemptTimeline(
            gpus=4,
            start=T0,
            end=T0 + 770,
            outcome=Outcome.FAILED,
            resumed_checkpoint=ResumedCheckpoint(step=600, saved_at=T0 + 650),
            step_windows=windows,
            checkpoint_intervals=[(T0 + 330, T0 + 340), (T0 + 640, T0 + 650)],
            activity=busy(4, 13),
        )
    )

    assert accounting.categories() == {
        "lost": 4 * 120,
        "startup": 4 * 30,
        "checkpoint": 4 * 20,
        "interactive_idle": 0,
        "idle": 0,
        "input_wait": 4 * 30,
        "comm_wait": 0,
        "effective": 2280,
    }
    assert_invariant(accounting)


def test_failure_without_a_usable_checkpoint_loses_everything_after_startup():
    accounting = account(
        AttemptTimeline(
            gpus=2,
            start=T0,
            end=T0 + 630,
            outcome=Outcome.PREEMPTED,
            step_windows=minute_windows(STARTUP_S, 10),
            activity=busy(2, 11),
        )
    )

    assert (accounting.lost, accounting.startup, accounting.effective) == (1200, 60, 0)


def test_idle_notebook_shows_idle():
    # One GPU for two hours: 5 active minutes, 100 idle ones, 15 active ones; no SDK.
    minutes = {T0 + 60 * m: 0.4 for m in range(5)}
    minutes |= {T0 + 60 * m: 0.0 for m in range(5, 105)}
    minutes |= {T0 + 60 * m: 0.3 for m in range(105, 120)}

    accounting = account(
        AttemptTimeline(
            gpus=1, start=T0, end=T0 + 7200, outcome=Outcome.CANCELLED, activity={"0": minutes}
        )
    )

    assert (accounting.idle, accounting.startup, accounting.effective) == (6000, 0, 1200)
    assert_invariant(accounting)


def test_startup_without_sdk_ends_at_the_first_active_minute():
    minutes = {T0: 0.0, T0 + 60: 0.01, T0 + 120: 0.7, T0 + 180: 0.0}

    accounting = account(
        AttemptTimeline(
            gpus=2, start=T0, end=T0 + 240, outcome=Outcome.SUCCEEDED, activity={"0": minutes}
        )
    )

    assert (accounting.startup, accounting.idle, accounting.effective) == (240, 60, 180)


def test_precedence_checkpoint_over_idle_and_lost_over_everything():
    windows = minute_windows(0, 3, data_wait_s=30)
    activity = {"0": {T0: 0.0, T0 + 60: 0.0, T0 + 120: 0.0}}

    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 180,
            outcome=Outcome.LOST,
            resumed_checkpoint=ResumedCheckpoint(step=100, saved_at=T0 + 120),
            step_windows=windows,
            checkpoint_intervals=[(T0 + 50, T0 + 70), (T0 + 110, T0 + 150)],
            activity=activity,
        )
    )

    assert accounting.categories() == {
        "lost": 60,
        "startup": 0,
        "checkpoint": 30,
        "interactive_idle": 0,
        "idle": 90,
        "input_wait": 0,
        "comm_wait": 0,
        "effective": 0,
    }


def test_fractional_times_keep_the_invariant_exact_and_round_to_whole_seconds():
    accounting = account(
        AttemptTimeline(
            gpus=3,
            start=T0 + 0.25,
            end=T0 + 100.5,
            outcome=Outcome.SUCCEEDED,
            step_windows=[
                StepWindow(T0 + 10.1, T0 + 99.9, 89, 1.0, data_wait_s=7.3, comm_wait_s=2.2)
            ],
        )
    )

    assert accounting.allocated == Fraction(3 * 401, 4)
    assert_invariant(accounting)
    assert accounting.whole_seconds()["allocated"] == 301


# The gaps mutation testing found (issue 32): each value worked out by hand ------------


def test_every_idle_gpu_of_a_minute_counts():
    # Given 4 GPUs in one step window: all 4 idle in the first minute, 2 in the second
    idle_then_half = {str(gpu): {T0: 0.0, T0 + 60: 0.0 if gpu < 2 else 0.9} for gpu in range(4)}

    accounting = account(
        AttemptTimeline(
            gpus=4,
            start=T0,
            end=T0 + 120,
            outcome=Outcome.SUCCEEDED,
            step_windows=[StepWindow(T0, T0 + 120, steps=120, step_time_s=1.0)],
            activity=idle_then_half,
        )
    )

    # Then idle is 4 x 60 + 2 x 60, the 2 busy GPUs of the second minute effective
    assert accounting.categories() == {
        "lost": 0,
        "startup": 0,
        "checkpoint": 0,
        "interactive_idle": 0,
        "idle": 360,
        "input_wait": 0,
        "comm_wait": 0,
        "effective": 120,
    }


def test_a_minute_never_has_more_idle_gpus_than_the_attempt():
    # Three idle series (a multi-node attempt repeats GPU indices) for a 2-GPU attempt
    series = {"node-a/0": {T0: 0.0}, "node-a/1": {T0: 0.01}, "node-b/0": {T0: 0.02}}

    accounting = account(
        AttemptTimeline(gpus=2, start=T0, end=T0 + 60, outcome=Outcome.SUCCEEDED, activity=series)
    )

    assert (accounting.idle, accounting.effective, accounting.allocated) == (120, 0, 120)


def test_abutting_step_windows_each_charge_their_own_shares():
    # Given [0, 60) waiting for data half its step time, then [60, 180) not waiting
    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 180,
            outcome=Outcome.SUCCEEDED,
            step_windows=[
                StepWindow(T0, T0 + 60, steps=30, step_time_s=1.0, data_wait_s=30),
                StepWindow(T0 + 60, T0 + 180, steps=120, step_time_s=1.0),
            ],
        )
    )

    # Then only the first window's 30 s are input wait
    assert (accounting.input_wait, accounting.effective) == (30, 150)


def test_a_whole_number_allocation_rounds_to_itself_with_no_phantom_second():
    accounting = account(
        AttemptTimeline(
            gpus=4,
            start=T0,
            end=T0 + 120,
            outcome=Outcome.SUCCEEDED,
            checkpoint_intervals=[(T0 + 10, T0 + 20)],
        )
    )

    assert accounting.whole_seconds() == {
        "lost": 0,
        "startup": 0,
        "checkpoint": 40,
        "interactive_idle": 0,
        "idle": 0,
        "input_wait": 0,
        "comm_wait": 0,
        "effective": 440,
        "allocated": 480,
    }


def test_a_half_second_rounds_up_and_goes_to_the_largest_remainder():
    # 2 GPUs for 50.25 s = 100.5 GPU-s, rounded half up to 101; the floors give 100, and the
    # second left goes to the category with the larger fraction
    def rounded(saving_s: float) -> dict[str, int]:
        whole = account(
            AttemptTimeline(
                gpus=2,
                start=T0,
                end=T0 + 50.25,
                outcome=Outcome.SUCCEEDED,
                checkpoint_intervals=[(T0, T0 + saving_s)],
            )
        ).whole_seconds()
        return {name: count for name, count in whole.items() if count}

    # checkpoint 2 x 5.1 = 10.2, effective 2 x 45.15 = 90.3: effective gets it
    assert rounded(5.1) == {"checkpoint": 10, "effective": 91, "allocated": 101}
    # checkpoint 2 x 5.15 = 10.3, effective 2 x 45.1 = 90.2: checkpoint gets it
    assert rounded(5.15) == {"checkpoint": 11, "effective": 90, "allocated": 101}


def test_a_step_window_outside_the_allocation_or_inside_another_drops_no_later_one():
    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 60,
            outcome=Outcome.SUCCEEDED,
            step_windows=[
                StepWindow(T0 - 100, T0 - 40, steps=60, step_time_s=1.0),  # before it
                StepWindow(T0 + 10, T0 + 40, steps=30, step_time_s=1.0),
                StepWindow(T0 + 15, T0 + 35, steps=20, step_time_s=1.0),  # inside the last
                StepWindow(T0 + 40, T0 + 60, steps=10, step_time_s=1.0, data_wait_s=10),
            ],
        )
    )

    # Then startup runs to the first window inside (10 s), and the last one waits 10 of 20 s
    assert (accounting.startup, accounting.input_wait, accounting.effective) == (10, 10, 40)


def test_an_activity_sample_outside_the_allocation_drops_no_later_one():
    # Samples before and after the allocation come first; the idle minute is T0
    samples = {"0": {T0 - 60: 0.9, T0 + 120: 0.0, T0: 0.0, T0 + 60: 0.6}}

    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 120,
            outcome=Outcome.SUCCEEDED,
            step_windows=[StepWindow(T0, T0 + 120, steps=120, step_time_s=1.0)],
            activity=samples,
        )
    )

    # Then minute T0 is idle; only the inside minutes count as activity (0.6 x 60 s)
    assert (accounting.idle, accounting.effective) == (60, 60)
    assert accounting.active_gpu_hours == 0.01


def test_startup_ends_at_the_earliest_active_minute_of_any_gpu_in_any_order():
    activity = {"0": {T0 + 120: 0.9}, "1": {T0 + 60: 0.9, T0: 0.01}}

    accounting = account(
        AttemptTimeline(
            gpus=2, start=T0, end=T0 + 180, outcome=Outcome.SUCCEEDED, activity=activity
        )
    )

    # The idle minute T0 is startup: startup comes first
    assert (accounting.startup, accounting.idle, accounting.effective) == (120, 0, 240)


def test_fraction_times_are_read_exactly():
    # Given 3 GPUs from T0 + 1/3 for 10 s, a step window from 2 s in waiting 1 s of its 8
    third = Fraction(1, 3)

    accounting = account(
        AttemptTimeline(
            gpus=3,
            start=T0 + third,
            end=T0 + 10 + third,
            outcome=Outcome.FAILED,
            resumed_checkpoint=ResumedCheckpoint(step=4, saved_at=T0 + 6 + third),
            step_windows=[
                StepWindow(T0 + 2 + third, T0 + 10 + third, 8, 1.0, data_wait_s=1.0),
            ],
        )
    )

    # Then startup 3 x 2, lost 3 x 4 after the save, and of the 3 x 4 GPU-s in between the
    # window's share, 1/8, is input wait
    assert accounting.categories() == {
        "lost": 12,
        "startup": 6,
        "checkpoint": 0,
        "interactive_idle": 0,
        "idle": 0,
        "input_wait": Fraction(3, 2),
        "comm_wait": 0,
        "effective": Fraction(21, 2),
    }


def test_a_window_shorter_than_a_second_still_has_its_shares():
    # A 1 s window blocked 0.5 s checkpointing (no interval) and waiting 0.25 s for data
    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 1,
            outcome=Outcome.SUCCEEDED,
            step_windows=[
                StepWindow(T0, T0 + 1, 1, 0.5, data_wait_s=0.25, checkpoint_s=0.5),
            ],
        )
    )

    # Then checkpoint is half; of the other half, 0.25 of 0.5 s is input wait
    assert (accounting.checkpoint, accounting.input_wait, accounting.effective) == (
        Fraction(1, 2),
        Fraction(1, 4),
        Fraction(1, 4),
    )


def test_a_sample_stamped_inside_a_minute_counts_for_that_minute():
    accounting = account(
        AttemptTimeline(
            gpus=1, start=T0, end=T0 + 60, outcome=Outcome.SUCCEEDED, activity={"0": {T0 + 30: 0.0}}
        )
    )

    assert (accounting.idle, accounting.effective) == (60, 0)


def test_a_minute_ending_at_the_allocation_start_does_not_end_startup():
    # Active in the minute before the allocation, and from its second minute on
    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 120,
            outcome=Outcome.SUCCEEDED,
            activity={"0": {T0 - 60: 0.9, T0 + 60: 0.9}},
        )
    )

    assert (accounting.startup, accounting.effective) == (60, 60)


def test_a_step_window_inside_a_checkpoint_interval_is_all_checkpoint():
    # Given a window waiting for data, whose whole minute [60, 120) is a blocking save: no
    # open time to share out (the shares are zero, not a division by zero)
    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 180,
            outcome=Outcome.SUCCEEDED,
            step_windows=[StepWindow(T0 + 60, T0 + 120, 60, 1.0, data_wait_s=10)],
            checkpoint_intervals=[(T0 + 60, T0 + 120)],
        )
    )

    # Then startup until the window, the save, and the last minute effective; no input wait
    assert accounting.categories() == {
        "lost": 0,
        "startup": 60,
        "checkpoint": 60,
        "interactive_idle": 0,
        "idle": 0,
        "input_wait": 0,
        "comm_wait": 0,
        "effective": 60,
    }


def test_a_step_window_its_checkpoint_seconds_fill_has_no_step_time_to_wait_in():
    # Given a one-minute window reporting 60 s blocked checkpointing (no interval) and 10 s
    # waiting for data: every open second is checkpoint, none is left for steps
    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 60,
            outcome=Outcome.SUCCEEDED,
            step_windows=[StepWindow(T0, T0 + 60, 60, 1.0, data_wait_s=10, checkpoint_s=60)],
        )
    )

    assert (accounting.checkpoint, accounting.input_wait, accounting.effective) == (60, 0, 0)


def test_overlapping_checkpoint_intervals_count_from_the_first_ones_start():
    # Given saves over [60, 120) and [90, 150): one blocked stretch [60, 150)
    accounting = account(
        AttemptTimeline(
            gpus=2,
            start=T0,
            end=T0 + 180,
            outcome=Outcome.SUCCEEDED,
            checkpoint_intervals=[(T0 + 90, T0 + 150), (T0 + 60, T0 + 120)],
        )
    )

    assert (accounting.checkpoint, accounting.effective) == (2 * 90, 2 * 90)


def test_activity_at_the_idle_threshold_is_not_idle():
    # Given a first minute exactly at the threshold and a second one below it
    accounting = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 120,
            outcome=Outcome.SUCCEEDED,
            activity={"0": {T0: 0.05, T0 + 60: 0.04}},
            idle_threshold=0.05,
        )
    )

    # Then only the second minute is idle, and the first one, active, ends no startup
    assert (accounting.startup, accounting.idle, accounting.effective) == (0, 60, 60)


def test_queue_time_is_wall_seconds_from_submission_and_none_without_it():
    def queued(submitted_at):
        return account(
            AttemptTimeline(
                gpus=4, start=T0, end=T0 + 60, outcome=Outcome.SUCCEEDED, submitted_at=submitted_at
            )
        ).queue_s

    assert (queued(T0 - 90), queued(T0 + 5), queued(None)) == (90, 0, None)


# Properties ----------------------------------------------------------------------------


@st.composite
def timelines(draw, *, with_windows: bool = False):
    gpus = draw(st.integers(1, 8))
    start = T0 + draw(st.integers(0, 59))
    duration = draw(st.integers(0, 900))
    offset = st.integers(-30, duration + 30)

    def at(seconds: int) -> int:
        return start + seconds

    windows = []
    for _ in range(draw(st.integers(1 if with_windows else 0, 6))):
        begin, length = draw(offset), draw(st.integers(1, 300))
        windows.append(
            StepWindow(
                at(begin),
                at(begin + length),
                steps=draw(st.integers(0, 100)),
                step_time_s=1.0,
                data_wait_s=draw(st.floats(0, 400)),
                comm_wait_s=draw(st.floats(0, 400)),
                checkpoint_s=draw(st.floats(0, 100)),
            )
        )
    checkpoints = [
        (at(begin), at(begin + draw(st.integers(-5, 60))))
        for begin in draw(st.lists(offset, max_size=4))
    ]
    minutes = range((start - 60) // 60 * 60, start + duration + 60, 60)
    activity = {
        str(gpu): draw(
            st.dictionaries(st.sampled_from(minutes), st.floats(0, 1), max_size=len(minutes))
        )
        for gpu in range(gpus)
    }
    resumed = draw(st.none() | offset.map(lambda s: ResumedCheckpoint(step=1, saved_at=at(s))))
    return AttemptTimeline(
        gpus=gpus,
        start=start,
        end=start + duration,
        outcome=draw(st.sampled_from(list(Outcome))),
        resumed_checkpoint=resumed,
        step_windows=windows,
        checkpoint_intervals=checkpoints,
        activity=activity,
        submitted_at=start - draw(st.integers(0, 1000)),
    )


@settings(max_examples=300, deadline=None)
@given(timelines())
def test_every_gpu_second_is_in_exactly_one_category_as_the_definitions_say(timeline):
    accounting = account(timeline)

    assert accounting.allocated == timeline.gpus * (timeline.end - timeline.start)
    assert_invariant(accounting)
    assert accounting.categories() == reference(timeline)


def reference(timeline: AttemptTimeline) -> dict[str, Fraction]:
    """The categories by the documented definitions (docs/accounting.md), one wall second at
    a time: slow, and independent of ``account``'s sweep over cut points. Needs whole-second
    times (then every cut falls on a whole second, so each second is in one situation)."""

    def exact(value) -> Fraction:
        return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)

    start, end = int(timeline.start), max(int(timeline.end), int(timeline.start))
    seconds = range(start, end)
    blocked = {s for a, b in timeline.checkpoint_intervals for s in range(int(a), int(b))}

    # Each second belongs to the earliest-starting step window that covers it.
    owner: dict[int, int] = {}
    windows = timeline.step_windows
    for index in sorted(range(len(windows)), key=lambda i: windows[i].start):
        window = timeline.step_windows[index]
        for s in range(int(window.start), int(window.end)):
            if start <= s < end:
                owner.setdefault(s, index)
    shares = {}
    for index in set(owner.values()):
        window, own = timeline.step_windows[index], [s for s in owner if owner[s] == index]
        open_s = sum(1 for s in own if s not in blocked)
        extra = max(Fraction(0), exact(window.checkpoint_s) - (len(own) - open_s))
        checkpoint = min(Fraction(1), extra / open_s) if open_s else Fraction(0)
        step_s = open_s - extra
        data = comm = Fraction(0)
        if step_s > 0:
            data = min(Fraction(1), exact(window.data_wait_s) / step_s)
            comm = min(1 - data, exact(window.comm_wait_s) / step_s)
        shares[index] = (checkpoint, data, comm)

    idle_gpus: dict[int, int] = {}
    active = []
    for minutes in timeline.activity.values():
        for minute, activity in minutes.items():
            if not any(start <= s < end for s in range(minute, minute + 60)):
                continue
            if activity < timeline.idle_threshold:
                idle_gpus[minute] = min(timeline.gpus, idle_gpus.get(minute, 0) + 1)
            else:
                active.append(max(start, minute))
    # Startup runs to the first step window, else to the first active minute.
    productive = min(owner) if owner else min(active, default=start)
    lost_from = end
    if timeline.outcome in (Outcome.FAILED, Outcome.PREEMPTED, Outcome.LOST):
        lost_from = productive
        if timeline.resumed_checkpoint is not None:
            lost_from = min(end, max(productive, int(timeline.resumed_checkpoint.saved_at)))

    gpus, total = timeline.gpus, dict.fromkeys(CATEGORIES, Fraction(0))
    for s in seconds:
        idle = idle_gpus.get(s // 60 * 60, 0)
        if s >= lost_from:
            total["lost"] += gpus
        elif s < productive:
            total["startup"] += gpus
        elif s in blocked:
            total["checkpoint"] += gpus
        elif s in owner:
            checkpoint, data, comm = shares[owner[s]]
            total["checkpoint"] += gpus * checkpoint
            total["idle"] += idle * (1 - checkpoint)
            rest = (gpus - idle) * (1 - checkpoint)
            total["input_wait"] += rest * data
            total["comm_wait"] += rest * comm
            total["effective"] += rest * (1 - data - comm)
        else:
            total["idle"] += idle
            total["effective"] += gpus - idle
    return total


@settings(max_examples=200, deadline=None)
@given(timelines(with_windows=True), st.data())
def test_more_idle_minutes_never_decrease_idle(timeline, data):
    gpu = data.draw(st.sampled_from(sorted(timeline.activity)))
    minute = data.draw(st.integers(timeline.start // 60 - 1, timeline.end // 60 + 1)) * 60
    activity = {key: dict(minutes) for key, minutes in timeline.activity.items()}
    activity[gpu][minute] = 0.0
    idler = AttemptTimeline(**{**_fields(timeline), "activity": activity})

    assert account(idler).idle >= account(timeline).idle


def _fields(timeline: AttemptTimeline) -> dict:
    return {name: getattr(timeline, name) for name in AttemptTimeline.__dataclass_fields__}


# KPIs ----------------------------------------------------------------------------------


def test_goodput_over_attempts_is_effective_over_allocated():
    healthy = account(AttemptTimeline(gpus=1, start=T0, end=T0 + 100, outcome=Outcome.SUCCEEDED))
    crashed = account(
        AttemptTimeline(
            gpus=1,
            start=T0,
            end=T0 + 100,
            outcome=Outcome.FAILED,
            step_windows=[StepWindow(T0 + 20, T0 + 100, 80, 1.0)],
        )
    )

    assert goodput([healthy, crashed]) == Fraction(100, 200)
    assert goodput([]) is None


def test_checkpoint_recovery_success_counts_resumes_that_progressed_or_succeeded():
    resumed = [
        ResumedAttempt(restored_step=600, last_step=900),
        ResumedAttempt(restored_step=600, last_step=600),  # restored, then failed at once
        ResumedAttempt(restored_step=0, last_step=10),
        # Succeeded with nothing left to do after the restored step: recovered.
        ResumedAttempt(restored_step=600, last_step=600, succeeded=True),
    ]

    assert checkpoint_recovery_success(resumed) == Fraction(3, 4)
    assert checkpoint_recovery_success([]) is None


def test_a_workspace_idle_streak_is_interactive_idle_whatever_the_gpu_activity():
    # 2 GPUs for 40 minutes; nobody used the workspace from minute 10 to 30. Its GPUs were
    # idle from minute 5 to 35 (the minutes DCGM saw), busy otherwise.
    activity = {
        gpu: {minute * 60: (0.0 if 5 <= minute < 35 else 0.9) for minute in range(40)}
        for gpu in ("n/0", "n/1")
    }
    timeline = AttemptTimeline(
        gpus=2,
        start=0,
        end=2400,
        outcome=Outcome.CANCELLED,
        activity=activity,
        interactive_idle_intervals=[(600, 1200), (1100, 1800), (2500, 2600)],
    )
    accounting = account(timeline)
    assert accounting.categories() == {
        "lost": 0,
        "startup": 0,
        "checkpoint": 0,
        "interactive_idle": 2 * 1200,
        "idle": 2 * 600,
        "input_wait": 0,
        "comm_wait": 0,
        "effective": 2 * 600,
    }
    assert_invariant(accounting)


def test_every_one_of_several_idle_streaks_counts():
    timeline = AttemptTimeline(
        gpus=1,
        start=0,
        end=100,
        outcome=Outcome.SUCCEEDED,
        interactive_idle_intervals=[(10, 20), (30, 40), (50, 60)],
    )
    accounting = account(timeline)
    assert (accounting.interactive_idle, accounting.effective) == (30, 70)
    assert_invariant(accounting)
