"""Finance spells no accounting category itself: telemetry.accounting is the one definition
(effective and the waste categories), and costing, statements, exports and charts derive
from it, so a category added there reaches every finance output."""

import ast
from pathlib import Path

import finance
from finance import costing, services
from finance.selectors import amounts, exports
from telemetry import accounting

FINANCE_DIR = Path(finance.__file__).parent


def test_finance_uses_telemetrys_categories_and_waste():
    assert accounting.WASTE == (
        "lost", "startup", "checkpoint", "interactive_idle", "idle", "input_wait", "comm_wait",
    )  # fmt: skip
    assert (*accounting.WASTE, "effective") == accounting.CATEGORIES
    assert amounts.WASTE is exports.WASTE is accounting.WASTE
    assert services.CATEGORIES is accounting.CATEGORIES
    # The tie order of costing holds every category once: effective first, then the waste
    assert ("effective", *accounting.WASTE) == costing.SHARE_ORDER
    assert sorted(costing.SHARE_ORDER) == sorted(accounting.CATEGORIES)


def test_the_statement_line_categories_and_the_export_columns_keep_their_order():
    line = amounts.Usage(
        allocated_gpu_s=28, effective_gpu_s=0, lost_gpu_s=1, startup_gpu_s=2,
        checkpoint_gpu_s=3, interactive_idle_gpu_s=7, idle_gpu_s=4, input_wait_gpu_s=5,
        comm_wait_gpu_s=6,
    )  # fmt: skip

    assert [(share.key, share.gpu_s) for share in line.waste_shares] == [
        ("lost", 1), ("startup", 2), ("checkpoint", 3), ("interactive_idle", 7), ("idle", 4),
        ("input_wait", 5), ("comm_wait", 6),
    ]  # fmt: skip
    assert exports.EXPORT_COLUMNS[8:16] == (
        "allocated_gpu_h", "effective_gpu_h", "lost_gpu_h", "startup_gpu_h", "checkpoint_gpu_h",
        "interactive_idle_gpu_h", "idle_gpu_h", "input_wait_gpu_h",
    )  # fmt: skip


def _category_literals(source: str) -> list[int]:
    """Lines of tuple, list or set literals naming two or more categories."""
    names = set(accounting.CATEGORIES)
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            spelled = {
                item.value
                for item in node.elts
                if isinstance(item, ast.Constant) and item.value in names
            }
            if len(spelled) >= 2:
                lines.append(node.lineno)
    return lines


def test_the_finder_sees_a_copied_list_and_passes_single_names():
    # The definition finance/costing.py held before it imported telemetry's
    copy = 'CATEGORIES = ("effective", "lost", "startup", "checkpoint", "idle", "input_wait")\n'
    single = 'x = getattr(row, "effective_gpu_s")\ny = ("effective", "effective_cost")\n'

    assert _category_literals(copy) == [1]
    assert _category_literals(single) == []


def test_no_finance_module_spells_a_list_of_categories():
    found = {
        str(path.relative_to(FINANCE_DIR)): lines
        for path in sorted(FINANCE_DIR.rglob("*.py"))
        if "migrations" not in path.parts and (lines := _category_literals(path.read_text()))
    }

    assert found == {}
