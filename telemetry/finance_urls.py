from datetime import date

from django.urls import path, register_converter

from telemetry import finance_views as views


class MonthConverter:
    """``YYYY-MM`` in a URL, the first day of that month in the view."""

    regex = r"[0-9]{4}-(?:0[1-9]|1[0-2])"

    def to_python(self, value: str) -> date:
        year, month = value.split("-")
        return date(int(year), int(month), 1)

    def to_url(self, value: date) -> str:
        return f"{value:%Y-%m}"


register_converter(MonthConverter, "finance_month")

app_name = "finance"
urlpatterns = [
    path("", views.index, name="index"),
    path("rates/", views.rate_cards, name="rate_cards"),
    path("export.csv", views.export_csv, name="export_csv"),
    path("export.xlsx", views.export_xlsx, name="export_xlsx"),
    path("<slug:tenant_slug>/<finance_month:month>/", views.statement, name="statement"),
    path("<slug:tenant_slug>/<finance_month:month>/runs/", views.statement_runs, name="runs"),
]
