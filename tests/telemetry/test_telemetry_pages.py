"""Telemetry pages: a run's GPU usage, a tenant's goodput, unmapped samples.

Telemetry rows are written with the ORM, so every number on the pages is known exactly.
"""

import json
import re
from datetime import UTC, datetime, time, timedelta

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from jobs.durations import duration_text
from jobs.models import Attempt, AttemptState, Checkpoint, Run
from jobs.services.submission import run_submit
from telemetry.accounting import WASTE
from telemetry.goodput import goodput_of_my_tenants, goodput_window
from telemetry.models import AttemptAccounting, GpuMinute, SdkEvent, StepWindow, UnmappedSamples
from telemetry.selectors import run_page, tenant_goodput
from telemetry.selectors.gpu_seconds import GpuSeconds
from telemetry.selectors.tenant_goodput import GoodputPeriod
from tenants.access import tenant_roles
from tenants.models import Membership, Project, Tenant
from tests.conftest import experiment_input, make_user

T0 = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)
HOSTILE = "<script>alert(1)</script>"
PLOTLY = "/static/vendor/plotly/plotly-4.1.1.min.js"
TELEMETRY_JS = "/static/gantry/telemetry.js"


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def attempt_of(
    world,
    run: Run,
    *,
    number: int = 1,
    state: str = AttemptState.SUCCEEDED,
    start: datetime | None = T0,
    hours: float = 1.0,
    **fields,
) -> Attempt:
    """An attempt that ran ``hours`` from ``start`` (still running: no end)."""
    ended = state not in (AttemptState.RUNNING, AttemptState.PENDING)
    return Attempt.objects.create(
        run=run,
        number=number,
        cluster=world.cluster,
        state=state,
        started_at=start,
        finished_at=start + timedelta(hours=hours) if ended and start else None,
        **fields,
    )


def account(
    attempt: Attempt, *, allocated: int, activity_weighted: float = 0.0, queue_s=None, **waste
) -> AttemptAccounting:
    """Stored accounting: the waste categories given, the rest of ``allocated`` effective."""
    return AttemptAccounting.objects.create(
        attempt=attempt,
        allocated_gpu_s=allocated,
        effective_gpu_s=allocated - sum(waste.values()),
        **{f"{name}_gpu_s": waste.get(name, 0) for name in WASTE},
        activity_weighted_gpu_s=activity_weighted,
        queue_s=queue_s,
        computed_at=attempt.finished_at or T0,
    )


def page(client, user, url: str) -> str:
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def telemetry_url(run: Run) -> str:
    return reverse("telemetry:run_telemetry", args=[run.pk])


def chart_payload(content: str, element_id: str) -> dict:
    match = re.search(
        rf'<script id="{element_id}" type="application/json">(.*?)</script>', content, re.S
    )
    assert match, element_id
    return json.loads(match.group(1))


def text(html: str) -> str:
    return " ".join(strip_tags(html).split())


