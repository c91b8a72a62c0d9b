"""Which rank a process is, and which physical GPU it drives, from the launcher's variables.

Every rank reports its own step windows (``rank_window`` events) so Gantry can tell which
rank is slow; these are the fields that name the rank. Standard library only.
"""

from __future__ import annotations

import os
import socket

# Launchers' variables, in the order they are read: torchrun / torch.distributed, Slurm,
# Open MPI, MPICH / Intel MPI (PMI).
RANK_ENVS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_ENVS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_ENVS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# The node's name as the cluster knows it (what DCGM labels its samples with): the
# Kubernetes downward API's usual NODE_NAME, Slurm's node name, else the host name.
HOST_ENVS = ("NODE_NAME", "SLURMD_NODENAME")
RANKS_ENV = "GANTRY_SDK_RANKS"  # "0" (or false/no/off): no per-rank windows
DEVICE_ENV = "GANTRY_SDK_DEVICE"  # the CUDA device index the process uses, if not LOCAL_RANK
GPU_ENV = "GANTRY_SDK_GPU"  # the physical GPU by name (index or UUID), when the job knows better
MAX_HOST_CHARS = 255
MAX_GPU_CHARS = 64
MAX_WORLD_SIZE = 65536


def _first_int(environ, names):
    for name in names:
        raw = environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def env_rank(environ):
    """The process's global rank, or None when no launcher set one."""
    return _first_int(environ, RANK_ENVS)


def ranks_enabled(environ):
    """False when the job opted out of per-rank windows (``GANTRY_SDK_RANKS=0``)."""
    raw = environ.get(RANKS_ENV, "").strip().lower()
    return raw not in ("0", "false", "no", "off")


def physical_gpu(environ, device):
    """The GPU that CUDA device ``device`` is, as the node numbers it: the ``device``-th
    entry of ``CUDA_VISIBLE_DEVICES`` (an index, or a ``GPU-…`` UUID), else ``device``
    itself. None when the variable hides every GPU or has fewer entries."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(device)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if len(entries) == 1:  # one GPU per task (srun --gpus-per-task=1): device 0 is it
        return entries[0][:MAX_GPU_CHARS]
    if device >= len(entries):
        return None
    return entries[device][:MAX_GPU_CHARS]


def _host(environ):
    for name in HOST_ENVS:
        value = environ.get(name, "").strip()
        if value:
            return value[:MAX_HOST_CHARS]
    return socket.gethostname()[:MAX_HOST_CHARS]


def rank_identity(environ=None):
    """The fields every ``rank_window`` of this process carries: ``rank``, ``local_rank``,
    ``world_size``, ``host``, ``gpu``; or None when the process is not one rank of several
    (no launcher, a world of one) or its GPU cannot be named, so it sends no rank windows."""
    environ = os.environ if environ is None else environ
    rank = env_rank(environ)
    world_size = _first_int(environ, WORLD_SIZE_ENVS)
    if rank is None or world_size is None or not rank < world_size <= MAX_WORLD_SIZE:
        return None
    if world_size < 2:  # nothing to compare a single rank with
        return None
    local_rank = _first_int(environ, LOCAL_RANK_ENVS)
    device = _first_int(environ, (DEVICE_ENV,))
    if device is None:
        device = 0 if local_rank is None else local_rank
    gpu = environ.get(GPU_ENV, "").strip()[:MAX_GPU_CHARS] or physical_gpu(environ, device)
    if gpu is None:
        return None
    return {
        "rank": rank,
        "local_rank": 0 if local_rank is None else local_rank,
        "world_size": world_size,
        "host": _host(environ),
        "gpu": gpu,
    }
