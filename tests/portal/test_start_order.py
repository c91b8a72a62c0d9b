"""The suite's longest files start first under pytest-xdist (tests/conftest.py START_FIRST):
a renamed or removed file would silently fall back to its place in the collection."""

from pathlib import Path

from tests.conftest import START_FIRST, _start_order

ROOT = Path(__file__).resolve().parents[2]


def test_each_file_started_first_exists():
    assert [path for path in START_FIRST if not (ROOT / path).is_file()] == []


def test_listed_files_start_in_the_listed_order_and_the_rest_after_them():
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    names = [
        "tests/jobs/test_admission.py::test_x",
        f"{START_FIRST[1]}::test_b@group",
        f"{START_FIRST[0]}::test_a",
    ]
    ordered = sorted((Item(name) for name in names), key=_start_order)  # type: ignore[arg-type]
    assert [item.nodeid for item in ordered] == [names[2], names[1], names[0]]
