"""DCGM exposition parsing, mapping to attempts and minute rollups (pure, no database)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.exposition.ingestor import Ingestor, ingest
from telemetry.exposition.mapping import (
    AllocationIndex,
    HostAllocation,
    KubernetesJobAllocation,
    PodAllocation,
    SlurmAllocation,
    map_samples,
)
from telemetry.exposition.parsing import (
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    KEPT_METRICS,
    MAX_BODY_BYTES,
    POWER_USAGE,
    TENSOR_ACTIVE,
    VALUE_CEILING,
    XID_ERRORS,
    BodyTooLarge,
    ExpositionParser,
    GpuSample,
    ParseStats,
    parse,
    render,
)
from telemetry.exposition.rollups import MinuteRollup, MinuteRollups, rollup_minutes

T0 = 1_700_000_040_000  # Unix ms at the start of a minute
LABELS = (
    'gpu="0",UUID="GPU-604ac76c",pci_bus_id="00000000:07:00.0",device="nvidia0",'
    'modelName="NVIDIA A100-SXM4-80GB",Hostname="node1",DCGM_FI_DRIVER_VERSION="550.54",'
    'container="trainer",namespace="team-a",pod="train-42-0-abcde"'
)


def sample(metric=GR_ENGINE_ACTIVE, value=0.5, ts=T0, host="node1", gpu="0", **labels):
    return GpuSample(host, gpu, "GPU-1", metric, value, ts, **labels)


def line_count(body: bytes) -> int:
    pieces = body.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    return len(pieces)


def test_dcgm_exporter_output_keeps_used_metrics_and_counts_the_rest():
    body = (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 97\n"
        f"DCGM_FI_DEV_MEM_CLOCK{{{LABELS}}} 1593\n"
        "\n"
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{LABELS}}} 0.812 {T0 + 5}\n"
    )

    result = parse(body, default_ts=T0)

    assert result.samples == [
        GpuSample(
            "node1",
            "0",
            "GPU-604ac76c",
            GPU_UTIL,
            97.0,
            T0,
            "train-42-0-abcde",
            "team-a",
            "trainer",
        ),
        GpuSample(
            "node1",
            "0",
            "GPU-604ac76c",
            GR_ENGINE_ACTIVE,
            0.812,
            T0 + 5,
            "train-42-0-abcde",
            "team-a",
            "trainer",
        ),
    ]
    assert result.types == {"DCGM_FI_DEV_GPU_UTIL": "gauge"}
    assert result.help == {"DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %)."}
    stats = result.stats
    assert (stats.lines, stats.samples, stats.comments, stats.blanks, stats.ignored) == (
        6,
        2,
        2,
        1,
        1,
    )
    assert stats.accounted() == stats.lines


def test_both_hostname_spellings_old_label_names_and_slurm_jobs_are_normalized():
    body = (
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-a",hostname="node2",hpc_job="4711"} 2048\n'
        'DCGM_FI_DEV_FB_USED{gpu="2",uuid="GPU-b",Hostname="node3",pod_name="p",'
        'pod_namespace="ns",container_name="c"} 1024\n'
    )

    samples = parse(body, default_ts=T0).samples

    assert samples == [
        GpuSample("node2", "1", "GPU-a", FB_USED, 2048.0, T0, hpc_job="4711"),
        GpuSample("node3", "2", "GPU-b", FB_USED, 1024.0, T0, "p", "ns", "c"),
    ]


def test_escaped_label_values_are_unescaped():
    body = 'DCGM_FI_DEV_POWER_USAGE{gpu="0",Hostname="a\\"b\\\\c\\nd",pod=""} 250.5\n'

    (only,) = parse(body, default_ts=T0).samples

    assert only.host == 'a"b\\c\nd'
    assert only.pod == ""
    assert only.value == 250.5


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} NaN', "non_finite"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} +Inf', "non_finite"),
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"} -Inf', "non_finite"),
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0"} 1.5', "out_of_range"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 101', "out_of_range"),
        ('DCGM_FI_DEV_POWER_USAGE{gpu="0"} -1', "out_of_range"),
        ('DCGM_FI_DEV_MEM_CLOCK{gpu="0"} NaN', "ignored"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0" 97', "malformed"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",gpu="1"} 97', "malformed"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="\\x"} 97', "malformed"),
        ("DCGM_FI_DEV_GPU_UTIL{gpu=0} 97", "malformed"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} ninety', "malformed"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 9_7', "malformed"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 97 12.5', "malformed"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 97 1 2', "malformed"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"}', "malformed"),
        ('9DCGM{gpu="0"} 97', "malformed"),
        ('{gpu="0"} 97', "malformed"),
        ("# TYPE DCGM_FI_DEV_GPU_UTIL thermometer", "malformed"),
        ("# HELP", "malformed"),
        ("# any other comment", "comments"),
        (" \t ", "blanks"),
        ("\x0c", "malformed"),
    ],
)
def test_each_bad_line_is_counted_once_under_its_problem(line, problem):
    stats = parse(line + "\n", default_ts=T0).stats

    assert getattr(stats, problem) == 1
    assert stats.lines == stats.accounted() == 1
    assert stats.samples == 0


def test_samples_without_labels_or_with_a_trailing_comma_and_spaces_parse():
    body = 'DCGM_FI_DEV_GPU_UTIL 40\n  DCGM_FI_DEV_GPU_UTIL { gpu = "3" , } 41  \n'

    samples = parse(body, default_ts=T0).samples

    assert [(s.gpu, s.value) for s in samples] == [("", 40.0), ("3", 41.0)]


def test_lines_that_are_not_utf8_are_malformed_and_the_rest_still_parse():
    body = b'DCGM_FI_DEV_GPU_UTIL{gpu="\xff"} 1\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} 2\n'

    result = parse(body, default_ts=T0)

    assert [s.value for s in result.samples] == [2.0]
    assert (result.stats.lines, result.stats.malformed) == (2, 1)


def test_a_body_over_the_cap_is_refused_with_a_clear_error():
    body = b"#" * (MAX_BODY_BYTES + 1)

    with pytest.raises(BodyTooLarge, match=r"8,388,609 bytes, over the 8,388,608-byte limit"):
        parse(body, default_ts=T0)


def test_the_parser_cache_does_not_leak_between_different_label_sets():
    parser = ExpositionParser()
    first = parser.parse('DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="a"} 1\n', default_ts=T0)
    second = parser.parse('DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="b"} 2\n', default_ts=T0)

    assert [s.pod for s in first.samples + second.samples] == ["a", "b"]


# Mapping -------------------------------------------------------------------------------


def test_samples_map_by_pod_by_slurm_job_and_by_host_gpu_and_time():
    allocations = [
        PodAllocation("team-a", "train-1", attempt_id=1),
        SlurmAllocation("4711", attempt_id=2),
        HostAllocation("node9", "0", start_ms=T0, end_ms=T0 + 60_000, attempt_id=3),
        HostAllocation("node9", "0", start_ms=T0 + 60_000, end_ms=None, attempt_id=4),
    ]
    by_pod = sample(pod="train-1", namespace="team-a")
    by_job = sample(hpc_job="4711")
    by_host = sample(host="node9", ts=T0 + 59_999)
    by_host_later = sample(host="node9", ts=T0 + 60_000)
    foreign_pod = sample(host="node9", pod="not-ours", namespace="team-a")
    before_window = sample(host="node9", ts=T0 - 1)
    unknown_job = sample(hpc_job="9999")

    mapped, unmapped = map_samples(
        [by_pod, by_job, by_host, by_host_later, foreign_pod, before_window, unknown_job],
        allocations,
    )

    assert mapped == [(1, by_pod), (2, by_job), (3, by_host), (4, by_host_later)]
    assert unmapped == 3


def test_pods_of_a_kubernetes_job_map_to_its_attempt_in_its_namespace_only():
    index = AllocationIndex(
        [
            KubernetesJobAllocation("gantry-vision", "gantry-a12", attempt_id=12),
            KubernetesJobAllocation("gantry-vision", "gantry-a1", attempt_id=1),
        ]
    )
    indexed = sample(pod="gantry-a12-3-x7k2q", namespace="gantry-vision")
    plain = sample(pod="gantry-a12-b9z4m", namespace="gantry-vision")
    other_job = sample(pod="gantry-a1-0-qqqqq", namespace="gantry-vision")
    other_namespace = sample(pod="gantry-a12-0-x7k2q", namespace="gantry-nlp")
    lookalike = sample(pod="gantry-a123-0-x7k2q", namespace="gantry-vision")
    missed: list = []

    mapped, unmapped = index.map(
        [indexed, plain, other_job, other_namespace, lookalike, indexed], missed
    )

    assert mapped == [(12, indexed), (12, plain), (1, other_job), (12, indexed)]
    assert (unmapped, missed) == (2, [other_namespace, lookalike])


# Rollups -------------------------------------------------------------------------------


def test_rollup_prefers_gr_engine_active_and_falls_back_to_gpu_util():
    mapped = [
        (7, sample(GR_ENGINE_ACTIVE, 0.4, T0)),
        (7, sample(GR_ENGINE_ACTIVE, 0.6, T0 + 30_000)),
        (7, sample(GPU_UTIL, 100.0, T0)),
        (7, sample(GPU_UTIL, 80.0, T0 + 60_000)),
        (7, sample(TENSOR_ACTIVE, 0.25, T0)),
        (7, sample(FB_USED, 100.0, T0)),
        (7, sample(FB_USED, 300.0, T0 + 30_000)),
        (7, sample(POWER_USAGE, 200.0, T0)),
        (7, sample(POWER_USAGE, 300.0, T0 + 30_000)),
        (7, sample(XID_ERRORS, 79.0, T0 + 10_000)),
        (7, sample(XID_ERRORS, 0.0, T0 + 20_000)),
    ]

    rows, stats = rollup_minutes(mapped)

    minute = T0 // 1000
    assert rows == [
        MinuteRollup(
            attempt_id=7,
            host="node1",
            gpu="0",
            minute=minute,
            activity=0.5,
            sm_active=None,
            tensor_active=0.25,
            dram_active=None,
            fb_used=300.0,
            power=250.0,
            xid=79,
            samples=10,
        ),
        MinuteRollup(7, "node1", "0", minute + 60, 0.8, None, None, None, None, None, 0, 1),
    ]
    assert (stats.samples, stats.duplicates) == (11, 0)


def test_rollup_skips_duplicates_and_accepts_samples_out_of_order():
    late, early = sample(value=0.2, ts=T0 + 30_000), sample(value=0.6, ts=T0)
    duplicate = sample(value=0.9, ts=T0 + 30_000)

    rows, stats = rollup_minutes([(1, late), (1, early), (1, duplicate)])

    assert [row.activity for row in rows] == [pytest.approx(0.4)]
    assert (stats.samples, stats.duplicates) == (2, 1)


def test_the_same_gpu_index_on_two_hosts_of_one_attempt_stays_two_gpus():
    rows, _ = rollup_minutes([(1, sample(host="a")), (1, sample(host="b"))])

    assert [(row.host, row.gpu) for row in rows] == [("a", "0"), ("b", "0")]


def test_ingest_counts_what_it_could_not_map_and_rolls_up_the_rest():
    mine = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n",namespace="t",pod="p"} 50\n'
    other = 'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="n",namespace="t",pod="q"} 50\n'
    bodies = [(mine + other, T0), (mine + other, T0 + 30_000), (mine, T0 + 30_000)]

    rows, parse_stats, unmapped, rollup_stats = ingest(bodies, [PodAllocation("t", "p", 5)])

    assert [(row.attempt_id, row.activity, row.samples) for row in rows] == [(5, 0.5, 2)]
    assert (parse_stats.samples, unmapped, rollup_stats.duplicates) == (5, 2, 1)


# Fuzz and round trip -------------------------------------------------------------------

FRAGMENTS = st.sampled_from(
    [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_MEM_CLOCK",
        "{",
        "}",
        '"',
        "\\",
        "\\n",
        '\\"',
        "=",
        ",",
        "gpu",
        "Hostname",
        "pod",
        "NaN",
        "+Inf",
        "-Inf",
        "1e400",
        "0.5",
        "97",
        "-3",
        "1_0",
        "١",
        " ",
        "\t",
        "\r",
        "\x00",
        "#",
        "# HELP ",
        "# TYPE ",
        "gauge",
        "é",
        "\n",
    ]
)
HOSTILE_BODY = st.lists(st.one_of(FRAGMENTS, st.text(max_size=5)), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(HOSTILE_BODY)
def test_hostile_text_never_raises_and_every_line_is_counted(body):
    stats = ExpositionParser().parse(body, default_ts=T0).stats

    assert stats.lines == line_count(body.encode()) == stats.accounted()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_raise_and_every_line_is_counted(body):
    result = parse(body, default_ts=T0)

    assert result.stats.lines == line_count(body) == result.stats.accounted()
    assert all(math.isfinite(s.value) for s in result.samples)


LABEL_VALUE = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)


@st.composite
def gpu_samples(draw):
    metric = draw(st.sampled_from(sorted(KEPT_METRICS)))
    ceiling = min(VALUE_CEILING[metric], 1e12)
    return GpuSample(
        host=draw(LABEL_VALUE),
        gpu=draw(LABEL_VALUE),
        uuid=draw(LABEL_VALUE),
        metric=metric,
        value=draw(st.floats(0, ceiling, allow_nan=False)),
        ts=draw(st.integers(-(2**53), 2**53)),
        pod=draw(LABEL_VALUE),
        namespace=draw(LABEL_VALUE),
        container=draw(LABEL_VALUE),
        hpc_job=draw(LABEL_VALUE),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(gpu_samples(), max_size=20))
def test_rendered_exposition_round_trips_exactly(samples):
    body = render(samples)

    result = ExpositionParser().parse(body.encode(), default_ts=0)

    assert result.samples == samples
    assert result.stats.samples == result.stats.lines == len(samples)


# The one-pass ingestor gives what parse -> map -> roll up gives --------------------------

EQUIVALENCE_ALLOCATIONS = [
    PodAllocation("ns", "p1", 1),
    KubernetesJobAllocation("ns", "job", 2),
    SlurmAllocation("77", 3),
    HostAllocation("h", "0", T0, T0 + 90_000, 4),
    HostAllocation("h", "0", T0 + 90_000, None, 5),
    HostAllocation("h", "1", T0 + 30_000, T0 + 60_000, 6),
]
SERIES_LABELS = st.sampled_from(
    [
        'gpu="0",Hostname="h",namespace="ns",pod="p1"',
        'Hostname="h",gpu="0",pod="p1",namespace="ns"',  # same series, other order
        'gpu="1",hostname="h",namespace="ns",pod="job-3-xyz"',
        'gpu="1",Hostname="h",namespace="other",pod="p1"',
        'gpu="0",Hostname="s",hpc_job="77"',
        'gpu="0",Hostname="s",hpc_job="78"',
        'gpu="0",Hostname="h"',
        'gpu="1",Hostname="h",pod=""',
        'gpu="2",Hostname="h"',
        'gpu="0",Hostname="h",gpu="1"',  # duplicate label: malformed
        'gpu="0",Hostname="h\\q\\"}"',  # escapes and a brace inside a value
    ]
)
METRIC_NAMES = st.sampled_from([*sorted(KEPT_METRICS), "DCGM_FI_DEV_MEM_CLOCK", "9bad"])
VALUE_TEXT = st.sampled_from(["0.25", "1", "97", "0", "-1", "2", "NaN", "+Inf", "1_0", "x", "3"])
STAMP = st.one_of(
    st.just(""),
    st.integers(T0 - 60_000, T0 + 240_000).map(lambda ts: f" {ts}"),
    st.sampled_from([" 1_0", " x", " 5 6"]),
)


@st.composite
def sample_lines(draw):
    padding = draw(st.sampled_from(["", " ", "\t"]))
    return (
        f"{padding}{draw(METRIC_NAMES)}{{{draw(SERIES_LABELS)}}} {draw(VALUE_TEXT)}"
        f"{draw(STAMP)}{padding}"
    )


EXPOSITION_LINES = st.one_of(
    sample_lines(),
    st.sampled_from(["", "  ", "# HELP x y", "# TYPE x gauge", "# TYPE x bogus", "x 1", "}"]),
    HOSTILE_BODY,
)
SCRAPES = st.lists(
    st.tuples(
        st.lists(EXPOSITION_LINES, max_size=25).map(lambda lines: "\n".join(lines)),
        st.sampled_from([T0, T0 + 30_000, T0 + 150_000]),
        st.sampled_from(["a", "b"]),
    ),
    max_size=6,
)


def reference_ingest(scrapes, start_ms, end_ms):
    """parse -> map -> roll up, one sample object at a time: the obvious way."""
    parser, index, rollups = ExpositionParser(), AllocationIndex(EQUIVALENCE_ALLOCATIONS), None
    rollups = MinuteRollups()
    totals, unmapped = ParseStats(), {}
    for body, at, origin in scrapes:
        result = parser.parse(body.encode(), default_ts=at)
        totals.add(result.stats)
        inside = [s for s in result.samples if start_ms <= s.ts < end_ms]
        missed = []
        mapped, _ = index.map(inside, missed)
        rollups.add(mapped)
        for missed_sample in missed:
            key = (missed_sample.ts // 60_000 * 60, origin)
            unmapped[key] = unmapped.get(key, 0) + 1
    return rollups.rows(), totals, unmapped, rollups.stats


@settings(max_examples=400, deadline=None)
@given(SCRAPES, st.sampled_from([(None, None), (T0, T0 + 60_000), (T0 + 30_000, T0 + 120_000)]))
def test_the_one_pass_ingestor_gives_what_parse_map_and_rollup_give(scrapes, window):
    start_ms, end_ms = window
    ingestor = Ingestor(EQUIVALENCE_ALLOCATIONS, start_ms=start_ms, end_ms=end_ms)
    for body, at, origin in scrapes:
        ingestor.feed(body.encode(), default_ts=at, origin=origin)

    rows, totals, unmapped, rollup_stats = reference_ingest(
        scrapes, -math.inf if start_ms is None else start_ms, math.inf if end_ms is None else end_ms
    )
    assert ingestor.rows() == rows
    assert ingestor.stats == totals
    assert dict(ingestor.unmapped) == unmapped
    assert ingestor.rollups.stats == rollup_stats


def test_the_ingestor_learns_each_head_once_and_counts_like_the_parser():
    body = (
        "# HELP DCGM_FI_DEV_GPU_UTIL util\n"
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} 50\n"
        f"DCGM_FI_DEV_MEM_CLOCK{{{LABELS}}} 1593\n"
        f"DCGM_FI_DEV_GPU_UTIL{{{LABELS}}} NaN\n"
        "\n"
    )
    ingestor = Ingestor([PodAllocation("team-a", "train-42-0-abcde", 9)])
    ingestor.feed(body, default_ts=T0)
    ingestor.feed(body, default_ts=T0 + 30_000)

    assert (ingestor.stats.lines, ingestor.stats.samples, ingestor.stats.ignored) == (10, 2, 2)
    assert (ingestor.stats.comments, ingestor.stats.non_finite, ingestor.stats.blanks) == (2, 2, 2)
    assert [(row.attempt_id, row.activity, row.samples) for row in ingestor.rows()] == [(9, 0.5, 2)]
    assert len(ingestor._routes) == 2  # the GPU_UTIL and MEM_CLOCK heads, learned once


def test_the_dcgm_4_6_xid_name_rolls_up_as_the_xid_and_counts_as_one_metric():
    body = (
        'DCGM_FI_DEV_XID_ERROR{gpu="0",Hostname="node1",hpc_job="7"} 79\n'
        f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",Hostname="node1",hpc_job="7"}} 79 {T0}\n'
    )

    rows, stats, unmapped, rollup_stats = ingest([(body, T0)], [SlurmAllocation("7", 1)])

    assert [(row.attempt_id, row.xid, row.samples) for row in rows] == [(1, 79, 1)]
    assert (stats.samples, unmapped, rollup_stats.duplicates) == (2, 0, 1)
    assert parse(body, default_ts=T0).samples[0].metric == XID_ERRORS
