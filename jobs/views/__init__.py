"""Researcher pages: thin views over jobs.selectors and jobs.services, one module per
sub-area (runs, submit, experiments, templates, quotas, members, clusters).

``jobs/urls.py`` imports from the modules themselves; this package re-exports nothing."""
