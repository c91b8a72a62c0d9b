# The track record of the full-limits start estimate (issue 31, point 6).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0017_s3_move_to_clusters"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="start_expected_was",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="start_full_limits_was",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="start_missed_by_s",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("start_missed_by_s__isnull", False)),
                fields=["started_at", "flavor", "start_missed_by_s"],
                name="run_start_record",
            ),
        ),
    ]