def row(content: str, opening: str) -> list[str]:
    """The texts of the cells of the table row that starts with ``opening``."""
    match = re.search(re.escape(opening) + r"(.*?)</tr>", content, re.S)
    assert match, opening
    return [text(cell) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", match.group(1), re.S)]


def category_row(content: str, label: str) -> list[str]:
    return row(content, f'<th scope="row">{label}</th>')


# --- a run's GPU usage -------------------------------------------------------------------------


def test_waste_breakdown_of_an_attempt_in_gpu_hours_and_percent(client, world):
    run = submit(world)
    attempt = attempt_of(world, run)
    account(
        attempt,
        allocated=7200,
        idle=1200,
        input_wait=600,
        activity_weighted=6000.0,
        queue_s=95.0,
    )

    content = page(client, world.researcher_a, telemetry_url(run))

    assert category_row(content, "Allocated") == ["2.00 GPU-h"]
    assert category_row(content, "Effective") == ["1.50 GPU-h 75.0 %"]
    assert category_row(content, "Lost work") == ["0 GPU-h 0.0 %"]
    assert category_row(content, "Idle") == ["0.33 GPU-h 16.7 %"]
    assert category_row(content, "Input wait") == ["0.17 GPU-h 8.3 %"]
    assert category_row(content, "Goodput") == ["75.0 %"]
    assert category_row(content, "Activity-weighted GPU-hours") == ["1.67"]
    assert '<dd data-kpi="goodput">75.0 %</dd>' in content
    assert '<dd data-kpi="queue">1 min 35 s</dd>' in content
    assert text(re.search(r'<dd data-kpi="waste">.*?</dd>', content).group(0)) == (
        "0.50 GPU-hours mostly idle"
    )
    chart = chart_payload(content, "waste-chart-data")
    assert (chart["kind"], chart["orientation"], chart["categories"]) == ("bar", "h", ["Attempt 1"])
    assert [(trace["name"], trace["values"]) for trace in chart["traces"]] == [
        ("Effective", [1.5]),
        ("Lost work", [0.0]),
        ("Startup", [0.0]),
        ("Checkpointing", [0.0]),
        ("Interactive idle", [0.0]),
        ("Idle", [0.333]),
        ("Input wait", [0.167]),
        ("Communication wait", [0.0]),
    ]


def test_the_run_column_sums_its_attempts(client, world):
    run = submit(world)
    first = attempt_of(world, run, state=AttemptState.PREEMPTED, hours=0.5)
    second = attempt_of(world, run, number=2, start=T0 + timedelta(hours=1))
    account(first, allocated=3600, lost=1800, queue_s=60.0)
    account(second, allocated=7200, idle=1800, queue_s=3600.0)

    content = page(client, world.researcher_a, telemetry_url(run))

    # Attempt 1, attempt 2, the run.
    assert category_row(content, "Allocated") == ["1.00 GPU-h", "2.00 GPU-h", "3.00 GPU-h"]
    assert category_row(content, "Effective") == [
        "0.50 GPU-h 50.0 %",
        "1.50 GPU-h 75.0 %",
        "2.00 GPU-h 66.7 %",
    ]
    assert category_row(content, "Lost work") == [
        "0.50 GPU-h 50.0 %",
        "0 GPU-h 0.0 %",
        "0.50 GPU-h 16.7 %",
    ]
    assert category_row(content, "Idle") == [
        "0 GPU-h 0.0 %",
        "0.50 GPU-h 25.0 %",
        "0.50 GPU-h 16.7 %",
    ]
    assert category_row(content, "Goodput") == ["50.0 %", "75.0 %", "66.7 %"]
    assert row(content, '<th scope="row">Queue time') == [
        "1 min 00 s",
        "1 h 00 min",
        "1 h 01 min",
    ]
    assert chart_payload(content, "waste-chart-data")["categories"] == [
        "Attempt 1",
        "Attempt 2",
        "Run",
    ]


def test_activity_chart_has_a_line_per_gpu_with_the_three_metrics(client, world):
    run = submit(world)
    attempt = attempt_of(world, run)
    for gpu, activities in (("0", (0.5, 0.25)), ("1", (0.75, None))):
        for offset, activity in enumerate(activities):
            GpuMinute.objects.create(
                attempt=attempt,
                host="node-a",
                gpu=gpu,
                minute=T0 + timedelta(minutes=offset),
                activity=activity,
                sm_active=0.6,
                tensor_active=0.125,
                fb_used=40960,
                xid=79 if (gpu, offset) == ("1", 1) else 0,
                samples=4,
            )

    content = page(client, world.researcher_a, telemetry_url(run))

    chart = chart_payload(content, "activity-chart-data")
    assert (chart["kind"], chart["x_title"]) == ("activity", "Time (UTC)")
    assert chart["lines"] == [
        {
            "name": "Attempt 1 · node-a GPU 0",
            "x": ["2025-03-03 09:00:00", "2025-03-03 09:01:00"],
            "activity": [50.0, 25.0],
            "sm_active": [60.0, 60.0],
            "tensor_active": [12.5, 12.5],
        },
        {
            "name": "Attempt 1 · node-a GPU 1",
            "x": ["2025-03-03 09:00:00", "2025-03-03 09:01:00"],
            "activity": [75.0, None],
            "sm_active": [60.0, 60.0],
            "tensor_active": [12.5, 12.5],
        },
    ]
    assert '<option value="tensor_active">Tensor active</option>' in content
    # Attempt, host, GPU, minutes, activity, SM, tensor, peak memory, minutes with XIDs.
    assert row(content, '<tr data-gpu="1/node-a/0">') == [
        "1", "node-a", "0", "2", "37.5 %", "60.0 %", "12.5 %", "40960 MiB", "0",
    ]  # fmt: skip
    assert row(content, '<tr data-gpu="1/node-a/1">') == [
        "1", "node-a", "1", "2", "75.0 %", "60.0 %", "12.5 %", "40960 MiB", "1",
    ]  # fmt: skip


def test_a_run_of_days_is_charted_in_hourly_means(client, world):
    run = submit(world)
    attempt = attempt_of(world, run, hours=72)
    for minute, activity in ((0, 0.2), (30, 0.4), (60, 1.0)):
        GpuMinute.objects.create(
            attempt=attempt,
            host="n",
            gpu="0",
            minute=T0 + timedelta(minutes=minute),
            activity=activity,
        )

    content = page(client, world.researcher_a, telemetry_url(run))

    line = chart_payload(content, "activity-chart-data")["lines"][0]
    assert (line["x"], line["activity"]) == (
        ["2025-03-03 09:00:00", "2025-03-03 10:00:00"],
        [30.0, 100.0],
    )
    assert "hourly means" in content


def test_chart_resolution_keeps_lines_under_720_points():
    hours = timedelta(hours=1)
    assert run_page.chart_resolution(first=T0, last=T0 + 12 * hours) == "minute"
    assert run_page.chart_resolution(first=T0, last=T0 + 12 * hours + timedelta(minutes=1)) == (
        "hour"
    )
    assert run_page.chart_resolution(first=T0, last=T0 + 720 * hours) == "hour"
    assert run_page.chart_resolution(first=T0, last=T0 + 721 * hours) == "day"
    assert run_page.chart_resolution(first=None, last=None) == "minute"


def test_step_time_split_totals_and_over_time(client, world):
    run = submit(world)
    attempt = attempt_of(world, run)
    for seq, (minute, steps, step_time, data, comm, checkpoint) in enumerate(
        ((0, 100, 1.0, 20.0, 10.0, 0.0), (1, 50, 1.0, 5.0, 5.0, 12.0)), start=1
    ):
        StepWindow.objects.create(
            attempt=attempt,
            source="rank0",
            seq=seq,
            start=T0 + timedelta(minutes=minute),
            end=T0 + timedelta(minutes=minute + 1),
            steps=steps,
            step_time_s=step_time,
            data_wait_s=data,
            comm_wait_s=comm,
            checkpoint_s=checkpoint,
        )

    content = page(client, world.researcher_a, telemetry_url(run))

    # Steps, step time, compute, data wait, communication wait, checkpointing between steps.
    assert row(content, '<tr data-steps="1">') == [
        "1",
        "150",
        "2 min 30 s",
        "1 min 50 s 73.3 %",
        "25 s 16.7 %",
        "15 s 10.0 %",
        "12 s",
    ]
    chart = chart_payload(content, "steps-chart-data")
    assert chart["categories"] == ["2025-03-03 09:00:00", "2025-03-03 09:01:00"]
    assert [(trace["key"], trace["values"]) for trace in chart["traces"]] == [
        ("compute", [70.0, 80.0]),
        ("data_wait", [20.0, 10.0]),
        ("comm_wait", [10.0, 10.0]),
    ]


def test_checkpoints_are_listed_and_marked_on_the_activity_chart(client, world):
    run = submit(world)
    first = attempt_of(world, run, state=AttemptState.PREEMPTED)
    second = attempt_of(world, run, number=2, start=T0 + timedelta(hours=2))
    GpuMinute.objects.create(attempt=first, host="n", gpu="0", minute=T0, activity=0.9)
    Checkpoint.objects.create(
        run=run,
        attempt=first,
        step=600,
        uri="s3://ckpt/run/step-600",
        saved_at=T0 + timedelta(minutes=40),
        save_seconds=12.5,
    )
    SdkEvent.objects.create(
        attempt=second,
        source="rank0",
        seq=1,
        type=SdkEvent.Type.CHECKPOINT_RESTORED,
        ts=T0 + timedelta(hours=2, minutes=1),
        payload={"step": 600, "uri": "s3://ckpt/run/step-600", "seconds": 8.0},
    )

    content = page(client, world.researcher_a, telemetry_url(run))

    assert row(content, '<tr data-checkpoint="1/600/saved/cluster">') == [
        "1",
        "saved",
        "600",
        "s3://ckpt/run/step-600",
        "2025-03-03 09:40:00 UTC",
        "12.5 s",
        "cluster",
    ]
    assert row(content, '<tr data-checkpoint="2/600/restored/SDK">') == [
        "2",
        "restored",
        "600",
        "s3://ckpt/run/step-600",
        "2025-03-03 11:01:00 UTC",
        "8.0 s",
        "SDK",
    ]
    assert chart_payload(content, "activity-chart-data")["markers"] == {
        "name": "Checkpoints",
        "x": ["2025-03-03 09:40:00", "2025-03-03 11:01:00"],
        "y": [100, 100],
        "text": [
            "Attempt 1: checkpoint of step 600 saved (cluster) s3://ckpt/run/step-600",
            "Attempt 2: checkpoint of step 600 restored (SDK) s3://ckpt/run/step-600",
        ],
    }


def test_a_save_the_sdk_reported_is_listed_once_as_the_sdk_timed_it(client, world):
    run = submit(world)
    attempt = attempt_of(world, run)
    saved_at = T0 + timedelta(minutes=10)
    Checkpoint.objects.create(
        run=run, attempt=attempt, step=100, uri="s3://c/100", saved_at=saved_at, save_seconds=9.0
    )
    SdkEvent.objects.create(
        attempt=attempt,
        source="rank0",
        seq=1,
        type=SdkEvent.Type.CHECKPOINT_SAVED,
        ts=saved_at,
        payload={"step": 100, "uri": "s3://c/100", "seconds": 9.5},
    )

    content = page(client, world.researcher_a, telemetry_url(run))

    assert content.count("<tr data-checkpoint=") == 1
    assert row(content, '<tr data-checkpoint="1/100/saved/SDK">')[5] == "9.5 s"


def test_diagnosis_in_plain_words_from_the_telemetry(client, world):
    run = submit(world)
    slow = attempt_of(world, run, state=AttemptState.FAILED, failure_reason="OOM_GPU")
    healthy = attempt_of(world, run, number=2, start=T0 + timedelta(hours=2))
    # Attempt 1: 30 % activity, 40 % of the step time waiting for data, then out of memory.
    for gpu in ("0", "1"):
        GpuMinute.objects.create(
            attempt=slow, host="n", gpu=gpu, minute=T0, activity=0.3, tensor_active=0.2
        )
    StepWindow.objects.create(
        attempt=slow,
        source="rank0",
        seq=1,
        start=T0,
        end=T0 + timedelta(minutes=2),
        steps=100,
        step_time_s=1.0,
        data_wait_s=40.0,
        comm_wait_s=5.0,
    )
    account(slow, allocated=7200, input_wait=2880)
    GpuMinute.objects.create(
        attempt=healthy,
        host="n",
        gpu="0",
        minute=T0 + timedelta(hours=2),
        activity=0.9,
        tensor_active=0.4,
    )
    account(healthy, allocated=7200)

    content = page(client, world.researcher_a, telemetry_url(run))

    diagnosis = content[content.index('id="diagnosis"') :]
    first = diagnosis[: diagnosis.index('data-attempt="2"')]
    assert re.findall(r'data-finding="([a-z_]+)">', first) == ["failure", "input_bound"]
    assert (
        "Out of GPU memory: lower the per-GPU batch size (keep the global batch with gradient "
        "accumulation), enable activation checkpointing or bf16, or choose a flavor with more "
        "GPU memory." in first
    )
    assert (
        "Input-bound: shard the dataset, add DataLoader workers, use local NVMe cache. The GPUs "
        "waited for data 40 % of the step time (0.8 GPU-hours)." in first
    )
    assert "Nothing to fix" in diagnosis[diagnosis.index('data-attempt="2"') :]


def test_running_and_pending_attempts_explain_themselves(client, world):
    run = submit(world)
    attempt_of(world, run, state=AttemptState.FAILED, hours=0.5)
    running = attempt_of(
        world, run, number=2, state=AttemptState.RUNNING, start=T0 + timedelta(hours=1)
    )

    content = page(client, world.researcher_a, telemetry_url(run))

    assert "Attempt 2 is running. Its accounting is computed when it ends" in content
    assert "No GPU samples yet." in content
    assert "Accounting pending: where the GPU time went follows within about a minute." in content
    assert (
        "Still running: where the GPU time went (input, communication, idleness, time lost) "
        "follows when the attempt ends" in content
    )
    assert "No step windows: the job does not report its training steps." in content
    assert "No checkpoints recorded." in content
    # Nothing to draw: Plotly is not loaded.
    assert PLOTLY not in content and TELEMETRY_JS not in content

    AttemptAccounting.objects.all().delete()
    account(Attempt.objects.get(run=run, number=1), allocated=3600)
    Attempt.objects.filter(pk=running.pk).update(
        state=AttemptState.SUCCEEDED, finished_at=T0 + timedelta(hours=2)
    )
    content = page(client, world.researcher_a, telemetry_url(run))
    assert "Accounting pending: the telemetry worker computes it" not in content
    assert category_row(content, "Allocated") == ["1.00 GPU-h", "accounting pending", "1.00 GPU-h"]


def test_a_run_without_attempts_says_it_has_not_started(client, world):
    run = submit(world)

    content = page(client, world.researcher_a, telemetry_url(run))

    assert "No telemetry yet: the run has not started" in content
    assert PLOTLY not in content


def test_pages_with_charts_load_vendored_plotly_and_no_inline_script(client, world):
    run = submit(world)
    attempt = attempt_of(world, run)
    account(attempt, allocated=3600)

    content = page(client, world.researcher_a, telemetry_url(run))

    assert re.findall(r"<script[^>]*>", content) == [
        '<script src="/static/vendor/htmx/htmx-2.0.11.min.js" defer>',
        '<script src="/static/gantry/gantry.js" defer>',
        f'<script src="{PLOTLY}" defer>',
        f'<script src="{TELEMETRY_JS}" defer>',
        '<script id="waste-chart-data" type="application/json">',
    ]
    assert " style=" not in content
    assert re.search(r"\son[a-z]+=", content) is None
    assert finders.find("vendor/plotly/plotly-4.1.1.min.js")
    assert finders.find("vendor/plotly/LICENSE.txt")
    assert finders.find("gantry/telemetry.js")


def test_hostile_labels_are_escaped_in_tables_and_chart_data(client, world):
    run = submit(world)
    attempt = attempt_of(world, run)
    GpuMinute.objects.create(attempt=attempt, host=HOSTILE, gpu="0", minute=T0, activity=0.5)
    Checkpoint.objects.create(run=run, attempt=attempt, step=1, uri=HOSTILE, saved_at=T0)

    content = page(client, world.researcher_a, telemetry_url(run))

    assert HOSTILE not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content  # the tables
    assert "\\u003Cscript\\u003E" not in content  # the chart data holds it HTML-escaped...
    chart = chart_payload(content, "activity-chart-data")
    # ...so that Plotly, which reads some HTML in labels, shows it as text.
    assert chart["lines"][0]["name"] == ("Attempt 1 · &lt;script&gt;alert(1)&lt;/script&gt; GPU 0")
    assert chart["markers"]["text"] == [
        "Attempt 1: checkpoint of step 1 saved (cluster) &lt;script&gt;alert(1)&lt;/script&gt;"
    ]
    assert "\\u0026lt;script\\u0026gt;" in content


@pytest.mark.parametrize(
    "persona", ["researcher_a", "researcher_a2", "tenant_admin_a", "finance", "platform_admin"]
)
def test_readers_of_the_tenant_see_the_run_telemetry(client, world, persona):
    run = submit(world)

    page(client, getattr(world, persona), telemetry_url(run))


def test_run_telemetry_is_404_for_other_tenants_and_missing_runs(client, world):
    run = submit(world)
    client.force_login(world.researcher_b)

    assert client.get(telemetry_url(run)).status_code == 404
    assert client.get(reverse("telemetry:run_telemetry", args=[run.pk + 1000])).status_code == 404


@pytest.mark.parametrize(
    "name",
    [
        "telemetry:run_telemetry",
        "telemetry:goodput",
        "telemetry:tenant_goodput",
        "telemetry:unmapped_samples",
    ],
)
def test_anonymous_is_sent_to_login(client, world, name):
    run = submit(world)
    args = {"telemetry:run_telemetry": [run.pk], "telemetry:tenant_goodput": ["vision"]}
    url = reverse(name, args=args.get(name, []))

    response = client.get(url)

    assert response.status_code == 302
    assert response.url == f"{reverse('login')}?next={url}"


def test_run_telemetry_queries_do_not_grow_with_attempts(
    client, world, django_assert_max_num_queries
):
    run = submit(world)

    def add_attempt(number: int) -> None:
        attempt = attempt_of(
            world, run, number=number, state=AttemptState.FAILED, start=T0 + timedelta(hours=number)
        )
        account(attempt, allocated=3600, lost=600)
        GpuMinute.objects.create(attempt=attempt, host="n", gpu="0", minute=attempt.started_at)
        StepWindow.objects.create(
            attempt=attempt,
            source="r0",
            seq=1,
            start=attempt.started_at,
            end=attempt.finished_at,
            steps=10,
            step_time_s=1.0,
        )
        Checkpoint.objects.create(
            run=run, attempt=attempt, step=number, uri="s3://c", saved_at=attempt.started_at
        )

    add_attempt(1)
    client.force_login(world.researcher_a)
    with CaptureQueriesContext(connection) as one_attempt:
        client.get(telemetry_url(run))
    for number in range(2, 12):
        add_attempt(number)

    # 17 for the page and its charts (two for the ranks reporting), 6 for the verdicts'
    # facts (the attempts' nodes, the image's versions, the straggler flags, the ranks'
    # versions, InfiniBand, NVLink errors).
    with django_assert_max_num_queries(23), CaptureQueriesContext(connection) as many:
        response = client.get(telemetry_url(run))

    assert len(response.context["telemetry"].attempts) == 11
    assert len(many) == len(one_attempt)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0 s"),
        (59.4, "59 s"),
        (60, "1 min 00 s"),
        (3599, "59 min 59 s"),
        (3600, "1 h 00 min"),
        (86399, "23 h 59 min"),
        (90000, "1 d 1 h"),
    ],
)
def test_durations_read_like_people_write_them(seconds, expected):
    assert duration_text(seconds) == expected


