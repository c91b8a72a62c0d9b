"""jobs.attribution: the cause class of an ended attempt and its evidence (no database)."""

import pytest

from jobs.attribution import (
    GRACE_S,
    HARDWARE,
    PLATFORM,
    USER,
    EndedAttempt,
    HealthEvent,
    attribute,
)

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
T0_ISO = "2027-01-15T08:00:00+00:00"
END = T0 + 3600


def ended(**facts) -> EndedAttempt:
    base = {
        "state": "FAILED",
        "ended": END,
        "started": T0,
        "nodes": ("n1", "n2"),
        "gpus": ("0", "1", "2", "3"),
    }
    return EndedAttempt(**{**base, **facts})


XID79 = HealthEvent("n2", "gpu_lost", T0 + 60, gpu="3", code="79", detail="fell off the bus")


def test_cause_class_values_are_the_models():
    from jobs.models import CauseClass

    assert (
        CauseClass.USER.value,
        CauseClass.PLATFORM.value,
        CauseClass.HARDWARE.value,
    ) == (USER, PLATFORM, HARDWARE)


@pytest.mark.parametrize("state", ["SUCCEEDED", "CANCELLED"])
def test_success_and_cancel_get_no_class(state):
    assert attribute(ended(state=state), [XID79]) == ("", {})


def test_hardware_event_on_its_gpu_is_the_cause_with_the_earliest_as_evidence():
    later = HealthEvent("n1", "ecc_uncorrectable", T0 + 120, gpu="0", code="48")
    cause = attribute(ended(failure_reason="USER_EXIT", exit_code=1), [later, XID79])
    assert cause == (
        HARDWARE,
        {
            "node": "n2",
            "gpu": "3",
            "signal": "gpu_lost",
            "code": "79",
            "at": "2027-01-15T08:01:00+00:00",
            "detail": "fell off the bus",
        },
    )


def test_gpu_event_on_another_gpu_of_the_node_is_not_this_attempts():
    other_gpu = HealthEvent("n2", "gpu_lost", T0 + 60, gpu="7", code="79")
    cause, evidence = attribute(ended(failure_reason="USER_EXIT", exit_code=1), [other_gpu])
    assert cause == USER
    assert evidence["signal"] == "user_exit"


def test_gpu_event_counts_for_any_gpu_when_the_attempts_gpus_are_unknown():
    other_gpu = HealthEvent("n2", "gpu_lost", T0 + 60, gpu="7", code="79")
    cause, evidence = attribute(ended(gpus=(), failure_reason="USER_EXIT"), [other_gpu])
    assert (cause, evidence["gpu"]) == (HARDWARE, "7")


def test_node_level_event_counts_whatever_its_gpus():
    down = HealthEvent("n1", "node_down", T0 + 5, detail="Slurm: NOT_RESPONDING")
    assert attribute(ended(failure_reason="NODE_FAILURE"), [down])[1]["detail"] == (
        "Slurm: NOT_RESPONDING"
    )


@pytest.mark.parametrize(
    ("at", "counts"),
    [
        (T0 - 1, False),  # before it started
        (T0, True),
        (END + GRACE_S, True),  # reported a scrape after the job died of it
        (END + GRACE_S + 1, False),
    ],
)
def test_window_is_the_attempt_plus_a_grace(at, counts):
    event = HealthEvent("n1", "nvlink", at, code="74")
    cause, _ = attribute(ended(failure_reason="USER_EXIT"), [event])
    assert cause == (HARDWARE if counts else USER)


def test_non_hardware_signals_do_not_blame_the_hardware():
    events = [
        HealthEvent("n1", "thermal_throttle", T0 + 10),
        HealthEvent("n1", "xid_application", T0 + 10, gpu="0", code="13"),
        HealthEvent("n1", "attempt_failures", T0 + 10),
    ]
    assert attribute(ended(failure_reason="OOM_GPU"), events)[0] == USER


def test_an_attempt_with_no_node_list_is_concerned_by_no_event():
    cause, evidence = attribute(ended(nodes=(), failure_reason="USER_EXIT", exit_code=2), [XID79])
    assert cause == USER
    assert evidence == {
        "node": "",
        "gpu": "",
        "signal": "user_exit",
        "code": "USER_EXIT",
        "at": "2027-01-15T09:00:00+00:00",
        "detail": "",
    }


@pytest.mark.parametrize(
    ("facts", "cause", "signal"),
    [
        ({"state": "PREEMPTED", "failure_reason": "PREEMPTED"}, PLATFORM, "preempted"),
        ({"state": "LOST", "failure_reason": "LOST"}, PLATFORM, "lost"),
        ({"failure_reason": "UNKNOWN", "backend_error": True}, PLATFORM, "backend_error"),
        ({"failure_reason": "OOM_GPU"}, USER, "oom_gpu"),
        ({"failure_reason": "OOM_HOST"}, USER, "oom_host"),
        ({"failure_reason": "USER_EXIT", "exit_code": 1}, USER, "user_exit"),
        ({"failure_reason": "IMAGE_PULL"}, USER, "image_pull"),
        ({"failure_reason": "TIMEOUT"}, USER, "timeout"),
        ({"failure_reason": "UNKNOWN"}, USER, "unknown"),
        ({"failure_reason": ""}, USER, "exit"),
        # NCCL without a hardware signal: the program's (see the module).
        ({"failure_reason": "NCCL"}, USER, "nccl"),
        ({"failure_reason": "NODE_FAILURE", "message": "node n1 down"}, HARDWARE, "node_down"),
        ({"failure_reason": "GPU_XID", "message": "GPU error"}, HARDWARE, "gpu_lost"),
        (
            {"failure_reason": "GPU_XID", "message": "Xid 48 on GPU 0"},
            HARDWARE,
            "ecc_uncorrectable",
        ),
        # An application XID says nothing about the hardware (NVIDIA's catalog).
        ({"failure_reason": "GPU_XID", "message": "XID: 13"}, USER, "xid_application"),
        (
            {
                "failure_reason": "USER_EXIT",
                "runtime_error": "CUDA error: uncorrectable ECC error encountered",
            },
            HARDWARE,
            "runtime_error",
        ),
        (
            {
                "failure_reason": "USER_EXIT",
                "runtime_error": "CUDA error: an illegal memory access",
            },
            USER,
            "user_exit",
        ),
    ],
)
def test_without_events_the_failure_reason_decides(facts, cause, signal):
    got_cause, evidence = attribute(ended(**facts), [])
    assert (got_cause, evidence["signal"]) == (cause, signal)


