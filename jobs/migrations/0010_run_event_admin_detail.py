import re

from django.db import migrations, models

# The preemption message admission wrote before events had an admin-only detail.
_NAMED_RECLAIM = re.compile(
    r"tenant \S+ reclaimed (?P<gpus>\d+) (?P<flavor>\S+) GPUs of its guarantee on "
    r"(?P<cluster>\S+) for run \d+; this run had borrowed (?P<borrowed>\d+)"
)


def anonymise_preemptions(apps, schema_editor):
    """Stored preemption events named the reclaiming tenant and run to everyone: keep that
    text for platform admins and give everyone else the neutral one."""
    RunEvent = apps.get_model("jobs", "RunEvent")
    for event in RunEvent.objects.filter(reason="PREEMPTED", message__startswith="tenant "):
        match = _NAMED_RECLAIM.fullmatch(event.message)
        if match is None:
            continue
        event.admin_detail = event.message
        event.message = (
            f"a tenant within its guarantee reclaimed {match['gpus']} {match['flavor']} GPUs "
            f"on {match['cluster']}; this run had borrowed {match['borrowed']}"
        )
        event.save(update_fields=["message", "admin_detail"])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0009_node_inventory_and_placement"),
    ]

    operations = [
        migrations.AddField(
            model_name="runevent",
            name="admin_detail",
            field=models.TextField(blank=True),
        ),
        migrations.RunPython(anonymise_preemptions, migrations.RunPython.noop),
    ]
