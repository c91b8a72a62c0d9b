"""What the end-to-end node-health tests share (issue 34, acceptance 8): dcgm-exporter's
answer for one node, and a stand-in for the Celery worker that runs what Gantry enqueued.

The tests go through Gantry's own services and tasks: the telemetry task scrapes exporters
the test serves on 127.0.0.1, the periodic sync task pushes quarantines to the backend,
and the jobs Gantry enqueues on commit (cancel, admission cycle, submit) are run the way a
worker runs them, in the order they were sent.
"""

import json
from collections.abc import Callable, Mapping

from celery import current_app
from rest_framework.test import APIClient

from jobs import enqueue
from telemetry.exposition.parsing import ECC_DBE_VOL, XID_ERRORS

EVENTS_URL = "/api/v1/attempts/events/"


def _labels(node: str, gpu: int) -> str:
    # dcgm-exporter's labels for one GPU (etc/default-counters.csv; Hostname is the node).
    return (
        f'gpu="{gpu}",UUID="GPU-{node}-{gpu:04d}",pci_bus_id="00000000:{gpu + 7:02X}:00.0",'
        f'device="nvidia{gpu}",modelName="NVIDIA A100-SXM4-80GB",Hostname="{node}",'
        'DCGM_FI_DRIVER_VERSION="550.54.15"'
    )


def exporter_body(
    node: str,
    *,
    gpus: int = 8,
    xid: Mapping[int, int] | None = None,
    dbe: Mapping[int, int] | None = None,
) -> bytes:
    """dcgm-exporter's /metrics of ``node``: the last XID and the volatile double-bit ECC
    count of each GPU (0 unless ``xid`` / ``dbe`` say otherwise, by GPU index)."""
    xid, dbe = xid or {}, dbe or {}
    lines = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        *(f"DCGM_FI_DEV_GPU_UTIL{{{_labels(node, gpu)}}} 97" for gpu in range(gpus)),
        f"# HELP {XID_ERRORS} Value of the last XID error encountered.",
        f"# TYPE {XID_ERRORS} gauge",
        *(f"{XID_ERRORS}{{{_labels(node, gpu)}}} {xid.get(gpu, 0)}" for gpu in range(gpus)),
        f"# HELP {ECC_DBE_VOL} Total number of double-bit volatile ECC errors.",
        f"# TYPE {ECC_DBE_VOL} counter",
        *(f"{ECC_DBE_VOL}{{{_labels(node, gpu)}}} {dbe.get(gpu, 0)}" for gpu in range(gpus)),
    ]
    return ("\n".join(lines) + "\n").encode()


def checkpoint_report(token: str, *, step: int, uri: str, ts: float) -> dict:
    """The job-side SDK's checkpoint_saved event, posted with the job's own token to the
    attempt API; the API's answer."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Attempt " + token)
    event = {"type": "checkpoint_saved", "seq": 1, "ts": ts, "step": step, "uri": uri}
    body = {"source": "rank0", "sdk": "gantry-sdk/0.1.0", "events": [event | {"seconds": 4.0}]}
    response = client.post(EVENTS_URL, json.dumps(body), content_type="application/json")
    assert response.status_code == 202, response.content
    return response.json()


class Worker:
    """Celery's worker, inline: ``jobs.enqueue`` sends each task here once its transaction
    commits (the test's callbacks run on commit), and ``run`` takes them in the order they
    were sent, as one worker would, until none is left."""

    def __init__(self, monkeypatch, capture: Callable) -> None:
        self.sent: list[tuple[str, tuple[int, ...]]] = []
        self.done: list[tuple[str, tuple[int, ...]]] = []
        self._capture = capture
        monkeypatch.setattr(enqueue, "_send", self._send)

    def _send(self, task: str, *args: int, countdown: float = 0) -> None:
        self.sent.append((task, args))

    def call(self, function: Callable, *args, **kwargs):
        """Call ``function`` and send what it enqueued (its on-commit callbacks)."""
        with self._capture(execute=True):
            return function(*args, **kwargs)

    def run_next(self) -> tuple[str, tuple[int, ...]]:
        """Run the task sent first; it and its arguments."""
        task, args = self.sent.pop(0)
        self.call(current_app.tasks[task], *args)
        self.done.append((task, args))
        return task, args

    def run(self) -> list[tuple[str, tuple[int, ...]]]:
        """Run every task sent, and those they send; returns them in order."""
        ran = []
        while self.sent:
            ran.append(self.run_next())
        return ran
