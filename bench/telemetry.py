"""DCGM ingestion: parse + map + minute rollup of exposition text, Gantry vs a naive parser.

The scrapes imitate dcgm-exporter on a mixed fleet: 64 nodes × 8 GPUs, the 8 gauges Gantry
uses plus 12 it ignores (clocks, temperatures, PCIe…), every 30 s for 15 minutes. Nodes
0-31 are Kubernetes (pod labels; GPUs 6-7 hold no pod), 32-47 Slurm (``hpc_job``), 48-63
carry no workload labels and map by host, GPU and time. The baseline is what one writes
first: a regex per line, a dict of labels per sample, a scan of the node's allocations per
sample, lists of values per minute. Both must produce the same rollups; the run stops if
they do not. Then the rollups are stored the way the collector stores a window
(``telemetry.collection.gpu_minutes_replace``) against a raw PostgreSQL COPY of the same
rows into the same table. Last, the SDK's events are checked against their schema
(``bench/sdk_events.py``).
"""

import math
import re
from collections import defaultdict

from bench import sdk_events
from bench.report import Section, best_of, ms, ratio, timed
from telemetry.exposition.ingestor import ingest
from telemetry.exposition.mapping import Allocation, HostAllocation, PodAllocation, SlurmAllocation
from telemetry.exposition.parsing import (
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    KEPT_METRICS,
    VALUE_CEILING,
    XID_ERRORS,
    ExpositionParser,
)

