# The finance models moved to the finance app (finance/migrations/0001_initial.py). Their
# tables stay where they are, under their telemetry_* names: only Django's state changes.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("telemetry", "0003_finance_rate_cards_daily_usage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="RateCard"),
                migrations.DeleteModel(name="DailyUsage"),
                migrations.DeleteModel(name="UsageRollupState"),
            ],
            database_operations=[],
        ),
    ]
