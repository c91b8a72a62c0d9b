"""DCGM health fields to node-health signals (pure, no database)."""

from clusters.health import Signal, SignalClass, Source
from telemetry.exposition import health_signals as hs
from telemetry.exposition.health_signals import health_signals
from telemetry.exposition.parsing import (
    CLOCK_EVENTS,
    DCGM_FIELDS,
    ECC_DBE_AGG,
    ECC_DBE_VOL,
    FIELD_NAMES,
    HEALTH_CEILING,
    NVLINK_CRC_FLIT,
    PCIE_REPLAY,
    RETIRED_DBE,
    ROW_REMAP_FAILURE,
    XID_ERRORS,
    ExpositionParser,
    GpuSample,
    parse,
)

T0 = 1_764_000_000_000  # Unix ms
NOW = T0 + 600_000


def _labels(gpu: int, host: str = "gpu-node2") -> str:
    return (
        f'gpu="{gpu}",UUID="GPU-2b8f0c4e-{gpu:04d}",pci_bus_id="00000000:{gpu + 7:02X}:00.0",'
        f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
        'DCGM_FI_DRIVER_VERSION="550.54.15"'
    )


# dcgm-exporter's output for two GPUs with the health fields of its default CSV plus the
# commented-out ones an operator enables (HELP texts as in etc/default-counters.csv).
EXPORTER_BODY = (
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    f"DCGM_FI_DEV_GPU_UTIL{{{_labels(0)}}} 97\n"
    f"DCGM_FI_DEV_GPU_UTIL{{{_labels(1)}}} 0\n"
    "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
    "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n"
    f"DCGM_FI_DEV_XID_ERRORS{{{_labels(0)}}} 0\n"
    f"DCGM_FI_DEV_XID_ERRORS{{{_labels(1)}}} 79\n"
    "# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total number of PCIe retries.\n"
    "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n"
    f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{_labels(0)}}} 12\n"
    f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{_labels(1)}}} 0\n"
    "# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.\n"
    "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"
    f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{_labels(0)}}} 0\n"
    f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{_labels(1)}}} 2\n"
    "# HELP DCGM_FI_DEV_ECC_DBE_AGG_TOTAL Total number of double-bit persistent ECC errors.\n"
    "# TYPE DCGM_FI_DEV_ECC_DBE_AGG_TOTAL counter\n"
    f"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{{{_labels(0)}}} 3\n"
    "# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed\n"
    "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge\n"
    f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{_labels(0)}}} 0\n"
    "# HELP DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL Total number of NVLink flow-control "
    "CRC errors.\n"
    "# TYPE DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL counter\n"
    f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{_labels(0)}}} 7\n"
    "# HELP DCGM_FI_DEV_CLOCKS_EVENT_REASONS Current clock event reasons (bitmask).\n"
    "# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge\n"
    f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{_labels(0)}}} 64\n"
)


def health_parse(body: str, ts: int) -> list[GpuSample]:
    return ExpositionParser(HEALTH_CEILING).parse(body, default_ts=ts).samples


def at(metric: str, value: float, ts: int, *, gpu: str = "0", host: str = "gpu-node2"):
    return GpuSample(host, gpu, "GPU-x", metric, value, ts)


def dcgm(signal, *, at_ms, code, detail, gpu="0", node="gpu-node2") -> Signal:
    return Signal(node, signal, Source.DCGM, at_ms / 1000, gpu, code, detail)


def test_the_exporters_body_gives_its_health_fields_and_leaves_the_rest():
    result = ExpositionParser(HEALTH_CEILING).parse(EXPORTER_BODY, default_ts=T0)

    assert [(s.host, s.gpu, s.metric, s.value) for s in result.samples] == [
        ("gpu-node2", "0", XID_ERRORS, 0.0),
        ("gpu-node2", "1", XID_ERRORS, 79.0),
        ("gpu-node2", "0", PCIE_REPLAY, 12.0),
        ("gpu-node2", "1", PCIE_REPLAY, 0.0),
        ("gpu-node2", "0", ECC_DBE_VOL, 0.0),
        ("gpu-node2", "1", ECC_DBE_VOL, 2.0),
        ("gpu-node2", "0", ECC_DBE_AGG, 3.0),
        ("gpu-node2", "0", ROW_REMAP_FAILURE, 0.0),
        ("gpu-node2", "0", NVLINK_CRC_FLIT, 7.0),
        ("gpu-node2", "0", CLOCK_EVENTS, 64.0),
    ]
    assert (result.stats.samples, result.stats.ignored, result.stats.comments) == (10, 2, 16)


