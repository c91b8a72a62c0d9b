"""Histories for the what-if reports' tests: one recorded through the product
(``tests.jobs.replay_support``: runs submitted through the service, the worker's loop
driven by hand on a clock the test moves), and a long queue whose replay takes seconds.

PYTEST_DONT_REWRITE: a helper module; it asserts nothing.
"""

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import time_machine
from django.db.models import F

from jobs.models import Run
from jobs.services.submission import run_submit
from policy.models import ReplayReport
from policy.services.reports import replay_report_create
from tests.conftest import experiment_input
from tests.jobs.replay_support import record

# The window the tests replay: T0 to T0 + 20 minutes; "now" is an hour after T0.
T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=20)
NOW = T0 + timedelta(hours=1)
TICK_S = 60


def submit(world, tenant: str, *, work_s: int, gpus: int = 8, **values) -> Run:
    user, project = (
        (world.researcher_a, "detection") if tenant == "vision" else (world.researcher_b, "llm")
    )
    return run_submit(
        user=user,
        data=experiment_input(
            world,
            tenant=tenant,
            project=project,
            gpus_per_node=gpus,
            env={"GANTRY_SIM_DURATION_S": str(work_s)},
            **values,
        ),
    )


def record_history(world, *, start: datetime = T0) -> None:
    """20 minutes from ``start`` on the world's cluster at real speed: vision submits three 1×8
    A100 runs of 5 minutes at once, nlp three of 10 minutes; both have 16 guaranteed A100
    GPUs of the 32, so each tenant's third run waits for one of its first two; recorded six
    minutes past the window, so every run has ended when it is read."""
    world.cluster.settings = {**world.cluster.settings, "speedup": 1}
    world.cluster.save(update_fields=["settings"])

    def people(second: int) -> None:
        if second == 0:
            for _ in range(3):
                submit(world, "vision", work_s=300)
                submit(world, "nlp", work_s=600)

    seconds = int(WINDOW.total_seconds()) + 6 * TICK_S
    record(world.cluster, start=start, seconds=seconds, tick_s=TICK_S, at_tick=people)


def long_queue(world, *, start: datetime, count: int) -> None:
    """``count`` 1-GPU runs of vision with a time limit of a minute, queued one a second from
    ``start`` and never admitted: read back unfinished, each runs to its limit in a replay, so
    a replay of the two hours from ``start`` admits thousands of them (it takes seconds), to
    watch and to cancel."""
    with time_machine.travel(start, tick=False):
        first = submit(world, "vision", work_s=300, gpus=1, max_runtime_minutes=1)
    Run.objects.bulk_create(
        Run(
            experiment=first.experiment,
            tenant=first.tenant,
            flavor=first.flavor,
            gpus=first.gpus,
            priority=first.priority,
            submitted_by=first.submitted_by,
        )
        for _ in range(count - 1)
    )
    # One a second, by id, from ``start`` (bulk_create stamped them all with now).
    Run.objects.filter(pk__gte=first.pk).update(
        submitted_at=start + (F("id") - first.pk) * timedelta(seconds=1)
    )


def text_of(html: str) -> str:
    """The text of ``html`` as a reader sees it: tags and scripts dropped, entities read,
    whitespace collapsed."""
    html = re.sub(r"<script.*?</script>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def ask(world, proposal, **options) -> ReplayReport:
    """A report on the window ``WINDOW`` from ``T0``, asked for by the platform admin at
    ``NOW`` (``options``: replay_report_create's, confirm_warnings, share, …)."""
    with time_machine.travel(NOW, tick=False):
        return replay_report_create(
            actor=world.platform_admin,
            window_start=T0,
            window_end=T0 + WINDOW,
            proposal=proposal,
            **options,
        )
