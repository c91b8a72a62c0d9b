# The cluster model moved from jobs to the clusters app (clusters/migrations/0001_initial.py)
# under its old table: the daily usage's foreign key points to it there. Django's state
# only; the column and its constraint stay as they are.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0001_initial"),
        ("finance", "0002_daily_usage_rate_card_instead_of_rounded_cost"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="dailyusage",
                    name="cluster",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="clusters.cluster",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
