# Gantry: build, run and test. `make help` lists the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

VENV := .venv
PY := $(VENV)/bin/python
# What `make run` needs (the package and its runtime dependencies), and on top of it the dev
# tools that lint, test and bench need. Each stamp is redone when pyproject.toml changes.
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
BOOTSTRAP_PYTHON ?= $(shell command -v python3.11 || command -v python3)
PYTEST_ARGS ?=
# pytest-xdist processes: the suite mostly waits on real servers, so more workers than cores pay.
TEST_WORKERS ?= 3
BENCH_ARGS ?=
# `make mutation MUTATION_ARGS="--modules finance/costing.py --sample 100"`: scripts/mutation.py -h
MUTATION_ARGS ?=

.PHONY: help venv dev-venv run lint test bench mutation clean distclean

help:
	@echo "make run        the embedded portal on http://127.0.0.1:8000 (SQLite, Celery, simulator, demo data)"
	@echo "make lint       ruff, ruff format --check, manage.py check, makemigrations --check, lint-imports,"
	@echo "                mypy (django-stubs, drf-stubs; strict on the pure modules)"
	@echo "make test       lint beside pytest against PostgreSQL and Redis (scripts/test-services.sh)"
	@echo "                PYTEST_ARGS='-k admission' passes arguments to pytest;"
	@echo "                TEST_WORKERS=1 runs it in one process (default $(TEST_WORKERS), pytest-xdist)"
	@echo "make bench      the benchmarks (python -m bench) against the same services"
	@echo "make mutation   mutmut over the pure cores with the tests that need no database: the score"
	@echo "                per module, exit 1 below 95 % (MUTATION_ARGS: scripts/mutation.py -h); not in make test"
	@echo "make venv       $(VENV) with the project and what it needs to run (what make run installs)"
	@echo "make dev-venv   the same plus the dev tools of lint, test and bench (redone when pyproject.toml changes)"
	@echo "make clean      remove var/ and build artefacts; make distclean also removes $(VENV)"

venv: $(RUN_STAMP)
dev-venv: $(DEV_STAMP)

# A venv whose interpreter no longer runs (moved, or its Python removed) is rebuilt from
# scratch. Its pip is a recent one, installed without compiling it: by the bootstrap Python's
# pip when that has --python (pip 22.3 and later), else by ensurepip (which compiles pip and
# setuptools, ~3 s of CPU) and then upgraded. Python 3.11's own pip (23.2) takes twice the CPU
# of a recent one to pick the wheels of the runtime set (pydantic-core, aiohttp and rpds-py
# list thousands of files each). README.md, *How long make run takes*.
PIP_UPGRADE := install --quiet --progress-bar off --no-compile --upgrade 'pip>=25'
define make_venv
	@test -n "$(BOOTSTRAP_PYTHON)" || { echo "make: neither python3.11 nor python3 found" >&2; exit 1; }
	$(PY) -c '' 2>/dev/null || { \
		$(BOOTSTRAP_PYTHON) -m venv --clear --without-pip $(VENV) && \
		{ $(BOOTSTRAP_PYTHON) -m pip --python $(PY) $(PIP_UPGRADE) 2>/dev/null || \
			{ $(PY) -m ensurepip --default-pip >/dev/null && $(PY) -m pip $(PIP_UPGRADE); }; }; }
endef

# --no-compile: Python compiles a module when it is first imported, so the few that running
# Gantry imports are compiled once at start-up instead of every file of every package now
# (most of the install's time otherwise).
$(RUN_STAMP): pyproject.toml
	$(make_venv)
	$(PY) -m pip install --quiet --progress-bar off --no-compile -e .
	touch $@

# A venv that `make run` made gets the dev extras the first time lint, test or bench runs;
# they include the runtime install, so its stamp is renewed too.
$(DEV_STAMP): pyproject.toml
	$(make_venv)
	$(PY) -m pip install --progress-bar off -e '.[dev]'
	touch $@ $(RUN_STAMP)

# Python writes the bytecode of what it imports, once (the install compiles nothing): with
# PYTHONDONTWRITEBYTECODE set, each of make run's processes would compile every module it
# imports again, at every start.
run: venv
	env -u PYTHONDONTWRITEBYTECODE GANTRY_EMBEDDED=1 $(PY) -m portal.embedded

# Every step runs, so one report shows all problems; the target fails if any step failed.
# Django runs embedded against a throwaway data directory: nothing here needs a server.
lint: dev-venv
	@failed=(); \
	data_dir=$$(mktemp -d); \
	trap 'rm -rf "$$data_dir"' EXIT; \
	embedded=(env -u DATABASE_URL -u CELERY_BROKER_URL GANTRY_EMBEDDED=1 GANTRY_DATA_DIR="$$data_dir"); \
	django=("$${embedded[@]}" $(PY) manage.py); \
	step() { echo "+ $$*"; "$$@" || failed+=("$$*"); }; \
	step $(VENV)/bin/ruff check .; \
	step $(VENV)/bin/ruff format --check .; \
	step "$${django[@]}" check; \
	step "$${django[@]}" makemigrations --check --dry-run; \
	step $(VENV)/bin/lint-imports; \
	step "$${embedded[@]}" $(VENV)/bin/mypy; \
	if (( $${#failed[@]} )); then printf 'lint: FAILED: %s\n' "$${failed[@]}" >&2; exit 1; fi

# Lint runs beside the tests (its mypy takes a minute of CPU while the tests' workers start
# their servers and databases), its report printed after theirs; either failing fails.
test: dev-venv
	@lint_log=$$(mktemp); \
	trap 'rm -f "$$lint_log"' EXIT; \
	$(MAKE) lint >"$$lint_log" 2>&1 & lint_pid=$$!; \
	tests=0; bash scripts/test-services.sh exec -- $(VENV)/bin/pytest -n $(TEST_WORKERS) \
		--dist loadgroup --durations=30 $(PYTEST_ARGS) || tests=$$?; \
	lint=0; wait $$lint_pid || lint=$$?; \
	echo "--- make lint, run beside the tests:"; cat "$$lint_log"; \
	if (( tests )); then echo "test: FAILED: pytest (exit $$tests)" >&2; fi; \
	if (( lint )); then echo "test: FAILED: make lint" >&2; fi; \
	(( ! tests && ! lint ))

# The benchmarks need PostgreSQL and Redis only: not the registry, Prometheus and Chromium
# the tests install (an install would also wait on any other apt-get of the machine).
bench: dev-venv
	@if [[ -f bench/__main__.py ]]; then \
		DJANGO_SETTINGS_MODULE=$${DJANGO_SETTINGS_MODULE:-tests.settings} \
		GANTRY_TEST_SERVICES_TOOLS=$${GANTRY_TEST_SERVICES_TOOLS:-0} \
			bash scripts/test-services.sh exec -- $(PY) -m bench $(BENCH_ARGS); \
	else \
		echo "bench: bench/__main__.py does not exist; nothing to run"; \
	fi

# Pure tests only: nothing here needs PostgreSQL or Redis (Django's settings are read, never
# connected). docs/mutation-testing.md: what it runs, how long it takes, how it counts.
mutation: dev-venv
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf var mutants build dist .eggs *.egg-info .pytest_cache .ruff_cache .hypothesis .mypy_cache .import_linter_cache htmlcov .coverage
	find . \( -path ./$(VENV) -o -path ./.git -o -name node_modules \) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
