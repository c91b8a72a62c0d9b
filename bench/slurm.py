"""The Slurm backend against the project's test cluster (``scripts/slurm-cluster.sh``).

- Submissions per second: 100 and 1,000 one-GPU jobs through Gantry's backend (CLI and
  REST transports) as a first try submits them (no look-up: the service recorded the
  intent to submit before the call; a retry looks the attempt's name up and adopts)
  versus a plain ``sbatch`` loop with the same options.
- One sync cycle with 1,000 live jobs: ``SlurmBackend.sync`` on 1,000 refs (one squeue or
  REST ``/jobs`` call) versus asking Slurm about each job (``squeue -j <id>`` per job).

Jobs go to the cluster's ``parked`` partition (State=DOWN): Slurm queues them and starts
none, like jobs held with ``--hold``, so only submission and status reads are measured.
Every job is cancelled at the end. If this run started the cluster, it stops it again.
"""

import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from bench.report import Section, ms, ratio, timed
from clusters.backends.base import JobRef, JobSpec
from clusters.backends.slurm import QuotaLimit, SlurmBackend

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
SUBMISSION_COUNTS = (100, 1_000)
LIVE_JOBS = 1_000
TENANT = "gantrybench"
MIN_JOB_AGE_S = 300  # the test cluster's MinJobAge
IMAGE = "registry.example.org/ml/pytorch@sha256:" + "a" * 64


def _run(argv: list[str], *, timeout: float = 60, check: bool = True):
    """Our own fixed commands (Slurm's clients and the cluster script)."""
    return subprocess.run(  # noqa: S603
        argv, capture_output=True, text=True, timeout=timeout, check=check
    )


def _script(*args: str) -> subprocess.CompletedProcess:
    return _run(["bash", str(SCRIPT), *args], timeout=600, check=False)


@contextlib.contextmanager
def running_test_cluster() -> Iterator[dict[str, str]]:
    """The test cluster, brought up unless it is (``up`` is idempotent): the environment
    its clients need, also set in this process's environment (and so passed on to the
    processes a benchmark starts). If this run started it, it is stopped at the end."""
    was_up = _script("status").returncode == 0
    done = _script("up")
    if done.returncode != 0:
        raise SystemExit(f"bench: scripts/slurm-cluster.sh up failed:\n{done.stderr}")
    env = {}
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export":
            key, _, value = words[1].partition("=")
            env[key] = value
    os.environ.update(env)
    try:
        yield env
    finally:
        if not was_up:
            _script("down")


def cluster_settings(env: dict[str, str], transport: str, *, partition: str) -> dict:
    """A Slurm cluster's settings for the test cluster: jobs into ``partition`` (``gpu``
    starts them, ``parked`` only queues them), run on the node without a container."""
    settings = {
        "transport": transport,
        "job_dir": env["GANTRY_SLURM_JOB_DIR"],
        "slurm_conf": env["SLURM_CONF"],
        "partition": partition,
        "flavors": {"a100-80gb": env.get("GANTRY_SLURM_GPU_TYPE", "a100")},
        "container_runtime": "none",
        "submit_users": ["root", "slurmrest"],
    }
    if transport == "rest":
        settings |= {
            "rest_url": env["GANTRY_SLURM_REST_URL"],
            "rest_user": "slurmrest",
            "rest_token_env": "GANTRY_SLURM_TOKEN",
        }
    return settings


def _backend(env: dict[str, str], transport: str) -> SlurmBackend:
    settings = cluster_settings(env, transport, partition="parked")
    return SlurmBackend(SimpleNamespace(name=f"bench-{transport}", settings=settings))


def _spec(name: str, number: int) -> JobSpec:
    return JobSpec(
        name=name,
        attempt_id=number,
        run_id=number,
        tenant=TENANT,
        project="bench",
        image=IMAGE,
        command="true",
        env={},
        api_url="http://127.0.0.1:8000/api/v1",
        flavor="a100-80gb",
        nodes=1,
        gpus_per_node=1,
        max_runtime_s=600,
        attempt_token=f"gat_{number}.bench",
    )


def _sbatch(env: dict[str, str], name: str) -> str:
    done = _run(
        [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--comment={name}",
            f"--account={TENANT}",
            "--partition=parked",
            "--nodes=1",
            "--gres=gpu:a100:1",
            "--time=10",
            f"--chdir={env['GANTRY_SLURM_JOB_DIR']}",
            "--wrap=true",
        ]
    )
    return done.stdout.strip().split(";")[0]


def cancel(job_ids: list[str]) -> None:
    """scancel those jobs (ids of jobs already gone are ignored)."""
    for start in range(0, len(job_ids), 500):
        _run(["scancel", *job_ids[start : start + 500]], timeout=120, check=False)


def run() -> list[Section]:
    prefix = f"gantry-bench-{int(time.time())}"
    submitted: list[str] = []
    with running_test_cluster() as env:
        try:
            # The tenant's Slurm account (enforced by the test cluster), with no real limit.
            _backend(env, "cli").mirror_quotas([QuotaLimit(TENANT, "a100-80gb", 100_000)])
            return [_submissions(env, prefix, submitted), _sync(env, prefix, submitted)]
        finally:
            cancel(submitted)