def test_the_accounting_parser_still_ignores_the_health_counters():
    result = parse(EXPORTER_BODY, default_ts=T0)

    assert [(s.gpu, s.metric, s.value) for s in result.samples] == [
        ("0", "DCGM_FI_DEV_GPU_UTIL", 97.0),
        ("1", "DCGM_FI_DEV_GPU_UTIL", 0.0),
        ("0", XID_ERRORS, 0.0),
        ("1", XID_ERRORS, 79.0),
    ]
    assert result.stats.ignored == 8


def test_first_sight_only_what_still_holds_is_a_fault():
    batch = health_signals(health_parse(EXPORTER_BODY, T0), {}, now_ms=NOW)

    assert batch.signals == [
        dcgm(
            SignalClass.GPU_LOST,
            at_ms=T0,
            gpu="1",
            code="79",
            detail="XID 79 GPU has fallen off the bus",
        ),
        dcgm(
            SignalClass.ECC_UNCORRECTABLE,
            at_ms=T0,
            gpu="1",
            code=ECC_DBE_VOL,
            detail="double-bit ECC errors (volatile): 2 when Gantry first read this GPU",
        ),
    ]
    # The aggregate DBE (3, lifetime), NVLink (7) and PCIe (12) counts are a baseline.
    assert batch.state[f"gpu-node2\t0\t{ECC_DBE_AGG}"] == [3.0, T0]
    assert batch.state[f"gpu-node2\t0\t{PCIE_REPLAY}"] == [12.0, T0]
    assert batch.state[f"gpu-node2\t0\t{CLOCK_EVENTS}"] == [64, T0]


def test_counters_that_grow_across_two_fetches_are_signals_and_a_drop_is_a_reset():
    first = health_signals(health_parse(EXPORTER_BODY, T0), {}, now_ms=NOW)
    grown = (
        EXPORTER_BODY.replace(f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{_labels(0)}}} 12", "X 0")
        .replace(f"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{{{_labels(0)}}} 3", "X 0")
        .replace(
            f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{_labels(0)}}} 7",
            f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{_labels(0)}}} 9",
        )
        .replace(
            f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{_labels(1)}}} 2",
            f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{_labels(1)}}} 0",
        )
        + f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{_labels(0)}}} 15\n"
        + f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{_labels(1)}}} 1\n"
    ).replace(
        f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{_labels(0)}}} 0", f"{ROW_REMAP_FAILURE}{{{_labels(0)}}} 1"
    )

    second = health_signals(health_parse(grown, T0 + 30_000), first.state, now_ms=NOW)

    assert second.signals == [
        dcgm(
            SignalClass.ROW_REMAP_FAILURE,
            at_ms=T0 + 30_000,
            code=ROW_REMAP_FAILURE,
            detail="row-remap failure grew from 0 to 1",
        ),
        dcgm(
            SignalClass.NVLINK_ERRORS,  # the link retried: warn, not XID 74's NVLINK
            at_ms=T0 + 30_000,
            code=NVLINK_CRC_FLIT,
            detail="NVLink CRC flit errors grew from 7 to 9",
        ),
        dcgm(
            SignalClass.PCIE_REPLAY,
            at_ms=T0 + 30_000,
            code=PCIE_REPLAY,
            detail="PCIe replays grew from 12 to 15",
        ),
        dcgm(
            SignalClass.ROW_REMAP_FAILURE,
            at_ms=T0 + 30_000,
            gpu="1",
            code=ROW_REMAP_FAILURE,
            detail="row-remap failure: 1 when Gantry first read this GPU",
        ),
    ]
    # GPU 1's volatile DBE count went 2 -> 0 (a reset): no signal, 0 is the new baseline;
    # its XID stayed 79: the same event, not a new one.
    assert second.state[f"gpu-node2\t1\t{ECC_DBE_VOL}"] == [0.0, T0 + 30_000]
    third = health_signals([at(ECC_DBE_VOL, 1, T0 + 60_000, gpu="1")], second.state, now_ms=NOW)
    assert [(s.signal, s.detail) for s in third.signals] == [
        (SignalClass.ECC_UNCORRECTABLE, "double-bit ECC errors (volatile) grew from 0 to 1")
    ]


