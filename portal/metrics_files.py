"""Where the processes of one deployment keep their metric values (prometheus_client's
multiprocess mode), and how the deployment starts them afresh.

Every gunicorn worker, Celery worker and beat writes its counters and histograms to files of
its own, named after its process id, under ``PROMETHEUS_MULTIPROC_DIR``; a scrape of
/metrics sums the files of every process (portal/metrics.py). Each host (each container of
docker-compose.yml, which share the root on a volume) writes into a directory of its own
below the deployment's root, so two containers whose processes have the same id never
share a file; the scrape reads them all.

What starts the processes of a host empties that host's directory first, while none of them
runs (``manage.py metrics_reset``: ``make run`` through portal/embedded.py, each service of
docker-compose.yml before it starts its program): the files of processes from an earlier
start would otherwise be added in forever, and a new process could reuse an old one's id.
Prometheus sees the fresh start as a counter reset, which ``rate()`` and ``increase()``
handle. Never empty a directory whose processes run: they keep writing to files already
open, and a process that opens its first file of a kind then fails.

No Django here: the settings use it before Django is set up.
"""

import os
import shutil
import socket
import sys
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def process_metrics_dir(root: Path) -> Path:
    """This host's directory below ``root``, created if missing."""
    directory = root / socket.gethostname()
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def metrics_dir_use(root: Path) -> Path:
    """Make this process keep its values in this host's directory below ``root``.

    prometheus_client chooses where values live once, when it is first imported: this must
    run before that (the settings call it), or the values would stay in memory, unseen by
    the scrape of another process."""
    loaded = sys.modules.get("prometheus_client.values")
    if loaded is not None and loaded.ValueClass.__name__ != "MmapedValue":
        raise RuntimeError(
            "prometheus_client was imported before the settings set PROMETHEUS_MULTIPROC_DIR"
        )
    directory = process_metrics_dir(root)
    os.environ[MULTIPROC_ENV] = str(directory)
    return directory


def host_metrics_reset(root: Path) -> Path:
    """Forget the values of this host's processes: only while none of them runs."""
    directory = root / socket.gethostname()
    shutil.rmtree(directory, ignore_errors=True)
    return process_metrics_dir(root)


def metric_files(root: Path) -> list[Path]:
    """Every process's value file, of every host."""
    return sorted(root.glob("*/*.db"))
