# pgq's front door. `make help` lists the targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.DEFAULT_GOAL := help
.PHONY: help demo unit test test-embedded test-all lint typecheck check bench latency-rounds peers oban-venv soak soak-pinned clean chromium pgbouncer patroni screenshots chaos node model

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP) ## run a worker on a few hundred demo jobs (embedded Postgres unless PGQ_DSN is set)
	$(BIN)/python docs/examples/demo.py

unit: $(STAMP) ## the tests that need no server (tests/unit), in well under a minute
	$(BIN)/python -m pytest tests/unit -q -p no:xdist

# Test processes for `make test` and `make test-embedded` (pytest-xdist); 0 runs one.
TEST_WORKERS ?= 2

test: $(STAMP) lint model chromium pgbouncer ## lint, type-check, check the model and run the whole suite against real Postgres
	PGQ_TEST_EMBEDDED_DIR=$(CURDIR)/.pgq-embedded/tests $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

test-embedded: $(STAMP) chromium pgbouncer ## the suite against the embedded server, as on a machine without PostgreSQL
	PGQ_TEST_EMBEDDED=1 PGQ_TEST_EMBEDDED_DIR=$(CURDIR)/.pgq-embedded/tests $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

PYTHONS ?= 3.11 3.12 3.13

test-all: ## the suite on every Python in PYTHONS that this machine has (each in .venv-X.Y)
	@missing=""; failed=""; passed=""; \
	for v in $(PYTHONS); do \
	  py=""; \
	  for c in $$(command -v python$$v) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v 2>/dev/null | sort -V -r); do \
	    if $$c -c 'import sys' >/dev/null 2>&1; then py=$$c; break; fi; \
	  done; \
	  if [ -z "$$py" ]; then missing="$$missing $$v"; continue; fi; \
	  echo "== Python $$v ($$py)"; \
	  if [ ! -x .venv-$$v/bin/python ] || [ pyproject.toml -nt .venv-$$v/.installed-stamp ]; then \
	    $$py -m venv .venv-$$v && .venv-$$v/bin/python -m pip install --quiet --upgrade pip && \
	    .venv-$$v/bin/python -m pip install --quiet -e '.[dev]' && touch .venv-$$v/.installed-stamp; \
	  fi; \
	  if PGQ_TEST_EMBEDDED_DIR=$(CURDIR)/.pgq-embedded/tests .venv-$$v/bin/python -m pytest -q -p no:cacheprovider; \
	  then passed="$$passed $$v"; else failed="$$failed $$v"; fi; \
	done; \
	echo "passed:$${passed:- none}"; echo "failed:$${failed:- none}"; echo "missing:$${missing:- none}"; \
	[ -z "$$failed" ]

# The dashboard's browser tests drive Debian's chromium; installed here when missing (as root).
chromium: ## make sure chromium is installed (for the dashboard's browser tests)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium for the dashboard's browser tests"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	  else echo "the dashboard's browser tests need chromium: sudo apt-get install chromium" >&2; exit 1; fi; }

# The pooler tests run Debian's PgBouncer (started by the test, on loopback).
pgbouncer: ## make sure PgBouncer is installed (for the transaction-pooler tests)
	@command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing pgbouncer for the transaction-pooler tests"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q pgbouncer >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q pgbouncer >/dev/null; }; \
	  else echo "the pooler tests need PgBouncer: sudo apt-get install pgbouncer" >&2; exit 1; fi; }