def test_run_page_links_to_its_gpu_usage(client, world):
    run = submit(world)

    content = page(client, world.researcher_a, reverse("jobs:run_detail", args=[run.pk]))

    assert f'<a class="button" href="{telemetry_url(run)}">Open GPU usage</a>' in content


# --- a tenant's goodput -----------------------------------------------------------------------


def today_at(days_ago: int, hour: int = 12) -> datetime:
    """``hour`` o'clock, ``days_ago`` days before today, in the current time zone."""
    day = timezone.localdate() - timedelta(days=days_ago)
    return datetime.combine(day, time(hour), tzinfo=timezone.get_current_timezone())


def finished(world, run: Run, *, days_ago: int, number: int = 1, **accounting) -> Attempt:
    """An attempt of ``run`` that ended at noon ``days_ago`` days ago, with its accounting."""
    end = today_at(days_ago)
    attempt = attempt_of(world, run, number=number, start=end - timedelta(hours=1))
    account(attempt, **accounting)
    return attempt


@pytest.fixture
def goodput_world(world):
    """Vision: alice in detection (two days), arthur in segmentation; nlp: bob."""
    segmentation = Project.objects.create(tenant=world.vision, slug="segmentation", name="Seg")
    alice_run = submit(world)
    finished(world, alice_run, days_ago=0, allocated=7200, idle=1800)
    finished(world, alice_run, days_ago=2, number=2, allocated=3600, lost=1800)
    arthur_run = submit(world, user=world.researcher_a2, project=segmentation.slug)
    finished(world, arthur_run, days_ago=2, allocated=14400, input_wait=3600, comm_wait=1800)
    old_run = submit(world, user=world.researcher_a2)
    finished(world, old_run, days_ago=40, allocated=36000)
    nlp_run = submit(world, user=world.researcher_b, tenant="nlp", project="llm")
    finished(world, nlp_run, days_ago=1, allocated=99000)
    return world


