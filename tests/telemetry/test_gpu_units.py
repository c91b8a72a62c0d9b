"""GPU time and shares in the unit that makes them readable (telemetry/templatetags)."""

from types import SimpleNamespace

import pytest
from django.template import Context, Template

from telemetry.templatetags.gpu_units import gpu_time, mostly, share_percent


@pytest.mark.parametrize(
    ("gpu_seconds", "shown"),
    [
        (0, "0 GPU-h"),
        (0.2, "<1 GPU-s"),
        (1, "1 GPU-s"),
        (14.4, "14 GPU-s"),  # 0.004 GPU-hours
        (59, "59 GPU-s"),
        (60, "1.0 GPU-min"),
        (144, "2.4 GPU-min"),  # 0.04 GPU-hours
        (359, "6.0 GPU-min"),
        (360, "0.10 GPU-h"),
        (1200, "0.33 GPU-h"),
        (3600, "1.00 GPU-h"),
        (8280, "2.30 GPU-h"),
        (4_500_000, "1,250.00 GPU-h"),
        (None, ""),
    ],
)
def test_gpu_time_picks_hours_minutes_or_seconds(gpu_seconds, shown):
    assert gpu_time(gpu_seconds) == shown


@pytest.mark.parametrize(
    ("percent", "shown"),
    [
        (0, "0.0 %"),
        (0.03, "<0.1 %"),
        (0.05, "0.1 %"),
        (2.44, "2.4 %"),
        (100, "100.0 %"),
        (None, "—"),
    ],
)
def test_share_percent_never_shows_a_non_zero_share_as_zero(percent, shown):
    assert share_percent(percent) == shown


@pytest.mark.parametrize(
    ("percent", "shown"), [(0, "0 %"), (0.4, "<1 %"), (0.5, "<1 %"), (0.8, "1 %"), (25, "25 %")]
)
def test_share_percent_in_whole_percent_for_the_budget_meter(percent, shown):
    assert share_percent(percent, 0) == shown


def test_a_startup_of_fourteen_gpu_seconds_reads_as_such_beside_its_share():
    share = {"gpu_s": 14, "percent": 2.4}

    rendered = Template('{% include "telemetry/_gpu_hours.html" %}').render(
        Context({"share": share})
    )

    assert rendered.strip() == '14 GPU-s <span class="muted">2.4 %</span>'


@pytest.mark.parametrize(
    ("labels", "case", "expected"),
    [
        (["Idle"], "lower", "mostly idle"),
        (["Lost work", "Idle"], "lower", "lost work and idle equally"),
        (["GPU out of memory", "Preempted"], "", "GPU out of memory and Preempted equally"),
        (["A", "B", "C"], "", "A, B and C equally"),
        ([], "", ""),
    ],
)
def test_mostly_names_every_item_of_a_tie(labels, case, expected):
    items = [SimpleNamespace(label=label) for label in labels]
    assert mostly(items, case) == expected
