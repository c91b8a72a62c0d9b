import hashlib

from django.db import migrations, models


def stamp_existing_tokens(apps, schema_editor):
    """Tokens made before the stamp existed are bound to the password their owner has now
    (``ApiToken.stamp_for``), so they keep working until that password changes."""
    ApiToken = apps.get_model("tenants", "ApiToken")
    for token in ApiToken.objects.select_related("user"):
        token.credential_stamp = hashlib.sha256(
            b"gantry.api-token.credential-stamp:" + token.user.password.encode()
        ).hexdigest()
        token.save(update_fields=["credential_stamp"])


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0005_auditevent_append_only"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="credential_stamp",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(stamp_existing_tokens, migrations.RunPython.noop),
    ]
