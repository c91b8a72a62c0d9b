"""The workspace idle benchmark's simulation (bench/workspace_idle.py) on one hand-made
person, whose minutes each policy can be counted by hand."""

from bench.workspace_idle import MINUTES, Person, Tally, simulate


def monday_person() -> Person:
    # Launches a 2-GPU workspace on Monday at 9:00, runs cells until 9:30, starts a silent
    # GPU computation from 10:00 to 12:00 and never comes back nor stops it.
    who = Person(gpus=2, launches=[9 * 60])
    for minute in range(9 * 60, 9 * 60 + 30, 3):
        who.acts[minute] = True
    for minute in range(9 * 60, 12 * 60):
        who.present[minute] = True
    who.computations.append((10 * 60, 12 * 60))
    for minute in range(10 * 60, 12 * 60):
        who.gpu_busy[minute] = True
    return who


def test_each_policy_holds_what_it_should():
    # In use: 9:00-9:42 (the last cell at 9:27, plus 15 minutes), then 10:00-12:00.
    in_use = 2 * (43 + 120)
    assert simulate(monday_person(), "no limit") == Tally(2 * (MINUTES - 9 * 60), in_use)
    # Ended at 17:00: the computation had finished, nothing is lost.
    assert simulate(monday_person(), "8-hour limit") == Tally(2 * 8 * 60, in_use)
    # The GPUs stop at 12:00: warned at 12:50, suspended at 13:00.
    assert simulate(monday_person(), "Gantry") == Tally(2 * (4 * 60 - 1), in_use)


def test_the_fixed_limit_ends_a_long_computation_and_gantry_does_not():
    who = monday_person()
    for minute in range(12 * 60, 20 * 60):
        who.gpu_busy[minute] = True
    who.computations[0] = (10 * 60, 20 * 60)
    killed = simulate(who, "8-hour limit")
    assert (killed.killed, killed.killed_gpu_min) == (1, 2 * 7 * 60)
    who = monday_person()
    for minute in range(12 * 60, 20 * 60):
        who.gpu_busy[minute] = True
    kept = simulate(who, "Gantry")
    assert (kept.killed, kept.held_gpu_min) == (0, 2 * (12 * 60 - 1))
