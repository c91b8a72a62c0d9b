"""The survivors explained in equivalent.toml (docs/mutation-testing.md) are still mutants
mutmut generates, each with the change its reason was written for: when the code under a
listed mutant changes, its name points elsewhere or nowhere and this fails, so the list
cannot rot. Pure: mutmut's generator only, no test run."""

import functools
import tomllib
from pathlib import Path

import pytest
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.mutation.file_mutation import MutatedFile, mutate_file_contents

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = tomllib.loads(Path(__file__).with_name("equivalent.toml").read_text())["mutant"]


def source_path(mutant: str) -> str:
    """``finance.costing.x__round__mutmut_3`` → ``finance/costing.py``."""
    module = mutant.rpartition(".x")[0]
    return module.replace(".", "/") + ".py"


@functools.cache
def generated(path: str) -> MutatedFile:
    return mutate_file_contents(path, (ROOT / path).read_text())


def changed_lines(diff: str) -> list[str]:
    return [
        line.strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry["name"])
def test_each_explained_survivor_is_still_generated_with_the_change_explained(entry):
    path = source_path(entry["name"])
    mutated = generated(path)

    assert entry["name"].removeprefix(path[:-3].replace("/", ".") + ".") in mutated.mutant_names
    diff = get_diff_for_mutant(entry["name"], source=mutated.code, path=path)
    assert changed_lines(diff) == entry["change"]
    assert len(entry["reason"].split()) >= 5, "say why the change alters no behaviour"


def test_each_survivor_is_explained_once():
    names = [entry["name"] for entry in ENTRIES]

    assert len(names) == len(set(names))
