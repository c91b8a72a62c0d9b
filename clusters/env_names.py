"""Which environment variable names an experiment may set.

An experiment's env is for the program, inside its container. Gantry delivers it there and
nowhere else (Slurm: exported by the shell the step runs in the container, after srun and the
container runtime have started; Kubernetes: the container's env), and refuses at submit the
names something else would read on the way, so a name cannot mean one thing in the record and
another on the cluster:

- the host-side launcher: Slurm reads ``SLURM_*`` (``SLURM_JOB_ID`` would point a step at
  another job's allocation: every tenant's jobs run as one Slurm user), ``SRUN_*``,
  ``SBATCH_*``, ``SALLOC_*``, ``SPANK_*`` and the PMI/PMIx variables; the container runtimes
  ``PYXIS_*``, ``ENROOT_*``, ``APPTAINER*``, ``SINGULARITY*``;
- the dynamic loader: ``LD_*`` (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, …);
- bash at start-up: ``BASH_ENV``, ``ENV``, ``SHELLOPTS``, ``BASHOPTS``, ``BASH_FUNC_*``;
- names bash does not let a script set or pass on (read-only, or reset by bash itself:
  ``UID``, ``PPID``, ``RANDOM``, ``PWD``, ``SHLVL``, ``IFS``, …): refused rather than silently
  changed. The list was measured with bash 5.2 (``export NAME=v`` and ``NAME=v bash -c``);
  tested in ``tests/clusters/test_env_names.py``;
- Gantry's own: every variable Gantry puts in a job's environment itself
  (``clusters.job_env.GANTRY_ENV``: the attempt token, the API URL, the image, the
  checkpoint directory, the checkpoint a resumed attempt starts from), so the program never
  reads a value other than the one Gantry meant, on any backend. Other ``GANTRY_*`` names
  are the program's (``GANTRY_SIM_*`` steer the simulator).
"""

import re

from clusters.job_env import GANTRY_ENV

NAME_PATTERN = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z")

HOST_SIDE_PREFIXES = (
    "SLURM_", "SRUN_", "SBATCH_", "SALLOC_", "SPANK_", "PMI_", "PMIX_",
    "PYXIS_", "ENROOT_", "APPTAINER", "SINGULARITY",
    "LD_",
    "BASH_FUNC_",
)  # fmt: skip
HOST_SIDE_NAMES = frozenset({"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS"})
BASH_REFUSES = frozenset(
    {
        "BASH", "BASHOPTS", "BASHPID", "BASH_ALIASES", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0",
        "BASH_CMDS", "BASH_COMMAND", "BASH_LINENO", "BASH_SOURCE", "BASH_SUBSHELL",
        "BASH_VERSINFO", "BASH_VERSION", "DIRSTACK", "EPOCHREALTIME", "EPOCHSECONDS", "EUID",
        "FUNCNAME", "GROUPS", "HISTCMD", "IFS", "LINENO", "OLDPWD", "OPTERR", "OPTIND",
        "PPID", "PS4", "PWD", "RANDOM", "SECONDS", "SHELLOPTS", "SHLVL",
        "SRANDOM", "UID", "_",
    }
)  # fmt: skip


def env_name_refusal(name: str) -> str | None:
    """Why an experiment may not set ``name``, as the person submitting should read it; None
    when it may. The renderers ask again for records older than a rule."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return (
            f"{name!r} is not a valid variable name: letters, digits and _, not starting with "
            "a digit, at most 128 characters."
        )
    if name in GANTRY_ENV:
        return f"{name} is set by Gantry itself ({GANTRY_ENV[name]}); leave it out."
    if name in HOST_SIDE_NAMES or name.startswith(HOST_SIDE_PREFIXES):
        return (
            f"{name} is read by the cluster's launcher, the dynamic loader or the shell outside "
            "your container, not only by your program; Gantry does not pass such names. Set "
            "it inside your command instead (e.g. 'export NAME=value; python train.py')."
        )
    if name in BASH_REFUSES:
        return (
            f"{name} is set by bash itself and cannot be passed to a job; use another name, or "
            "set it inside your command."
        )
    return None
