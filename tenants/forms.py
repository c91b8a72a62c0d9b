"""Forms of the platform pages: they parse types only; the services hold every rule."""

from django import forms

from core.forms import ServiceErrorsMixin
from tenants.models import (
    IDLE_POLICY_MAX_MIN,
    WORKSPACE_IDLE_MAX_MIN,
    WORKSPACE_IDLE_MIN_MIN,
    WORKSPACE_MAX_HOURS,
    ApiToken,
    Membership,
    Quota,
    max_length_of,
)
from tenants.services.memberships import MEMBER_IDENTIFIER_MAX_LENGTH
from tenants.services.tokens import API_TOKEN_DEFAULT_DAYS, API_TOKEN_MAX_DAYS


def _number(**attrs) -> forms.NumberInput:
    return forms.NumberInput(attrs={"step": 1, **attrs})


class QuotaForm(ServiceErrorsMixin, forms.Form):
    guaranteed_gpus = forms.IntegerField(
        label="Guaranteed GPUs",
        widget=_number(min=0),
        help_text="Always available to the tenant: reclaimed from borrowers when needed.",
    )
    borrow_limit_gpus = forms.IntegerField(
        label="Borrow limit (GPUs)",
        widget=_number(min=0),
        help_text="Idle GPUs the tenant may use beyond its guarantee; those runs are "
        "preemptible. Needs a cluster that offers the flavor.",
    )
    max_gpus_per_run = forms.IntegerField(
        required=False,
        label="Max GPUs per run",
        widget=_number(min=1),
        help_text="Leave empty for no limit.",
    )
    monthly_gpu_hour_budget = forms.IntegerField(
        required=False,
        label="Monthly budget (GPU-hours)",
        widget=_number(min=0),
        help_text="Allocated GPU-hours per calendar month (UTC). Leave empty for no budget.",
    )
    budget_mode = forms.ChoiceField(
        label="Budget mode",
        choices=Quota.BudgetMode.choices,
        help_text="What happens when the budget is spent.",
    )
    fair_share_weight = forms.IntegerField(
        label="Fair-share weight",
        widget=_number(min=1),
        help_text="Competing borrowers share idle GPUs in proportion to their weights.",
    )
    confirm_overcommit = forms.BooleanField(
        required=False,
        label="Save even though the guarantees of this flavor exceed its capacity",
        help_text="Guarantees beyond the GPUs the clusters have cannot all be kept at once: a "
        "tenant within its guarantee may still wait.",
    )


QUOTA_FORM_VALUES = ("confirm_overcommit",)  # form fields that are no quota field


def quota_initial(quota: Quota | None) -> dict:
    """Form values of an existing quota, or of a new one (the model's defaults)."""
    quota = quota or Quota()
    return {
        name: getattr(quota, name)
        for name in QuotaForm.base_fields
        if name not in QUOTA_FORM_VALUES
    }


class FlavorForm(ServiceErrorsMixin, forms.Form):
    slug = forms.CharField(
        label="Slug",
        help_text="As clusters report it, e.g. h100-80gb or a100-1g.10gb; it cannot change later.",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off"}),
    )
    name = forms.CharField(label="Name", required=False)
    memory_gb = forms.IntegerField(label="Memory (GB)", widget=_number(min=1))
    gpu_fraction = forms.DecimalField(
        label="Fraction of a full GPU",
        widget=forms.NumberInput(attrs={"step": "0.0001", "min": "0.0001", "max": "1"}),
        help_text="1 for a full GPU; 0.1429 for a 1/7 MIG slice. Reports weigh GPU-hours by it.",
    )

    def __init__(self, *args, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["slug"]


class IdlePolicyForm(ServiceErrorsMixin, forms.Form):
    idle_notify_after_min = forms.IntegerField(
        required=False,
        label="Warn after (idle minutes)",
        widget=_number(min=1, max=IDLE_POLICY_MAX_MIN),
        help_text="The run's submitter is notified and the run's timeline says so. "
        "Leave empty for no warning.",
    )
    idle_cancel_after_min = forms.IntegerField(
        required=False,
        label="Cancel after (idle minutes)",
        widget=_number(min=1, max=IDLE_POLICY_MAX_MIN),
        help_text="The run is cancelled; it must be later than the warning. "
        "Leave empty to never cancel.",
    )


class WorkspacePolicyForm(ServiceErrorsMixin, forms.Form):
    workspace_suspend_after_min = forms.IntegerField(
        label="Suspend after (idle minutes)",
        widget=_number(min=WORKSPACE_IDLE_MIN_MIN, max=WORKSPACE_IDLE_MAX_MIN),
        help_text="Idle on every signal (no kernel or terminal ran, nothing done through "
        "Gantry, GPUs idle) this long, a workspace is suspended: its GPUs released, its files "
        "kept.",
    )
    workspace_warn_before_min = forms.IntegerField(
        label="Warn before (minutes)",
        widget=_number(min=1, max=WORKSPACE_IDLE_MAX_MIN),
        help_text="Its owner is warned this long before the suspension.",
    )
    workspace_suspend_silent_busy = forms.BooleanField(
        required=False,
        label="Also suspend a kernel busy without output while its GPUs are idle",
        help_text="Off: such a workspace is only warned about (a CPU computation that prints "
        "nothing looks the same).",
    )
    workspace_max_hours = forms.IntegerField(
        label="Longest workspace (hours)",
        widget=_number(min=1, max=WORKSPACE_MAX_HOURS),
        help_text="Its hours at launch and every extension.",
    )


class MemberAddForm(ServiceErrorsMixin, forms.Form):
    # Named like the service's error key, so "no such user" sits next to this field.
    user = forms.CharField(
        label="Username or e-mail address",
        help_text="Exactly as the person's Gantry account has it. They must have signed in "
        "to Gantry once (or been given an account) before they can be added.",
        widget=forms.TextInput(
            attrs={
                "spellcheck": "false",
                "autocomplete": "off",
                "maxlength": MEMBER_IDENTIFIER_MAX_LENGTH,
            }
        ),
    )
    role = forms.CharField(
        label="Role",
        widget=forms.Select(choices=Membership.Role.choices),
        initial=Membership.Role.RESEARCHER,
        help_text="Researchers submit runs; tenant admins also manage members, templates and "
        "the idle-GPU policy.",
    )


class ApiTokenForm(ServiceErrorsMixin, forms.Form):
    # A one-time key per rendered form (``api_token_issue_once``): sent twice, it makes one
    # token.
    submission_key = forms.UUIDField(
        widget=forms.HiddenInput,
        error_messages={
            "required": "This form is out of date: open your account page again.",
            "invalid": "This form is damaged: open your account page again.",
        },
    )
    name = forms.CharField(
        label="Name",
        help_text="What the token is for, e.g. the laptop or the script that uses it.",
        widget=forms.TextInput(
            attrs={"autocomplete": "off", "maxlength": max_length_of(ApiToken, "name")}
        ),
    )
    expires_in_days = forms.IntegerField(
        required=False,
        label="Expires after (days)",
        widget=_number(min=1, max=API_TOKEN_MAX_DAYS),
        help_text=f"1 to {API_TOKEN_MAX_DAYS} days; empty: {API_TOKEN_DEFAULT_DAYS}.",
    )