def window(days: int) -> tuple[datetime, datetime]:
    since = today_at(days - 1, hour=0)
    return since, today_at(-1, hour=0)


def test_goodput_by_period_sums_in_sql_and_fills_empty_days(
    goodput_world, django_assert_num_queries
):
    since, until = window(7)

    with django_assert_num_queries(1):
        rows = tenant_goodput.goodput_by_period(
            tenant=goodput_world.vision, since=since, until=until, period=GoodputPeriod.DAY
        )

    assert [day for day, _ in rows] == [
        timezone.localdate() - timedelta(days=n) for n in range(6, -1, -1)
    ]
    by_day = dict(rows)
    assert by_day[timezone.localdate()] == GpuSeconds(
        allocated=7200, effective=5400, idle=1800, attempts=1
    )
    assert by_day[timezone.localdate() - timedelta(days=2)] == GpuSeconds(
        allocated=18000, effective=10800, lost=1800, input_wait=3600, comm_wait=1800, attempts=2
    )
    assert by_day[timezone.localdate() - timedelta(days=1)] == GpuSeconds()  # nlp's day


def test_goodput_by_week_starts_on_mondays(goodput_world):
    since, until = window(90)

    rows = tenant_goodput.goodput_by_period(
        tenant=goodput_world.vision, since=since, until=until, period=GoodputPeriod.WEEK
    )

    assert all(start.weekday() == 0 for start, _ in rows)
    assert sum(seconds.allocated for _, seconds in rows) == 7200 + 3600 + 14400 + 36000
    assert sum(seconds.attempts for _, seconds in rows) == 4


