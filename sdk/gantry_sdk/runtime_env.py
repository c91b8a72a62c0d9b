"""The runtime environment of a training process (driver, CUDA, cuDNN, NCCL, frameworks,
host, GPUs), collected best-effort, and cleaned to what the runtime-report endpoint accepts."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys

# The runtime report's limits (jobs/serializers/runtime.py): strings of at most 200 characters.
MAX_REPORT_TEXT = 200
MAX_REPORT_ITEMS = 1024
MAX_REPORT_FRAMEWORKS = 64


def _text(value):
    return str(value).strip()[:MAX_REPORT_TEXT]


def _run(argv, timeout):
    """stdout of a command, or "" if it is missing, fails or takes longer than ``timeout``."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        done = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except Exception:
        return ""
    if done.returncode != 0:
        return ""
    return done.stdout.decode("utf-8", "replace")


def _packed_version(version):
    """``8907`` → ``8.9.7`` (major * 1000 + …); ``90100`` → ``9.1.0`` (major * 10000 + …,
    cuDNN 9+ and NCCL 2.9+)."""
    major_unit = 10000 if version >= 10000 else 1000
    return f"{version // major_unit}.{version % major_unit // 100}.{version % 100}"


def _cudnn_text(version):
    return _packed_version(int(version))


def _nccl_text(version):
    if isinstance(version, (tuple, list)):
        return ".".join(str(part) for part in version)
    return _packed_version(int(version))


def _torch_facts(report, import_torch):
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch
        except Exception:
            return
    if torch is None:
        return
    with contextlib.suppress(Exception):
        report.setdefault("framework", {})["torch"] = _text(torch.__version__)
    try:
        if torch.version.cuda:
            report["cuda_version"] = _text(torch.version.cuda)
    except Exception:  # noqa: S110
        pass
    try:
        cudnn = torch.backends.cudnn.version()
        if cudnn:
            report["cudnn_version"] = _cudnn_text(cudnn)
    except Exception:  # noqa: S110
        pass
    try:
        if torch.cuda.is_available():
            report["nccl_version"] = _nccl_text(torch.cuda.nccl.version())
    except Exception:  # noqa: S110
        pass


def collect_runtime_env(import_torch=True, nvidia_smi_timeout=5.0, environ=None):
    """The runtime report of this process, best-effort, in the keys the runtime-report
    endpoint accepts (every value a string, lists of strings for ``node_list`` and
    ``gpu_uuids``, ``framework`` a name → version map). Never raises."""
    environ = os.environ if environ is None else environ
    report = {"python_version": platform.python_version()}
    with contextlib.suppress(Exception):
        report["hostname"] = _text(socket.gethostname())
    with contextlib.suppress(Exception):
        report["kernel_version"] = _text(platform.release())
    with contextlib.suppress(Exception):
        _torch_facts(report, import_torch)
    for name in ("jax", "tensorflow", "transformers", "deepspeed", "lightning"):
        module = sys.modules.get(name)  # only what the job already imported
        version = getattr(module, "__version__", None) if module else None
        if version:
            report.setdefault("framework", {})[name] = _text(version)
    smi = _run(
        ["nvidia-smi", "--query-gpu=driver_version,uuid", "--format=csv,noheader"],
        nvidia_smi_timeout,
    )
    uuids = []
    for line in smi.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 2 and parts[1]:
            report.setdefault("driver_version", _text(parts[0]))
            uuids.append(_text(parts[1]))
    if uuids:
        report["gpu_uuids"] = uuids[:MAX_REPORT_ITEMS]
    nodelist = environ.get("SLURM_JOB_NODELIST", "").strip()
    if nodelist:
        hosts = _run(["scontrol", "show", "hostnames", nodelist], nvidia_smi_timeout).split()
        report["node_list"] = [_text(h) for h in hosts[:MAX_REPORT_ITEMS]] or [_text(nodelist)]
    return report


# The driver's kernel module names its version here: read without starting a process.
NVIDIA_VERSION_FILE = "/proc/driver/nvidia/version"
_NVRM_VERSION = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s")


def _driver_version(version_file, nvidia_smi_timeout):
    """The NVIDIA driver's version: from the kernel module's file, else ``nvidia-smi``;
    None if neither says."""
    with contextlib.suppress(Exception), open(version_file, encoding="utf-8") as file:
        found = _NVRM_VERSION.search(file.read(4096))
        if found:
            return found.group(1)
    smi = _run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], nvidia_smi_timeout
    )
    for line in smi.splitlines():
        if line.strip():
            return _text(line)
    return None


def collect_rank_versions(
    import_torch=False, nvidia_smi_timeout=5.0, version_file=NVIDIA_VERSION_FILE
):
    """What every rank reports of itself, cheaply: ``nccl_version`` and ``cuda_version``
    from torch (only if the job imported it, unless ``import_torch``), ``driver_version``
    from the driver's kernel module (``nvidia-smi`` if that cannot be read). Only the
    versions found; never raises."""
    report = {}
    with contextlib.suppress(Exception):
        _torch_facts(report, import_torch)
    versions = {name: report[name] for name in ("nccl_version", "cuda_version") if name in report}
    with contextlib.suppress(Exception):
        driver = _driver_version(version_file, nvidia_smi_timeout)
        if driver:
            versions["driver_version"] = _text(driver)
    return versions


def clean_runtime_report(report):
    """Only the keys and shapes the runtime-report endpoint accepts; the rest dropped."""
    clean = {}
    for name in (
        "driver_version",
        "cuda_version",
        "cudnn_version",
        "nccl_version",
        "python_version",
        "hostname",
        "kernel_version",
    ):
        value = report.get(name)
        if value is not None and _text(value):
            clean[name] = _text(value)
    framework = report.get("framework")
    if isinstance(framework, dict):
        items = [(_text(k), _text(v)) for k, v in framework.items() if _text(k) and _text(v)]
        if items:
            clean["framework"] = dict(items[:MAX_REPORT_FRAMEWORKS])
    for name in ("node_list", "gpu_uuids"):
        value = report.get(name)
        if isinstance(value, (list, tuple)):
            clean[name] = [_text(v) for v in value if _text(v)][:MAX_REPORT_ITEMS]
    return clean
