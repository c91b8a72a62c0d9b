"""Every state change of experiments, runs and attempts, one module per sub-area.

Import from the module itself (``from jobs.services.submission import run_submit``);
this package re-exports nothing."""