NODES, GPUS = 64, 8
SCRAPE_EVERY_MS, SCRAPES = 30_000, 30
T0 = 1_700_000_040_000
IGNORED = (
    "DCGM_FI_DEV_VIDEO_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
VALUES = {
    GR_ENGINE_ACTIVE: 0.8125,
    GPU_UTIL: 97.0,
    "DCGM_FI_PROF_SM_ACTIVE": 0.75,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.375,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.5,
    FB_USED: 40_960.0,
    "DCGM_FI_DEV_POWER_USAGE": 312.5,
    XID_ERRORS: 0.0,
}


def _labels(node: int, gpu: int) -> str:
    base = (
        f'gpu="{gpu}",UUID="GPU-{node:04x}{gpu:04x}-5e3c-4b7d-9f1a-0c2d4e6f8a9b",'
        f'pci_bus_id="00000000:{gpu + 7:02X}:00.0",device="nvidia{gpu}",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="node{node:03d}",'
        'DCGM_FI_DRIVER_VERSION="550.54.15"'
    )
    if node < 32:
        pod = f"train-{node}-0-abcde" if gpu < 6 else ""
        namespace = "team-a" if pod else ""
        container = "trainer" if pod else ""
        return f'{base},container="{container}",namespace="{namespace}",pod="{pod}"'
    if node < 48:
        return f'{base},hpc_job="{10_000 + node}"'
    return base


def scrapes() -> list[tuple[bytes, int]]:
    bodies = []
    for scrape in range(SCRAPES):
        for node in range(NODES):
            lines = []
            for metric in (*VALUES, *IGNORED):
                lines.append(f"# HELP {metric} {metric.lower()}")
                lines.append(f"# TYPE {metric} gauge")
                value = VALUES.get(metric, 1410.0)
                lines.extend(f"{metric}{{{_labels(node, gpu)}}} {value!r}" for gpu in range(GPUS))
            bodies.append((("\n".join(lines) + "\n").encode(), T0 + scrape * SCRAPE_EVERY_MS))
    return bodies


def allocations() -> list[Allocation]:
    held: list[Allocation] = [PodAllocation("team-a", f"train-{n}-0-abcde", n) for n in range(32)]
    held += [SlurmAllocation(str(10_000 + n), n) for n in range(32, 48)]
    end = T0 + SCRAPES * SCRAPE_EVERY_MS
    held += [
        HostAllocation(f"node{n:03d}", str(gpu), T0, end, n)
        for n in range(48, 64)
        for gpu in range(GPUS)
    ]
    return held


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_MEANS = ("activity", "sm_active", "tensor_active", "dram_active", "power")


def naive_ingest(bodies: list[tuple[bytes, int]], held: list[Allocation]) -> list[tuple]:
    samples = []
    for body, scraped_at in bodies:
        for line in body.decode().split("\n"):
            if not line.strip() or line.startswith("#"):
                continue
            match = _LINE.match(line)
            if match is None:
                continue
            name, label_text, value_text, ts_text = match.groups()
            if name not in KEPT_METRICS:
                continue
            labels = {
                key: value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                for key, value in _LABEL.findall(label_text or "")
            }
            value = float(value_text)
            if not math.isfinite(value) or not 0 <= value <= VALUE_CEILING[name]:
                continue
            samples.append(
                {
                    "metric": name,
                    "value": value,
                    "ts": int(ts_text) if ts_text else scraped_at,
                    "host": labels.get("Hostname", labels.get("hostname", "")),
                    "gpu": labels.get("gpu", ""),
                    "pod": labels.get("pod", ""),
                    "namespace": labels.get("namespace", ""),
                    "hpc_job": labels.get("hpc_job", ""),
                }
            )
    values: dict[tuple, list[float]] = defaultdict(list)
    seen = set()
    for sample in samples:
        attempt = None
        for allocation in held:
            if sample["pod"]:
                if isinstance(allocation, PodAllocation) and (
                    allocation.namespace,
                    allocation.pod,
                ) == (sample["namespace"], sample["pod"]):
                    attempt = allocation.attempt_id
            elif sample["hpc_job"]:
                if (
                    isinstance(allocation, SlurmAllocation)
                    and allocation.hpc_job == sample["hpc_job"]
                ):
                    attempt = allocation.attempt_id
            elif (
                isinstance(allocation, HostAllocation)
                and (allocation.host, allocation.gpu) == (sample["host"], sample["gpu"])
                and allocation.start_ms <= sample["ts"] < (allocation.end_ms or math.inf)
            ):
                attempt = allocation.attempt_id
        if attempt is None:
            continue
        identity = (attempt, sample["host"], sample["gpu"], sample["metric"], sample["ts"])
        if identity in seen:
            continue
        seen.add(identity)
        minute = sample["ts"] // 60_000 * 60
        values[(attempt, sample["host"], sample["gpu"], minute, sample["metric"])].append(
            sample["value"]
        )
    rows: dict[tuple, dict[str, float]] = defaultdict(dict)
    for (attempt, host, gpu, minute, metric), found in values.items():
        rows[(attempt, host, gpu, minute)][metric] = sum(found) / len(found)
    result = []
    for key, means in rows.items():
        activity = means.get(GR_ENGINE_ACTIVE)
        if activity is None and GPU_UTIL in means:
            activity = means[GPU_UTIL] / 100
        result.append(
            (
                *key,
                activity,
                means.get("DCGM_FI_PROF_SM_ACTIVE"),
                means.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
                means.get("DCGM_FI_PROF_DRAM_ACTIVE"),
                means.get("DCGM_FI_DEV_POWER_USAGE"),
            )
        )
    return sorted(result, key=lambda row: (str(row[0]), *row[1:4]))


def run() -> list[Section]:
    bodies = scrapes()
    held = allocations()
    rows, parse_stats, unmapped, _ = ingest(bodies, held)
    ours = [
        (row.attempt_id, row.host, row.gpu, row.minute, *(getattr(row, n) for n in _MEANS))
        for row in rows
    ]
    assert ours == naive_ingest(bodies, held), "Gantry's rollups differ from the baseline's"
    cold = best_of(lambda: ingest(bodies, held), repeat=3)
    collector = ExpositionParser()  # as the collector keeps it: label sets seen before
    ingest(bodies, held, parser=collector)
    warm = best_of(lambda: ingest(bodies, held, parser=collector), repeat=3)
    baseline = best_of(lambda: naive_ingest(bodies, held), repeat=1)
    kept = parse_stats.samples
    section = Section(
        title="DCGM ingestion: parse + map + minute rollup (pure)",
        intro=(
            f"{len(bodies):,} dcgm-exporter scrapes ({NODES} nodes × {GPUS} GPUs, "
            f"{len(VALUES)} used and {len(IGNORED)} ignored gauges, every 30 s for "
            f"{SCRAPES * SCRAPE_EVERY_MS // 60_000} minutes; Kubernetes, Slurm and "
            "unlabelled nodes) through `telemetry.exposition.ingestor.ingest`, the one-pass "
            "`Ingestor` the collector runs for each window. Baseline: a regex "
            "per line, a label dict per sample, a scan of the allocations per sample "
            "(`bench/telemetry.py`); its rollups are asserted equal. Samples are the kept "
            "gauge values. The parser caches label sets: \"fresh\" starts each run empty, as "
            "the collector does for each window; \"kept\" hands the same parser to every run. "
            "Best of 3 (Gantry), 1 (baseline)."
        ),
        columns=[
            "parser", "lines", "samples", "unmapped", "rollup rows", "Gantry",
            "naive baseline", "speed-up",
        ],
    )  # fmt: skip
    for label, gantry in (("fresh", cold), ("kept between runs", warm)):
        section.rows.append(
            [
                label,
                f"{parse_stats.lines:,}",
                f"{kept:,}",
                f"{unmapped:,}",
                f"{len(rows):,}",
                f"{kept / gantry:,.0f} samples/s ({parse_stats.lines / gantry:,.0f} lines/s)",
                f"{kept / baseline:,.0f} samples/s",
                ratio(baseline, gantry),
            ]
        )
    fresh_rate = kept / cold
    verdict = "met" if fresh_rate >= 200_000 else "missed"
    section.notes.append(
        f"Target ≥ 200,000 samples/s: {verdict} ({fresh_rate:,.0f} samples/s fresh, the "
        "collector's case)."
    )
    return [section, store_section(rows), sdk_events.run()]


# --- storing rollups -----------------------------------------------------------------------

STORE_COPIES = 8  # the 15 minutes of rollups, repeated over 2 hours: ~54k rows


def seed_attempts(count: int):
    """An empty bench database with one cluster and ``count`` running attempts."""
    from django.contrib.auth import get_user_model

    from bench.cycle import truncate
    from clusters.models import Cluster
    from images.models import Image
    from jobs.models import Attempt, AttemptState, Experiment, Run
    from tenants.models import GpuFlavor, Project, Tenant

    truncate()
    user = get_user_model().objects.create(username="bench-telemetry")
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    project = Project.objects.create(tenant=tenant, slug="main", name="Main")
    flavor = GpuFlavor.objects.create(slug="h100-80gb", name="H100", memory_gb=80)
    cluster = Cluster.objects.create(name="bench-k8s", backend=Cluster.Backend.KUBERNETES)
    image = Image.objects.create(
        repository="registry.example.org/bench/train",
        digest="sha256:" + "0" * 64,
        status=Image.Status.APPROVED,
    )
    experiment = Experiment.objects.create(
        tenant=tenant, project=project, owner=user, name="bench", image=image,
        image_reference=image.reference, command="python train.py", flavor=flavor, nodes=1,
        gpus_per_node=8, gantry_version="bench",
    )  # fmt: skip
    ids = []
    for _ in range(count):
        run = Run.objects.create(
            experiment=experiment, tenant=tenant, flavor=flavor, gpus=8, submitted_by=user
        )
        attempt = Attempt.objects.create(
            run=run, number=1, cluster=cluster, state=AttemptState.RUNNING
        )
        ids.append(attempt.pk)
    return cluster, ids


def store_section(rollups) -> Section:
    from dataclasses import replace
    from datetime import UTC, datetime

    from django.db import connection, transaction
    from psycopg import sql

    from telemetry.collection import GPU_MINUTE_COLUMNS, gpu_minutes_replace
    from telemetry.models import GpuMinute

    cluster, attempt_ids = seed_attempts(NODES)
    rows = [
        replace(row, attempt_id=attempt_ids[row.attempt_id], minute=row.minute + copy * 900)
        for copy in range(STORE_COPIES)
        for row in rollups
    ]
    start = datetime.fromtimestamp(min(row.minute for row in rows), tz=UTC)
    end = datetime.fromtimestamp(max(row.minute for row in rows) + 60, tz=UTC)
    now = datetime.now(UTC)
    tuples = [
        (
            row.attempt_id, row.host, row.gpu, datetime.fromtimestamp(row.minute, tz=UTC),
            row.activity, row.sm_active, row.tensor_active, row.dram_active, row.fb_used,
            row.power, row.xid, row.samples, now,
        )
        for row in rows
    ]  # fmt: skip
    table = GpuMinute._meta.db_table
    copy_statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, GPU_MINUTE_COLUMNS))
    )

    def empty() -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))

    def gantry() -> None:
        with transaction.atomic():
            gpu_minutes_replace(cluster=cluster, start=start, end=end, rows=rows)

    def raw_copy() -> None:
        with (
            transaction.atomic(),
            connection.cursor() as cursor,
            cursor.cursor.copy(copy_statement) as copy,
        ):
            for values in tuples:
                copy.write_row(values)

    def measured(fn) -> float:
        times = []
        for _ in range(3):
            empty()
            times.append(timed(fn)[0])
        return min(times)

    copy_s = measured(raw_copy)
    gantry_s = measured(gantry)
    stored = GpuMinute.objects.count()
    assert stored == len(rows), f"stored {stored} of {len(rows)} rollups"
    empty()
    share = copy_s / gantry_s
    section = Section(
        title="Storing minute rollups vs a raw PostgreSQL COPY",
        intro=(
            f"The {len(rollups):,} rollups of the ingestion benchmark, repeated over "
            f"{STORE_COPIES * 15} minutes ({len(rows):,} rows, {NODES} attempts), stored the "
            "way the collector stores a window: `gpu_minutes_replace` deletes the window's "
            "rows and writes the new ones with COPY, from `MinuteRollup` objects. Baseline: "
            "psycopg's COPY of the same rows, already as tuples, into the same table. Each "
            "run starts from an empty table; best of 3."
        ),
        columns=["rows", "Gantry", "raw COPY", "Gantry ÷ COPY throughput"],
    )
    section.rows.append(
        [
            f"{len(rows):,}",
            f"{len(rows) / gantry_s:,.0f} rows/s ({ms(gantry_s)})",
            f"{len(rows) / copy_s:,.0f} rows/s ({ms(copy_s)})",
            f"{share:.2f}",
        ]
    )
    section.notes.append("Target: Gantry ≥ 0.5 of COPY's throughput.")
    return section