def test_goodput_by_user_and_by_project(goodput_world, django_assert_num_queries):
    since, until = window(30)
    vision = goodput_world.vision

    with django_assert_num_queries(2):
        by_user = tenant_goodput.goodput_by_user(tenant=vision, since=since, until=until)
        by_project = tenant_goodput.goodput_by_project(tenant=vision, since=since, until=until)

    assert by_user == [
        (
            "arthur",
            GpuSeconds(
                allocated=14400, effective=9000, input_wait=3600, comm_wait=1800, attempts=1
            ),
        ),
        ("alice", GpuSeconds(allocated=10800, effective=7200, lost=1800, idle=1800, attempts=2)),
    ]
    assert by_project == [
        (
            "segmentation",
            "Seg",
            GpuSeconds(
                allocated=14400, effective=9000, input_wait=3600, comm_wait=1800, attempts=1
            ),
        ),
        (
            "detection",
            "Detection",
            GpuSeconds(allocated=10800, effective=7200, lost=1800, idle=1800, attempts=2),
        ),
    ]
    assert by_user[1][1].largest_waste.label == "Lost work"  # a tie goes to the first
    assert by_user[0][1].largest_waste.label == "Input wait"


def test_tenant_goodput_page_shows_exact_numbers(client, goodput_world):
    url = reverse("telemetry:tenant_goodput", args=["vision"])

    content = page(client, goodput_world.researcher_a, url)

    assert '<dd data-kpi="goodput">64.3 %</dd>' in content  # 16,200 of 25,200 GPU-s
    assert '<dd data-kpi="attempts">3</dd>' in content
    # User, attempts, allocated, effective, goodput, largest waste, activity-weighted.
    assert row(content, '<tr data-row="arthur">') == [
        "arthur", "1", "4.00", "2.50", "62.5 %", "Input wait 1.00 GPU-h, 25.0 %", "0.00",
    ]  # fmt: skip
    assert row(content, '<tr data-row="alice">') == [
        "alice", "2", "3.00", "2.00", "66.7 %", "Lost work and Idle 0.50 GPU-h each, 16.7 %",
        "0.00",
    ]  # fmt: skip
    assert row(content, '<tr data-row="segmentation">')[:5] == [
        "Seg segmentation", "1", "4.00", "2.50", "62.5 %",
    ]  # fmt: skip
    chart = chart_payload(content, "goodput-chart-data")
    assert len(chart["categories"]) == 30
    assert chart["categories"][-1] == timezone.localdate().isoformat()
    values = {trace["key"]: trace["values"] for trace in chart["traces"]}
    assert (values["effective"][-1], values["idle"][-1]) == (1.5, 0.5)
    assert (values["effective"][-3], values["lost"][-3], values["input_wait"][-3]) == (
        3.0,
        0.5,
        1.0,
    )
    assert sum(values["effective"]) == 4.5
    assert PLOTLY in content


