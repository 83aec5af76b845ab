# The two commands of the README: `make demo` and `make test`. Each creates .venv and installs
# what it needs on a fresh machine with Python 3.11+ and Java 17+.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# hadoop-aws for this PySpark's Hadoop (replicate --output s3://), resolved once by Spark's Ivy
# from Maven Central into ~/.ivy2.5.2
S3A_STAMP := $(VENV)/.s3a-jars-stamp

.PHONY: demo test test-fast test-spark-oldest test-install test-extended fuzz faults-full netfaults-full cluster-long \
	soak benchmarks lint java-check clean spark-merge-jars

# The oldest PySpark the package supports (the floor of pyproject's range), in its own venv
SPARK_OLDEST := 4.0.0
OLDEST       := .venv-spark-oldest
# The venvs of `make test-install` (and the wheel they share)
INSTALLS     := .venv-install

# setup.py builds the compiled PlainBuffer decoder (C, optional: skipped without a compiler);
# `make test` then requires it (REQUIRE_COMPILED), so the suite tests the compiled decoder
DECODER_C := connector/tunnel/tablestore/_columnar.c
REQUIRE_COMPILED := TABLESTORE_CDC_REQUIRE_COMPILED_DECODER=1

$(STAMP): pyproject.toml setup.py $(DECODER_C)
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 11) else "error: Python 3.11+ is required, found %d.%d" % v[:2])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dynamodb,tablestore,lakehouse]'
	touch $(STAMP)

$(S3A_STAMP): $(STAMP) | java-check
	$(BIN)/python -m tablestore_cdc.pipeline.output fetch
	touch $@

$(OLDEST)/.installed-stamp: pyproject.toml
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -e '.[test,dynamodb,tablestore,lakehouse]' 'pyspark==$(SPARK_OLDEST)'
	touch $@

# The Spark engine (replicate --engine spark: tablestore_cdc/lakehouse/spark_merge.py) is tested
# on the newest PySpark minor that both delta-spark and Iceberg's Spark runtime are released for
# (docs/lakehouse.md lists them per minor), in a venv of its own; its jars are resolved once by
# Spark's Ivy from Maven Central into ~/.ivy2.5.2 (a user's spark.jars.packages does the same)
SPARK_MERGE_PYSPARK := 4.1.4
SPARK_MERGE         := .venv-spark-merge
JARS_STAMP          := $(SPARK_MERGE)/.jars-stamp

$(SPARK_MERGE)/.installed-stamp: pyproject.toml
	test -x $(SPARK_MERGE)/bin/python || $(PYTHON) -m venv $(SPARK_MERGE)
	$(SPARK_MERGE)/bin/python -m pip install --quiet --upgrade pip
	$(SPARK_MERGE)/bin/python -m pip install --quiet -e '.[lakehouse,tablestore]' 'pyspark==$(SPARK_MERGE_PYSPARK)'
	touch $@

$(JARS_STAMP): $(SPARK_MERGE)/.installed-stamp tablestore_cdc/lakehouse/spark_merge.py | java-check
	$(SPARK_MERGE)/bin/python -m tablestore_cdc.lakehouse.spark_merge fetch
	touch $@

## make spark-merge-jars: the Spark engine's venv and jars (a part of make test)
spark-merge-jars: $(JARS_STAMP)

java-check:
	@if [ -n "$$JAVA_HOME" ] && [ -x "$$JAVA_HOME/bin/java" ]; then exit 0; fi; \
	command -v java >/dev/null 2>&1 || { \
	  echo "error: Spark needs a Java 17+ runtime and none was found." >&2; \
	  echo "       install one (e.g. apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME." >&2; \
	  exit 1; }

## make demo: the main job on the embedded store, verified (about a minute)
demo: $(STAMP) java-check
	$(BIN)/tablestore-cdc demo $(DEMO_ARGS)

## make test: the default test suite (fast tests, real Spark, restarts, fault subset, browser),
## then the oldest_spark tests on the oldest supported PySpark, then the user's install
test: $(STAMP) java-check $(JARS_STAMP) $(S3A_STAMP)
	$(REQUIRE_COMPILED) $(BIN)/python -m pytest -m "not faults_full and not extended and not user_install" -n 2 --dist loadgroup --durations=30 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-spark-oldest
	$(MAKE) --no-print-directory test-install

