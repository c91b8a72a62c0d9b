"""The usage export as an XLSX sheet that opens ready to read: dates as dates, GPU-hours and
money as numbers with their formats (money in the platform's currency), the header row bold
and frozen, and columns wide enough for what they hold.

Write-only: the workbook streams rows to its file, so memory stays flat up to the export's
row cap. Widths are fixed per column, as they must be set before the first row is written.
"""

from collections.abc import Iterable, Sequence
from typing import IO, Any

from openpyxl import Workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter
from openpyxl.worksheet._write_only import WriteOnlyWorksheet

DATE_FORMAT = "yyyy-mm-dd"
# At least two decimals, up to the six the export carries: 0.004167 GPU-hours stays visible.
GPU_HOURS_FORMAT = "#,##0.00####"
PRICE_PLACES = 4
MONEY_PLACES = 2
TEXT_COLUMNS = {"tenant": 16, "project": 20, "user": 16, "flavor": 14, "cluster": 14}
DATE_WIDTH = 12
NUMBER_WIDTH = 14
# Header names are lowercase identifiers: a little wider than the header keeps it readable.
HEADER_PADDING = 2


def money_format(places: int, currency: str) -> str:
    """``#,##0.00 "EUR"``: thousands separated, fixed places, the currency code after."""
    number = "#,##0." + "0" * places
    return f'{number} "{currency}"' if currency else number


def column_formats(columns: Sequence[str], currency: str) -> list[str | None]:
    """The number format of each export column; None for text."""
    formats: list[str | None] = []
    for name in columns:
        if name in ("from", "to"):
            formats.append(DATE_FORMAT)
        elif name == "price_per_gpu_hour":
            formats.append(money_format(PRICE_PLACES, currency))
        elif name.endswith("_gpu_h"):
            formats.append(GPU_HOURS_FORMAT)
        elif name == "cost" or name.endswith("_cost"):
            formats.append(money_format(MONEY_PLACES, currency))
        else:
            formats.append(None)
    return formats


def column_width(name: str, number_format: str | None) -> int:
    """Characters: the header's length or what the column's values need, whichever is more."""
    if number_format == DATE_FORMAT:
        content = DATE_WIDTH
    elif number_format is not None:
        content = NUMBER_WIDTH
    else:
        content = TEXT_COLUMNS.get(name, len(name))
    return max(content, len(name) + HEADER_PADDING)


def usage_workbook_write(
    rows: Iterable[Sequence[Any]], *, columns: Sequence[str], currency: str, into: IO[bytes]
) -> None:
    """Write the export's ``rows`` (in ``columns`` order) as the sheet "Usage" into ``into``."""
    workbook = Workbook(write_only=True)
    sheet: WriteOnlyWorksheet = workbook.create_sheet("Usage")
    # Set up by the worksheet (Worksheet._setup), though the stubs do not declare it.
    dimensions = sheet.column_dimensions  # type: ignore[attr-defined]
    formats = column_formats(columns, currency)
    for index, (name, number_format) in enumerate(zip(columns, formats, strict=True), start=1):
        dimensions[get_column_letter(index)].width = column_width(name, number_format)
    sheet.freeze_panes = "A2"
    bold = Font(bold=True)
    header = []
    for name in columns:
        cell = WriteOnlyCell(sheet, value=name)
        cell.font = bold
        header.append(cell)
    sheet.append(header)
    for row in rows:
        cells: list[Any] = []
        for value, number_format in zip(row, formats, strict=True):
            if number_format is None or value is None:
                cells.append(value)
            else:
                cell = WriteOnlyCell(sheet, value=value)
                cell.number_format = number_format
                cells.append(cell)
        sheet.append(cells)
    workbook.save(into)
