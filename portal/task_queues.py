"""The Celery queues, one per kind of background work, and the queue of every task.

A worker consumes every queue unless told otherwise (``celery worker`` without ``-Q``: the
single host of docker-compose.yml and ``make run``); on Kubernetes each kind has its own
workers (deploy/kubernetes), so a burst of submits or a slow telemetry source does not
delay the admission cycle, and each kind scales by itself."""

ADMISSION = "admission"  # the admission cycle: which queued runs start where
BACKEND = "backend"  # submits, cancels and the sync with the clusters' backends
TELEMETRY = "telemetry"  # GPU metrics, idle and straggler scans
BACKGROUND = "background"  # start estimates, accounting, what-if replays: minutes late is fine

QUEUES = (ADMISSION, BACKEND, TELEMETRY, BACKGROUND)

QUEUE_OF_TASK = {
    "jobs.tasks.admission_cycle": ADMISSION,
    "jobs.tasks.attempt_submit": BACKEND,
    "jobs.tasks.attempt_cancel": BACKEND,
    "jobs.tasks.sync_all_clusters": BACKEND,
    "telemetry.tasks.telemetry_collect_all": TELEMETRY,
    "telemetry.tasks.telemetry_collect": TELEMETRY,
    "telemetry.tasks.idle_policy_enforce": TELEMETRY,
    "telemetry.tasks.straggler_scan": TELEMETRY,
    "telemetry.tasks.workspace_idle_scan": TELEMETRY,
    "jobs.tasks.estimate_starts": BACKGROUND,
    "jobs.tasks.budget_alerts": BACKGROUND,
    "telemetry.tasks.accounting_compute_pending": BACKGROUND,
    "finance.tasks.daily_usage_update": BACKGROUND,
    "policy.tasks.replay_report_run": BACKGROUND,
}


def queue_of(task: str) -> str:
    """The queue a task is routed to: its own, or the default (the settings' route)."""
    return QUEUE_OF_TASK.get(task, BACKGROUND)
