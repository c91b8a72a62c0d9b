"""Reading the jobs that wait in Slurm's queue for GPUs (squeue -t PD, slurmrestd /jobs):
what they claim, and a clear error rather than a guess for an answer that cannot be read."""

from datetime import UTC, datetime

import pytest

from clusters.backends.base import PendingClaim
from clusters.backends.slurm_accounts import is_operator
from clusters.backends.slurm_batch import batch_job
from clusters.backends.slurm_pending import (
    SQUEUE_PENDING_FORMAT,
    PendingError,
    parse_rest_pending,
    parse_squeue_pending,
)
from clusters.backends.slurm_settings import SlurmSettings
from tests.clusters.backends.test_slurm_script import job_spec as spec

SETTINGS = SlurmSettings.parse(
    {
        "transport": "cli",
        "job_dir": "/shared/jobs",
        "partition": "gpu",
        "flavors": {"a100-80gb": "a100", "h100-80gb": {"gres_type": "h100", "partition": "hopper"}},
    }
)
START = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)


def line(**cells: str) -> str:
    values = {
        "i": "812", "T": "PENDING", "Q": "4294901750", "D": "2", "b": "gres:gpu:a100:8",
        "S": str(int(START.timestamp())), "Y": "gpu-node[1-2]", "n": "", "P": "gpu",
        "r": "Resources", "j": "train", "k": "(null)",
    }  # fmt: skip
    values.update(cells)
    return "|".join(values[key[1]] for key in SQUEUE_PENDING_FORMAT.split("|"))


def test_the_format_asks_squeue_for_every_field_in_order():
    assert SQUEUE_PENDING_FORMAT == "%i|%T|%Q|%D|%b|%S|%Y|%n|%P|%r|%j|%k"


def test_a_pending_gpu_job_is_a_claim_with_its_priority_start_and_planned_nodes():
    text = "\n".join(
        [
            line(),
            line(i="813", D="1", b="gres:gpu:4", S="N/A", Y="(null)", n="gpu-node2", r="Priority"),
            line(i="814", b="gres:gpu:h100:8", P="hopper"),
        ]
    )
    assert parse_squeue_pending(text, SETTINGS) == [
        PendingClaim("Slurm job 812", "a100-80gb", 2, 8, 4294901750, START,
                     ("gpu-node1", "gpu-node2")),
        # An untyped GPU request fits every flavor of its partition.
        PendingClaim("Slurm job 813", "a100-80gb", 1, 4, 4294901750, None, (), ("gpu-node2",)),
        PendingClaim("Slurm job 814", "h100-80gb", 2, 8, 4294901750, START,
                     ("gpu-node1", "gpu-node2")),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "cells",
    [
        {"j": "gantry-a17", "k": "gantry-a17"},  # Gantry's own job
        {"r": "JobHeldUser"},  # held, waiting for a dependency or its own limits:
        {"r": "Dependency"},  # none of these starts when GPUs free
        {"r": "QOSGrpGRES"},
        {"b": "N/A"},  # asks for no GPUs
        {"b": "gres:gpu:l4:1"},  # a GPU type Gantry does not map
        {"P": "debug"},  # a partition none of the flavors uses
    ],
)
def test_jobs_that_would_not_take_freed_gpus_are_no_claim(cells):
    assert parse_squeue_pending(line(**cells), SETTINGS) == []


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("812|PENDING|17|2", "line 1 has 4 of squeue's 12 fields: '812|PENDING|17|2'"),
        (line(T="BOOT_FAIL"), "job 812: state 'BOOT_FAIL', where only PENDING was asked for"),
        (line(T="NEW_STATE"), "job 812: state 'NEW_STATE', where only PENDING was asked for"),
        (line(i="abc"), "line 1: job id 'abc' is not a number"),
        (line(Q="high"), "job 812: priority 'high' is not a number of at least 0"),
        (line(D="0"), "job 812: node count '0' is not a number of at least 1"),
        (line(S="tomorrow"), "job 812: expected start 'tomorrow' is not a time in seconds"),
        ("\n" + line(Y="gpu-node[2-"), "job 812: unbalanced brackets in host list 'gpu-node[2-'"),
    ],
)  # fmt: skip
def test_an_answer_that_cannot_be_read_whole_is_an_error_naming_the_line(text, error):
    with pytest.raises(PendingError) as raised:
        parse_squeue_pending(text, SETTINGS)
    assert str(raised.value) == error


