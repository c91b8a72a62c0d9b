"""Whether this process can serve: its database answers and holds every migration the code
expects. A web replica started before the release's migrations ran (Kubernetes starts it
beside the migration Job) is then left out of the Service until they have, instead of
answering requests with 500s from missing tables or columns."""

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

# Once every migration was found applied, this process does not ask again: a release's
# migrations only move forward, and a newer release starts new processes.
_migrated: set[str] = set()


def database_unready_reason(alias: str = DEFAULT_DB_ALIAS) -> str | None:
    """Why the database cannot serve this code yet, or None when it can. Never raises: a
    database that does not answer is a reason too."""
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        if alias in _migrated:
            return None
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # any database failure means not ready
        return f"database: {str(exc)[:200]}"
    if plan:
        first, _backwards = plan[0]
        return f"migrations: {len(plan)} not applied yet (first {first.app_label}.{first.name})"
    _migrated.add(alias)
    return None


def readiness_forget() -> None:
    """Ask the database about migrations again at the next check (tests)."""
    _migrated.clear()
