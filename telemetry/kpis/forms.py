"""The filters of the platform KPI page: a range of whole days and an optional tenant,
flavor and cluster. It parses and validates input only; the numbers come from
``telemetry.kpis.selectors``.

The range is the days ``from`` through ``to``, both included, in the portal's time zone:
``from == to`` is one day. Without either parameter it is the last ``DEFAULT_RANGE_DAYS``
days up to today. A range is rejected when it is

- empty: a bound was sent blank, so the range holds no days at all;
- inverted: ``from`` is after ``to``;
- too long: more than ``KPI_MAX_RANGE_DAYS`` days.
"""

from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils import timezone

from clusters.models import Cluster
from tenants.models import GpuFlavor, Tenant

DEFAULT_RANGE_DAYS = 30
# The longest report, in days. A module constant, not a setting: about the 13 months a
# year-on-year comparison needs; longer ranges are a finance export, not a page.
KPI_MAX_RANGE_DAYS = 400

EMPTY_RANGE = "The range is empty: choose its first and its last day."
INVERTED_RANGE = "The range ends before it starts."


def kpi_filter_data(query: QueryDict, *, today: date) -> QueryDict:
    """The query with the default range filled in when it names neither bound."""
    data = query.copy()
    if "from" not in data and "to" not in data:
        data["from"] = (today - timedelta(days=DEFAULT_RANGE_DAYS - 1)).isoformat()
        data["to"] = today.isoformat()
    return data


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())


class KpiFilterForm(forms.Form):
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="All tenants",
    )
    flavor = forms.ModelChoiceField(
        queryset=GpuFlavor.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="All flavors",
    )
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.order_by("name"),
        to_field_name="name",
        required=False,
        empty_label="All clusters",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # "from" is a Python keyword, so the range fields cannot be class attributes.
        date_widget = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
        self.fields = {
            "from": forms.DateField(label="From", required=False, widget=date_widget),
            "to": forms.DateField(label="To", required=False, widget=date_widget),
            **self.fields,
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        first, last = cleaned.get("from"), cleaned.get("to")
        if "from" in self.errors or "to" in self.errors:
            return cleaned  # not a date: said next to the field
        if first is None or last is None:
            raise forms.ValidationError(EMPTY_RANGE, code="empty")
        if first > last:
            raise forms.ValidationError(INVERTED_RANGE, code="inverted")
        days = (last - first).days + 1
        if days > KPI_MAX_RANGE_DAYS:
            raise forms.ValidationError(
                f"The range spans {days} days; a report covers at most "
                f"{KPI_MAX_RANGE_DAYS} days. Choose a shorter range.",
                code="too_long",
            )
        return cleaned

    @property
    def days(self) -> int:
        return (self.cleaned_data["to"] - self.cleaned_data["from"]).days + 1

    @property
    def since(self) -> datetime:
        """The start of the first day."""
        return _day_start(self.cleaned_data["from"])

    @property
    def until(self) -> datetime:
        """The start of the day after the last one: the range is [since, until)."""
        return _day_start(self.cleaned_data["to"] + timedelta(days=1))
