"""The forms of the what-if pages: the new report (its window and its proposal, edited next
to today's values), and the confirmations of applying one. They parse types and build the
proposal's JSON (``policy.proposals``); the service judges it (``policy.selectors.replay_check``).
"""

from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.utils import timezone

from core.forms import ServiceErrorsMixin
from policy.selectors import PoolLine, QuotaLine

PRESETS = (("7", "The last 7 days"), ("30", "The last 30 days"), ("custom", "From … to …"))
PREEMPTION_CHOICES = (
    ("", "As now: borrowed runs are preempted to give guarantees back"),
    ("off", "Never: borrowed runs keep their GPUs until they end"),
)
BUDGET_MODES = (("hard", "Hard"), ("soft", "Soft"))
# The values of a quota a proposal edits, with their labels: (field, label, minimum).
QUOTA_FIELDS = (
    ("guaranteed", "Guaranteed GPUs", 0),
    ("borrow_limit", "Borrow limit", 0),
    ("weight", "Fair-share weight", 1),
    ("budget", "Monthly budget (GPU-hours)", 0),
)


def _number(**attrs) -> forms.NumberInput:
    return forms.NumberInput(attrs={"step": 1, **attrs})


def quota_field_name(line: QuotaLine, name: str) -> str:
    # Slugs hold no colon: "q:vision:a100-80gb:guaranteed" splits back without doubt.
    return f"q:{line.tenant}:{line.flavor}:{name}"


def pool_field_name(line: PoolLine) -> str:
    return f"n:{line.cluster}:{line.flavor}"


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


class ReplayRequestForm(ServiceErrorsMixin, forms.Form):
    """A window and a proposal: each quota of today with its proposed values (today's
    values to start with), each pool's nodes added or removed, the admission settings."""

    window = forms.ChoiceField(label="Window", choices=PRESETS, initial="30")
    starvation_after_min = forms.IntegerField(
        required=False,
        label="Hold GPUs for a run waiting longer than (minutes)",
        widget=_number(min=0),
        help_text="Empty: as now.",
    )
    preemption = forms.ChoiceField(
        label="Preemption", choices=PREEMPTION_CHOICES, required=False, initial=""
    )
    share = forms.BooleanField(
        required=False,
        label="Share with finance and the admins of the tenants it concerns",
        help_text="Each tenant's admins see their own tenant's rows and the platform totals.",
    )
    confirm_warnings = forms.BooleanField(
        required=False,
        label="Replay it even though the guarantees exceed the capacity",
        help_text="Shown, never applied: applying a proposal asks again.",
    )

    def __init__(
        self,
        *args,
        quotas: list[QuotaLine],
        pools: list[PoolLine],
        starvation_now_s: float,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.quota_lines, self.pool_lines = quotas, pools
        date_widget = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
        # "from" is a Python keyword, so the range fields cannot be class attributes.
        self.fields["from"] = forms.DateField(label="From", required=False, widget=date_widget)
        self.fields["to"] = forms.DateField(label="To", required=False, widget=date_widget)
        self.fields[
            "starvation_after_min"
        ].help_text = f"Empty: as now ({starvation_now_s / 60:g} minutes)."
        for line in quotas:
            quota = line.quota
            current = {
                "guaranteed": quota.guaranteed,
                "borrow_limit": quota.borrow_limit,
                "weight": quota.weight,
                "budget": None if quota.budget_gpu_hours is None else int(quota.budget_gpu_hours),
            }
            for name, label, minimum in QUOTA_FIELDS:
                self.fields[quota_field_name(line, name)] = forms.IntegerField(
                    label=f"{label} of {line.tenant} for {line.flavor}",
                    required=name != "budget",
                    initial=current[name],
                    widget=_number(min=minimum),
                )
            self.fields[quota_field_name(line, "budget_mode")] = forms.ChoiceField(
                label=f"Budget mode of {line.tenant} for {line.flavor}",
                choices=BUDGET_MODES,
                initial="hard" if quota.budget_hard else "soft",
            )
        for pool in pools:
            self.fields[pool_field_name(pool)] = forms.IntegerField(
                label=f"{pool.flavor} nodes added (+) or removed (−) on {pool.cluster}",
                required=False,
                initial=0,
                widget=_number(),
            )

    def quota_rows(self) -> list[tuple[QuotaLine, list[forms.BoundField]]]:
        """Each quota of today with the bound fields of its proposed values, for the page."""
        names = [name for name, _, _ in QUOTA_FIELDS] + ["budget_mode"]
        return [
            (line, [self[quota_field_name(line, name)] for name in names])
            for line in self.quota_lines
        ]

    def pool_rows(self) -> list[tuple[PoolLine, forms.BoundField]]:
        return [(pool, self[pool_field_name(pool)]) for pool in self.pool_lines]

    def window_bounds(self, *, now: datetime) -> tuple[datetime, datetime] | None:
        """The window chosen: a preset ends now; custom days run from the first day's
        start through the last day's end, in the portal's time zone."""
        data = self.cleaned_data
        if data["window"] != "custom":
            return now - timedelta(days=int(data["window"])), now
        first, last = data.get("from"), data.get("to")
        if first is None or last is None:
            self.add_error("from" if first is None else "to", "Choose the window's days.")
            return None
        return _day_start(first), min(now, _day_start(last + timedelta(days=1)))

    def proposal(self) -> dict[str, Any]:
        """The proposal's JSON: the quotas whose values differ from today's (each whole),
        the pools' nodes changed, the admission settings chosen."""
        data = self.cleaned_data
        quotas = []
        for line in self.quota_lines:
            values = {n: data.get(quota_field_name(line, n)) for n, _, _ in QUOTA_FIELDS}
            hard = data.get(quota_field_name(line, "budget_mode")) != "soft"
            proposed = {
                "tenant": line.tenant,
                "flavor": line.flavor,
                "guaranteed": values["guaranteed"],
                "borrow_limit": values["borrow_limit"],
                "max_gpus_per_run": line.quota.max_gpus_per_run,
                "budget_gpu_hours": values["budget"],
                "budget_hard": hard,
                "weight": values["weight"],
            }
            quota = line.quota
            today = {
                "guaranteed": quota.guaranteed,
                "borrow_limit": quota.borrow_limit,
                "budget_gpu_hours": quota.budget_gpu_hours,
                "budget_hard": quota.budget_hard,
                "weight": quota.weight,
            }
            if any(proposed[key] != value for key, value in today.items()):
                quotas.append(proposed)
        nodes = [
            {"cluster": pool.cluster, "flavor": pool.flavor, "count": count, "gpus_per_node": 0}
            for pool in self.pool_lines
            if (count := data.get(pool_field_name(pool))) not in (None, 0)
        ]
        minutes = data.get("starvation_after_min")
        return {
            "quotas": quotas,
            "nodes": nodes,
            "preemption": False if data.get("preemption") == "off" else None,
            "starvation_after_s": None if minutes is None else minutes * 60,
        }


class ApplyForm(ServiceErrorsMixin, forms.Form):
    confirm = forms.BooleanField(
        label="Set these quotas now",
        help_text="Each change is saved and audited as on the quota form; admission applies "
        "them at its next cycle.",
    )
    confirm_overcommit = forms.BooleanField(
        required=False,
        label="Set them even though the guarantees of a flavor exceed its capacity",
        help_text="Guarantees beyond the GPUs the clusters have cannot all be kept at once.",
    )
