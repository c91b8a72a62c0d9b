"""Reads of the telemetry app, one module per sub-area: finished attempts and the accounting
still to compute (``finished_attempts``), GPU-seconds per accounting category
(``gpu_seconds``), a run's telemetry page (``run_page``, its reads in ``run_page_sql``), a
tenant's goodput (``tenant_goodput``), the samples mapped to no attempt (``unmapped``) and
a finished attempt's timeline, the accounting's input (``timeline``).

The pages' reads give plain data: the views turn it into tables and chart series. Each
answers in one query per table it reads, grouping in SQL.

Import from the module itself (``from telemetry.selectors.run_page import run_telemetry``);
this package re-exports nothing."""
