"""Pages by position (keyset), never by OFFSET: a page deep in a million rows costs what
the first one does. Shared by the run list and the experiments list."""

from django.db.models import Q, QuerySet, Subquery


def keyset_page(
    listed: QuerySet,
    *,
    readable: QuerySet,
    field: str,
    size: int,
    before: int | None,
    after: int | None,
) -> tuple[list, bool, bool]:
    """The ``size`` rows of ``listed`` just older than row ``before``, just newer than row
    ``after``, or the newest ones, newest first by (``field``, id); with whether newer and
    older rows exist. A cursor only marks a position: it is looked up in ``readable`` (a
    row the reader may not see marks none, so the page is empty)."""
    newest_first = (f"-{field}", "-id")
    if before is None and after is None:
        rows = list(listed.order_by(*newest_first)[: size + 1])
        return rows[:size], False, len(rows) > size
    cursor = before if before is not None else after
    at = Subquery(readable.filter(pk=cursor).order_by().values(field))
    # (field, id) beyond the cursor's: the bound on the field alone is what an index range
    # can use, the rest breaks ties between equal values.
    if before is not None:
        rows = list(
            listed.filter(
                Q(**{f"{field}__lt": at}) | Q(**{field: at, "pk__lt": cursor}),
                **{f"{field}__lte": at},
            ).order_by(*newest_first)[: size + 1]
        )
        return rows[:size], True, len(rows) > size
    rows = list(
        listed.filter(
            Q(**{f"{field}__gt": at}) | Q(**{field: at, "pk__gt": cursor}),
            **{f"{field}__gte": at},
        ).order_by(field, "id")[: size + 1]
    )
    return rows[:size][::-1], len(rows) > size, True
