"""scripts/mutation.py's accounting of a run (docs/mutation-testing.md): what counts as
killed, and a function that gained code without tests named in the report. Pure: the
statuses are given, mutmut does not run."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mutation.py"
spec = importlib.util.spec_from_file_location("mutation_script", SCRIPT)
assert spec is not None and spec.loader is not None
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)

NAMES = [
    "finance.costing.x__split_parts__mutmut_1",  # killed
    "finance.costing.x__split_parts__mutmut_2",  # timed out
    "finance.costing.x__split_parts__mutmut_3",  # survived, explained
    "finance.costing.x__split_parts__mutmut_4",  # survived, not explained
    "finance.costing.xǁRateǁcovers__mutmut_1",  # no test reaches it
    "finance.costing.x_new_rule__mutmut_1",  # new code, no test
    "finance.costing.x_new_rule__mutmut_2",  # new code, no test
    "finance.costing.x_cents__mutmut_1",  # never run
]
STATUS = {
    NAMES[0]: "killed",
    NAMES[1]: "timeout",
    NAMES[2]: "survived",
    NAMES[3]: "survived",
    NAMES[4]: "no tests",
    NAMES[5]: "no tests",
    NAMES[6]: "survived",
}
EXPLAINED = {NAMES[2]: "a reason"}


def test_each_mutant_is_counted_by_its_state_and_survivors_are_grouped_by_function():
    counts, unexplained = mutation.tally(NAMES, STATUS, EXPLAINED)

    assert counts == Counter(
        {"killed": 1, "timeout": 1, "equivalent": 1, "survived": 2, "no tests": 2,
         "not checked": 1}
    )  # fmt: skip
    assert unexplained == {
        "_split_parts": ["finance.costing.x__split_parts__mutmut_4 (survived)"],
        "Rate.covers": ["finance.costing.xǁRateǁcovers__mutmut_1 (no tests)"],
        "new_rule": [
            "finance.costing.x_new_rule__mutmut_1 (no tests)",
            "finance.costing.x_new_rule__mutmut_2 (survived)",
        ],
    }
    # Only what a test kills counts: killed and timed out, 2 of 8.
    assert mutation.score(counts) == 25.0


def test_the_report_names_the_functions_without_tests_and_fails_below_the_threshold(
    monkeypatch, capsys
):
    monkeypatch.setattr(mutation, "statuses", lambda path: STATUS)
    monkeypatch.setattr(mutation, "equivalents", lambda: EXPLAINED)

    assert mutation.report({"finance/costing.py": NAMES}, threshold=95.0) is False

    out, err = capsys.readouterr()
    assert out.splitlines()[1].split() == [
        "finance/costing.py", "8", "1", "1", "1", "2", "2", "1", "25.0%",
    ]  # fmt: skip
    assert "  new_rule: 2\n" in out
    assert "  _split_parts: 1\n" in out
    assert "  Rate.covers: 1\n" in out
    assert err == "\nmutation: a module scores below 95 %\n"
    assert mutation.report({"finance/costing.py": NAMES[:2]}, threshold=95.0) is True


@pytest.mark.parametrize(
    ("size", "expected"),
    [(None, 20), (0, 1057), (100, 100), (2000, 1057)],
)
def test_admission_is_sampled_by_default_and_the_sample_is_the_same_every_run(size, expected):
    names = [f"jobs.admission.x_decide__mutmut_{i}" for i in range(1, 1058)]

    picked = mutation.sample(names, "jobs/admission.py", size)

    assert len(picked) == expected
    assert picked == mutation.sample(names, "jobs/admission.py", size)
    assert picked == [name for name in names if name in set(picked)]  # mutmut's order
    assert mutation.sample(names[:10], "finance/costing.py", None) == names[:10]


def test_the_report_reads_the_checked_in_reasons():
    explained = mutation.equivalents()

    assert "jobs.estimates.x_simulate__mutmut_3" in explained
    assert all(len(reason.split()) >= 5 for reason in explained.values())
