"""``local_session`` keeps what the installation's ``spark-defaults.conf`` says of the three
settings it extends (``connector.spark.session_settings``, ``spark_defaults``): a setting given
to the session builder replaces the file's, so a cluster's executor ``PYTHONPATH``, driver Java
options or ``spark.jars.packages`` written there were lost."""

from __future__ import annotations

import os
from pathlib import Path

from connector.spark import (
    LOG4J2,
    SHORT_RUN_JVM_OPTIONS,
    WORKER_SITE,
    session_settings,
    spark_defaults,
)

PATH, JAVA = "spark.executorEnv.PYTHONPATH", "spark.driver.extraJavaOptions"


def _conf_dir(tmp_path: Path, text: str) -> dict[str, str]:
    (tmp_path / "spark-defaults.conf").write_text(text)
    return {"SPARK_CONF_DIR": str(tmp_path)}


def test_the_file_is_read_as_spark_submit_reads_it(tmp_path: Path) -> None:
    env = _conf_dir(tmp_path, "# a comment\n! another\n\n"
                              "spark.executorEnv.PYTHONPATH   /opt/hooks\n"
                              "spark.driver.extraJavaOptions=-Dx=1 -Dy=2\n"
                              "spark.executor.memory : 2g  \n")
    assert spark_defaults(env) == {PATH: "/opt/hooks", JAVA: "-Dx=1 -Dy=2",
                                   "spark.executor.memory": "2g"}


def test_spark_home_conf_is_read_when_no_conf_dir_is_named(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text("spark.a b\n")
    assert spark_defaults({"SPARK_HOME": str(tmp_path)}) == {"spark.a": "b"}


def test_no_file_or_an_unreadable_one_is_no_settings(tmp_path: Path) -> None:
    assert spark_defaults({"SPARK_CONF_DIR": str(tmp_path / "absent")}) == {}
    (tmp_path / "spark-defaults.conf").write_bytes(b"spark.a \xff\xfe\n")
    assert spark_defaults({"SPARK_CONF_DIR": str(tmp_path)}) == {}


def test_the_files_path_and_java_options_follow_ours() -> None:
    settings = session_settings("app", "local[1]", None, {PATH: "/opt/hooks", JAVA: "-Dx=1"})
    assert settings[PATH] == os.pathsep.join([WORKER_SITE, "/opt/hooks"])
    assert settings[JAVA] == f"-Dlog4j2.configurationFile=file:{LOG4J2} -Dx=1"


def test_the_callers_path_replaces_the_files_and_its_java_options_follow_the_files() -> None:
    """The job's own log configuration (``pipeline.job_log``, given as ``conf``) comes last, so
    it wins over ours, and a cluster's Java options in the file (a trust store, a proxy) stay."""
    settings = session_settings(
        "app", "local[1]", {PATH: "/given", JAVA: "-Dlog4j2.configurationFile=file:/job"},
        {PATH: "/opt/hooks", JAVA: "-Djavax.net.ssl.trustStore=/ca"}, short_run=True)
    assert settings[PATH] == os.pathsep.join([WORKER_SITE, "/given"])
    assert settings[JAVA] == (f"-Dlog4j2.configurationFile=file:{LOG4J2} "
                              "-Djavax.net.ssl.trustStore=/ca "
                              f"-Dlog4j2.configurationFile=file:/job {SHORT_RUN_JVM_OPTIONS}")


def test_without_a_file_the_settings_are_ours_alone() -> None:
    settings = session_settings("app", "local[1]", None, {})
    assert settings[PATH] == WORKER_SITE
    assert settings[JAVA] == f"-Dlog4j2.configurationFile=file:{LOG4J2}"


def test_the_files_packages_are_kept_before_those_the_job_adds() -> None:
    given = {"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.5.0,io.delta:x:1"}
    defaults = {"spark.jars.packages": "com.example:udfs:2.1,io.delta:x:1"}
    assert session_settings("a", "local[1]", given, defaults)["spark.jars.packages"] == (
        "com.example:udfs:2.1,io.delta:x:1,org.apache.hadoop:hadoop-aws:3.5.0")
    assert session_settings("a", "local[1]", given, {})["spark.jars.packages"] == (
        given["spark.jars.packages"])
    assert "spark.jars.packages" not in session_settings("a", "local[1]", {}, defaults)