def test_a_longer_period_takes_in_older_attempts(client, goodput_world):
    url = reverse("telemetry:tenant_goodput", args=["vision"]) + "?days=90&by=week"

    content = page(client, goodput_world.researcher_a, url)

    assert '<dd data-kpi="attempts">4</dd>' in content
    assert row(content, '<tr data-row="arthur">')[:3] == ["arthur", "2", "14.00"]
    assert '<option value="week" selected>Per week</option>' in content


def test_unknown_period_values_fall_back_to_the_defaults(client, goodput_world):
    url = reverse("telemetry:tenant_goodput", args=["vision"]) + "?days=1000&by=hour"

    content = page(client, goodput_world.researcher_a, url)

    assert '<option value="30" selected>Last 30 days</option>' in content
    assert '<option value="day" selected>Per day</option>' in content


def test_the_home_pages_goodput_is_the_goodput_pages_total_and_row_of_the_user(
    goodput_world, django_assert_num_queries
):
    """telemetry.goodput answers, in one query, per tenant of a user, exactly what the
    tenant's goodput page shows over the same window: its total, and the user's row."""
    world = goodput_world
    finished(
        world,
        submit(world),
        days_ago=3,
        allocated=5400,
        startup=600,
        queue_s=12.5,
        activity_weighted=1234.5,
    )
    mixed = submit(world)
    attempt_of(world, mixed, start=today_at(1), state=AttemptState.RUNNING)  # not finished
    Membership.objects.create(user=world.researcher_a, tenant=world.nlp, role="researcher")
    # As the next request loads them: a user's roles are read once per request and cached
    users = [
        User.objects.get(pk=user.pk)
        for user in (world.researcher_a, world.researcher_a2, world.researcher_b)
    ] + [world.platform_admin]
    seen = set()
    for user in users:
        tenant_roles(user)  # read by every signed-in page (its navigation) before the home's
        for days in (1, 3, 7, 30, 60):
            since, until = goodput_window(days=days, today=timezone.localdate())
            with django_assert_num_queries(1):
                found = goodput_of_my_tenants(user=user, since=since, until=until)
            expected = []
            for tenant in Tenant.objects.filter(memberships__user=user).order_by("slug"):
                days_of = tenant_goodput.goodput_by_period(
                    tenant=tenant, since=since, until=until, period=GoodputPeriod.DAY
                )
                total = sum((seconds for _, seconds in days_of), GpuSeconds())
                if not total.attempts:
                    continue
                rows = dict(tenant_goodput.goodput_by_user(tenant=tenant, since=since, until=until))
                mine = rows.get(user.username, GpuSeconds())
                expected.append((tenant.slug, total, mine))
            assert [(item.slug, item.tenant, item.mine) for item in found] == [
                (slug, _exact(total), _exact(mine)) for slug, total, mine in expected
            ], (user, days)
            seen.add(tuple(item.mine.attempts for item in found))
    assert len(seen) >= 4  # the cases compared are not all alike
    world.vision.active = False
    world.vision.save(update_fields=["active"])
    since, until = goodput_window(days=60, today=timezone.localdate())
    assert [
        item.slug
        for item in goodput_of_my_tenants(
            user=User.objects.get(pk=world.researcher_a.pk), since=since, until=until
        )
    ] == ["nlp"]


