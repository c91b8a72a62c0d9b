"""Services write, selectors read (docs/architecture.md), kept by reading the source.

A module under any app's ``selectors`` (a ``selectors.py`` or a ``selectors/`` package)
must not write: no ORM write (``.save()``, ``.create()``, ``.update()``, ``.delete()`` with
keyword arguments only, as the ORM takes them; ``bulk_create``, ``bulk_update``,
``get_or_create``, ``update_or_create`` always), no INSERT, UPDATE or DELETE in SQL, no
import of a service, of ``core.bulk`` or of ``jobs.enqueue``. A module under ``services``
must write somewhere, and each of its public functions that reads the database (through the
ORM, a cursor or a selector) writes too, itself or through a function of its module: a read
belongs in the selectors. The import-linter layers
keep selectors from importing their own app's services; this also covers other apps'
services and writes made directly.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("core", "tenants", "images", "clusters", "jobs", "telemetry", "finance", "policy", "portal")

# Called with keyword arguments only (or none) these are the ORM's writes; with a positional
# argument they are a dict's or a set's (``counts.update(other)``), which a read may use.
ORM_WRITES_KEYWORDS_ONLY = frozenset({"save", "create", "update", "delete"})
ORM_WRITES = frozenset({"bulk_create", "bulk_update", "get_or_create", "update_or_create"})
WRITE_SQL = re.compile(r"\b(insert\s+into|delete\s+from|update\s+[\w\".]+\s+set)\b", re.I)
# Modules whose every call changes state: the services, many rows at once, background work.
WRITING_MODULES = re.compile(r"(^|\.)services(\.|$)|^core\.bulk$|^jobs\.enqueue$")

# A selector that really must write, with the reason. None today.
SELECTOR_WRITES_ALLOWED: dict[str, str] = {}
# A service function that reads and does not write, with the reason.
SERVICE_READS_ALLOWED = {
    "jobs/services/workspace_address.py:workspace_start_overdue": (
        "cancels on its cluster the job of a workspace whose server never answered, before "
        "the sync records the attempt's end from the status it returns"
    ),
    "images/services/registries.py:tag_resolve": (
        "asks the repository's registry over the network which digest a tag names, for the "
        "submit service inside its transaction"
    ),
    "jobs/services/admission_cycle.py:admission_lock": (
        "takes the admitters' advisory lock for the writes that follow in its transaction"
    ),
    "jobs/services/submission.py:submission_once": (
        "writes through the service it is given (``create``), once per submission key"
    ),
    "clusters/services/health_events.py:stored_events": (
        "reads the rows a batch of signals adds to, for the writes that follow under the "
        "cluster's node-health lock"
    ),
}
SELECTOR_MODULES = re.compile(r"(^|\.)selectors(\.|$)")


def _layer_modules(layer: str) -> list[str]:
    """The source files of ``layer`` in every app, as paths relative to the repository."""
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            parts = path.relative_to(ROOT).parts
            if "migrations" in parts:
                continue
            if f"{layer}.py" == parts[-1] or layer in parts[:-1]:
                found.append(path.relative_to(ROOT).as_posix())
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose, not SQL)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _writing_imports(tree: ast.AST) -> tuple[set[str], list[str]]:
    """Names bound to a writing module or to a function of one, and the imports themselves."""
    names: set[str] = set()
    imports: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if WRITING_MODULES.search(alias.name):
                    names.add(alias.asname or alias.name.split(".")[0])
                    imports.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if WRITING_MODULES.search(node.module) or WRITING_MODULES.search(full):
                    names.add(alias.asname or alias.name)
                    imports.append(f"from {node.module} import {alias.name}")
    return names, imports


def writes_in(source: str) -> list[str]:
    """Every write ``source`` makes, one line each (``line: what``); empty if it only reads.
    A call to a name imported from a service, ``core.bulk`` or ``jobs.enqueue`` is a write;
    importing only a constant or a dataclass from one is not."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    writing_names, _ = _writing_imports(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                if func.attr in ORM_WRITES or (
                    func.attr in ORM_WRITES_KEYWORDS_ONLY and not node.args
                ):
                    found.append(f"{node.lineno}: .{func.attr}()")
                elif isinstance(func.value, ast.Name) and func.value.id in writing_names:
                    found.append(f"{node.lineno}: {func.value.id}.{func.attr}()")
            elif isinstance(func, ast.Name) and func.id in writing_names:
                found.append(f"{node.lineno}: {func.id}()")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and WRITE_SQL.search(node.value)
        ):
            found.append(f"{node.lineno}: SQL {WRITE_SQL.search(node.value).group(0)!r}")
    return sorted(set(found), key=lambda line: int(line.split(":")[0]))


