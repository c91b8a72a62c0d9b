"""The audit log becomes append-only: its foreign keys PROTECT (see AuditEvent), and on
PostgreSQL a trigger refuses every UPDATE and DELETE of its rows, whoever sends them.

TRUNCATE is left alone on purpose: it is not a row change but the database owner emptying
the table (``manage.py flush``, the test runner between tests); no code path of Gantry
truncates.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# One statement per string: each is sent on its own, without parameters (so the % of the
# message is not taken for a placeholder).
CREATE_TRIGGER = (
    """
    CREATE FUNCTION tenants_auditevent_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'The audit log is append-only: % of tenants_auditevent rows is refused.',
            TG_OP
            USING ERRCODE = 'restrict_violation';
    END;
    $$
    """,
    """
    CREATE TRIGGER tenants_auditevent_append_only
        BEFORE UPDATE OR DELETE ON tenants_auditevent
        FOR EACH ROW EXECUTE FUNCTION tenants_auditevent_append_only()
    """,
)
DROP_TRIGGER = (
    "DROP TRIGGER tenants_auditevent_append_only ON tenants_auditevent",
    "DROP FUNCTION tenants_auditevent_append_only()",
)


def _on_postgresql(statements: tuple[str, ...]):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_login_failure_external_identity"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="auditevent",
            options={"base_manager_name": "objects", "ordering": ["-at", "-id"]},
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="actor",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="tenant",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="tenants.tenant",
            ),
        ),
        migrations.RunPython(_on_postgresql(CREATE_TRIGGER), _on_postgresql(DROP_TRIGGER)),
    ]
