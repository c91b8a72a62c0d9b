"""Forms of the finance pages: they parse input only. Which tenants a user may read comes
from ``finance.access``; every rule of a rate card from ``finance.services.rate_card_add``.

An export covers the days ``from`` through ``to``, both included (UTC days, as DailyUsage
counts them). A range is rejected when it is

- empty: a bound is missing, so the range holds no days at all;
- inverted: ``from`` is after ``to``;
- too long: more than ``EXPORT_MAX_DAYS`` days.
"""

import re
from datetime import date
from typing import Any

from django import forms
from django.db.models import QuerySet

from core.forms import ServiceErrorsMixin
from finance.models import RateCard
from finance.selectors.months import EARLIEST_MONTH, LATEST_MONTH, month_is_statable
from tenants.models import GpuFlavor, Tenant

# The longest export, in days: a year, leap years included. Longer periods are exported a
# year at a time, which keeps each file (and each XLSX built in memory) bounded.
EXPORT_MAX_DAYS = 366

EMPTY_RANGE = "The range is empty: choose its first and its last day."
INVERTED_RANGE = "The range ends before it starts."
CHOOSE_TENANT = "Choose a tenant."
_MONTH = re.compile(r"(?P<year>[0-9]{4})-(?P<month>0[1-9]|1[0-2])")


class MonthField(forms.Field):
    """A calendar month as ``YYYY-MM`` (what ``<input type="month">`` sends), cleaned to
    its first day."""

    widget = forms.TextInput(attrs={"type": "month", "placeholder": "YYYY-MM"})
    default_error_messages = {
        "invalid": "Enter a month as YYYY-MM, e.g. 2025-03.",
        "out_of_range": (
            f"Statements cover {EARLIEST_MONTH:%Y-%m} to {LATEST_MONTH:%Y-%m}: choose a month "
            "in that range."
        ),
    }

    def to_python(self, value) -> date | None:
        if value in self.empty_values:
            return None
        if isinstance(value, date):
            return value.replace(day=1)
        match = _MONTH.fullmatch(str(value).strip())
        if match is None:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        year, month = int(match["year"]), int(match["month"])
        if not year or not month_is_statable(date(year, month, 1)):
            raise forms.ValidationError(self.error_messages["out_of_range"], code="out_of_range")
        return date(year, month, 1)

    def prepare_value(self, value):
        return f"{value:%Y-%m}" if isinstance(value, date) else value


class TenantChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Tenant) -> str:
        return f"{obj.name} ({obj.slug})"


def _tenant_field(tenants: QuerySet, *, required: bool) -> forms.ModelChoiceField:
    return TenantChoiceField(
        queryset=tenants,
        to_field_name="slug",
        required=required,
        empty_label=None if required else "All tenants",
        error_messages={"required": CHOOSE_TENANT},
    )


class StatementChoiceForm(forms.Form):
    """The index page: which tenant's statement, of which month."""

    month = MonthField(label="Month")

    def __init__(self, *args, tenants: QuerySet, **kwargs) -> None:
        kwargs.setdefault("auto_id", "statement-%s")
        super().__init__(*args, **kwargs)
        self.fields = {"tenant": _tenant_field(tenants, required=True), **self.fields}
        self.fields["tenant"].label = "Tenant"


class ExportForm(forms.Form):
    """The rows of an export: a range of days and a tenant (or, for finance and platform
    admins, every tenant)."""

    def __init__(self, *args, tenants: QuerySet, all_tenants: bool, **kwargs) -> None:
        kwargs.setdefault("auto_id", "export-%s")
        super().__init__(*args, **kwargs)
        date_widget = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
        # "from" is a Python keyword, so the range fields cannot be class attributes.
        self.fields = {
            "tenant": _tenant_field(tenants, required=not all_tenants),
            "from": forms.DateField(label="From", required=False, widget=date_widget),
            "to": forms.DateField(label="To", required=False, widget=date_widget),
        }
        self.fields["tenant"].label = "Tenant"

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if "from" in self.errors or "to" in self.errors:
            return cleaned  # not a date: said next to the field
        first, last = cleaned.get("from"), cleaned.get("to")
        if first is None or last is None:
            raise forms.ValidationError(EMPTY_RANGE, code="empty")
        if first > last:
            raise forms.ValidationError(INVERTED_RANGE, code="inverted")
        days = (last - first).days + 1
        if days > EXPORT_MAX_DAYS:
            raise forms.ValidationError(
                f"The range spans {days} days; an export covers at most {EXPORT_MAX_DAYS} "
                "days. Export one year at a time.",
                code="too_long",
            )
        return cleaned


class RateCardForm(ServiceErrorsMixin, forms.Form):
    flavor = forms.ModelChoiceField(
        queryset=GpuFlavor.objects.order_by("slug"),
        to_field_name="slug",
        label="GPU flavor",
        empty_label=None,
    )
    # The price and currency are checked by the service (sign, places, the platform's one
    # currency); the form only reads them.
    price_per_gpu_hour = forms.DecimalField(
        label="Price per GPU-hour",
        widget=forms.NumberInput(attrs={"step": "0.0001"}),
        help_text="Up to 4 decimal places. Cost = allocated GPU-hours × this price.",
    )
    currency = forms.CharField(
        label="Currency",
        widget=forms.TextInput(attrs={"size": 3, "autocomplete": "off", "spellcheck": "false"}),
        help_text="ISO 4217 code; every card of the platform is in one currency.",
    )
    valid_from = forms.DateField(
        label="Valid from",
        widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"),
        help_text="From 00:00 UTC on this day. It ends the flavor's current card.",
    )
    credit_policy = forms.ChoiceField(
        label="Hardware and platform failures",
        choices=RateCard.CreditPolicy.choices,
        initial=RateCard.CreditPolicy.CREDIT,
        required=False,  # left out (an older client, a script): the default, credit
        help_text="Credit: the GPU-hours a hardware or platform fault cost an attempt (its "
        "lost work and startup) are not charged.",
    )

    def clean_credit_policy(self) -> str:
        return self.cleaned_data["credit_policy"] or RateCard.CreditPolicy.CREDIT


class CreditPolicyForm(forms.Form):
    credit_policy = forms.ChoiceField(choices=RateCard.CreditPolicy.choices)
