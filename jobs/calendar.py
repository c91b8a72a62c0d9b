"""Month arithmetic for budgets: pure functions on aware datetimes (UTC months)."""

from datetime import UTC, date, datetime


def month_start(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(start: datetime) -> datetime:
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def split_by_month(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """Seconds of [start, end) in each calendar month (UTC), in order."""
    parts = []
    cursor = start.astimezone(UTC)
    end = end.astimezone(UTC)
    while cursor < end:
        boundary = next_month(month_start(cursor))
        stop = min(boundary, end)
        parts.append((month_start(cursor).date(), (stop - cursor).total_seconds()))
        cursor = stop
    return parts