def rest_job(**fields) -> dict:
    job = {
        "job_id": 812, "job_state": "PENDING", "priority": 4294901750, "node_count": 2,
        "tres_per_node": "gres:gpu:a100:8", "start_time": int(START.timestamp()),
        "partition": "gpu", "state_reason": "Resources", "name": "train", "comment": "",
        "required_nodes": "",
    }  # fmt: skip
    job.update(fields)
    return job


def test_slurmrestd_pending_jobs_are_claims_and_other_states_are_not():
    payload = {
        "jobs": [
            rest_job(),
            rest_job(job_id=813, job_state="RUNNING"),
            rest_job(job_id=814, name="gantry-a9", comment="gantry-a9"),
            rest_job(job_id=815, start_time=0, required_nodes="gpu-node1", node_count=1),
        ]
    }
    assert parse_rest_pending(payload, SETTINGS) == [
        PendingClaim("Slurm job 812", "a100-80gb", 2, 8, 4294901750, START),
        PendingClaim("Slurm job 815", "a100-80gb", 1, 8, 4294901750, None, (), ("gpu-node1",)),
    ]


@pytest.mark.parametrize(
    ("job", "error"),
    [
        (rest_job(job_state=None), "job 812 has no job_state"),
        (rest_job(node_count=None), "job 812: node_count 'None' is not a number of at least 1"),
        (rest_job(priority="top"), "job 812: priority 'top' is not a number of at least 0"),
        (rest_job(priority=True), "job 812: priority 'True' is not a number of at least 0"),
        (rest_job(job_id=None), "a job in slurmrestd's answer has job id 'None'"),
        ("812", "a job in slurmrestd's answer is not an object"),
    ],
)
def test_a_slurmrestd_answer_with_missing_fields_is_an_error(job, error):
    with pytest.raises(PendingError) as raised:
        parse_rest_pending({"jobs": [job]}, SETTINGS)
    assert str(raised.value) == error


def test_a_reclaiming_job_asks_for_top_priority_only_through_the_cli():
    reclaiming = spec(reclaiming=True)
    cli = batch_job(reclaiming, SETTINGS)
    assert cli.top_priority and "--priority=TOP" in cli.sbatch_options()
    assert "#SBATCH --priority=TOP" in cli.script.splitlines()
    assert not batch_job(spec(), SETTINGS).top_priority
    operator_less = SlurmSettings.parse(
        {"transport": "cli", "job_dir": "/j", "flavors": {"a100-80gb": "a100"},
         "reclaim_priority": False}
    )  # fmt: skip
    assert not batch_job(reclaiming, operator_less).top_priority
    rest = SlurmSettings.parse(
        {"job_dir": "/j", "flavors": {"a100-80gb": "a100"}, "rest_url": "http://slurm:6820",
         "rest_user": "gantry", "rest_token_env": "SLURM_JWT"}
    )  # fmt: skip
    job = batch_job(reclaiming, rest)
    assert not job.top_priority and "priority" not in job.rest_submission()["job"]


@pytest.mark.parametrize(
    ("answer", "operator"),
    [("Administrator\n", True), ("Operator\n", True), ("None\n", False), ("", False)],
)
def test_only_an_operator_may_put_a_job_first(answer, operator):
    # sacctmgr -n -P show user NAME format=AdminLevel; "" for a user Slurm does not know.
    # Slurm 22.05 ignores --priority=TOP of anyone else without a word (tried on the test
    # cluster: the job of a user with AdminLevel None got the usual priority).
    assert is_operator(answer) is operator
