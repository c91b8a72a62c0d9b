# The cluster model moved from jobs to the clusters app (clusters/migrations/0001_initial.py)
# under its old table: the telemetry's foreign keys point to it there. Django's state only;
# the columns and their constraints stay as they are.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0001_initial"),
        ("telemetry", "0004_finance_models_moved_to_finance_app"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="clustertelemetry",
                    name="cluster",
                    field=models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="telemetry",
                        to="clusters.cluster",
                    ),
                ),
                migrations.AlterField(
                    model_name="rawscrape",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="clusters.cluster",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
