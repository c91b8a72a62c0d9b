"""Every rank reports its versions (issue 36): a rank other than 0 sends its NCCL, driver
and CUDA versions and host once, from a background thread, to the rank-report endpoint;
rank 0 sends its runtime report as before; ``GANTRY_SDK_RANKS=0`` turns it off. And where
the versions come from: torch if the job imported it, the driver's kernel module file."""

import json
import sys
import time
import types

import pytest

from tests.sdk.test_sdk import (  # the SDK, put on the path there
    TOKEN,
    Reporter,
    gantry_sdk,
    portal,  # noqa: F401 (the fixture)
    sdk_runtime_env,
)

sdk_client = gantry_sdk.client

TORCHRUN = {
    "RANK": "11",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "16",
    "CUDA_VISIBLE_DEVICES": "4,5,6,7",
    "NODE_NAME": "gpu-07",
}
VERSIONS = {"nccl_version": "2.21.5", "driver_version": "550.54.15", "cuda_version": "12.4"}
PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build\n"


def _env(portal, **extra):  # noqa: F811 (the fixture's value)
    return {"GANTRY_API_URL": portal.url, "GANTRY_ATTEMPT_TOKEN": TOKEN, **TORCHRUN, **extra}


@pytest.fixture
def versions(monkeypatch):
    """What the rank finds: fixed versions (the tests run without GPUs or torch)."""
    found = dict(VERSIONS)
    monkeypatch.setattr(sdk_client, "collect_rank_versions", lambda: dict(found))
    return found


def test_a_rank_other_than_zero_sends_its_versions_and_host_once(portal, versions):  # noqa: F811
    reporter = Reporter.from_env(_env(portal))
    reporter.runtime_env(extra={"node_list": ["gpu-07"]})
    reporter.runtime_env()
    assert reporter.flush(5)

    [request] = portal.posts("/rank-report/")
    assert request["path"] == "/api/v1/attempts/rank-report/"
    assert request["headers"]["authorization"] == f"Attempt {TOKEN}"
    assert json.loads(request["body"]) == {
        "rank": 11,
        "hostname": "gpu-07",
        "nccl_version": "2.21.5",
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
    }
    assert portal.posts("/attempts/report/") == []


def test_rank_zero_sends_its_runtime_report_and_no_rank_report(portal, versions):  # noqa: F811
    reporter = Reporter.from_env(_env(portal, RANK="0", LOCAL_RANK="0"))
    reporter.runtime_env(wait=True)
    assert reporter.flush(5)

    assert len(portal.posts("/attempts/report/")) == 1
    assert portal.posts("/rank-report/") == []


def test_every_rank_of_all_ranks_still_leaves_the_runtime_report_to_rank_zero(portal, versions):  # noqa: F811
    reporter = Reporter.from_env(_env(portal), all_ranks=True)
    reporter.runtime_env(wait=True)
    assert reporter.flush(5)

    assert [json.loads(r["body"])["rank"] for r in portal.posts("/rank-report/")] == [11]
    assert portal.posts("/attempts/report/") == []


@pytest.mark.parametrize("opt_out", [{"GANTRY_SDK_RANKS": "0"}, {"GANTRY_SDK_RANKS": "off"}])
def test_the_opt_out_sends_no_rank_report(portal, versions, opt_out):  # noqa: F811
    for reporter in (
        Reporter.from_env(_env(portal, **opt_out)),
        Reporter.from_env(_env(portal, **opt_out), all_ranks=True),
        Reporter.from_env(_env(portal), ranks=False),
    ):
        reporter.runtime_env(wait=True)
        assert reporter.flush(5)

    assert portal.requests == []


def test_a_rank_that_finds_no_version_sends_nothing(portal, versions):  # noqa: F811
    versions.clear()
    reporter = Reporter.from_env(_env(portal))
    reporter.runtime_env(wait=True)
    assert reporter.flush(5)

    assert portal.requests == []


def test_the_rank_report_never_waits_in_the_training_loop(portal, monkeypatch):  # noqa: F811
    def slow():
        time.sleep(0.5)
        return dict(VERSIONS)

    monkeypatch.setattr(sdk_client, "collect_rank_versions", slow)
    reporter = Reporter.from_env(_env(portal))

    started = time.perf_counter()
    reporter.runtime_env()
    returned_after = time.perf_counter() - started
    assert reporter.flush(5)

    assert returned_after < 0.05
    assert len(portal.posts("/rank-report/")) == 1


def test_a_refused_rank_report_is_not_resent(portal, versions, caplog):  # noqa: F811
    portal.statuses = [400]
    reporter = Reporter.from_env(_env(portal))
    reporter.runtime_env(wait=True)

    assert len(portal.posts("/rank-report/")) == 1
    assert "the portal refused the rank report (HTTP 400)" in caplog.text


# --- where the versions come from ----------------------------------------------------------------


def _fake_torch(nccl=(2, 21, 5), cuda="12.4"):
    nccl_module = types.SimpleNamespace(version=lambda: nccl)
    return types.SimpleNamespace(
        __version__="2.4.0",
        version=types.SimpleNamespace(cuda=cuda),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 90100)),
        cuda=types.SimpleNamespace(is_available=lambda: True, nccl=nccl_module),
    )


@pytest.mark.parametrize(("text", "driver"), [(PROPRIETARY, "550.54.15"), (OPEN, "560.35.03")])
def test_the_versions_come_from_torch_and_the_drivers_kernel_module(
    monkeypatch, tmp_path, text, driver
):
    version_file = tmp_path / "version"
    version_file.write_text(text)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())

    found = sdk_runtime_env.collect_rank_versions(version_file=str(version_file))

    assert found == {"nccl_version": "2.21.5", "cuda_version": "12.4", "driver_version": driver}


def test_without_torch_imported_a_rank_reports_its_driver_only(monkeypatch, tmp_path):
    version_file = tmp_path / "version"
    version_file.write_text(PROPRIETARY)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either

    found = sdk_runtime_env.collect_rank_versions(version_file=str(version_file))

    assert found == {"driver_version": "550.54.15"}
    assert "torch" not in sys.modules  # a rank does not import torch to report


def test_without_the_kernel_modules_file_the_driver_comes_from_nvidia_smi(monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '535.104.05\\n535.104.05\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)

    found = sdk_runtime_env.collect_rank_versions(version_file=str(tmp_path / "missing"))

    assert found == {"driver_version": "535.104.05"}


def test_nothing_found_is_nothing_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)

    assert sdk_runtime_env.collect_rank_versions(version_file=str(tmp_path / "missing")) == {}