def test_nccl_with_a_hardware_event_is_the_hardware():
    link = HealthEvent("n1", "nvlink", T0 + 30, gpu="1", code="74")
    assert attribute(ended(failure_reason="NCCL"), [link])[0] == HARDWARE


def test_backend_words_are_the_evidence_of_an_unsupported_hardware_reason():
    facts = ended(nodes=("n1",), failure_reason="GPU_XID", message="Xid 79: GPU 3 fell off")
    assert attribute(facts, []) == (
        HARDWARE,
        {
            "node": "n1",
            "gpu": "",
            "signal": "gpu_lost",
            "code": "XID 79",
            "at": "2027-01-15T09:00:00+00:00",
            "detail": "Xid 79: GPU 3 fell off",
        },
    )


def test_a_person_draining_the_node_is_the_platforms():
    drained = HealthEvent("n1", "quarantine", T0 + 100, source="person", detail="bad fan")
    cause, evidence = attribute(ended(failure_reason="NODE_FAILURE"), [drained])
    assert (cause, evidence["signal"], evidence["detail"]) == (PLATFORM, "quarantine", "bad fan")


@pytest.mark.parametrize(
    ("source", "signal"),
    [("gantry", "fence"), ("gantry", "unfence"), ("person", "release"),
     ("health_check", "health_check_passed")],
)  # fmt: skip
def test_other_acts_on_the_node_are_no_cause(source, signal):
    """Gantry's push to the backend follows a quarantine (which is the cause, if any); a
    release or a passing check takes nothing out of service."""
    act = HealthEvent("n1", signal, T0 + 100, source=source)
    cause, evidence = attribute(ended(failure_reason="USER_EXIT", exit_code=1), [act])
    assert (cause, evidence["signal"]) == (USER, "user_exit")


def test_hardware_beats_preemption():
    cause, evidence = attribute(ended(state="PREEMPTED", failure_reason="PREEMPTED"), [XID79])
    assert (cause, evidence["code"], evidence["at"][:10]) == (HARDWARE, "79", T0_ISO[:10])


def test_never_started_attempt_looks_at_its_end_only():
    before = HealthEvent("n1", "gpu_lost", END - 1, gpu="0", code="79")
    at_end = HealthEvent("n1", "gpu_lost", END + 1, gpu="0", code="79")
    assert attribute(ended(started=None, failure_reason="LOST", state="LOST"), [before])[0] == (
        PLATFORM
    )
    assert attribute(ended(started=None, failure_reason="LOST", state="LOST"), [at_end])[0] == (
        HARDWARE
    )


def test_gpu_named_by_uuid_matches_the_attempts_uuids():
    uuids = ("GPU-aaaa", "GPU-bbbb")
    mine = HealthEvent("n1", "gpu_lost", T0 + 1, gpu="GPU-bbbb", code="79")
    other = HealthEvent("n1", "gpu_lost", T0 + 1, gpu="GPU-cccc", code="79")
    assert attribute(ended(gpus=uuids, failure_reason="USER_EXIT"), [mine])[0] == HARDWARE
    assert attribute(ended(gpus=uuids, failure_reason="USER_EXIT"), [other])[0] == USER


def test_gpu_index_against_reported_uuids_cannot_be_told_apart_and_counts():
    by_index = HealthEvent("n1", "gpu_lost", T0 + 1, gpu="5", code="79")
    facts = ended(gpus=("GPU-aaaa",), failure_reason="USER_EXIT")
    assert attribute(facts, [by_index])[1]["gpu"] == "5"


@pytest.mark.parametrize(
    ("cause", "evidence", "words"),
    [
        (
            HARDWARE,
            {"signal": "gpu_lost", "code": "79", "gpu": "3"},
            "a hardware fault on its node (XID 79 on GPU 3)",
        ),
        (
            HARDWARE,
            {"signal": "gpu_lost", "code": "XID 79", "gpu": ""},
            "a hardware fault on its node (XID 79)",
        ),
        (
            HARDWARE,
            {"signal": "node_down", "code": "NODE_FAILURE", "gpu": ""},
            "a hardware fault on its node (node down)",
        ),
        (HARDWARE, {}, "a hardware fault on its node"),
        (PLATFORM, {"signal": "preempted"}, "the platform: preempted to make room"),
        (PLATFORM, {"signal": "lost"}, "the platform: lost by the cluster"),
        (PLATFORM, {"signal": "quarantine"}, "the platform: its node was taken out of service"),
        (USER, {"signal": "oom_gpu"}, "the program"),
        ("", {}, ""),
    ],
)
def test_cause_words(cause, evidence, words):
    from jobs.attribution import cause_words

    assert cause_words(cause, evidence) == words