def _exact(seconds: GpuSeconds) -> GpuSeconds:
    """A sum of page figures as the one query returns it (no attempt: no queue time)."""
    return seconds if seconds.attempts else GpuSeconds(attempts=0)


def test_goodput_without_finished_attempts_says_so(client, world):
    content = page(client, world.researcher_a, reverse("telemetry:tenant_goodput", args=["vision"]))

    assert "No finished attempts in the last 30 days" in content
    assert PLOTLY not in content


def test_goodput_index_goes_to_the_users_tenant(client, world):
    client.force_login(world.researcher_a)

    response = client.get(reverse("telemetry:goodput") + "?days=7")

    assert response.status_code == 302
    assert response.url == "/tenants/vision/goodput/?days=7&by=day"


@pytest.mark.parametrize(("persona", "slugs"), [
    ("researcher_a", {"vision"}),
    ("tenant_admin_a", {"vision"}),
    ("researcher_b", {"nlp"}),
    ("finance", {"vision", "nlp"}),
    ("platform_admin", {"vision", "nlp"}),
])  # fmt: skip
def test_goodput_is_shown_to_members_finance_and_platform_admins_only(
    client, world, persona, slugs
):
    client.force_login(getattr(world, persona))

    for slug in ("vision", "nlp"):
        url = reverse("telemetry:tenant_goodput", args=[slug])
        assert client.get(url).status_code == (200 if slug in slugs else 404), slug
        redirect = client.get(reverse("telemetry:goodput") + f"?tenant={slug}")
        assert redirect.status_code == (302 if slug in slugs else 404), slug


