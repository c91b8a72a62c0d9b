"""mypy checks every pure module strictly: a module that imports no Django, neither itself
nor through a module of the project that does, is in the strict list of pyproject.toml's
[tool.mypy] overrides. A new pure module left out of it fails here, by name.

"Imports" are the statements of the module (at any depth, as import-linter reads them); a
module that imports by name at run time (``importlib.import_module``) may load anything,
so it is not counted pure. A module that holds only a docstring and imports has nothing to
type and is not asked for."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())
DJANGO = frozenset({"django", "rest_framework", "celery"})


def project_modules(packages: list[str]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], bool]:
    """The modules ``name`` imports (absolute names), and whether it imports by name."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            called = getattr(node.func, "id", getattr(node.func, "attr", None))
            dynamic = dynamic or called in ("import_module", "__import__")
    return {module for module in found if module.split(".")[0] in DJANGO or module in known}, (
        dynamic
    )


def has_code(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return any(
        not isinstance(node, ast.Import | ast.ImportFrom)
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        for node in body
    )


def pure_modules(packages: list[str]) -> list[str]:
    known = project_modules(packages)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    impure: dict[str, bool] = {}

    def uses_django(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name not in impure:
            modules, dynamic = graph[name]
            impure[name] = dynamic or any(
                module.split(".")[0] in DJANGO
                or (module not in seen and uses_django(module, seen | {name}))
                for module in modules
            )
        return impure[name]

    return sorted(name for name in known if has_code(known[name]) and not uses_django(name))


def strict_modules() -> set[str]:
    return {
        module
        for override in CONFIG["tool"]["mypy"]["overrides"]
        if override.get("disallow_untyped_defs")
        for module in override["module"]
    }


def test_every_pure_module_is_type_checked_strictly():
    missing = [
        name
        for name in pure_modules(CONFIG["tool"]["mypy"]["packages"])
        if name not in strict_modules()
    ]

    assert missing == []


def test_the_pure_modules_found_include_the_cores_and_leave_out_what_imports_django():
    pure = pure_modules(CONFIG["tool"]["mypy"]["packages"])

    for core in ("jobs.admission", "jobs.estimates", "telemetry.accounting", "finance.costing"):
        assert core in pure
    # Django itself, Django through a project module, and a module loaded by name
    for impure in ("jobs.models", "jobs.services.submission", "clusters.backends"):
        assert impure not in pure


def test_the_finder_follows_imports_through_the_project(tmp_path, monkeypatch):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text('"""An app."""\n')
    (tmp_path / "app" / "models.py").write_text("from django.db import models\nX = 1\n")
    (tmp_path / "app" / "helper.py").write_text("from app import models\nY = 2\n")
    (tmp_path / "app" / "relative.py").write_text("from .helper import Y\nZ = Y\n")
    (tmp_path / "app" / "plain.py").write_text("import json\nW = json.dumps(1)\n")
    (tmp_path / "app" / "loader.py").write_text(
        "from importlib import import_module\nV = import_module('app.models')\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)

    assert pure_modules(["app"]) == ["app.plain"]
