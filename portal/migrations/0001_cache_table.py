from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    """The table of the database cache (GANTRY_CACHE_URL=db://, the embedded default);
    nothing when the cache is Redis. Run again later with ``manage.py createcachetable``
    after switching a deployment to db://."""
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = []

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