def test_goodput_is_404_for_a_user_without_tenants(client, world):
    client.force_login(make_user("nobody"))

    assert client.get(reverse("telemetry:goodput")).status_code == 404
    assert client.get(reverse("telemetry:tenant_goodput", args=["vision"])).status_code == 404


def test_goodput_page_queries_do_not_grow_with_attempts(
    client, world, django_assert_max_num_queries
):
    run = submit(world)
    finished(world, run, days_ago=1, allocated=3600)
    client.force_login(world.finance)
    url = reverse("telemetry:tenant_goodput", args=["vision"])
    with CaptureQueriesContext(connection) as one_attempt:
        client.get(url)
    users = [make_user(f"user-{n}") for n in range(6)]
    for n in range(40):
        many = Run.objects.create(
            experiment=run.experiment,
            tenant=world.vision,
            flavor=world.a100,
            gpus=2,
            submitted_by=users[n % 6],
        )
        finished(world, many, days_ago=n % 20, allocated=3600 + n, idle=n)

    with django_assert_max_num_queries(12), CaptureQueriesContext(connection) as many_attempts:
        response = client.get(url)

    assert response.context["total"].attempts == 41
    assert len(response.context["by_user"]) == 7
    assert len(many_attempts) == len(one_attempt)


# --- unmapped samples -----------------------------------------------------------------------


def test_unmapped_samples_totals_by_source_and_recent_minutes(client, world):
    now = timezone.now().replace(second=0, microsecond=0)
    for minutes_ago, source, count in (
        (5, "dcgm@node-7", 120),
        (60 * 30, "dcgm@node-7", 40),  # 30 hours ago: in the week, not the day
        (10, "prometheus", 8),
        (60 * 24 * 8, "old-source", 1000),  # more than 7 days ago
    ):
        UnmappedSamples.objects.create(
            minute=now - timedelta(minutes=minutes_ago), source=source, count=count
        )

    content = page(client, world.platform_admin, reverse("telemetry:unmapped_samples"))

    assert row(content, '<tr data-source="dcgm@node-7">')[:3] == ["dcgm@node-7", "120", "160"]
    assert row(content, '<tr data-source="prometheus">')[:3] == ["prometheus", "8", "8"]
    assert 'data-source="old-source"' not in content
    assert content.count('<td class="mono">old-source</td>') == 1  # still in the recent rows
    assert "used outside Gantry" in content and "mapping gap" in content


def test_unmapped_samples_are_paginated(client, world):
    UnmappedSamples.objects.bulk_create(
        UnmappedSamples(minute=T0 + timedelta(minutes=n), source="dcgm", count=1) for n in range(51)
    )

    content = page(client, world.platform_admin, reverse("telemetry:unmapped_samples") + "?page=2")

    assert "Page 2 of 2 · 51 minutes" in content
    assert content.count('<td class="mono">dcgm</td>') == 1


def test_unmapped_source_labels_are_escaped(client, world):
    UnmappedSamples.objects.create(minute=timezone.now(), source=HOSTILE, count=3)

    content = page(client, world.platform_admin, reverse("telemetry:unmapped_samples"))

    assert HOSTILE not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content


@pytest.mark.parametrize("persona", ["researcher_a", "tenant_admin_a", "finance"])
def test_unmapped_samples_are_for_platform_admins_only(client, world, persona):
    client.force_login(getattr(world, persona))

    assert client.get(reverse("telemetry:unmapped_samples")).status_code == 404


# --- navigation ------------------------------------------------------------------------------


def test_navigation_links_goodput_for_readers_and_unmapped_for_platform_admins(client, world):
    researcher = page(client, world.researcher_a, reverse("jobs:run_list"))
    admin = page(client, world.platform_admin, reverse("jobs:run_list"))
    nobody = page(client, make_user("nobody"), reverse("jobs:run_list"))

    assert '<a href="/goodput/">Goodput</a>' in researcher
    assert "/telemetry/unmapped/" not in researcher
    assert '<a href="/goodput/">Goodput</a>' in admin
    assert '<a href="/telemetry/unmapped/">Unmapped</a>' in admin
    assert "/goodput/" not in nobody
