"""The attempt an SDK events request is for, read with its token in one statement.

Every rank of a job posts its step windows (issue 36): 1,024 ranks are about 9 requests a
second, each of a dozen windows. ``jobs.selectors.runs.attempt_get_for_token`` answers
through the ORM in two queries, and compiling them costs more than anything else such a
request does but the commit; the rank windows are then checked against what the attempt
holds, a third. Here one statement, whose SQL depends on nothing but the models (built
once), reads all of it; PostgreSQL and SQLite both run it.
"""

from functools import lru_cache

from django.db import connection

from clusters.models import Cluster, ClusterFlavor
from jobs.models import Attempt, AttemptToken, Experiment, Run
from jobs.reproducibility import attempt_id_of_token, attempt_token_matches
from jobs.selectors.sql import Loaded, Statement
from jobs.selectors.sql import field_of as _field
from jobs.selectors.sql import quoted_column as _quoted
from telemetry.selectors.rank_windows import held_gpus

# What the events endpoint uses of an attempt: the token's checks (``attempt_token_refusal``
# reads the number, the run and the state), the batch's writes, and what it holds. Any
# other field is deferred, as ``only(...)`` leaves it.
ATTEMPT_FIELDS = (
    "id", "run", "number", "cluster", "state", "backend_job_id", "node_list", "gpu_uuids",
)  # fmt: skip


def attempt_get_for_events(*, token: str) -> Attempt | None:
    """The attempt a genuine per-attempt token was issued for, as
    ``jobs.selectors.runs.attempt_get_for_token`` finds it (the same checks: the token's
    shape, its digest among those issued, compared in constant time), with ``superseded``
    (a later attempt of its run exists) and ``held_gpus`` (``HeldGpus``: what its ranks
    may claim to drive); None for anything not genuine. One statement (two on the
    simulator, whose job allocation is read apart)."""
    attempt_id = attempt_id_of_token(token)
    if attempt_id is None:
        return None
    statement = _statement(vendor=connection.vendor)
    with connection.cursor() as db_cursor:
        db_cursor.execute(statement.sql, [attempt_id])
        rows = db_cursor.fetchall()
    digests = [row[-1] for row in rows if row[-1] is not None]
    if not rows or not attempt_token_matches(token, digests):
        return None
    row = rows[0]
    attempt = statement.readers[""](row, connection.alias)
    assert isinstance(attempt, Attempt)
    gpus, backend, experiment_per_node, per_node, superseded = row[len(ATTEMPT_FIELDS) : -1]
    # As annotate(superseded=...) sets it (``attempt_token_refusal`` reads it).
    attempt.superseded = bool(superseded)  # type: ignore[attr-defined]
    attempt.held_gpus = held_gpus(  # type: ignore[attr-defined]
        attempt,
        gpus=gpus,
        backend=backend,
        experiment_per_node=experiment_per_node,
        per_node=per_node,
    )
    return attempt


@lru_cache(maxsize=4)
def _statement(*, vendor: str) -> Statement:
    """The SQL (parameter: the attempt's id): one row per token issued for the attempt
    (one with a NULL digest if none was), each with the attempt's ``ATTEMPT_FIELDS``, its
    run's GPUs, its cluster's backend, its experiment's and its cluster's GPUs per node,
    whether a later attempt exists, then the token's digest."""
    quote = connection.ops.quote_name
    # In the model's order, as ``Model.from_db`` takes them.
    attempt_fields = tuple(
        field for field in Attempt._meta.concrete_fields if field.name in ATTEMPT_FIELDS
    )
    loaded = {"": Loaded(model=Attempt, fields=attempt_fields, start=0)}
    attempt_id, attempt_run = _quoted(_field(Attempt, "pk")), _quoted(_field(Attempt, "run"))
    number = _quoted(_field(Attempt, "number"))
    attempt_cluster = _quoted(_field(Attempt, "cluster"))
    per_node = (
        f"(SELECT f.{_quoted(_field(ClusterFlavor, 'gpus_per_node'))} "  # noqa: S608 (identifiers from metadata)
        f"FROM {quote(ClusterFlavor._meta.db_table)} f "
        f"WHERE f.{_quoted(_field(ClusterFlavor, 'cluster'))} = a.{attempt_cluster} "
        f"AND f.{_quoted(_field(ClusterFlavor, 'flavor'))} = r.{_quoted(_field(Run, 'flavor'))})"
    )
    later = (
        f"EXISTS (SELECT 1 FROM {quote(Attempt._meta.db_table)} l "  # noqa: S608 (identifiers from metadata)
        f"WHERE l.{attempt_run} = a.{attempt_run} AND l.{number} > a.{number})"
    )
    selected = ", ".join(
        [f"a.{_quoted(field)}" for field in attempt_fields]
        + [
            f"r.{_quoted(_field(Run, 'gpus'))}",
            f"c.{_quoted(_field(Cluster, 'backend'))}",
            f"e.{_quoted(_field(Experiment, 'gpus_per_node'))}",
            per_node,
            later,
            f"t.{_quoted(_field(AttemptToken, 'digest'))}",
        ]
    )
    sql = (
        f"SELECT {selected} FROM {quote(Attempt._meta.db_table)} a "  # noqa: S608 (identifiers from metadata)
        f"JOIN {quote(Run._meta.db_table)} r ON r.{_quoted(_field(Run, 'pk'))} = a.{attempt_run} "
        f"JOIN {quote(Experiment._meta.db_table)} e "
        f"ON e.{_quoted(_field(Experiment, 'pk'))} = r.{_quoted(_field(Run, 'experiment'))} "
        f"JOIN {quote(Cluster._meta.db_table)} c "
        f"ON c.{_quoted(_field(Cluster, 'pk'))} = a.{attempt_cluster} "
        f"LEFT JOIN {quote(AttemptToken._meta.db_table)} t "
        f"ON t.{_quoted(_field(AttemptToken, 'attempt'))} = a.{attempt_id} "
        f"WHERE a.{attempt_id} = %s"
    )
    return Statement(sql=sql, loaded=loaded)
