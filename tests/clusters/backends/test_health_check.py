"""The health check on demand: its setting, the verdict of its end, and its job on Kubernetes
(the fake API server) reaching a node Gantry fenced. On Slurm: test_slurm_cluster.py."""

import pytest

from clusters.backends.base import JobRef, JobStatus, PermanentBackendError
from clusters.backends.health_check import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    RUNNING,
    HealthCheckResult,
    HealthCheckSettings,
    HealthCheckSettingsError,
    health_check_name,
    health_check_result,
    health_check_signal,
    parse_health_check,
)
from clusters.health import Signal, SignalClass, Source
from tests.clusters.backends.test_k8s_backend import A100, DIGEST, backend, run_until
from tests.clusters.backends.test_k8s_fence import fake  # noqa: F401 (the fixture)

IMAGE = f"nvcr.io/nvidia/cloud-native/dcgm@{DIGEST}"


def test_the_setting_is_checked():
    assert parse_health_check(None, needs_image=True) is None
    assert parse_health_check({"command": "dcgmi diag -r 1"}, needs_image=False) == (
        HealthCheckSettings(command="dcgmi diag -r 1", max_runtime_s=600)
    )
    assert parse_health_check(
        {"command": "dcgmi diag -r 2", "image": IMAGE, "max_runtime_s": 300}, needs_image=True
    ) == HealthCheckSettings(command="dcgmi diag -r 2", image=IMAGE, max_runtime_s=300)
    refusals = [
        ({}, False, "health_check: command is required (a shell line)"),
        ({"command": "  "}, False, "health_check: command is required (a shell line)"),
        (
            {"command": "x", "image": IMAGE},
            False,
            "health_check: unknown setting(s) image (it takes account, command, max_runtime_s)",
        ),
        (
            {"command": "x", "image": "nvcr.io/nvidia/dcgm:latest"},
            True,
            "health_check: image is required, pinned by digest (repository@sha256:…)",
        ),
        (
            {"command": "x", "account": "a b"},
            False,
            "health_check: account 'a b' is not a Slurm name",
        ),
        (
            {"command": "x", "max_runtime_s": 5},
            False,
            "health_check: max_runtime_s must be a whole number of seconds from 10 to 86400",
        ),
        (
            "dcgmi diag",
            False,
            'setting health_check must be an object such as {"command": "dcgmi diag -r 1"}',
        ),
    ]
    for raw, needs_image, message in refusals:
        with pytest.raises(HealthCheckSettingsError) as refused:
            parse_health_check(raw, needs_image=needs_image)
        assert str(refused.value) == message
    with pytest.raises(ValueError, match="positive integer"):
        health_check_name(0)
    assert health_check_name(12) == "gantry-hc12"


def status(state, exit_code=None, reason="", message="Slurm job 5 ..."):
    return JobStatus(state=state, exit_code=exit_code, failure_reason=reason, message=message)


@pytest.mark.parametrize(
    "job, expected",
    [
        (None, HealthCheckResult(RUNNING)),
        (status("PENDING", message="Resources"), HealthCheckResult(RUNNING, None, "Resources")),
        (status("SUCCEEDED", 0), HealthCheckResult(PASSED, 0, "the health check passed (exit 0)")),
        (
            status("FAILED", 226, "USER_EXIT", "Slurm job 5 FAILED"),
            HealthCheckResult(
                FAILED, 226, "a dcgmi diag test failed (DCGM_ST_NVVS_ERROR): Slurm job 5 FAILED"
            ),
        ),
        (
            status("FAILED", 205, "USER_EXIT", "x"),
            HealthCheckResult(
                FAILED, 205, "dcgmi diag asks to isolate a GPU (DCGM_ST_NVVS_ISOLATE_ERROR): x"
            ),
        ),
        (
            status("FAILED", 1, "USER_EXIT", "x"),
            HealthCheckResult(FAILED, 1, "the health check failed with exit code 1: x"),
        ),
        (
            status("FAILED", None, "TIMEOUT", "x"),
            HealthCheckResult(
                INCONCLUSIVE, None, "the health check did not run to its end (TIMEOUT): x"
            ),
        ),
        (
            status("CANCELLED", None, "CANCELLED", "x"),
            HealthCheckResult(
                INCONCLUSIVE, None, "the health check did not run to its end (CANCELLED): x"
            ),
        ),
        (
            status("FAILED", 137, "NODE_FAILURE", "x"),
            HealthCheckResult(
                INCONCLUSIVE, 137, "the health check did not run to its end (NODE_FAILURE): x"
            ),
        ),
    ],
)
def test_the_verdict_of_a_checks_end(job, expected):
    assert health_check_result(job) == expected


def test_only_a_failed_check_is_a_signal():
    failed = HealthCheckResult(FAILED, 226, "a dcgmi diag test failed (DCGM_ST_NVVS_ERROR)")
    assert health_check_signal("gpu-node2", failed, at=1_700_000_000.0) == Signal(
        node="gpu-node2",
        signal=SignalClass.HEALTH_CHECK_FAILED,
        source=Source.HEALTH_CHECK,
        at=1_700_000_000.0,
        code="exit 226",
        detail="a dcgmi diag test failed (DCGM_ST_NVVS_ERROR)",
    )
    for verdict in (RUNNING, PASSED, INCONCLUSIVE):
        assert health_check_signal("gpu-node2", HealthCheckResult(verdict), at=1.0) is None


def test_on_kubernetes_the_check_reaches_the_fenced_node_only(fake):  # noqa: F811
    fake.controller.add_node("gpu-1", product=A100, gpus=8)
    fake.controller.add_node("gpu-2", product=A100, gpus=8)
    k8s = backend(fake, health_check={"command": "dcgmi diag -r 1", "image": IMAGE})
    k8s.fence("gpu-1", "XID 79 on GPU 1")
    ref = k8s.health_check("gpu-1", check_id=3, flavor="a100-80gb", gpus=8)
    assert ref == JobRef("gantry-hc3", "gantry-health-check/gantry-hc3")
    job = fake.store.get("jobs", "gantry-health-check", "gantry-hc3")
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["tolerations"] == [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "gantry.io/node-health", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod_spec["containers"][0]["command"] == ["/bin/bash", "-c", "dcgmi diag -r 1"]
    assert pod_spec["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert run_until(fake, k8s, ref, "RUNNING").node_list == ["gpu-1"]
    done = run_until(fake, k8s, ref, "SUCCEEDED")
    assert health_check_result(done).verdict == PASSED
    assert fake.store.get("nodes", "", "gpu-1")["spec"]["unschedulable"] is True


def test_without_the_setting_there_is_no_check(fake):  # noqa: F811
    fake.controller.add_node("gpu-1", product=A100, gpus=8)
    with pytest.raises(PermanentBackendError) as refused:
        backend(fake).health_check("gpu-1", check_id=1, flavor="a100-80gb", gpus=8)
    assert str(refused.value) == ("k8s-test has no health_check setting (its command and image)")
    with pytest.raises(PermanentBackendError, match="is not a Kubernetes node name"):
        backend(fake, health_check={"command": "true", "image": IMAGE}).health_check(
            "gpu-1; rm", check_id=1, flavor="a100-80gb", gpus=8
        )
    assert fake.store.list("jobs")[0] == []
