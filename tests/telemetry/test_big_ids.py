"""Attempt and run ids are bigint: past 2**31 (as after the real-Slurm tests, which move the
sequences on, or on a long-lived installation) the straggler scan's lock, the verdicts'
grouped reads and the rank windows' paths work the same. The tests below are the other
modules' own, collected again here with the ids moved past 2**31 first."""

import pytest
from django.db import connection

from jobs.models import Attempt
from tests.telemetry.test_rank_windows import (  # noqa: F401 - collected again here
    test_ranks_reporting_are_those_of_the_last_ten_minutes,
)
from tests.telemetry.test_straggler_flags import (  # noqa: F401 - collected again here
    big,
    test_a_capped_sm_clock_alone_names_a_slow_gpu,
    test_a_second_scan_without_new_windows_changes_nothing,
    test_the_scan_flags_exactly_the_slow_rank_with_its_node_gpu_cause_and_slowdown,
)
from tests.telemetry.test_telemetry_pages import attempt_of, submit
from tests.telemetry.test_verdicts_api import (  # noqa: F401 - collected again here
    spread_run,
    test_a_flagged_rank_is_a_verdict_with_a_restart_button_while_running,
    test_link_counters_of_the_attempts_span_become_verdicts,
    test_what_a_tighter_placement_would_have_waited_and_the_ranks_nccl,
)

PAST_INT4 = 2**31 + 1_000


@pytest.fixture(autouse=True)
def ids_past_int4(db):
    with connection.cursor() as cursor:
        for table in ("jobs_attempt", "jobs_run"):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", [PAST_INT4]
            )


def test_the_ids_here_are_past_int4(world):
    run = submit(world)
    attempt = attempt_of(world, run)
    assert run.pk > 2**31 and attempt.pk > 2**31
    assert Attempt.objects.get(pk=attempt.pk) == attempt