## make test-spark-oldest: splits and a merge, kill and restart, AvailableNow, the demo on
## PySpark $(SPARK_OLDEST) (a run that selects no test exits 5 and fails)
test-spark-oldest: $(OLDEST)/.installed-stamp java-check
	$(OLDEST)/bin/python -m pytest -m oldest_spark $(PYTEST_ARGS)

## make test-install: the install a user does (integration/test_user_install.py): the wheel,
## built once, into clean venvs under $(INSTALLS) with no extra (PySpark: the newest, and 4.0.5
## and 4.2.1 installed first, which pip must keep); every module and --help, the demo (small) to
## its verification line; then one extra in each venv ([lakehouse], [dynamodb], [tablestore])
test-install: $(STAMP) java-check
	$(BIN)/python -m pytest -m user_install integration/test_user_install.py $(PYTEST_ARGS)

# Apache Iceberg's REST catalog test server (the REST catalog tests of make test-extended): its
# jars (testkit/rest_catalog/pom.xml) resolved once by Maven from Maven Central into
# ~/.cache/tablestore-cdc; a failure stops make test-extended
REST_CATALOG_STAMP := $(VENV)/.iceberg-rest-catalog-stamp

$(REST_CATALOG_STAMP): $(STAMP) testkit/rest_catalog/pom.xml | java-check
	$(BIN)/python -m testkit.rest_catalog fetch
	touch $@

# The official Tablestore Java SDK's tunnel client run against the emulator (the Java SDK judge of
# make test-extended, integration/test_java_sdk_judge.py): integration/java_sdk_judge built once by
# Maven, the SDK from Maven Central, into ~/.cache/tablestore-cdc; a failure stops make test-extended
JAVA_JUDGE_STAMP := $(VENV)/.java-sdk-judge-stamp

$(JAVA_JUDGE_STAMP): $(STAMP) integration/java_sdk_judge/pom.xml \
		integration/java_sdk_judge/src/main/java/judge/Judge.java | java-check
	$(BIN)/python -m testkit.java_sdk_judge fetch
	touch $@

## make test-extended: what the default suite leaves out for its time: the other format's,
## backend's, catalog's, crash point's or selection's run of a test it runs once, the
## million-record read, and the benchmarks' smoke run (about 15 minutes)
test-extended: $(STAMP) java-check $(JARS_STAMP) $(S3A_STAMP) $(REST_CATALOG_STAMP) \
		$(JAVA_JUDGE_STAMP)
	$(BIN)/python -m pytest -m extended -n 2 --dist loadgroup $(PYTEST_ARGS)

## make test-fast: the tests that start no Spark (seconds)
test-fast: $(STAMP)
	$(REQUIRE_COMPILED) $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

## make fuzz: the fuzz targets of tests/fuzz/ (page decoders, DynamoDB codec, options, emulator
## requests) long: FUZZ_EXAMPLES inputs each (default 10000, about 30 min); prints the inputs
## tried per target and what became of them (hypothesis statistics)
FUZZ_EXAMPLES ?= 10000
fuzz: $(STAMP)
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(REQUIRE_COMPILED) nice -n 10 $(BIN)/python -m pytest tests/fuzz \
		-m fuzz -p no:cacheprovider --timeout 0 --hypothesis-show-statistics $(PYTEST_ARGS)

## make faults-full: the full crash-point matrix and random kills (long)
faults-full: $(STAMP) java-check
	$(BIN)/python -m integration.faults

## make netfaults-full: every network-fault scenario (a fault proxy on every hop; ~40 min)
netfaults-full: $(STAMP) java-check
	$(BIN)/python -m integration.netfaults

## make cluster-long: the Spark standalone cluster across network namespaces, longer, then
## tablestore-cdc replicate on it with a worker killed (root)
cluster-long: $(STAMP) java-check $(JARS_STAMP) $(S3A_STAMP)
	$(BIN)/python -m integration.netfaults cluster --long
	$(BIN)/python -m pytest -p no:cacheprovider -m faults_full integration/test_cluster_replicate.py

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
	rm -rf $(VENV) $(OLDEST) $(INSTALLS) $(SPARK_MERGE) build tablestore-cdc-demo .pytest_cache
