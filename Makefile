# The two commands: `make run` (the platform on embedded defaults, with a demo) and `make test`.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8000
ONLY ?=

.PHONY: help install run demo test test-fast lint format bench lock migrate clean

help:
	@echo "make run      start the platform on embedded defaults (SQLite, no servers) with a demo"
	@echo "make test     run the whole test suite (PostgreSQL/Redis when DATABASE_URL/REDIS_URL are set)"
	@echo "make lint     ruff check and format check, import-linter contracts, mypy"
	@echo "make bench    run benchmarks (ONLY=<area> for one area)"

# uv installs the ~280 pinned packages in a fraction of pip's time (on CI's 2 cores the install
# was about 280 s of pip; uv took 97 s from an empty cache, bytecode compiled). It takes the
# find-links folders of pip's configuration (where torch's CPU wheel lies); pip, which reads all of
# its configuration, installs instead when uv cannot.
UV_VERSION := 0.13.10

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	links=$$($(BIN)/python -m pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'$$/\1/p" | head -n1); \
	  $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode \
	    $$(for l in $$links; do printf -- '--find-links %s ' "$$l"; done) -c requirements.lock -e ".[dev]" \
	  || $(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

run: migrate
	$(BIN)/python manage.py demo_setup
	@PORT=$(PORT) BIN=$(BIN) bash platform/run-local.sh

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python -m bench $(if $(ONLY),--only $(ONLY),)

lock: install
	@{ echo "# Full transitive pins for the platform and its dev tools (pip install -c requirements.lock)."; \
	   echo "# Regenerate with: make lock"; \
	   $(BIN)/pip freeze --exclude-editable | grep -v '^-e'; } > requirements.lock

clean:
	rm -rf $(VENV) var
