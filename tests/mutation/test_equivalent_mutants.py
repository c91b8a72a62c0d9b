"""The survivors explained in equivalent.toml (docs/mutation-testing.md) are still mutants
mutmut generates, each with the change its reason was written for: when the code under a
listed mutant changes, its name points elsewhere or nowhere and this fails, so the list
cannot rot. Pure: mutmut's generator only, no test run."""

import functools
import tomllib
from difflib import unified_diff
from pathlib import Path

import libcst as cst
import pytest
from mutmut.mutation.diff_apply import read_mutant_function, read_original_function
from mutmut.mutation.file_mutation import MutatedFile, mutate_file_contents

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = tomllib.loads(Path(__file__).with_name("equivalent.toml").read_text())["mutant"]
# One worker under pytest-xdist: each module's mutants are generated once per process (about
# 30 s for the largest), so spreading the entries over three workers generated them three times.
pytestmark = pytest.mark.xdist_group("mutmut-generation")


def source_path(mutant: str) -> str:
    """``finance.costing.x__round__mutmut_3`` → ``finance/costing.py``."""
    module = mutant.rpartition(".x")[0]
    return module.replace(".", "/") + ".py"


@functools.cache
def generated(path: str) -> MutatedFile:
    return mutate_file_contents(path, (ROOT / path).read_text())


@functools.cache
def parsed(path: str) -> cst.Module:
    """The mutated module, parsed once per test process (mutmut's ``get_diff_for_mutant``
    parses the whole generated file, thousands of functions, for every mutant)."""
    return cst.parse_module(generated(path).code)


def diff_for_mutant(name: str, path: str) -> str:
    """What ``mutmut.mutation.diff_apply.get_diff_for_mutant`` gives for ``source=``: the
    unified diff of the function and its mutant."""
    module = parsed(path)
    original, mutant = (
        cst.Module([function]).code.strip()
        for function in (read_original_function(module, name), read_mutant_function(module, name))
    )
    lines = unified_diff(
        original.split("\n"), mutant.split("\n"), fromfile=path, tofile=path, lineterm=""
    )
    return "\n".join(lines)


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
    diff = diff_for_mutant(entry["name"], path)
    assert changed_lines(diff) == entry["change"]
    assert len(entry["reason"].split()) >= 5, "say why the change alters no behaviour"


def test_each_survivor_is_explained_once():
    names = [entry["name"] for entry in ENTRIES]

    assert len(names) == len(set(names))