def test_the_input_state_is_left_as_it_was():
    state = {f"gpu-node2\t0\t{PCIE_REPLAY}": [1.0, T0]}

    batch = health_signals([at(PCIE_REPLAY, 4, T0 + 1)], state, now_ms=NOW)

    assert state == {f"gpu-node2\t0\t{PCIE_REPLAY}": [1.0, T0]}
    assert batch.state == {f"gpu-node2\t0\t{PCIE_REPLAY}": [4, T0 + 1]}


def test_a_flood_of_the_same_xid_is_one_signal_per_batch_stamped_with_the_first():
    samples = [at(XID_ERRORS, 79 if i % 2 == 0 else 0, T0 + i * 1000) for i in range(120)]
    samples += [at(XID_ERRORS, 48, T0 + 500, gpu="3")] * 3  # re-sent: counted stale

    batch = health_signals(list(reversed(samples)), {}, now_ms=NOW)

    assert batch.signals == [
        dcgm(SignalClass.GPU_LOST, at_ms=T0, code="79", detail="XID 79 GPU has fallen off the bus"),
        dcgm(
            SignalClass.ECC_UNCORRECTABLE,
            at_ms=T0 + 500,
            gpu="3",
            code="48",
            detail="XID 48 Double Bit ECC Error",
        ),
    ]
    assert batch.stale == 2


def test_an_unknown_xid_is_recorded_as_unknown_and_an_application_xid_keeps_its_class():
    batch = health_signals(
        [at(XID_ERRORS, 999, T0), at(XID_ERRORS, 13, T0, gpu="1")], {}, now_ms=NOW
    )

    assert batch.signals == [
        dcgm(
            SignalClass.XID_UNKNOWN,
            at_ms=T0,
            code="999",
            detail="XID 999 (a code not in Gantry's table of NVIDIA's XIDs)",
        ),
        dcgm(
            SignalClass.XID_APPLICATION,
            at_ms=T0,
            gpu="1",
            code="13",
            detail="XID 13 Graphics Engine Exception",
        ),
    ]


def test_throttling_counts_once_it_persists_two_samples_over_a_minute():
    def run(offsets, mask=0x40, state=None):
        samples = [at(CLOCK_EVENTS, mask, T0 + o) for o in offsets]
        return health_signals(samples, state or {}, now_ms=NOW)

    assert run([0]).signals == []
    assert run([0, 59_999]).signals == []
    assert run([0, 60_000]).signals == [
        dcgm(
            SignalClass.THERMAL_THROTTLE,
            at_ms=T0,
            code=CLOCK_EVENTS,
            detail="thermal throttling: clock event reasons 0x40 for 60 s (2 samples)",
        )
    ]
    # Interrupted by a sample without the bit, or by a silence over 5 minutes: starts again.
    assert (
        health_signals(
            [
                at(CLOCK_EVENTS, 0x40, T0),
                at(CLOCK_EVENTS, 0x1, T0 + 30_000),
                at(CLOCK_EVENTS, 0x40, T0 + 60_000),
            ],
            {},
            now_ms=NOW,
        ).signals
        == []
    )
    assert run([0, 300_001, 330_000]).signals == []
    assert [s.detail for s in run([0, 300_000]).signals] == [
        "thermal throttling: clock event reasons 0x40 for 300 s (2 samples)"
    ]
    assert [(s.signal, s.detail) for s in run([0, 60_000], mask=0x80).signals] == [
        (
            SignalClass.POWER_THROTTLE,
            "power throttling: clock event reasons 0x80 for 60 s (2 samples)",
        )
    ]
    # HW slowdown counts as thermal, SW power cap as power; a run continues across fetches.
    first = run([0], mask=0x0C)
    assert first.signals == []
    assert first.state == {
        f"gpu-node2\t0\t{CLOCK_EVENTS}": [0x0C, T0],
        f"gpu-node2\t0\t{CLOCK_EVENTS}:thermal_throttle": [T0, T0, 1],
        f"gpu-node2\t0\t{CLOCK_EVENTS}:power_throttle": [T0, T0, 1],
    }
    second = run([30_000, 90_000], mask=0x0C, state=first.state)
    assert [(s.signal, s.at, s.detail) for s in second.signals] == [
        (
            SignalClass.THERMAL_THROTTLE,
            T0 / 1000,
            "thermal throttling: clock event reasons 0xc for 90 s (3 samples)",
        ),
        (
            SignalClass.POWER_THROTTLE,
            T0 / 1000,
            "power throttling: clock event reasons 0xc for 90 s (3 samples)",
        ),
    ]


