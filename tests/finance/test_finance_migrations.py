"""Moving the finance models from ``telemetry`` to the ``finance`` app changed Django's state
only: a database migrated before the move keeps its rate cards, daily usage and rollup state
in the same tables, and reads them through ``finance.models`` after the move."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from finance.models import DailyUsage, RateCard, UsageRollupState

BEFORE_MOVE = [("telemetry", "0003_finance_rate_cards_daily_usage")]
AFTER_MOVE = [
    ("telemetry", "0004_finance_models_moved_to_finance_app"),
    ("finance", "0001_initial"),
]
# The latest finance schema, which the models below read.
LATEST = [("finance", "0005_i37_interactive_idle")]
ACCOUNTED_UNTIL = datetime(2026, 3, 2, 6, 0, tzinfo=UTC)


def migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor


@pytest.fixture
def before_move(transactional_db):
    """The database as it was before the move; migrated forward again afterwards whatever
    the test did, so the tests after it find the schema they expect."""
    executor = migrate(BEFORE_MOVE)
    yield executor.loader.project_state(BEFORE_MOVE).apps
    # Every app's latest migration, not only finance's: going back to BEFORE_MOVE also undid
    # the later migrations of other apps that depend on it (the runs' start record, say).
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_the_move_keeps_every_finance_row_and_its_table(before_move, world):
    # Given rate cards, a day of usage and the rollup state written through the models as
    # they were in telemetry
    old_rate_card = before_move.get_model("telemetry", "RateCard")
    old_daily_usage = before_move.get_model("telemetry", "DailyUsage")
    old_state = before_move.get_model("telemetry", "UsageRollupState")
    first = old_rate_card.objects.create(
        flavor_id=world.a100.pk,
        price_per_gpu_hour=Decimal("2.5000"),
        currency="EUR",
        valid_from=date(2026, 1, 1),
        valid_to=date(2026, 3, 1),
        created_by_id=world.finance.pk,
    )
    second = old_rate_card.objects.create(
        flavor_id=world.a100.pk,
        price_per_gpu_hour=Decimal("3.0000"),
        currency="EUR",
        valid_from=date(2026, 3, 1),
    )
    usage = old_daily_usage.objects.create(
        date=date(2026, 3, 1),
        tenant_id=world.vision.pk,
        project_id=world.vision_project.pk,
        user_id=world.researcher_a.pk,
        flavor_id=world.a100.pk,
        cluster_id=world.cluster.pk,
        attempts=2,
        allocated_gpu_s=7200,
        effective_gpu_s=5400,
        lost_gpu_s=600,
        startup_gpu_s=300,
        checkpoint_gpu_s=300,
        idle_gpu_s=300,
        input_wait_gpu_s=200,
        comm_wait_gpu_s=100,
        unpriced_gpu_s=0,
        cost=Decimal("6.00"),
        effective_cost=Decimal("4.50"),
    )
    old_state.objects.create(pk=1, accounted_until=ACCOUNTED_UNTIL)
    # and the content type the rate cards had in telemetry (what permissions point to)
    old_content_type = ContentType.objects.get(app_label="telemetry", model="ratecard")

    # When the database is migrated to the move and on to the latest finance schema
    migrate(AFTER_MOVE)
    migrate(LATEST)

    # Then finance.models reads the same rows from the same tables, and the rate cards'
    # content type (their permissions, admin log) belongs to finance now
    assert [
        (card.pk, card.flavor_id, card.price_per_gpu_hour, card.valid_from, card.valid_to)
        for card in RateCard.objects.order_by("valid_from")
    ] == [
        (first.pk, world.a100.pk, Decimal("2.5000"), date(2026, 1, 1), date(2026, 3, 1)),
        (second.pk, world.a100.pk, Decimal("3.0000"), date(2026, 3, 1), None),
    ]
    assert RateCard.objects.get(pk=first.pk).created_by == world.finance
    row = DailyUsage.objects.get()
    assert (row.pk, row.date, row.tenant, row.project, row.user, row.flavor, row.cluster) == (
        usage.pk,
        date(2026, 3, 1),
        world.vision,
        world.vision_project,
        world.researcher_a,
        world.a100,
        world.cluster,
    )
    assert (row.allocated_gpu_s, row.effective_gpu_s, row.waste_gpu_s) == (7200, 5400, 1800)
    # Issue 34: nothing was credited before credits existed, and the cards credit by default.
    assert (row.credited_gpu_s, row.charged_gpu_s) == (0, 7200)
    assert {card.credit_policy for card in RateCard.objects.all()} == {"credit"}
    # The rounded cost is gone; the row names the card in force on its day (the second).
    assert row.rate_card_id == second.pk
    assert UsageRollupState.objects.get(pk=1).accounted_until == ACCOUNTED_UNTIL
    assert (RateCard._meta.db_table, DailyUsage._meta.db_table) == (
        "telemetry_ratecard",
        "telemetry_dailyusage",
    )
    ContentType.objects.clear_cache()
    assert ContentType.objects.get_for_model(RateCard).pk == old_content_type.pk
    assert not ContentType.objects.filter(app_label="telemetry", model="ratecard").exists()


def test_a_new_row_after_the_move_lands_in_the_old_table(before_move, world):
    # Given the database before the move, migrated to it
    migrate(AFTER_MOVE)
    migrate(LATEST)

    # When a rate card is written through finance.models
    card = RateCard.objects.create(
        flavor=world.h100,
        price_per_gpu_hour=Decimal("4"),
        currency="EUR",
        valid_from=date(2026, 4, 1),
    )

    # Then it is a row of the table the telemetry app created
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, currency FROM telemetry_ratecard")
        assert cursor.fetchall() == [(card.pk, "EUR")]