def _submissions(env: dict[str, str], prefix: str, submitted: list[str]) -> Section:
    section = Section(
        title="Slurm submissions",
        intro=(
            "One-GPU jobs submitted one after another to the test cluster (Slurm 22.05, "
            "`scripts/slurm-cluster.sh`), into a partition that queues jobs without starting "
            f"them, {' and '.join(f'{n:,}' for n in SUBMISSION_COUNTS)} at a time. Gantry: "
            "`SlurmBackend.submit` as a first try calls it (`may_exist=False`: the service "
            "recorded the intent to submit, CREATED -> SUBMITTING, before the call, so no "
            "earlier try can have reached Slurm): render the script, submit. Baseline: "
            "plain `sbatch --parsable` with the same options in a loop, measured in the same "
            "run just before."
        ),
        columns=["how", "jobs", "time", "submissions/s", "vs. plain sbatch"],
    )
    rows = []
    for count in SUBMISSION_COUNTS:
        sys.stderr.write(f"bench: slurm submissions, {count:,}…\n")
        baseline_s, ids = timed(
            lambda count=count: [_sbatch(env, f"{prefix}-sbatch{count}-{i}") for i in range(count)]
        )
        submitted += ids
        rows.append(("plain `sbatch` loop", count, baseline_s, baseline_s))
        for transport in ("cli", "rest"):
            backend = _backend(env, transport)
            specs = [_spec(f"{prefix}-{transport}{count}-{i}", i) for i in range(count)]
            seconds, ids = timed(
                lambda backend=backend, specs=specs: [
                    backend.submit(s, may_exist=False) for s in specs
                ]
            )
            submitted += ids
            rows.append((f"Gantry backend, {transport} transport", count, seconds, baseline_s))
            if count == SUBMISSION_COUNTS[0]:
                again, same = timed(
                    lambda backend=backend, specs=specs: [backend.submit(s) for s in specs]
                )
                assert same == ids, "a retry must adopt, not submit again"
                section.notes.append(
                    f"{transport}: a retry of the same {count} attempts (`may_exist=True`, "
                    f"after a redelivery, crash or timeout) adopted all of them "
                    f"({count / again:,.0f} look-ups/s) and created no job."
                )
    held = len(_run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split())
    section.notes.append(
        f"slurmctld held {held:,} jobs at the end (finished ones stay {MIN_JOB_AGE_S} s): "
        "a retry's REST look-up reads all of them, since API v0.0.38 cannot filter "
        "`GET /jobs` by name; the CLI's `squeue --name` gets them in Slurm's binary "
        "protocol. Both then ask accounting (`sacct`, or slurmdbd's REST API). A first "
        "try makes no look-up, which is what brings submissions to sbatch speed."
    )
    for how, count, seconds, baseline_s in rows:
        section.rows.append(
            [
                how,
                f"{count:,}",
                ms(seconds),
                f"{count / seconds:,.0f}",
                "1.0×" if seconds == baseline_s else f"{baseline_s / seconds:,.2f}×",
            ]
        )
    return section


def _sync(env: dict[str, str], prefix: str, submitted: list[str]) -> Section:
    sys.stderr.write(f"bench: slurm sync of {LIVE_JOBS:,} live jobs…\n")
    names = [f"{prefix}-live-{i}" for i in range(LIVE_JOBS)]
    ids = [_sbatch(env, name) for name in names]
    submitted += ids
    refs = [JobRef(name, job_id) for name, job_id in zip(names, ids, strict=True)]
    section = Section(
        title="Slurm sync cycle",
        intro=(
            f"One sync of {LIVE_JOBS:,} live (queued) jobs: `SlurmBackend.sync`, which asks "
            "slurmctld once for every job (`squeue --json`, or REST `GET /jobs`) and maps "
            "each to the run lifecycle. Baseline: one `squeue -h -j <id>` per job, as a "
            "poller that follows jobs one by one does. Best of 3 (Gantry), one pass "
            "(baseline)."
        ),
        columns=["how", "jobs", "time", "per job", "speed-up"],
    )

    def one_by_one() -> int:
        states = [
            _run(["squeue", "-h", "-j", ref.backend_job_id, "-o", "%T"]).stdout.strip()
            for ref in refs
        ]
        return sum(state == "PENDING" for state in states)

    baseline_s, pending = timed(one_by_one)
    assert pending == LIVE_JOBS, f"{pending} of {LIVE_JOBS} jobs pending"
    rows = []
    for transport in ("cli", "rest"):
        backend = _backend(env, transport)
        best = None
        for _ in range(3):
            seconds, statuses = timed(lambda backend=backend: backend.sync(refs))
            assert len(statuses) == LIVE_JOBS
            assert {s.state for s in statuses.values()} == {"PENDING"}
            best = seconds if best is None else min(best, seconds)
        rows.append((f"Gantry `sync`, {transport} transport", best))
    rows.append(("`squeue -j` per job", baseline_s))
    for how, seconds in rows:
        section.rows.append(
            [
                how,
                f"{LIVE_JOBS:,}",
                ms(seconds),
                ms(seconds / LIVE_JOBS),
                "—" if seconds == baseline_s else ratio(baseline_s, seconds),
            ]
        )
    return section
