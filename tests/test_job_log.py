"""Where a job's Spark log goes (``tablestore_cdc.pipeline.job_log``): the log4j2 configuration
the JVM is started with, for an output directory whose path has a space (the JVM options are
split at spaces, so the configuration is named by its URI)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from tablestore_cdc.pipeline.job_log import spark_log_to_file


def test_the_configuration_is_named_by_a_uri_one_jvm_option_long(tmp_path: Path) -> None:
    output = tmp_path / "out dir (2)"
    log, conf = spark_log_to_file(output / "logs")
    options = shlex.split(conf["spark.driver.extraJavaOptions"])
    assert len(options) == 1
    name, _, uri = options[0].partition("=")
    assert name == "-Dlog4j2.configurationFile"
    config = Path(unquote(urlparse(uri).path))
    assert config == output / "logs" / "log4j2.properties"
    assert f"appender.file.fileName = {log}" in config.read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_job_whose_output_has_a_space_starts_and_logs_there(tmp_path: Path) -> None:
    from connector.local import LocalTablestore

    store = LocalTablestore(tmp_path / "s.db")
    store.create_table("t", primary_key=[("id", "INTEGER")], columns=[("v", "INTEGER")])
    for i in range(5):
        store.put_row("t", {"id": i}, {"v": i})
    output = tmp_path / "out dir"
    done = subprocess.run([sys.executable, "-m", "tablestore_cdc", "replicate", "--store",
                           str(store.path), "--table", "t", "--output", str(output), "--once"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "caught up" in done.stderr
    assert (output / "logs" / "spark.log").exists()
