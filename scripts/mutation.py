"""`make mutation`: mutmut over the pure cores, the score per module, and the survivors.

Runs mutmut (configured in pyproject.toml, [tool.mutmut]) on the modules it names in
``only_mutate`` with only the tests that need no database, then prints per module the
mutants, how many a test killed, the timeouts, the survivors explained in
tests/mutation/equivalent.toml and those not explained (by function), and the score:
killed (timeouts included, see docs/mutation-testing.md) ÷ mutants. Exits 1 when a module
scores below the threshold. ``--report`` only prints the table of the last run (mutants/).
A module named in pyproject's [tool.gantry.mutation.sample] runs that fixed sample of its
mutants unless ``--sample`` says otherwise (``--sample 0``: all).

    python scripts/mutation.py [--modules telemetry/accounting.py ...] [--sample N]
        [--threshold 95] [--max-children N] [--all-examples] [--report]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_FILE = ROOT / "tests" / "mutation" / "equivalent.toml"
KILLED, TIMEOUT, SURVIVED, NO_TESTS = "killed", "timeout", "survived", "no tests"
EQUIVALENT, NOT_CHECKED = "equivalent", "not checked"


def configured_modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["mutmut"]["only_mutate"])


def default_samples() -> dict[str, int]:
    """module -> how many of its mutants a run without --sample takes (pyproject.toml,
    [tool.gantry.mutation.sample]); a module not named runs whole."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(config["tool"].get("gantry", {}).get("mutation", {}).get("sample", {}))


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def mutant_names(path: str) -> list[str]:
    """Every mutant mutmut generates for ``path``, by its full name, in mutmut's order."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    mutated = mutate_file_contents(path, (ROOT / path).read_text())
    return [f"{module_name(path)}.{name}" for name in mutated.mutant_names]


def function_of(mutant: str) -> str:
    """``telemetry.accounting.xǁAccountingǁwhole_seconds__mutmut_3`` → Accounting.whole_seconds."""
    name = mutant.rpartition(".")[2].rpartition("__mutmut_")[0]
    return name.removeprefix("x_").removeprefix("xǁ").replace("ǁ", ".")


def equivalents() -> dict[str, str]:
    entries = tomllib.loads(EQUIVALENT_FILE.read_text()).get("mutant", [])
    return {entry["name"]: entry["reason"] for entry in entries}


def statuses(path: str) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    meta = ROOT / "mutants" / f"{path}.meta"
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in codes.items()}


def tally(
    names: list[str], status: dict[str, str], explained: dict[str, str]
) -> tuple[Counter[str], dict[str, list[str]]]:
    """Each mutant's state counted (a survivor explained in equivalent.toml is equivalent, one
    with no result not checked), and the survivors and the mutants no test reaches that no
    reason explains, by the function they change: where a module gained code without tests."""
    counts: Counter[str] = Counter()
    unexplained: dict[str, list[str]] = defaultdict(list)
    for name in names:
        state = status.get(name, NOT_CHECKED)
        if state == SURVIVED and name in explained:
            state = EQUIVALENT
        counts[state] += 1
        if state in (SURVIVED, NO_TESTS):
            unexplained[function_of(name)].append(f"{name} ({state})")
    return counts, dict(unexplained)


def score(counts: Counter[str]) -> float:
    """Killed (timeouts included) ÷ mutants, in %: an equivalent mutant is not killed."""
    total = sum(counts.values())
    return 100 * (counts[KILLED] + counts[TIMEOUT]) / total if total else 100.0


def report(chosen: dict[str, list[str]], threshold: float) -> bool:
    explained = equivalents()
    passed = True
    print(
        f"{'module':<26} {'mutants':>7} {'killed':>7} {'timeout':>7} {'equiv.':>7} "
        f"{'survived':>8} {'no test':>7} {'other':>5} {'score':>7}"
    )
    details = []
    for path, names in chosen.items():
        counts, unexplained = tally(names, statuses(path), explained)
        module_score = score(counts)
        other = len(names) - sum(
            counts[s] for s in (KILLED, TIMEOUT, EQUIVALENT, SURVIVED, NO_TESTS)
        )
        print(
            f"{path:<26} {len(names):>7} {counts[KILLED]:>7} {counts[TIMEOUT]:>7} "
            f"{counts[EQUIVALENT]:>7} {counts[SURVIVED]:>8} {counts[NO_TESTS]:>7} "
            f"{other:>5} {module_score:>6.1f}%"
        )
        passed &= module_score >= threshold
        if unexplained:
            details.append((path, unexplained))
    for path, unexplained in details:
        print(f"\n{path}: survivors no test kills and no reason explains, by function")
        for function, mutants in sorted(unexplained.items()):
            print(f"  {function}: {len(mutants)}")
            for mutant in mutants:
                print(f"    {mutant}")
    if not passed:
        print(f"\nmutation: a module scores below {threshold:g} %", file=sys.stderr)
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", default=configured_modules())
    parser.add_argument(
        "--sample",
        type=int,
        default=None,
        help="at most N mutants per module (0: all; default: pyproject's "
        "[tool.gantry.mutation.sample] for the modules it names, all for the others)",
    )
    parser.add_argument(
        "--all-examples",
        action="store_true",
        help="the property tests' whole example budget (default: a fifth, tests/conftest.py)",
    )
    parser.add_argument("--threshold", type=float, default=95.0)
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report", action="store_true", help="only report the last run")
    parser.add_argument(
        "--skeleton", action="store_true", help="print equivalent.toml entries for survivors"
    )
    args = parser.parse_args()
    unknown = set(args.modules) - set(configured_modules())
    if unknown:
        parser.error(f"not in [tool.mutmut] only_mutate: {', '.join(sorted(unknown))}")

    os.chdir(ROOT)
    chosen = {}
    for path in args.modules:
        chosen[path] = sample(mutant_names(path), path, args.sample)

    if not args.report:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # no result of older code
        started = time.monotonic()
        command = ["mutmut", "run", "--max-children", str(args.max_children)]
        # CI=true: the hypothesis tests draw the same examples for every mutant;
        # GANTRY_MUTATION=1: a fifth of them (tests/conftest.py).
        env = {**os.environ, "CI": "true"}
        if not args.all_examples:
            env["GANTRY_MUTATION"] = "1"
        run = subprocess.run(  # noqa: S603 (this Python, mutmut, the generated names; no shell)
            [sys.executable, "-m", *command, *(n for names in chosen.values() for n in names)],
            env=env,
            check=False,
        )
        print(f"\nmutmut: exit {run.returncode} after {time.monotonic() - started:.0f} s\n")
        if run.returncode:
            return run.returncode
    if args.skeleton:
        skeleton(chosen)
    return 0 if report(chosen, args.threshold) else 1


def sample(names: list[str], path: str, size: int | None) -> list[str]:
    """At most ``size`` of ``names`` (None: the module's default, 0: all), the same on every
    run (seeded by the module's path), in mutmut's order."""
    size = default_samples().get(path, 0) if size is None else size
    if not size or len(names) <= size:
        return names
    picked = set(random.Random(path).sample(names, size))
    return [name for name in names if name in picked]


def skeleton(chosen: dict[str, list[str]]) -> None:
    """Entries for tests/mutation/equivalent.toml, one per unexplained survivor: the
    reason is for a person to write, after reading the change."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.mutation.file_mutation import mutate_file_contents

    explained = equivalents()
    for path, names in chosen.items():
        status = statuses(path)
        code = mutate_file_contents(path, (ROOT / path).read_text()).code
        for name in names:
            if status.get(name) != SURVIVED or name in explained:
                continue
            diff = get_diff_for_mutant(name, source=code, path=path)
            change = [
                line.strip()
                for line in diff.splitlines()
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            ]
            print(f"\n[[mutant]]\nname = {json.dumps(name, ensure_ascii=False)}")
            print(f'change = {json.dumps(change, ensure_ascii=False)}\nreason = ""')


if __name__ == "__main__":
    sys.exit(main())
