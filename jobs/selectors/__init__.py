"""Reads of experiments, runs, attempts and templates, one module per sub-area.

Import from the module itself (``from jobs.selectors.runs import run_get_viewable``);
this package re-exports nothing."""
