"""The queueing policies admission applies to a tenant's line of runs of a flavor (pure: no
Django). Set per cluster (``clusters.models.Cluster.queueing``) and, overriding it, per
tenant (``tenants.models.Tenant.queueing``); read by admission through
``jobs.admission_types``. Here, at the bottom of the app layers, so that both models and the
pure admission code take it from one place."""

from enum import StrEnum


class Queueing(StrEnum):
    """What a tenant's later runs of a flavor may do while the first in line cannot be
    placed (docs/admission.md, "Backfill"): wait behind it (``strict``), start if they do
    not delay its reserved start (``backfill``, EASY), or start whenever they fit
    (``best-effort``, Kueue's BestEffortFIFO: the head can starve)."""

    STRICT = "strict"
    BACKFILL = "backfill"
    BEST_EFFORT = "best-effort"


# A cluster's policy until a platform admin sets another.
QUEUEING_DEFAULT = Queueing.BACKFILL
# The longest value: the width of the columns that store one.
QUEUEING_MAX_LENGTH = max(len(policy.value) for policy in Queueing)
