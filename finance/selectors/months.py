"""The months of statements: first days, the months around them, and which months can be
stated at all. Pure date arithmetic."""

from datetime import date

TREND_MONTHS = 12


def month_first_day(day: date) -> date:
    return day.replace(day=1)


def month_after(first_day: date) -> date:
    if first_day.month == 12:
        return first_day.replace(year=first_day.year + 1, month=1)
    return first_day.replace(month=first_day.month + 1)


def months_back(first_day: date, count: int) -> date:
    index = first_day.year * 12 + first_day.month - 1 - count
    return date(index // 12, index % 12 + 1, 1)


# The months a statement can be asked for. A statement page reaches TREND_MONTHS back and a
# month forward, so both ends stay inside what ``date`` can represent; GPU time before the
# Unix epoch does not exist.
EARLIEST_MONTH = date(1970, 1, 1)
LATEST_MONTH = date(9998, 12, 1)


def month_is_statable(first_day: date) -> bool:
    return EARLIEST_MONTH <= first_day <= LATEST_MONTH


def last_closed_month(today: date) -> date:
    """The first day of the month before ``today``'s: the latest month that is over, the one
    finance reviews."""
    return months_back(month_first_day(today), 1)
