"""The node exporter's InfiniBand counters: parsed out of any exposition body, named by node,
turned into per-node minute rates and error growth (pure, no database)."""

import pytest

from telemetry.exposition.node_links import (
    IB_LINK_DOWNED,
    IB_RECEIVE_ERRORS,
    IB_RECEIVED,
    IB_SYMBOL_ERRORS,
    IB_TRANSMITTED,
    LINK_METRICS,
    LinkParser,
    LinkSample,
    NodeLinkRollup,
    NodeLinkRollups,
    instance_host,
    render_link_samples,
    scrape_host,
)

T0 = 1_700_000_040_000  # Unix ms at the start of a minute


def test_the_metric_names_are_the_node_exporters():
    # collector/infiniband_linux.go: node_infiniband_ + the names it registers.
    assert sorted(LINK_METRICS) == [
        "node_infiniband_link_downed_total",
        "node_infiniband_link_error_recovery_total",
        "node_infiniband_port_data_received_bytes_total",
        "node_infiniband_port_data_transmitted_bytes_total",
        "node_infiniband_port_errors_received_total",
        "node_infiniband_symbol_error_total",
    ]


def test_a_node_exporter_body_gives_its_infiniband_counters_and_nothing_else():
    body = (
        "# HELP node_infiniband_port_data_transmitted_bytes_total Number of data octets...\n"
        "# TYPE node_infiniband_port_data_transmitted_bytes_total counter\n"
        'node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"} 1.493376e+07\n'
        'node_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 1.8527668e+07\n'
        'node_infiniband_symbol_error_total{device="mlx5_1",port="1"} 3 1700000045000\n'
        'node_infiniband_info{board_id="MT_0000000010",device="mlx5_0"} 1\n'
        'node_infiniband_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10\n'
        'node_cpu_seconds_total{cpu="0",mode="idle"} 123.5\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="gpu-07"} 97\n'
    )

    samples, stats = LinkParser().parse(body.encode(), default_ts=T0, default_host="gpu-07")

    assert samples == [
        LinkSample("gpu-07", "mlx5_0", "1", IB_TRANSMITTED, 14933760.0, T0),
        LinkSample("gpu-07", "mlx5_0", "1", IB_RECEIVED, 18527668.0, T0),
        LinkSample("gpu-07", "mlx5_1", "1", IB_SYMBOL_ERRORS, 3.0, 1_700_000_045_000),
    ]
    assert (stats.samples, stats.rejected, stats.nameless) == (3, 0, 0)


def test_a_series_is_named_by_its_host_label_else_its_instance_else_the_scraped_host():
    body = (
        f'{IB_LINK_DOWNED}{{device="d",port="1",Hostname="gpu-01",instance="x:9100"}} 1\n'
        f'{IB_LINK_DOWNED}{{device="d",port="1",instance="gpu-02:9100",job="node"}} 2\n'
        f'{IB_LINK_DOWNED}{{device="d",port="1",instance="[fd00::3]:9100"}} 3\n'
        f'{IB_LINK_DOWNED}{{device="d",port="1",instance="gpu-04"}} 4\n'
        f'{IB_LINK_DOWNED}{{device="d",port="1"}} 5\n'
    )
    parser = LinkParser()

    scraped, _ = parser.parse(body, default_ts=T0, default_host="gpu-05")
    from_prometheus, stats = parser.parse(body, default_ts=T0)

    assert [s.host for s in scraped] == ["gpu-01", "gpu-02", "fd00::3", "gpu-04", "gpu-05"]
    assert [s.host for s in from_prometheus] == ["gpu-01", "gpu-02", "fd00::3", "gpu-04"]
    assert (stats.samples, stats.nameless) == (4, 1)


@pytest.mark.parametrize(
    "line",
    [
        f'{IB_TRANSMITTED}{{device="d",port="1"}} NaN',
        f'{IB_TRANSMITTED}{{device="d",port="1"}} +Inf',
        f'{IB_TRANSMITTED}{{device="d",port="1"}} -1',
        f'{IB_TRANSMITTED}{{device="d",port="1"}} 1_0',
        f'{IB_TRANSMITTED}{{device="d",port="1"}} ten',
        f'{IB_TRANSMITTED}{{device="d",port="1"}} 10 soon',
        f'{IB_TRANSMITTED}{{device="d",port="1"}} 10 1 2',
        f'{IB_TRANSMITTED}{{device="d",port="1"}}',
        f'{IB_TRANSMITTED}{{device="d",port="1}} 10',
        f'{IB_TRANSMITTED}{{device="d",device="e"}} 10',
    ],
)
def test_a_bad_counter_line_is_rejected_and_counted(line):
    samples, stats = LinkParser().parse(line + "\n", default_ts=T0, default_host="gpu-07")

    assert samples == []
    assert (stats.samples, stats.rejected, stats.nameless) == (0, 1, 0)


