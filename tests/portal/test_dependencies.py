"""`make run` installs only what running Gantry needs (issue 31.7): every runtime dependency
in pyproject.toml is used by the shipped code, and the shipped code uses nothing that only
the dev extras install. The Makefile installs the runtime set for `make run` and adds the dev
extras for lint, test and bench."""

import ast
import re
import subprocess
import tomllib
from importlib.metadata import packages_distributions

from tests import REPOSITORY

PYPROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
SHIPPED = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
# Loaded by another package from a setting, never imported by name in Gantry's code.
LOADED_BY_OTHERS = {
    "psycopg": "Django's PostgreSQL backend (DATABASE_URL postgres://)",
    # The simulator's workspaces run the job-side launcher (sdk/gantry_sdk/workspace.py),
    # which starts `python -m jupyterlab`: what make run's demo opens.
    "jupyterlab": "the workspace launcher on the simulator (python -m jupyterlab)",
    "jupyter-server": "JupyterLab's server, run by the workspace launcher",
}


def distribution(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def shipped_sources() -> dict[str, str]:
    roots = {pattern.rstrip("*") for pattern in SHIPPED}
    return {
        str(path.relative_to(REPOSITORY)): path.read_text()
        for root in roots
        for path in (REPOSITORY / root).rglob("*.py")
        if "migrations" not in path.parts
    }


def top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def modules_of() -> dict[str, set[str]]:
    """Distribution name -> its top-level modules, for what is installed."""
    modules: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            modules.setdefault(distribution(dist), set()).add(module)
    return modules


def test_every_runtime_dependency_is_used_by_the_shipped_code():
    sources = shipped_sources()
    text = "\n".join(sources.values())
    imported = set().union(*(top_level_imports(source) for source in sources.values()))
    modules = modules_of()
    unused = []
    for requirement in PYPROJECT["project"]["dependencies"]:
        name = distribution(requirement)
        own = modules[name]
        # Imported, or named where the code hands it to Django, Celery or a subprocess
        # (INSTALLED_APPS, a middleware path, `python -m gunicorn`).
        used = own & imported or any(re.search(rf"\b{module}\b", text) for module in own)
        if not used and name not in LOADED_BY_OTHERS:
            unused.append(name)
    assert unused == []


def test_the_shipped_code_imports_nothing_only_the_dev_extras_install():
    runtime = {distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    dev_only = {
        distribution(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]
    } - runtime
    modules = modules_of()
    dev_modules = set().union(*(modules.get(name, set()) for name in dev_only))
    offending = {
        path: sorted(top_level_imports(source) & dev_modules)
        for path, source in shipped_sources().items()
        if top_level_imports(source) & dev_modules
    }
    assert offending == {}


def test_make_run_installs_the_runtime_set_and_lint_test_bench_add_the_dev_extras():
    makefile = (REPOSITORY / "Makefile").read_text()
    assert re.search(r"^run: venv$", makefile, flags=re.MULTILINE)
    assert re.search(r"^venv: \$\(RUN_STAMP\)$", makefile, flags=re.MULTILINE)
    assert "pip install --quiet --progress-bar off --no-compile -e .\n" in makefile
    for target in ("lint", "test", "bench"):
        assert re.search(rf"^{target}: dev-venv\b", makefile, flags=re.MULTILINE), target
    # A venv made by `make run` is upgraded by the first lint, test or bench.
    dev_rule = makefile[makefile.index("$(DEV_STAMP): pyproject.toml") :]
    assert "-e '.[dev]'" in dev_rule.split("\n\n")[0]


def test_make_run_starts_from_a_recent_uncompiled_pip_and_writes_bytecode_once():
    """What `make run` runs on a fresh clone (README.md, *How long make run takes*): a venv
    without ensurepip's compiled pip and setuptools, a recent pip from the bootstrap Python's
    (ensurepip and an upgrade where that has none, or none with --python), the runtime set
    uncompiled, and the processes with PYTHONDONTWRITEBYTECODE unset, so each module is
    compiled once, by the first process that imports it."""
    dry_run = subprocess.run(
        ["make", "-n", "-B", "run", "BOOTSTRAP_PYTHON=python3.11"],
        cwd=REPOSITORY, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    upgrade = "install --quiet --progress-bar off --no-compile --upgrade 'pip>=25'"
    assert dry_run.splitlines()[1:] == [
        ".venv/bin/python -c '' 2>/dev/null || {"
        " python3.11 -m venv --clear --without-pip .venv && {"
        f" python3.11 -m pip --python .venv/bin/python {upgrade} 2>/dev/null || {{"
        " .venv/bin/python -m ensurepip --default-pip >/dev/null &&"
        f" .venv/bin/python -m pip {upgrade};"
        " }; }; }",
        ".venv/bin/python -m pip install --quiet --progress-bar off --no-compile -e .",
        "touch .venv/.installed-run",
        "env -u PYTHONDONTWRITEBYTECODE GANTRY_EMBEDDED=1 .venv/bin/python -m portal.embedded",
    ]
