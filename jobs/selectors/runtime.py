"""What the ranks of attempts reported of their runtime (``AttemptRankRuntime``): the
evidence for "NCCL versions differ between ranks" (issue 36)."""

from collections import Counter

from django.db.models import Count

from jobs.models import RANK_VERSION_FIELDS, AttemptRankRuntime


def rank_versions(*, attempt_ids: list[int]) -> dict[int, dict[str, dict[str, int]]]:
    """Attempt id → ``{"nccl_version": {version: ranks}, "driver_version": {…},
    "cuda_version": {…}}``: how many of its ranks reported each version, for every id asked
    about (three empty maps where no rank reported; a version a rank did not send is not
    counted). Each rank counts once, whatever it sent. Not an access check: the caller
    scoped the ids. One query, grouped in the database, for any number of attempts."""
    if not attempt_ids:
        return {}
    counted: dict[int, dict[str, Counter[str]]] = {
        attempt_id: {name: Counter() for name in RANK_VERSION_FIELDS} for attempt_id in attempt_ids
    }
    rows = (
        AttemptRankRuntime.objects.filter(attempt_id__among=sorted(set(attempt_ids)))
        .values_list("attempt_id", *RANK_VERSION_FIELDS)
        .annotate(ranks=Count("id"))
        .order_by()
    )
    for attempt_id, *versions, ranks in rows:
        for name, version in zip(RANK_VERSION_FIELDS, versions, strict=True):
            if version:
                counted[attempt_id][name][version] += ranks
    return {
        attempt_id: {name: dict(counts) for name, counts in by_field.items()}
        for attempt_id, by_field in counted.items()
    }
