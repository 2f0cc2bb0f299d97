# The two commands the README gives: `make demo` and `make test`; `make docs` builds the site.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fuseplan demo

# `make test` (what CI runs) is the fast suite; `make test-all` adds the cases marked slow
# (zoo-scale solves, Pareto fronts, a two-node Ray cluster), minutes each on 2 cores.
# Both run on two pytest-xdist workers (every solve and the emulator use one core); the
# tests that start Ray share one worker (xdist_group "ray"), so one cluster runs at a time.
PYTEST = $(BIN)/python -m pytest -n 2 --dist loadgroup
test: $(STAMP)
	$(PYTEST) -m "not slow"

test-all: $(STAMP)
	$(PYTEST)

# ruff over the packages, tests and the bench scripts (extensionless, so named by the
# glob; the plots beside them, *.svg, are not Python);
# mypy over the package by its import names: the folders install as fuseplan.planner,
# fuseplan.rules, ... (pyproject.toml's package-dir), which mypy cannot follow through the
# editable install's import hook, so .lint/fuseplan rebuilds that layout as links; then
# over tests/ from inside it (its modules import `models` as top-level, as pytest's rootdir
# insertion makes them).
FOLDERS := planner rules hardware solver emulator
lint: $(STAMP)
	$(BIN)/ruff check $(FOLDERS) fuseplan tests examples docs $(filter-out %.svg,$(wildcard bench/*))
	rm -rf .lint && mkdir -p .lint/fuseplan
	ln -s ../../fuseplan/__init__.py .lint/fuseplan/__init__.py
	for d in $(FOLDERS); do ln -s ../../$$d .lint/fuseplan/$$d; done
	cd .lint && ../$(BIN)/mypy --config-file ../pyproject.toml -p fuseplan
	cd tests && MYPYPATH=../.lint ../$(BIN)/mypy --config-file ../pyproject.toml *.py
	$(BIN)/mypy --config-file pyproject.toml docs/*.py

# The documentation site (mkdocs.yml, docs/): regenerate the pages generated from the code
# and the bench JSON (docs/generate.py; tests/test_docs.py fails when they are stale), then
# build the site into site/, every warning an error.
docs: $(STAMP)
	$(BIN)/python docs/generate.py
	$(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python bench/run

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .lint site