@pytest.mark.parametrize(
    ("instance", "host"),
    [
        ("gpu-07:9100", "gpu-07"),
        ("gpu-07.cluster.example:9100", "gpu-07.cluster.example"),
        ("10.0.0.7:9100", "10.0.0.7"),
        ("[fd00::7]:9100", "fd00::7"),
        ("fd00::7", "fd00::7"),
        ("gpu-07", "gpu-07"),
        ("gpu-07:metrics", "gpu-07:metrics"),
        ("", ""),
    ],
)
def test_an_instance_label_names_its_host(instance, host):
    assert instance_host(instance) == host


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://gpu-07:9100/metrics", "gpu-07"),
        ("https://GPU-07.example:9100/metrics", "gpu-07.example"),
        ("prometheus:http://prometheus:9090", ""),
        ("simulator:sim-1", ""),
        ("http://[::1", ""),
    ],
)
def test_a_scraped_url_names_the_node_of_its_samples(origin, host):
    assert scrape_host(origin) == host


def ib(metric, values, *, start_ms=T0, every_ms=15_000, host="gpu-07", device="mlx5_0", port="1"):
    return [
        LinkSample(host, device, port, metric, float(value), start_ms + i * every_ms)
        for i, value in enumerate(values)
        if value is not None
    ]


def test_traffic_is_the_counters_growth_over_time_summed_over_the_nodes_ports():
    rollups = NodeLinkRollups(start_ms=T0, end_ms=T0 + 120_000)
    gb = 1_000_000_000
    rollups.add(ib(IB_TRANSMITTED, [0, 15 * gb, 30 * gb, 45 * gb, 60 * gb, 75 * gb]))
    rollups.add(ib(IB_RECEIVED, [0, 30 * gb, 60 * gb, 90 * gb, 120 * gb, 150 * gb]))
    rollups.add(ib(IB_TRANSMITTED, [5, 7.5 * gb + 5, 15 * gb + 5], device="mlx5_1"))
    rollups.add(ib(IB_SYMBOL_ERRORS, [10, 10, 12, 12, 17]))
    rollups.add(ib(IB_TRANSMITTED, [0, 3 * gb], host="gpu-08"))

    assert rollups.rows() == [
        # Minute 0: pairs ending at :15, :30, :45 (the sample at :00 is their baseline).
        NodeLinkRollup("gpu-07", T0 // 1000, 1 * gb + 2 * gb + 0.5 * gb, 2, 2, 15),
        NodeLinkRollup("gpu-07", T0 // 1000 + 60, 3 * gb, 5, 1, 5),
        NodeLinkRollup("gpu-08", T0 // 1000, 0.2 * gb, 0, 1, 2),
    ]


def test_a_dropped_counter_is_a_reset_and_a_long_silence_gives_no_rate():
    rollups = NodeLinkRollups(start_ms=T0, end_ms=T0 + 20 * 60_000)
    rollups.add(ib(IB_TRANSMITTED, [9_000, 12_000, 600, 1_200], every_ms=60_000))
    rollups.add(ib(IB_RECEIVE_ERRORS, [4, 1, 1, 3], every_ms=60_000))
    # Then silent for 6 minutes: the next sample is a new baseline.
    rollups.add(ib(IB_TRANSMITTED, [4_800, 5_400], start_ms=T0 + 9 * 60_000, every_ms=60_000))

    assert [(row.minute - T0 // 1000, row.ib_bytes_s, row.ib_errors) for row in rollups.rows()] == [
        (0, None, 0),  # first samples: nothing to compare with
        (60, 50.0, 0),
        (120, None, 0),  # 12,000 → 600 and 4 → 1: resets, new baselines
        (180, 10.0, 2),
        (540, None, 0),  # 6 minutes after the last sample: no rate
        (600, 10.0, 0),
    ]


def test_samples_before_the_window_are_baselines_and_after_it_are_left_out():
    rollups = NodeLinkRollups(start_ms=T0, end_ms=T0 + 60_000)
    rollups.add(ib(IB_TRANSMITTED, [100, 700, 1_300, 1_900, 2_500, 3_100], start_ms=T0 - 15_000))
    rollups.add(ib(IB_LINK_DOWNED, [0, 1, 1, 1, 1, 2], start_ms=T0 - 15_000))

    assert rollups.rows() == [NodeLinkRollup("gpu-07", T0 // 1000, 40.0, 1, 1, 8)]


def test_a_sample_sent_twice_counts_once():
    rollups = NodeLinkRollups(start_ms=T0, end_ms=T0 + 60_000)
    samples = ib(IB_TRANSMITTED, [0, 1_500, 3_000])

    rollups.add(samples)
    rollups.add(samples[1:])
    rollups.add([LinkSample("gpu-07", "mlx5_0", "1", IB_TRANSMITTED, 99.0, T0 + 15_000)])

    assert rollups.duplicates == 3
    assert rollups.rows() == [NodeLinkRollup("gpu-07", T0 // 1000, 100.0, 0, 1, 3)]


def test_rendered_samples_read_back_as_prometheus_gives_them():
    samples = ib(IB_TRANSMITTED, [1, 2]) + ib(IB_SYMBOL_ERRORS, [0], host='we"ird\\host')

    parsed, stats = LinkParser().parse(render_link_samples(samples), default_ts=0)

    assert parsed == samples
    assert stats.rejected == 0
