"""``manage.py migrate`` that any number of copies may run at once (the Kubernetes migration
Job started twice, two releases rolling out together): on PostgreSQL each first takes a
session advisory lock, so they migrate one after the other, and the later ones find nothing
left to do. Django's own migrate takes no lock: two at once would both apply the same
migration, and the slower one fails on a table or row the other has just created."""

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections

# The advisory lock's key, one bigint for the whole installation: "gantrymg" in ASCII.
MIGRATION_LOCK_KEY = int.from_bytes(b"gantrymg", "big") - 2**63


class Command(BaseCommand):
    help = (
        "Apply the migrations like migrate --noinput, one copy at a time on PostgreSQL (an "
        "advisory lock): safe to start several at once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args, **options):
        connection = connections[options["database"]]
        verbosity = options["verbosity"]
        if connection.vendor != "postgresql":  # SQLite: one host, one file, one writer
            call_command(
                "migrate", database=connection.alias, interactive=False, verbosity=verbosity
            )
            return
        with connection.cursor() as cursor:
            if verbosity:
                self.stdout.write("Waiting for the migration lock…")
            # Session level, not transaction level: migrate commits migration by migration.
            cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK_KEY])
        try:
            call_command(
                "migrate", database=connection.alias, interactive=False, verbosity=verbosity
            )
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK_KEY])