# The liveness model (tests/model) is checked with Quint, on Node.js >= 18; Debian's Node.js
# and npm are installed here when missing (as root).
node: ## make sure Node.js >= 18 and npm are installed (for the model check)
	@{ command -v npm >/dev/null 2>&1 && \
	   node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' 2>/dev/null; } || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Node.js and npm for the model check"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q nodejs npm >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q nodejs npm >/dev/null; }; \
	  else echo "the model check needs Node.js >= 18 and npm: sudo apt-get install nodejs npm" >&2; exit 1; fi; }

MODEL_STAMP := tests/model/node_modules/.installed-stamp

# Quint at the version the lockfile pins; installed again when either file changes.
$(MODEL_STAMP): tests/model/package.json tests/model/package-lock.json | node
	cd tests/model && npm ci --no-audit --no-fund --loglevel=error
	@touch $(MODEL_STAMP)

model: node $(MODEL_STAMP) ## check the liveness model (tests/model/liveness.qnt) with Quint (a minute or two)
	tests/model/check.sh

# The high-availability test runs Debian's Patroni and etcd (started by the test, on loopback).
patroni: ## make sure Patroni and etcd are installed (for the Patroni test in `make chaos`)
	@{ command -v patroni && command -v patronictl && command -v etcd; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing patroni and etcd-server for the high-availability test"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q patroni etcd-server >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q patroni etcd-server >/dev/null; }; \
	  else echo "the high-availability test needs Patroni and etcd: sudo apt-get install patroni etcd-server" >&2; exit 1; fi; }

lint: $(STAMP) ## ruff and mypy --strict
	$(BIN)/ruff check src tests benchmarks docs/examples migrations
	$(BIN)/ruff format --check src tests benchmarks docs/examples migrations
	$(BIN)/mypy

BENCH_STAMP := benchmarks/.venv/.installed-stamp

$(BENCH_STAMP): pyproject.toml benchmarks/requirements.txt
	$(PYTHON) -m venv benchmarks/.venv
	benchmarks/.venv/bin/python -m pip install --quiet --upgrade pip
	benchmarks/.venv/bin/python -m pip install --quiet -e . -r benchmarks/requirements.txt
	@touch $(BENCH_STAMP)

GRAPHILE_STAMP := benchmarks/graphile/node_modules/.installed-stamp

# Graphile Worker (a Node.js peer) at the version the lockfile pins, beside its driver.
$(GRAPHILE_STAMP): benchmarks/graphile/package.json benchmarks/graphile/package-lock.json | node
	cd benchmarks/graphile && npm ci --no-audit --no-fund --loglevel=error
	@touch $(GRAPHILE_STAMP)

# oban-py needs Python 3.12+: benchmarks/.venv-oban, made with the newest python3.12 found
# that runs (PATH, then pyenv's versions); without one, peers.py leaves oban-py out and says so.
PYTHON312 ?= $(shell for c in $$(command -v python3.12) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python3.12 2>/dev/null | sort -V -r); do $$c -c '' 2>/dev/null && { echo $$c; break; }; done)
OBAN_STAMP := benchmarks/.venv-oban/.installed-stamp

$(OBAN_STAMP): benchmarks/requirements-oban.txt
	$(PYTHON312) -m venv benchmarks/.venv-oban
	benchmarks/.venv-oban/bin/python -m pip install --quiet --upgrade pip
	benchmarks/.venv-oban/bin/python -m pip install --quiet -r benchmarks/requirements-oban.txt
	@touch $(OBAN_STAMP)

oban-venv:
	@if [ -n "$(PYTHON312)" ]; then $(MAKE) --no-print-directory $(OBAN_STAMP); \
	else echo "no python3.12 here: peers.py runs without oban-py" >&2; fi

peers: $(BENCH_STAMP) $(GRAPHILE_STAMP) oban-venv ## pgq beside PgQueuer, procrastinate, awa-pg, oban-py (and Graphile Worker) in ROUNDS interleaved rounds
	cd benchmarks && .venv/bin/python peers.py $(ROUNDS)

bench: $(BENCH_STAMP) $(GRAPHILE_STAMP) ## measure pgq beside its peers in their own venv (Graphile Worker by npm), then the round-2 figures (see docs/performance.md)
	benchmarks/.venv/bin/python benchmarks/run.py
	cd benchmarks && .venv/bin/python round2.py $(ROUNDS)

latency-rounds: $(BENCH_STAMP) $(GRAPHILE_STAMP) ## pgq's latency and drain beside Graphile Worker's, ROUNDS interleaved rounds (TREES: other pgq checkouts first)
	cd benchmarks && .venv/bin/python latency_rounds.py $(ROUNDS) $(TREES) $(CURDIR)

ROUNDS  ?= 5
TREES   ?=
MINUTES ?= 20
RATE    ?=
TABLE   ?=
SERVER  ?=

soak: $(BENCH_STAMP) ## a default `pgq worker` at half the measured maximum rate for MINUTES (20), with its chart
	cd benchmarks && .venv/bin/python soak.py $(MINUTES) "$(RATE)" "$(TABLE)" "$(SERVER)"

# Minutes of the pinned soak's phases: clean, pinned, recovery, pinned again, recovery again.
PHASES ?= 4,15,4,5,3

soak-pinned: $(BENCH_STAMP) ## the soak with a transaction holding the horizon in PHASES (4,15,4,5,3: about 33 min)
	cd benchmarks && .venv/bin/python soak_pinned.py "$(PHASES)" "$(RATE)"

CHAOS_SECONDS ?= 90

chaos: $(STAMP) patroni ## the chaos harness, every fault, then a Patroni failover and switchover (CHAOS_SECONDS=90)
	$(BIN)/python -m tests.faults.chaos_run --seconds $(CHAOS_SECONDS) --report chaos-report.json
	CHAOS_PATRONI_REPORT=$(CURDIR)/chaos-report.json $(BIN)/python -m pytest -s tests/faults/test_patroni.py

SCREENSHOT_DSN ?= postgresql://postgres@127.0.0.1:5432/pgq_screenshots

screenshots: $(STAMP) chromium ## retake docs/dashboard/*.png (4 minutes of real traffic first)
	$(BIN)/python -m tests.dashboard.screenshots $(SCREENSHOT_DSN) docs/dashboard

clean: ## remove the virtual environment and embedded server data
	rm -rf $(VENV) .venv-3.* .pgq-embedded tests/model/node_modules tests/model/out benchmarks/graphile/node_modules
