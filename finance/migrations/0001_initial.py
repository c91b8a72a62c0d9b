# The finance models, moved here from the telemetry app. Their tables already exist (created
# by telemetry's 0003, under the telemetry_* names they keep): this creates the models in
# Django's state only, and hands their content types (so their permissions and admin log
# entries) over from telemetry to finance.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MODELS = ("ratecard", "dailyusage", "usagerollupstate")


def _content_types_move(apps, *, source: str, target: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        # A fresh database has none yet (they are created after migrating); where the target
        # already exists, the source is left for remove_stale_contenttypes.
        if not content_type.objects.filter(app_label=target, model=model).exists():
            content_type.objects.filter(app_label=source, model=model).update(app_label=target)


def content_types_to_finance(apps, schema_editor) -> None:
    _content_types_move(apps, source="telemetry", target="finance")


def content_types_to_telemetry(apps, schema_editor) -> None:
    _content_types_move(apps, source="finance", target="telemetry")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("jobs", "0005_checkpoint_uri_2048"),
        ("telemetry", "0004_finance_models_moved_to_finance_app"),
        ("tenants", "0003_tenant_idle_policy"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="UsageRollupState",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("accounted_until", models.DateTimeField(blank=True, null=True)),
                        ("rates_changed_from", models.DateField(blank=True, null=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                    ],
                    options={"db_table": "telemetry_usagerollupstate"},
                ),
                migrations.CreateModel(
                    name="DailyUsage",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("date", models.DateField()),
                        (
                            "attempts",
                            models.PositiveIntegerField(
                                help_text="Attempts with GPU time on this day"
                            ),
                        ),
                        ("allocated_gpu_s", models.BigIntegerField()),
                        ("effective_gpu_s", models.BigIntegerField()),
                        ("lost_gpu_s", models.BigIntegerField()),
                        ("startup_gpu_s", models.BigIntegerField()),
                        ("checkpoint_gpu_s", models.BigIntegerField()),
                        ("idle_gpu_s", models.BigIntegerField()),
                        ("input_wait_gpu_s", models.BigIntegerField()),
                        ("comm_wait_gpu_s", models.BigIntegerField()),
                        (
                            "unpriced_gpu_s",
                            models.BigIntegerField(help_text="GPU-seconds no rate card covered"),
                        ),
                        ("cost", models.DecimalField(decimal_places=2, max_digits=16)),
                        ("effective_cost", models.DecimalField(decimal_places=2, max_digits=16)),
                        (
                            "cluster",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="jobs.cluster",
                            ),
                        ),
                        (
                            "flavor",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenants.gpuflavor",
                            ),
                        ),
                        (
                            "project",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenants.project",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="tenants.tenant",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "telemetry_dailyusage",
                        "verbose_name_plural": "daily usage",
                        "ordering": ["date", "tenant", "project", "user", "flavor", "cluster"],
                        "indexes": [
                            models.Index(fields=["tenant", "date"], name="dailyusage_tenant_date")
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("date", "tenant", "project", "user", "flavor", "cluster"),
                                name="dailyusage_unique_key",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="RateCard",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "price_per_gpu_hour",
                            models.DecimalField(decimal_places=4, max_digits=12),
                        ),
                        (
                            "currency",
                            models.CharField(help_text="ISO 4217 code, e.g. EUR", max_length=3),
                        ),
                        ("valid_from", models.DateField()),
                        (
                            "valid_to",
                            models.DateField(
                                blank=True, help_text="Exclusive; empty: open-ended", null=True
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "created_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "flavor",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="rate_cards",
                                to="tenants.gpuflavor",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "telemetry_ratecard",
                        "ordering": ["flavor", "valid_from"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("flavor", "valid_from"), name="ratecard_unique_start"
                            ),
                            models.CheckConstraint(
                                condition=models.Q(("price_per_gpu_hour__gte", 0)),
                                name="ratecard_price_not_negative",
                            ),
                            models.CheckConstraint(
                                condition=models.Q(
                                    ("valid_to__isnull", True),
                                    ("valid_to__gt", models.F("valid_from")),
                                    _connector="OR",
                                ),
                                name="ratecard_ends_after_it_starts",
                            ),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(content_types_to_finance, content_types_to_telemetry),
    ]
