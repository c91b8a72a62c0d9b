"""The table of the Launch-to-usable benchmark (bench/workspace_start.py) from hand-made
launches, whose medians, worst times and ratios can be worked out by hand."""

from bench.workspace_start import STEPS, launch_section


def launch(usable: float) -> dict[str, float]:
    # Each step a second after the one before, usable at ``usable``.
    return {step: usable - (len(STEPS) - 1 - i) for i, step in enumerate(STEPS)}


def test_each_step_has_its_median_and_worst_on_each_cluster_beside_the_baseline():
    section = launch_section(
        [launch(6.0), launch(8.0), launch(7.0)], [launch(20.0)], bare=[4.0, 3.0, 5.0]
    )
    assert section.rows == [
        ["launched", "2.00 s", "3.00 s", "15.00 s", "15.00 s"],
        ["admitted", "3.00 s", "4.00 s", "16.00 s", "16.00 s"],
        ["submitted", "4.00 s", "5.00 s", "17.00 s", "17.00 s"],
        ["running", "5.00 s", "6.00 s", "18.00 s", "18.00 s"],
        ["ready", "6.00 s", "7.00 s", "19.00 s", "19.00 s"],
        ["usable", "7.00 s", "8.00 s", "20.00 s", "20.00 s"],
        ["bare `jupyter lab` (baseline)", "4.00 s", "5.00 s", "4.00 s", "5.00 s"],
    ]
    assert section.notes == [
        "Launch to usable on simulator: 7.00 s, 1.75× a bare start of JupyterLab "
        "(goal ≤ 15 s: met).",
        "Launch to usable on Slurm: 20.00 s, 5.00× a bare start of JupyterLab "
        "(goal ≤ 15 s: missed).",
    ]
    assert section.intro.startswith(
        "3 workspaces launched one after the other on an idle simulator, then 1 on the idle "
        "Slurm test cluster"
    )
