from django.db import migrations, models
from django.db.models.functions import Now

ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")


def mark_ended_as_released(apps, schema_editor):
    """Workspaces that ended before their volumes existed have nothing to release."""
    Workspace = apps.get_model("jobs", "Workspace")
    Workspace.objects.filter(run__state__in=ENDED).update(storage_released_at=Now())


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0021_i37_workspaces"),
    ]

    operations = [
        migrations.AddField(
            model_name="workspace",
            name="storage_released_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(mark_ended_as_released, migrations.RunPython.noop),
    ]
