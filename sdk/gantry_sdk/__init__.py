"""Gantry's job-side SDK: report ready, step windows, checkpoints and the runtime
environment of a training attempt to the Gantry portal.

Standard library only; a no-op outside Gantry. See docs/sdk.md.

    from gantry_sdk import Reporter

    reporter = Reporter.from_env()
    start_step = reporter.resume_step or 0
"""

from .client import Reporter
from .runtime_env import clean_runtime_report, collect_rank_versions, collect_runtime_env
from .step_timer import StepTimer
from .transport import EVENTS_PATH, MAX_BATCH_BYTES, MAX_BATCH_EVENTS, REPORT_PATH, SDK_VERSION

__version__ = SDK_VERSION

__all__ = [
    "EVENTS_PATH",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_EVENTS",
    "REPORT_PATH",
    "Reporter",
    "StepTimer",
    "__version__",
    "clean_runtime_report",
    "collect_rank_versions",
    "collect_runtime_env",
]
