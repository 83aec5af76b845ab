# The two commands of the README: `make demo` and `make test`. Each creates .venv and installs
# what it needs on a fresh machine with Python 3.11+ and Java 17+.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-fast faults-full netfaults-full cluster-long soak benchmarks lint java-check clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else "error: Python 3.11+ is required, found %d.%d" % v[:2])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dynamodb,tablestore]'
	touch $(STAMP)

java-check:
	@if [ -n "$$JAVA_HOME" ] && [ -x "$$JAVA_HOME/bin/java" ]; then exit 0; fi; \
	command -v java >/dev/null 2>&1 || { \
	  echo "error: Spark needs a Java 17+ runtime and none was found." >&2; \
	  echo "       install one (e.g. apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME." >&2; \
	  exit 1; }

## make demo: the main job on the embedded store, verified (about a minute)
demo: $(STAMP) java-check
	$(BIN)/tablestore-cdc demo $(DEMO_ARGS)

## make test: the default test suite (fast tests, real Spark, restarts, fault subset, browser)
test: $(STAMP) java-check
	$(BIN)/python -m pytest -m "not faults_full and not benchmark" $(PYTEST_ARGS)

## make test-fast: the tests that start no Spark (seconds)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

## make faults-full: the full crash-point matrix and random kills (long)
faults-full: $(STAMP) java-check
	$(BIN)/python -m integration.faults

## make netfaults-full: every network-fault scenario (a fault proxy on every hop; ~40 min)
netfaults-full: $(STAMP) java-check
	$(BIN)/python -m integration.netfaults

## make cluster-long: the Spark standalone cluster across network namespaces, longer (root)
cluster-long: $(STAMP) java-check
	$(BIN)/python -m integration.netfaults cluster --long

## make soak: 64 channels, up to 1,000,000 changes, a query kill a minute, ~20 min (SOAK_ARGS)
soak: $(STAMP) java-check
	nice -n 10 $(BIN)/python -m integration.netfaults soak $(SOAK_ARGS)

## make benchmarks: throughput, protocol cost, freshness, recovery (--quick: under 10 min)
benchmarks: $(STAMP) java-check
	$(BIN)/python -m benchmarks --quick --json benchmarks-latest.json

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) tablestore-cdc-demo .pytest_cache
