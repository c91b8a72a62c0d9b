# DailyUsage stops storing money rounded per attempt and day (the statements summed those
# cents, and short attempts drifted by up to -1 %): each row names the rate card in force on
# its day instead, and a statement line prices its whole GPU-seconds once. Existing rows get
# their card here (cards start at 00:00 UTC, so a flavor's day has exactly one or none);
# going back, the dropped columns are recomputed from the card, one row at a time.

from decimal import ROUND_HALF_EVEN, Decimal

import django.db.models.deletion
from django.db import migrations, models

CENT = Decimal("0.01")


def rate_cards_named(apps, schema_editor) -> None:
    rate_card = apps.get_model("finance", "RateCard")
    daily_usage = apps.get_model("finance", "DailyUsage")
    for card in rate_card.objects.all():
        days = daily_usage.objects.filter(flavor_id=card.flavor_id, date__gte=card.valid_from)
        if card.valid_to is not None:
            days = days.filter(date__lt=card.valid_to)
        days.update(rate_card=card)


def costs_recomputed(apps, schema_editor) -> None:
    daily_usage = apps.get_model("finance", "DailyUsage")
    for row in daily_usage.objects.select_related("rate_card").iterator():
        price = row.rate_card.price_per_gpu_hour if row.rate_card_id else Decimal(0)
        row.cost, row.effective_cost = (
            (Decimal(gpu_s) * price / 3600).quantize(CENT, ROUND_HALF_EVEN)
            for gpu_s in (row.allocated_gpu_s, row.effective_gpu_s)
        )
        row.save(update_fields=["cost", "effective_cost"])


class Migration(migrations.Migration):
    dependencies = [
        ("finance", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="dailyusage",
            name="rate_card",
            field=models.ForeignKey(
                blank=True,
                help_text="The card in force on the day; empty: no card, the GPU-seconds are "
                "unpriced",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="finance.ratecard",
            ),
        ),
        # Nullable first, so that going back adds the columns empty, fills them, then
        # requires them again.
        *(
            migrations.AlterField(
                model_name="dailyusage",
                name=name,
                field=models.DecimalField(decimal_places=2, max_digits=16, null=True),
            )
            for name in ("cost", "effective_cost")
        ),
        migrations.RunPython(rate_cards_named, costs_recomputed),
        migrations.RemoveField(model_name="dailyusage", name="cost"),
        migrations.RemoveField(model_name="dailyusage", name="effective_cost"),
    ]