def test_samples_from_the_future_are_refused_and_nameless_ones_counted():
    batch = health_signals(
        [
            at(XID_ERRORS, 79, NOW + 60_001),
            at(XID_ERRORS, 79, NOW + 90_000, gpu="2"),
            at(XID_ERRORS, 48, NOW + 60_000, gpu="1"),
            at(XID_ERRORS, 62, T0, host=""),
            at(XID_ERRORS, 62, T0, host="", gpu="2"),
        ],
        {},
        now_ms=NOW,
    )

    assert [(s.gpu, s.code, s.at) for s in batch.signals] == [("1", "48", (NOW + 60_000) / 1000)]
    assert (batch.future, batch.latest_future_ms, batch.nameless) == (2, 90_000, 2)
    assert f"gpu-node2\t0\t{XID_ERRORS}" not in batch.state


def test_dcgm_4_6_names_are_the_same_fields():
    body = (
        f"DCGM_FI_DEV_XID_ERROR{{{_labels(0)}}} 74\n"
        f"DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL{{{_labels(0)}}} 2\n"
        f"DCGM_FI_DEV_ROW_REMAP_FAILED{{{_labels(0)}}} 0\n"
        f"DCGM_FI_DEV_PCIE_REPLAY_TOTAL{{{_labels(0)}}} 5\n"
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL{{{_labels(0)}}} 1\n"
        f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{_labels(0)}}} 128\n"
    )
    state = {f"gpu-node2\t0\t{RETIRED_DBE}": [1.0, T0], f"gpu-node2\t0\t{PCIE_REPLAY}": [5, T0]}

    samples = health_parse(body, T0 + 1000)
    batch = health_signals(samples, state, now_ms=NOW)

    assert [s.metric for s in samples] == [
        XID_ERRORS,
        RETIRED_DBE,
        ROW_REMAP_FAILURE,
        PCIE_REPLAY,
        NVLINK_CRC_FLIT,
        CLOCK_EVENTS,
    ]
    assert [(s.signal, s.code, s.detail) for s in batch.signals] == [
        (SignalClass.NVLINK, "74", "XID 74 NVLINK Error"),
        (
            SignalClass.ECC_PAGE_RETIREMENT,
            RETIRED_DBE,
            "pages retired for double-bit errors grew from 1 to 2",
        ),
    ]


def test_one_table_of_names_each_name_one_field():
    names = [n for field in DCGM_FIELDS for n in (field.name, field.alias) if n]

    assert len(names) == len(set(names)) == len(FIELD_NAMES) == 29
    assert set(HEALTH_CEILING) == {field.name for field in DCGM_FIELDS}
    assert set(hs.COUNTERS) == set(HEALTH_CEILING) - {XID_ERRORS, CLOCK_EVENTS}


def test_series_unseen_for_a_week_are_forgotten():
    old = {f"gone\t0\t{PCIE_REPLAY}": [3.0, NOW - hs.STATE_RETENTION_MS - 1]}
    kept = {f"kept\t0\t{PCIE_REPLAY}": [3.0, NOW - hs.STATE_RETENTION_MS]}

    assert health_signals([], old | kept, now_ms=NOW).state == kept
