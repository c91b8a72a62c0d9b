from datetime import date

from django.urls import path, register_converter

from finance import views
from finance.selectors.months import month_is_statable


class MonthConverter:
    """``YYYY-MM`` in a URL, the first day of that month in the view."""

    regex = r"[0-9]{4}-(?:0[1-9]|1[0-2])"

    def to_python(self, value: str) -> date:
        """A month outside the statable range does not match (404), like month 13."""
        year, month = value.split("-")
        first_day = date(int(year), int(month), 1) if int(year) else None
        if first_day is None or not month_is_statable(first_day):
            raise ValueError(f"no statement for {value}")
        return first_day

    def to_url(self, value: date) -> str:
        return f"{value:%Y-%m}"


register_converter(MonthConverter, "finance_month")

app_name = "finance"
urlpatterns = [
    path("", views.index, name="index"),
    path("rates/", views.rate_cards, name="rate_cards"),
    path(
        "rates/<int:card_id>/credit-policy/",
        views.rate_card_credit_policy,
        name="rate_card_credit_policy",
    ),
    path("export.csv", views.export_csv, name="export_csv"),
    path("export.xlsx", views.export_xlsx, name="export_xlsx"),
    path("<slug:tenant_slug>/<finance_month:month>/", views.statement, name="statement"),
    path("<slug:tenant_slug>/<finance_month:month>/runs/", views.statement_runs, name="runs"),
]