def reads_only(source: str) -> list[str]:
    """The public functions of ``source`` that read the database (the ORM's ``objects``, a
    cursor, a function imported from a selectors module) and write neither themselves nor
    through another function of the module."""
    tree = ast.parse(source)
    imports = "\n".join(
        ast.get_source_segment(source, node) or ""
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
    )
    selector_names = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and SELECTOR_MODULES.search(node.module)
        for alias in node.names
    }
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    writing, calls, reading = set(), {}, set()
    for name, function in functions.items():
        if writes_in(imports + "\n" + (ast.get_source_segment(source, function) or "")):
            writing.add(name)
        nodes = list(ast.walk(function))
        calls[name] = {
            node.func.id
            for node in nodes
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in functions
        }
        if any(
            (isinstance(node, ast.Attribute) and node.attr in ("objects", "cursor"))
            or (isinstance(node, ast.Name) and node.id in selector_names)
            for node in nodes
        ):
            reading.add(name)
    grown = True
    while grown:
        through = {name for name in functions if calls[name] & writing} - writing
        writing |= through
        grown = bool(through)
    return [name for name in functions if name in reading - writing and not name.startswith("_")]


def _source(path: str) -> str:
    return (ROOT / path).read_text()


SELECTORS = _layer_modules("selectors")
SERVICES = _layer_modules("services")


def test_every_selector_and_service_module_is_scanned():
    """The scan finds the layers where they are: a module per app, the packages' modules."""
    assert {
        "tenants/selectors.py",
        "images/selectors.py",
        "clusters/selectors.py",
        "finance/selectors/statements.py",
        "telemetry/selectors/run_page.py",
        "telemetry/kpis/selectors.py",
        "jobs/selectors/capacity.py",
        "jobs/selectors/runs.py",
    } <= set(SELECTORS)
    assert {
        "tenants/services/memberships.py",
        "images/services/catalog.py",
        "clusters/services/inventory.py",
        "clusters/services/health.py",
        "finance/services.py",
        "telemetry/services.py",
        "jobs/services/capacity.py",
        "jobs/services/lifecycle.py",
    } <= set(SERVICES)
    assert not set(SELECTORS) & set(SERVICES)


@pytest.mark.parametrize("path", SELECTORS)
def test_selectors_only_read(path):
    if path in SELECTOR_WRITES_ALLOWED:  # an allowance whose selector no longer writes goes
        assert writes_in(_source(path)) != []
        return
    assert writes_in(_source(path)) == []
    assert _writing_imports(ast.parse(_source(path)))[1] == []


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in SERVICES
        if any(isinstance(n, ast.FunctionDef) for n in ast.parse(_source(p)).body)
    ],
)
def test_services_write(path):
    """A services module with functions writes in at least one of them: one that only reads
    belongs in the selectors."""
    assert writes_in(_source(path)) != [], f"{path} only reads: move it to the selectors"
    allowed = {key.split(":")[1] for key in SERVICE_READS_ALLOWED if key.startswith(f"{path}:")}
    assert set(reads_only(_source(path))) == allowed  # an allowance no longer needed goes too


def test_the_scan_tells_writes_from_reads():
    """The scan itself, on code whose writes are known."""
    source = '''
"""UPDATE jobs_run SET nothing: a docstring is prose."""
from jobs.services.lifecycle import run_transition
from tenants.services.quotas import MAX_STORED_INT
from core import bulk

def reads(counts, other, cache_key):
    counts.update(other)
    seen = set()
    seen.update(other)
    rows = Run.objects.filter(pk__lte=MAX_STORED_INT).select_for_update()
    cursor.execute("SELECT id FROM jobs_run WHERE state = %s FOR UPDATE", ["queued"])
    return rows

def writes(run):
    Run.objects.filter(pk=run.pk).update(state="running")
    run.save(update_fields=["state"])
    run.delete()
    Run.objects.create(state="queued")
    Run.objects.bulk_create([])
    Run.objects.get_or_create(pk=1)
    cursor.execute("insert into jobs_run (id) values (1)")
    cursor.execute('UPDATE "jobs_run" SET state = %s', ["x"])
    cursor.execute("DELETE FROM jobs_run")
    run_transition(run=run)
    bulk.rows_update(run)
'''
    assert writes_in(source) == [
        "16: .update()",
        "17: .save()",
        "18: .delete()",
        "19: .create()",
        "20: .bulk_create()",
        "21: .get_or_create()",
        "22: SQL 'insert into'",
        "23: SQL 'UPDATE \"jobs_run\" SET'",
        "24: SQL 'DELETE FROM'",
        "25: run_transition()",
        "26: bulk.rows_update()",
    ]
    assert _writing_imports(ast.parse(source))[1] == [
        "from jobs.services.lifecycle import run_transition",
        "from tenants.services.quotas import MAX_STORED_INT",
        "from core import bulk",
    ]


def test_the_scan_finds_service_functions_that_only_read():
    source = """
from jobs.selectors.queue import gpu_occupancy
from jobs.services.lifecycle import run_transition

def usage_list(*, tenant):
    return list(Run.objects.filter(tenant=tenant))

def occupancy(*, now):
    return gpu_occupancy(now=now)

def _held(run):
    return Run.objects.filter(pk=run.pk).exists()

def cancel(*, run):
    if _held(run):
        _move(run)

def _move(run):
    run_transition(run=run)

def retry(*, run):
    if Run.objects.filter(pk=run.pk).exists():
        cancel(run=run)

def label(run):
    return f"run {run.pk}"
"""
    assert reads_only(source) == ["usage_list", "occupancy"]
